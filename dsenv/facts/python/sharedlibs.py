"""The dynamic linker's view: ``ldconfig -p``, LD_LIBRARY_PATH, ``ldd``, and which MPI ABI
a libmpi belongs to (read from the library, never loaded)."""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node, probe

_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", re.MULTILINE)


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    cache: dict[str, list[str]] = {}
    for name, _flags, path in _LDCONFIG_LINE.findall(text):
        cache.setdefault(name, []).append(path)
    return cache


@probe
def ldconfig_cache(node: Node) -> dict[str, list[str]]:
    exe = node.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if exe is None:
        return {}
    result = node.run([exe, "-p"])
    return parse_ldconfig(result.stdout) if result.ok else {}


DEFAULT_LIB_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


def find_library(node: Node, names) -> str | None:
    """Where the dynamic linker would find the first of ``names`` (LD_LIBRARY_PATH, cache, dirs)."""
    folders = node.library_path()
    cache = ldconfig_cache(node)
    for name in names:
        for folder in folders:
            if (Path(folder) / name).is_file():
                return str(Path(folder) / name)
        if cache.get(name):
            return cache[name][0]
        for folder in DEFAULT_LIB_DIRS:
            if node.path(folder).joinpath(name).is_file():
                return f"{folder}/{name}"
    return None


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|\S+)", re.MULTILINE)


def parse_ldd(text: str) -> dict[str, str | None]:
    """{'libmpi.so.40': '/lib/x86_64-linux-gnu/libmpi.so.40', 'libmpi.so.12': None}."""
    return {name: None if target == "not found" else target
            for name, target in _LDD_LINE.findall(text)}


def libmpi_abi(path: str) -> str | None:
    """'openmpi' or 'mpich' from the library itself (the test mpi4py's _mpiabi.py applies)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None  # a linker script such as the MPICH wheel's libmpi.so
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return "openmpi" if data.find(b"ompi_mpi_comm_self") >= 0 else "mpich"
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class LinkReport:
    """What ``ldd`` says of some shared objects: the libraries each cannot find, and the
    files ldd could not read (with how it ended)."""

    missing: dict[str, tuple[str, ...]]  # file -> sonames "not found"
    unread: dict[str, str]  # file -> why ldd gave no answer

    @property
    def read(self) -> int:
        return len(self.missing)


def unresolved(node: Node, files) -> LinkReport:
    """``ldd FILE`` for each file (the job's LD_LIBRARY_PATH applies: node.env): the
    libraries the dynamic loader would not find when the module is imported."""
    missing: dict[str, tuple[str, ...]] = {}
    unread: dict[str, str] = {}
    for path in files:
        result = node.run(["ldd", str(path)])
        if not result.ok:
            unread[str(path)] = result.describe()
            continue
        missing[str(path)] = tuple(n for n, target in parse_ldd(result.stdout).items()
                                   if target is None)
    return LinkReport(missing, unread)

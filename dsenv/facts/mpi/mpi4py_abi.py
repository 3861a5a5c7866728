"""mpi4py as installed in the environment under test: which MPI extension variants it has,
which one will load and which libmpi that loads, found the way mpi4py itself finds it (its
own ``_mpiabi.py`` rules, run standalone; nothing of MPI is loaded here)."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.sharedlibs import find_library, libmpi_abi, parse_ldd

_VARIANT = re.compile(r"^MPI(?:\.(\w+))?\.(?:cpython|pypy|abi3|so)")
DEFAULT_LIBMPI_NAMES = ("libmpi.so", "libmpi.so.12", "libmpi.so.40")


@dataclass(frozen=True)
class Mpi4py:
    location: str
    version: str | None
    variants: dict[str, str]  # abi ("" for a classic single build) -> extension file
    abi: str | None = None  # the variant that will load
    how: str = ""
    libmpi: str | None = None  # the libmpi.so that will be loaded
    problem: str = ""

    @property
    def multi_abi(self) -> bool:
        return "" not in self.variants


def extension_variants(folder: Path) -> dict[str, str]:
    variants = {}
    for path in sorted(folder.glob("MPI*.so")) + sorted(folder.glob("MPI*.pyd")):
        match = _VARIANT.match(path.name)
        if match:
            variants.setdefault(match.group(1) or "", str(path))
    return variants


def load_mpiabi_rules(folder: Path):
    """mpi4py's own _mpiabi.py, executed standalone (stdlib only; nothing of MPI is loaded)."""
    source = folder / "_mpiabi.py"
    if not source.is_file():
        return None, DEFAULT_LIBMPI_NAMES
    text = source.read_text(errors="replace")
    versions = re.findall(r'libname\("mpi",\s*(\d+)\)', text)
    names = ("libmpi.so", *(f"libmpi.so.{v}" for v in versions)) if versions else DEFAULT_LIBMPI_NAMES
    spec = importlib.util.spec_from_file_location("_dsenv_mpi4py_mpiabi", source)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - an unexpected mpi4py: fall back to the names only
        return None, names
    return module, names


def _mpi4py_version(folder: Path) -> str | None:
    """The version of the mpi4py in ``folder``: the metadata beside it, else __init__.py."""
    for dist in metadata.distributions(name="mpi4py", path=[str(folder.parent)]):
        return dist.version
    init = folder / "__init__.py"
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init.read_text(errors="replace")) \
        if init.is_file() else None
    return match.group(1) if match else None


def select_libmpi(node: Node, search_path: list[str], names) -> tuple[str | None, str | None]:
    """The first loadable libmpi along mpi4py's search (entries: folder, file or '' = system)."""
    for entry in search_path:
        entry = os.path.expanduser(entry)
        if entry and not os.path.isdir(entry):
            candidates = [entry]
        elif entry:
            candidates = [os.path.join(entry, n) for n in names]
        else:
            candidates = [p for p in (find_library(node, [n]) for n in names) if p]
        for candidate in candidates:
            abi = libmpi_abi(candidate) if os.path.isfile(candidate) else None
            if abi:
                return candidate, abi
    return None, None


@probe
def mpi4py_info(node: Node) -> Mpi4py | None:
    """The mpi4py the job's interpreter will import (:mod:`.target_env`), judged from files."""
    folder = target_env.module_folder(node, "mpi4py")
    if folder is None:
        return None
    variants = extension_variants(folder)
    version = _mpi4py_version(folder)
    if not variants:
        return Mpi4py(str(folder), version, {}, problem="no MPI extension module in the package")
    if "" in variants:  # classic build: one MPI.*.so linked to the libmpi it was built with
        libmpi, how = _ldd_libmpi(node, variants[""])
        abi = libmpi_abi(libmpi) if libmpi else None
        return Mpi4py(str(folder), version, variants, abi, how, libmpi)
    rules, names = load_mpiabi_rules(folder)
    chosen = node.env.get("MPI4PY_MPIABI")
    if chosen:
        abi = rules._get_mpiabi_from_string(chosen) if rules else chosen.lower()
        if abi not in variants:
            return Mpi4py(str(folder), version, variants, abi, f"MPI4PY_MPIABI={chosen}",
                          problem=f"MPI4PY_MPIABI={chosen} names no installed variant")
        libmpi, how = _ldd_libmpi(node, variants[abi])
        return Mpi4py(str(folder), version, variants, abi, f"MPI4PY_MPIABI={chosen}; {how}", libmpi)
    if node.env.get("MPI4PY_LIBMPI"):
        search, origin = node.env["MPI4PY_LIBMPI"].split(os.pathsep), "MPI4PY_LIBMPI"
    else:
        search = (rules._dlopen_rpath() if rules else []) or [""]
        origin = "mpi4py's library search (" + ", ".join(e or "system" for e in search) + ")"
    libmpi, abi = select_libmpi(node, search, names)
    if libmpi is None:
        return Mpi4py(str(folder), version, variants, None, origin,
                      problem="no libmpi found along " + origin)
    return Mpi4py(str(folder), version, variants, abi, f"{origin} finds {libmpi}", libmpi)


def _ldd_libmpi(node: Node, extension: str) -> tuple[str | None, str]:
    result = node.run(["ldd", extension])
    libs = parse_ldd(result.stdout)
    for name, target in libs.items():
        if re.match(r"lib(mpi|mpich|mpi_cray)[\w-]*\.so", name) and "mpifh" not in name:
            return target, f"ldd: {name} => {target or 'not found'}"
    return None, "ldd shows no libmpi" if result.ok else result.describe()

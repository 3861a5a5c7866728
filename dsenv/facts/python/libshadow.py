"""CUDA libraries of torch's pip wheels shadowed by same-name copies on LD_LIBRARY_PATH.

pip wheels of torch load cuBLAS, cuDNN, NCCL, nvJitLink... from ``site-packages/nvidia/*/lib``
(the nvidia-*-cu1X wheels). The dynamic loader searches LD_LIBRARY_PATH before a library's
RUNPATH, so a CUDA module or container that puts ``/usr/local/cuda/lib64`` there hands torch
its own libcublasLt or libcudnn instead; of another version, ``import torch`` stops with
``undefined symbol: cublasLtGetStatusString`` or the first matmul fails
(https://github.com/pytorch/pytorch/issues/91067).

Versions: a wheel's files carry only the soname (libcublas.so.12); its version is the
distribution's (nvidia-cublas-cu12 12.4.5.8, from its RECORD). A copy on LD_LIBRARY_PATH is
usually a symlink to ``libcublas.so.12.1.3.1``. Which copy a real ``import torch`` maps is
asked of the job's interpreter only when a differing copy is found.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from dsenv import proc
from dsenv.facts.node import Node

SONAME = re.compile(r"^lib[\w.+-]*?\.so(\.\d+)*$")
MARK = "DSENV-MAPS "
# Runs in the job's interpreter: import torch (what the job does first), then report which
# of the candidate files are mapped, and the import error if there is one.
MAPS_SCRIPT = """\
import json, os, sys
wanted = set(sys.argv[1:])
out = {"error": None, "mapped": []}
try:
    import torch
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    with open("/proc/self/maps") as maps:
        paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split()) >= 6}
    out["mapped"] = sorted(p for p in paths if os.path.realpath(p) in wanted)
except OSError:
    pass
print(__MARK__ + json.dumps(out))
""".replace("__MARK__", repr(MARK))


@dataclass(frozen=True)
class Shadow:
    soname: str
    wheel: Path  # the copy torch ships (site-packages/nvidia/<pkg>/lib/<soname>)
    other: Path  # the first same-name file on LD_LIBRARY_PATH
    wheel_version: str | None
    other_version: str | None
    differs: bool  # another version (or, versions unknown, another size)

    def describe(self) -> str:
        theirs = f" {self.other_version}" if self.other_version else ""
        ours = f" {self.wheel_version}" if self.wheel_version else ""
        real = os.path.realpath(self.other)
        target = f" -> {Path(real).name}" if Path(real).name != self.other.name else ""
        return (f"{self.soname}: LD_LIBRARY_PATH has {self.other}{target}{theirs}, "
                f"torch's wheel has {self.wheel}{ours}"
                + ("" if self.differs else " (same version)"))


def wheel_libraries(torch_folder: Path) -> dict[str, Path]:
    """{soname: file} of the nvidia-* wheels next to torch."""
    found: dict[str, Path] = {}
    for lib in sorted((Path(torch_folder).parent / "nvidia").glob("*/lib/*")):
        if SONAME.match(lib.name) and lib.is_file():
            found.setdefault(lib.name, lib)
    return found


def wheel_versions(site: Path) -> dict[str, str]:
    """{soname: version of the nvidia-* distribution that installed it}."""
    versions: dict[str, str] = {}
    for dist in metadata.distributions(path=[str(site)]):
        name = (dist.metadata["Name"] or "").lower()
        if not name.startswith("nvidia-"):
            continue
        for file in dist.files or ():
            if file.parts[:1] == ("nvidia",) and "lib" in file.parts:
                versions.setdefault(file.name, dist.version)
    return versions


def file_version(path: Path, soname: str) -> str | None:
    """'12.1.3.1' when ``path`` resolves to libcublas.so.12.1.3.1; None for the bare soname."""
    real = Path(os.path.realpath(path)).name
    stem = soname.split(".so", 1)[0] + ".so."
    return real[len(stem):] if real.startswith(stem) and len(real) > len(stem) else None


def _same_version(a: str, b: str) -> bool:
    """'9.1.0' and '9.1.0.70' agree: the shorter is a prefix of the longer, by components."""
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _differs(wheel: Path, other: Path, ours: str | None, theirs: str | None) -> bool:
    if ours and theirs:
        return not _same_version(ours, theirs)
    try:
        return os.path.getsize(wheel) != os.path.getsize(other)
    except OSError:
        return True


def find_shadows(torch_folder: Path, library_path: list[str]) -> tuple[list[Shadow], int]:
    """(same-soname copies in ``library_path``'s folders (LD_LIBRARY_PATH's: Node.library_path),
    how many wheel libraries were looked for)."""
    libs = wheel_libraries(torch_folder)
    if not libs:
        return [], 0
    found = []
    for soname, wheel in libs.items():
        for folder in library_path:
            other = Path(folder) / soname
            if other.exists() and os.path.realpath(other) != os.path.realpath(wheel):
                found.append((soname, wheel, other))
                break  # the loader takes the first
    versions = wheel_versions(Path(torch_folder).parent) if found else {}
    shadows = []
    for soname, wheel, other in found:
        ours = versions.get(soname) or file_version(wheel, soname)
        theirs = file_version(other, soname)
        shadows.append(Shadow(soname, wheel, other, ours, theirs,
                              _differs(wheel, other, ours, theirs)))
    return shadows, len(libs)


@dataclass(frozen=True)
class ImportCheck:
    ran: bool
    error: str | None = None  # the import error, or why the check could not run
    mapped: tuple[str, ...] = ()


def import_torch(node: Node, python: str, shadows: list[Shadow]) -> ImportCheck:
    """``import torch`` in the job's interpreter with the job's environment: which of the
    two copies got mapped, and the error if the import failed."""
    wanted = sorted({os.path.realpath(p) for s in shadows for p in (s.wheel, s.other)})
    result = node.run([python, "-c", MAPS_SCRIPT, *wanted])
    data = proc.marked_json(result.stdout, MARK)
    if not isinstance(data, dict):
        return ImportCheck(False, result.describe())
    return ImportCheck(True, data.get("error"), tuple(data.get("mapped") or ()))


def loaded_from_path(check: ImportCheck, shadows: list[Shadow]) -> list[str]:
    """The LD_LIBRARY_PATH copies the import really mapped."""
    others = {os.path.realpath(s.other) for s in shadows}
    return [p for p in check.mapped if os.path.realpath(p) in others]

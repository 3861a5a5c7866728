"""Where rocBLAS reads its Tensile (GEMM) kernels, and for which gfx targets it finds files there.

rocBLAS loads its kernels from ROCBLAS_TENSILE_LIBPATH, else from rocblas/library beside the
librocblas it loaded (ROCm/tensorflow-upstream#1617); a torch ROCm wheel loads its own copy from
torch/lib (its RPATH is $ORIGIN), any other torch the system ROCm's. Since ROCm 5.2 the files
are split per target, TensileLibrary_<gfx>.dat or TensileLibrary_lazy_<gfx>.dat
(ROCm/rocBLAS#1267); a build with merge-architectures has one TensileLibrary.dat whose targets
its name does not say. The folder is statted in a child first (mounts.require_files): a torch on
a file server that stopped answering is not judged rather than hung on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import mounts
from dsenv.facts.node import Node

TARGET_FILE = re.compile(r"^TensileLibrary_(?:lazy_)?(gfx[0-9a-f]+)(?:[-_:][\w+-]*)?\.(?:dat|co)$")
MERGED = "TensileLibrary.dat"
# HSA_OVERRIDE_GFX_VERSION=major.minor.stepping: the gfx target the runtime reports instead
# (10.3.0 -> gfx1030, 9.0.10 -> gfx90a: the stepping is one hex digit).
OVERRIDE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)\s*$")


@dataclass(frozen=True)
class TensileFolder:
    folder: Path
    why: str  # how rocBLAS gets there
    exists: bool
    targets: tuple[str, ...]  # gfx targets with a file of their own, sorted
    merged: bool  # one TensileLibrary.dat for every target it was built with

    def describe(self) -> str:
        return f"{self.folder} ({self.why})"


def target_of(arch: str, env) -> tuple[str, str]:
    """(the gfx target rocBLAS looks up for a GPU of ``arch``, why): HSA_OVERRIDE_GFX_VERSION
    replaces the GPU's own for every library of the runtime."""
    override = OVERRIDE.match(env.get("HSA_OVERRIDE_GFX_VERSION", ""))
    if override:
        major, minor, stepping = (int(g) for g in override.groups())
        if stepping < 16:
            return (f"gfx{major}{minor}{stepping:x}",
                    f"HSA_OVERRIDE_GFX_VERSION={env['HSA_OVERRIDE_GFX_VERSION'].strip()}")
    return arch.split(":")[0].lower(), "the GPU's own"


def _librocblas_in(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("librocblas.so*"))


def tensile_folder(node: Node, torch_location: str | Path) -> TensileFolder | None:
    """The folder rocBLAS reads for this torch, and what it holds; None when no librocblas is
    found: torch's own, else the first on LD_LIBRARY_PATH (where the loader looks first; a
    stale ROCm folder there sends rocBLAS to the wrong library folder), else the ROCm at
    ROCM_PATH (/opt/rocm by default)."""
    lib = Path(torch_location) / "lib"
    mounts.require_files(node, lib, 0, "torch's lib folder")
    rocm = node.env.get("ROCM_PATH")
    system = Path(rocm) / "lib" if rocm else node.path("/opt/rocm") / "lib"
    found = next(((Path(f), f"beside the first librocblas on LD_LIBRARY_PATH ({f})")
                  for f in node.library_path() if _librocblas_in(Path(f))), None)
    if node.env.get("ROCBLAS_TENSILE_LIBPATH"):
        folder, why = Path(node.env["ROCBLAS_TENSILE_LIBPATH"]), "ROCBLAS_TENSILE_LIBPATH"
    elif _librocblas_in(lib):
        folder, why = lib / "rocblas" / "library", "beside torch's own librocblas"
    elif found is not None:
        folder, why = found[0] / "rocblas" / "library", found[1]
    elif mounts.answers(node, system) and _librocblas_in(system):
        folder, why = system / "rocblas" / "library", f"beside {system.parent}'s librocblas"
    else:
        return None
    mounts.require_files(node, folder.parent, 1, "rocBLAS's library folder")
    if not folder.is_dir():
        return TensileFolder(folder, why, False, (), False)
    names = [p.name for p in folder.iterdir()]
    targets = sorted({m.group(1) for m in map(TARGET_FILE.match, names) if m})
    return TensileFolder(folder, why, True, tuple(targets), MERGED in names)

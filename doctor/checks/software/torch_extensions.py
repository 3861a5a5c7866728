"""torch.extension-symbols: every compiled module that links torch finds the C++ symbols it
asks for in the installed torch (flash-attn, mmcv, apex wheels; DeepSpeed's JIT builds).

"undefined symbol: _ZN3c10..." at import is an extension built against another torch
release or with the other C++ string ABI; the doctor reads both sides from the files
(dsenv.facts.python.torch_symbols) before the job imports them, and tells which it is."""

from __future__ import annotations

import struct
from pathlib import Path

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.python import target_env
from dsenv.facts.python import torch_info as tp
from dsenv.facts.python import torch_symbols as ts
from dsenv.facts.toolchain import extensions as ext
from dsenv.verdicts.findings import fail, ok, skip

# torch's own libraries and packages that never link it: not read
NOT_EXTENSIONS = ("torch", "nvidia", "triton", "functorch", "torchgen")
ABI_NAME = {"new": "new (_GLIBCXX_USE_CXX11_ABI=1, std::__cxx11::string)",
            "old": "old (_GLIBCXX_USE_CXX11_ABI=0, Ss)"}
ABI_WHEEL = {"new": "cxx11abiTRUE", "old": "cxx11abiFALSE"}


def _owner(path: Path, scan: ts.ExtensionScan, site: Path, root: Path | None
           ) -> tuple[str, str]:
    """(what to call the module, how to replace it): the distribution whose RECORD lists it
    (flash_attn_2_cuda...so sits at the top of site-packages and belongs to flash_attn), its
    top folder in site-packages, or its JIT build folder."""
    if root is not None and path.is_relative_to(root):
        folder = path.parent
        return f"the JIT build {folder.name}", f"rm -rf {folder} (it is rebuilt on first use)"
    package = scan.owners.get(path) or path.relative_to(site).parts[0].split(".")[0]
    return package, (f"pip install --no-build-isolation --no-cache-dir --force-reinstall "
                     f"{package}")


@check("torch.extension-symbols", "Compiled extensions match torch's C++ symbols")
def extension_symbols(ctx: Context):
    torch = tp.torch_build(ctx)
    if not torch.installed or not torch.location:
        return skip(f"{tp.NOT_INSTALLED}: no extension can link it")
    site = Path(torch.location).parent
    root = unread = ext.extensions_root(ctx).path
    if root is not None and not ext.files_answer(ctx):
        root = None  # a hung file server: the JIT builds are not read (extensions-dir says so)
    scan = ts.torch_extensions(site, root, skip=NOT_EXTENSIONS)
    files, left_out = scan.files, scan.left_out
    if not files:
        jit = f" and the JIT builds in {root}" if root is not None and root.is_dir() else ""
        return skip("no compiled module links torch's libraries: nothing to compare",
                    f"read: the modules installed in {site}{jit}",
                    *([f"not read: the JIT builds in {unread} (its file system gave no answer)"]
                      if root is None and unread is not None else []))
    lib_dir = Path(torch.location) / "lib"
    exports = ts.torch_exports(ctx, lib_dir, Path(target_env.environment(ctx).prefix) / "lib")
    if not exports.names.strip(b"\0"):
        return skip(f"no symbols read from torch's libraries in {lib_dir}"
                    + (f" ({'; '.join(exports.unread)})" if exports.unread else ""))
    judged = []
    for path in files:
        try:
            judged.append(ts.judge_extension(path, exports))
        except (OSError, ts.ElfError, struct.error):  # read a moment ago: replaced since
            left_out += 1
    broken = [e for e in judged if e.missing]
    more = f"; {left_out} more not read" if left_out else ""
    torch_abi = ABI_NAME.get(exports.abi, "unknown")
    evidence = [f"torch {torch.version} in {lib_dir}: {exports.libraries} libraries read, "
                f"{torch_abi} string ABI",
                *(f"{e.path}: asks for {len(e.missing)} symbol(s) torch lacks, e.g. "
                  f"{e.missing[0]}" for e in broken[:6])]
    if not broken:
        return ok(f"{len(judged)} compiled module(s) link torch: every torch symbol they ask "
                  f"for is in torch {torch.version}{more}", *evidence,
                  *(str(e.path) for e in judged[:6]))
    first = broken[0]
    name, replace = _owner(first.path, scan, site, root)
    others = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
    if first.abi and exports.abi and first.abi != exports.abi:
        wanted = ABI_WHEEL[exports.abi]
        return mode_finding(
            fail, "loader.ext-cxx11-abi-mismatch",
            f"{name} was built with the {first.abi} C++ string ABI, torch {torch.version} "
            f"with the {exports.abi} one: `import` fails with \"undefined symbol: "
            f"{first.missing[0]}\"{others}", *evidence,
            here=f"install {name}'s build for torch's ABI (a wheel named {wanted}) or rebuild "
                 f"it here: {replace}")
    return mode_finding(
        fail, "loader.ext-built-for-other-torch",
        f"{name} was built against another torch than {torch.version}: {len(first.missing)} "
        f"torch symbol(s) it asks for are gone, `import` fails with \"undefined symbol: "
        f"{first.missing[0]}\"{others}", *evidence, here=f"rebuild it for this torch: {replace}")

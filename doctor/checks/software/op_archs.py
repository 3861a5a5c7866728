"""deepspeed.op-archs: the precompiled CUDA ops hold a kernel image for every visible GPU.

A DeepSpeed op compiled for sm_80 and sm_90 loads on a V100 (sm_70) and dies at its first
kernel launch with "CUDA error: no kernel image is available for execution on the device".
`dsenv provision` records per op the archs its shared object holds (``ops.archs`` in
dsenv-env.json, read from the .nv_fatbin section); an env without that record (built by
hand with DS_BUILD_*) has its op libraries read here the same way (dsenv/facts/toolchain/fatbin.py).
"""

from __future__ import annotations

from pathlib import Path

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.errors import DsenvError
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.python import deepspeed_info as dsi
from dsenv.facts.python import target_env
from dsenv.facts.toolchain import fatbin
from dsenv.provision.record import manifest as env_manifest
from dsenv.verdicts.findings import fail, info, ok, skip


def _recorded(ctx: Context) -> tuple[dict[str, dict], str]:
    """({op: {"elf": [...], "ptx": [...]}}, where it came from): the manifest's record, else
    the shared objects of the precompiled ops."""
    prefix = Path(target_env.environment(ctx).prefix)
    try:
        recorded = env_manifest.read_manifest(prefix)
    except DsenvError:
        recorded = None
    archs = (recorded.ops.get("archs") if recorded is not None else None) or {}
    if archs:
        return archs, f"{prefix / env_manifest.MANIFEST_NAME} (ops.archs)"
    ds, _ = dsi.installs(ctx)
    if ds is None or not ds.precompiled:
        return {}, ""
    libraries = fatbin.op_libraries(ds.folder)
    found = {}
    for op in ds.precompiled:
        if op in libraries:
            try:
                found[op] = fatbin.read_device_code(libraries[op]).to_json()
            except fatbin.FatbinError:
                continue
    return found, f"the .nv_fatbin of {ds.folder / 'ops'}/*_op*.so"


def _code(op: str, record: dict) -> fatbin.DeviceCode:
    return fatbin.DeviceCode(op, tuple(record.get("elf") or ()), tuple(record.get("ptx") or ()))


@check("deepspeed.op-archs", "Precompiled ops hold kernels for the visible GPUs")
def op_archs(ctx: Context):
    code, source = _recorded(ctx)
    gpu_code = {op: r for op, r in code.items() if r.get("elf") or r.get("ptx")}
    if not gpu_code:
        return skip("no precompiled CUDA op" + (f" ({source})" if source else ""))
    held = [f"{op}: {_code(op, r).describe()}" for op, r in sorted(gpu_code.items())]
    gpus = [g for g in gpu_probe.visible_gpus(ctx) if g.vendor == "nvidia" and g.arch]
    if not gpus:
        return info(f"{len(gpu_code)} CUDA op(s) precompiled; no NVIDIA GPU visible to check "
                    "them against", f"from {source}", *held)
    bad = {}
    for gpu in gpus:
        missing = fatbin.unable(gpu_code, gpu.arch)
        if missing:
            bad[gpu] = missing
    if bad:
        gpu, missing = next(iter(bad.items()))
        wanted = sorted({g.arch for g in gpus}, key=lambda a: tuple(map(int, a.split("."))))
        return mode_finding(
            fail, "deepspeed.op-missing-arch",
            f"{', '.join(missing)} hold no kernel image for GPU {gpu.index} {gpu.name} "
            f"({fatbin.sm(gpu.arch)}): the job dies at their first launch with \"no kernel "
            "image is available for execution on the device\"", f"from {source}", *held,
            here=f"re-provision for these GPUs: `dsenv provision --arch \"{';'.join(wanted)}\" "
            "--force` (or TORCH_CUDA_ARCH_LIST with their archs when building by hand)")
    names = ", ".join(sorted({f"{g.name} ({fatbin.sm(g.arch)})" for g in gpus}))
    return ok(f"{len(gpu_code)} CUDA op(s) hold kernels for {names}", f"from {source}", *held)

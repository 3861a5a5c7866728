"""deepspeed: installed and built for this torch; precompiled vs JIT ops; the accelerator."""

from __future__ import annotations

import os

from dsenv.doctor.catalogue import mode_fact, mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs.training_stack import first_run_ops
from dsenv.facts.python import deepspeed_info as dsi
from dsenv.facts.python import dsconfig, target_env
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.facts.toolchain import extensions as ext
from dsenv.facts.toolchain import toolkit as tk
from dsenv.facts.toolchain.libaio import aio_link
from dsenv.verdicts.findings import fail, info, ok, skip, warn


@check("deepspeed.install", "DeepSpeed installed and built for this torch")
def install(ctx: Context):
    ds, torch = dsi.installs(ctx)
    if ds is None:  # the job's `import deepspeed` fails: not ready, on any target
        env = target_env.environment(ctx)
        return fail(f"DeepSpeed is not installed in {env.prefix}, the environment judged "
                    f"({env.why}): the job's `import deepspeed` fails",
                    "install the training stack: `dsenv provision` (or `pip install "
                    "deepspeed`)" + ("" if ctx.is_compute else ", or judge the environment "
                                     "the job will use: `dsenv doctor --env PREFIX`"))
    evidence = [f"installed at {ds.folder}"]
    if not torch.installed:
        return fail(f"DeepSpeed {ds.version} is installed but torch is not",
                    "install torch first, then DeepSpeed: `dsenv provision`", *evidence)
    evidence.append(torch.describe())
    mismatches = dsi.build_mismatches(ds, torch)
    if mismatches:
        return mode_finding(fail, "deepspeed.ops-built-for-other-torch",
                            f"DeepSpeed {ds.version}'s precompiled ops were built against "
                            f"{ds.built_against()}; they will refuse to load "
                            "(\"PyTorch version mismatch! DeepSpeed ops were compiled...\")",
                            *mismatches, "precompiled: " + ", ".join(ds.precompiled), *evidence)
    if ds.precompiled:
        return ok(f"DeepSpeed {ds.version}, {len(ds.precompiled)} ops precompiled for "
                  f"{ds.accelerator_name or '?'} against {ds.built_against()}", *evidence)
    return ok(f"DeepSpeed {ds.version} with {torch.describe()} (no ops precompiled)", *evidence)


def _compiler(ctx: Context) -> str | None:
    cxx = ctx.env.get("CXX")
    if cxx:
        return cxx if os.sep in cxx and os.path.exists(cxx) else ctx.which(cxx)
    return ctx.which("c++") or ctx.which("g++")


def _gpu_compiler(ctx: Context, accelerator: str, torch: TorchBuild) -> tuple[str, str | None] | None:
    """(name, path or None) of the device compiler a GPU JIT build needs, if it needs one."""
    if accelerator != "cuda" or not torch.gpu_build:
        return None
    name, variables = ("hipcc", ("ROCM_PATH", "ROCM_HOME")) if torch.hip else \
        ("nvcc", ("CUDA_HOME", "CUDA_PATH"))
    var = next((v for v in variables if ctx.env.get(v)), None)
    found = tk.home_binary(ctx, var, name) if var else None
    return name, str(found) if found else ctx.which(name)


def _provision_fix(gpus) -> str:
    archs = sorted({g.arch for g in gpus or []})
    return f"precompile the ops: `dsenv provision --arch {','.join(archs) or 'cpu'}`"


def _compat_evidence(compat: dsi.Compatibility, ds: dsi.DeepSpeedInstall) -> list[str]:
    if compat.error:
        return [f"op compatibility unknown: {compat.error}"]
    if not compat.known:
        return ["op compatibility " + dsi.NOT_ASKED.format(version=ds.version)]
    good = sorted(n for n, yes in compat.compatible.items() if yes)
    bad = sorted(n for n, yes in compat.compatible.items() if not yes)
    origin = {"recorded": "recorded by DeepSpeed at install", "cache": "cached answer"}.get(
        compat.source, "asked DeepSpeed's op builders")
    lines = [f"compatible ({origin}): {', '.join(good) or 'none'}"]
    if bad:
        lines.append("not compatible: " + ", ".join(bad))
    return lines


def _offload(ctx: Context) -> tuple[str, dict[str, str]]:
    """(--deepspeed-config's path, {"param"/"optimizer": the device it offloads to}, plus
    "aio": "section" when it has one); ("", {}) without a config."""
    config = dsconfig.loaded(ctx) if ctx.options.deepspeed_config else None
    data = config.data if config is not None and isinstance(config.data, dict) else {}
    zero = data.get("zero_optimization") if isinstance(data.get("zero_optimization"), dict) \
        else {}
    found = {key.removeprefix("offload_"): str(zero[key].get("device"))
             for key in ("offload_param", "offload_optimizer") if isinstance(zero.get(key), dict)}
    if "aio" in data:
        found["aio"] = "section"
    return (str(config.path) if config is not None else ""), found


def _nvme_offload(ctx: Context) -> str:
    """What in --deepspeed-config needs DeepSpeed's async_io op (NVMe offload, an aio
    section), "" when nothing does or no config was given."""
    path, offload = _offload(ctx)
    nvme = [part for part, device in offload.items() if device == "nvme"]
    if nvme:
        return f"{path} offloads {nvme[0]} to NVMe"
    return f"{path} has an aio section" if "aio" in offload else ""


@check("deepspeed.ops", "DeepSpeed ops: precompiled, compatible, JIT")
def ops(ctx: Context):
    ds, torch = dsi.installs(ctx)
    if ds is None:
        return skip("DeepSpeed is not installed")
    if torch.installed and dsi.build_mismatches(ds, torch):
        return skip("the precompiled ops cannot load until DeepSpeed is rebuilt: see "
                    "deepspeed.install")
    gpus = dsi.visible_gpus(ctx)
    accel = dsi.expected_accelerator(ctx, torch, gpus).name
    compat = dsi.op_compatibility(ctx)
    evidence = _compat_evidence(compat, ds)
    usable = ds.precompiled if ds.accelerator_name == accel else []
    if ds.precompiled and not usable:
        evidence.append(f"precompiled ops were built for {ds.accelerator_name}, DeepSpeed will "
                        f"run on {accel}: they are JIT-compiled instead")
    needed = [(op, secs) for op, secs in first_run_ops(accel) if op not in usable]
    if _offload(ctx)[1].get("optimizer") == "cpu" and "cpu_adam" not in usable:
        needed.append(("cpu_adam", None))  # the optimizer offloaded to the CPU: DeepSpeedCPUAdam
    incompatible = [op for op, _ in needed if compat.compatible.get(op) is False]
    if usable:
        evidence.insert(0, "precompiled: " + ", ".join(usable))
    if not needed:
        return ok(f"{len(usable)} ops precompiled for {accel}; a first run compiles nothing",
                  *evidence)
    names = ", ".join(op for op, _ in needed)
    if incompatible:
        return mode_finding(fail, "deepspeed.op-incompatible",
                            f"{', '.join(incompatible)} not precompiled and not compatible "
                            "here: the first fused op will fail to JIT-compile", *evidence,
                            here=_provision_fix(gpus))
    missing = [tool for tool, path in (("a C++ compiler (c++/g++)", _compiler(ctx)),
                                       ("ninja", ctx.which("ninja"))) if not path]
    device = _gpu_compiler(ctx, accel, torch)
    if device is not None and device[1] is None:
        missing.append(device[0])
    if missing:
        summary = (f"{names} not precompiled and no {' or '.join(missing)} on PATH: the first "
                   "fused op will fail to JIT-compile")
        if any(op == "cpu_adam" for op, _ in needed):  # DeepSpeedCPUAdam then has no op
            return mode_finding(fail, "deepspeed.cpu-adam-build-failed", summary, *evidence,
                                here=_provision_fix(gpus))
        return fail(summary, _provision_fix(gpus), *evidence)
    root = dsi.jit_build_root(ctx, torch)
    readable = ext.files_answer(ctx)  # a hung file server: taken as not cached
    uncached = [(op, secs) for op, secs in needed if not (readable and dsi.jit_cached(root, op))]
    evidence.append(f"JIT cache: {root}" + ("" if readable else
                                            " (not read: its file system gave no answer)"))
    if not uncached:
        return ok(f"{names} JIT-compiled earlier and cached in {root}", *evidence)
    total = sum(secs or 0 for _, secs in uncached)
    estimate = f" (~{round(total / 60)} min)" if total else ""
    listed = ", ".join(f"{op} (~{secs} s)" if secs else op for op, secs in uncached)
    return warn(f"nothing precompiled: the first run spends minutes JIT-compiling "
                f"{listed}{estimate}",
                "compile once into a shared cache that every job reuses: `export "
                "TORCH_EXTENSIONS_DIR=$SCRATCH/torch_extensions` (or precompile: "
                "`dsenv provision`)", *evidence)


@check("deepspeed.async-io", "DeepSpeed's async_io op (NVMe offload): libaio")
def async_io(ctx: Context):
    ds, _ = dsi.installs(ctx)
    if ds is None:
        return skip("DeepSpeed is not installed")
    if "async_io" in ds.precompiled:
        return ok("async_io is precompiled: it needs no libaio build here")
    link = aio_link(ctx)
    if link.linked is None:
        return skip(f"cannot test libaio the way DeepSpeed does: {link.detail}")
    tried = f"DeepSpeed's libaio test (io_submit linked with -laio) with {link.compiler}"
    if link.linked:
        return ok("libaio links: DeepSpeed can build its async_io op here", tried)
    nvme = _nvme_offload(ctx)
    evidence = (tried, f"the linker: {link.detail}")
    if nvme:
        return mode_finding(fail, "deepspeed.async-io-no-libaio",
                            f"{nvme}, but libaio does not link here: the NVMe offload stops "
                            "when DeepSpeed builds its async_io op", *evidence)
    # only NVMe offload needs the op, and DeepSpeed warns of it at every start: a fact here,
    # and the cause itself when a log says the op could not load (explain --here)
    return mode_fact("deepspeed.async-io-no-libaio", "libaio does not link here: DeepSpeed's "
                     "async_io op (NVMe offload) cannot be built; nothing given to the doctor "
                     "needs it", *evidence)


@check("deepspeed.accelerator", "Accelerator DeepSpeed will pick")
def accelerator(ctx: Context):
    ds, torch = dsi.installs(ctx)
    if ds is None:
        return skip("DeepSpeed is not installed")
    explicit = ctx.env.get("DS_ACCELERATOR")
    supported = dsi.supported_accelerators(ds)
    if explicit is not None and supported and explicit not in supported:
        return fail(f"DS_ACCELERATOR={explicit} is not one DeepSpeed knows; it raises "
                    "ValueError at import", "export DS_ACCELERATOR=cuda (GPUs) or cpu",
                    "supported: " + ", ".join(supported))
    gpus = dsi.visible_gpus(ctx)
    choice = dsi.expected_accelerator(ctx, torch, gpus)
    build = torch.describe()
    evidence = [build, f"visible GPUs: {len(gpus)}" if gpus is not None
                else "visible GPUs: unknown (GPU probe unavailable)"]
    if choice.name == "cuda":
        if not torch.gpu_build:
            return fail(f"DS_ACCELERATOR=cuda but {build}", "install a CUDA/ROCm build of "
                        "torch: `dsenv provision`", *evidence)
        vendors = {g.vendor for g in gpus or []}
        wanted = "amd" if torch.hip else "nvidia"
        if vendors and wanted not in vendors:
            return fail(f"{build} cannot drive the visible {'/'.join(sorted(vendors))} GPUs",
                        "install the torch build for these GPUs: `dsenv provision`", *evidence)
        if not gpus:
            if ctx.is_compute:
                return fail(f"DeepSpeed will use cuda ({choice.how}) but no GPU is visible",
                            "request GPUs (`#SBATCH --gpus-per-node=...`) or export "
                            "DS_ACCELERATOR=cpu", *evidence)
            return info(f"DeepSpeed will use cuda ({choice.how}); no GPU visible on this login "
                        "node", *evidence)
        return ok(f"cuda ({choice.how}) on {len(gpus)} GPU(s) with {build}", *evidence)
    if choice.name == "cpu":
        if gpus:
            if explicit is not None:
                return warn(f"DS_ACCELERATOR=cpu while {len(gpus)} GPU(s) are visible: they "
                            "stay idle", "unset DS_ACCELERATOR", *evidence)
            return (fail if ctx.is_compute else warn)(
                f"{len(gpus)} GPU(s) visible but {build}: DeepSpeed falls back to cpu and "
                "trains on the CPU", "install a CUDA/ROCm build of torch: `dsenv provision`",
                *evidence)
        if explicit is not None:
            return ok("cpu (DS_ACCELERATOR=cpu)", *evidence)
        if torch.gpu_build and gpus is not None:
            # A GPU build of torch where no GPU is visible: DeepSpeed picks cpu, so ops built
            # here (pip install with DS_BUILD_OPS=1, a JIT warm-up) are the CPU accelerator's.
            summary = (f"no GPU visible with {build}: DeepSpeed picks cpu here, so ops built "
                       "here (DS_BUILD_OPS=1 pip install, ds_report) are the CPU "
                       "accelerator's, not fused_adam and the GPU ops")
            if ctx.is_compute:
                return mode_finding(warn, "deepspeed.no-gpu-at-build", summary, *evidence)
            return mode_fact("deepspeed.no-gpu-at-build", summary, *evidence)
        return info("no GPU visible: DeepSpeed will warn \"Setting accelerator to CPU\" and "
                    "pick cpu (export DS_ACCELERATOR=cpu to choose it quietly)", *evidence)
    return info(f"DS_ACCELERATOR={choice.name}: an accelerator dsenv does not judge", *evidence)

"""torch: which build is installed, whether it covers the GPUs, the driver, real work on each GPU
(a kernel through the CUDA driver; a tensor op through torch with --verbose)."""

from __future__ import annotations

import re
from pathlib import Path

from dsenv.doctor.catalogue import mode_finding, mode_id
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.gpu import cuda_driver, rocblas
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.python import target_env
from dsenv.facts.python import torch_info as tp
from dsenv.facts.toolchain import toolkit
from dsenv.verdicts.findings import fail, ok, skip, warn
from dsenv.versions import version_tuple


def _wheel_fix(ctx: Context, gpus) -> str:
    if any(g.vendor == "amd" for g in gpus):
        return f"pip install --force-reinstall torch --index-url {toolkit.rocm_index()}"
    driver = next((g.driver for g in gpus if g.driver), None)
    index = toolkit.torch_index_for(driver, [g.arch for g in gpus])
    return f"pip install --force-reinstall torch --index-url {index}"


@check("torch.build", "torch installed, CPU/CUDA/HIP build")
def build(ctx: Context):
    found = tp.torch_build(ctx)
    gpus = gpu_probe.visible_gpus(ctx)
    if not found.installed:
        # a job started from this environment dies at its first import, on a login node's
        # verdict as in the job: not ready either way
        env = target_env.environment(ctx)
        summary = (f"torch is not installed in {env.prefix}, the environment judged "
                   f"({env.why}): the job's first import fails")
        if ctx.is_compute:
            return fail(summary, "install the training stack: `dsenv provision` (or "
                        f"`{_wheel_fix(ctx, gpus)}`)")
        return fail(summary, "judge the environment the job will use: `dsenv doctor --env "
                    "PREFIX` (or activate it first), or build one with `dsenv provision`")
    evidence = [f"read from {found.location}/version.py"]
    if found.kind == "cpu" and gpus:
        vendor = "AMD" if gpus[0].vendor == "amd" else "NVIDIA"
        return mode_finding(fail, "torch.cpu-only-build",
                            f"{found.describe()} on a node with {len(gpus)} {vendor} GPU(s): "
                            "training would run on the CPU", *evidence,
                            here=_wheel_fix(ctx, gpus))
    if found.kind == "cpu":
        return ok(f"{found.describe()}; no GPU visible, so the CPU build fits", *evidence)
    wrong = {"cuda": "amd", "hip": "nvidia"}[found.kind]
    if gpus and all(g.vendor == wrong for g in gpus):
        return fail(f"{found.describe()} cannot drive the {wrong.upper()} GPU(s) here",
                    _wheel_fix(ctx, gpus), *evidence)
    return ok(found.describe(), *evidence)


def _gpu_torch(ctx: Context):
    """(build, gpus) when a GPU torch and GPUs are both here, else a skip Finding. The
    runtime probe starts first, so it runs while nvidia-smi answers."""
    found = tp.torch_build(ctx)
    tp.start_runtime(ctx)
    gpus = gpu_probe.visible_gpus(ctx)
    if not found.installed:
        return skip(f"{tp.NOT_INSTALLED}: see torch.build")
    if found.kind not in ("cuda", "hip"):
        return skip(f"{found.describe()}: see torch.build")
    if not gpus:
        return skip("no GPU visible")
    return found, gpus


@check("torch.arch-list", "torch compiled for every visible GPU")
def arch_list(ctx: Context):
    state = _gpu_torch(ctx)
    if not isinstance(state, tuple):
        return state
    found, gpus = state
    runtime = tp.torch_runtime(ctx)
    if not runtime.ran:
        return skip(f"the torch probe did not run ({runtime.problem}): see torch.usable")
    compiled = list(runtime.arch_list)
    evidence = [f"{runtime.arch_source}: " + (" ".join(compiled) or "(empty)")]
    missing = sorted({f"{g.name} ({g.arch})" for g in gpus
                      if g.arch and tp.covering_entry(compiled, g.arch) is None})
    if not compiled:
        return warn("torch reported no compiled architectures", "see torch.usable", *evidence)
    if missing:
        return mode_finding(fail, _lacking_mode(gpus, compiled),
                            f"{found.describe()} has no kernels for {', '.join(missing)}: 'no "
                            "kernel image is available for execution on the device'", *evidence,
                            here=_wheel_fix(ctx, gpus))
    return ok(f"compiled arch list covers all {len(gpus)} GPU(s)", *evidence)


@check("torch.rocblas-kernels", "rocBLAS has GEMM kernels for every visible AMD GPU")
def rocblas_kernels(ctx: Context):
    """ROCm builds: the Tensile files in the folder rocBLAS will read, against each GPU's gfx
    target (or HSA_OVERRIDE_GFX_VERSION's). None there fails every GEMM at its first call with
    "rocBLAS error: Cannot read .../TensileLibrary.dat"."""
    state = _gpu_torch(ctx)
    if not isinstance(state, tuple):
        return state
    found, gpus = state
    if found.kind != "hip":
        return skip(f"{found.describe()}: rocBLAS is ROCm's")
    amd = [g for g in gpus if g.vendor == "amd" and g.arch.startswith("gfx")]
    if not amd:
        return skip("no AMD GPU with a gfx target visible")
    lib = rocblas.tensile_folder(ctx, found.location)
    if lib is None:
        return skip(f"no librocblas beside torch ({found.location}/lib) or in "
                    f"{ctx.env.get('ROCM_PATH') or '/opt/rocm'}/lib: nothing to read")
    if not lib.exists or not (lib.targets or lib.merged):
        held = "does not exist" if not lib.exists else "holds no TensileLibrary files"
        return mode_finding(fail, "rocm.rocblas-tensile-files-missing",
                            f"rocBLAS reads its kernels from {lib.describe()}, which {held}: "
                            "every GEMM fails with 'rocBLAS error: Cannot read "
                            ".../TensileLibrary.dat'", here=f"folder {lib.folder}")
    if not lib.targets:
        return skip(f"{lib.folder} holds one merged TensileLibrary.dat: its targets are not in "
                    "the file names, so they are not compared")
    evidence = [f"{lib.describe()}: files for {' '.join(lib.targets)}"]
    wanted = {g: rocblas.target_of(g.arch, ctx.env) for g in amd}
    missing = [f"{g.name} ({target}, {why})" for g, (target, why) in wanted.items()
               if target not in lib.targets]
    if missing:
        return mode_finding(fail, "gpu.rocm-gfx-unsupported",
                            f"rocBLAS has no kernels for {', '.join(sorted(set(missing)))}: every "
                            "GEMM fails with 'rocBLAS error: Cannot read .../TensileLibrary.dat'",
                            *evidence, here=f"targets with kernels: {' '.join(lib.targets)}")
    targets = sorted({target for target, _ in wanted.values()})
    return ok(f"rocBLAS has kernels for {' '.join(targets)} ({len(amd)} GPU(s))", *evidence)


def _lacking_mode(gpus, compiled) -> str:
    """The catalogue mode of a GPU the build has no kernels for: an AMD gfx target missing
    from a ROCm build, a GPU older than the build's lowest arch, else one newer than it."""
    gpu = next(g for g in gpus if g.arch and tp.covering_entry(compiled, g.arch) is None)
    if gpu.arch.startswith("gfx"):
        return mode_id("gpu.rocm-gfx-unsupported")
    lowest = min((int(m.group(1)) for m in map(re.compile(r"(?:sm|compute)_(\d+)").match,
                                               compiled) if m), default=None)
    if lowest is not None and int(gpu.arch.replace(".", "")) < lowest:
        return mode_id("gpu.too-old-for-torch")
    return mode_id("gpu.torch-build-lacks-arch")


def _compat_libcuda(ctx: Context) -> list[str]:
    """cuda-compat folders on LD_LIBRARY_PATH that hold a libcuda (forward compatibility)."""
    folders = [f for f in ctx.env.get("LD_LIBRARY_PATH", "").split(":") if "compat" in f]
    return [f for f in folders if any(Path(f).glob("libcuda.so*"))]


@check("torch.driver", "NVIDIA driver new enough for torch's CUDA")
def driver(ctx: Context):
    state = _gpu_torch(ctx)
    if not isinstance(state, tuple):
        return state
    found, gpus = state
    if found.kind != "cuda":
        return skip("ROCm build: the driver check applies to CUDA builds")
    have = next((g.driver for g in gpus if g.driver), None)
    if have is None:
        return skip("nvidia-smi reported no driver version")
    row, floor = toolkit.toolkit_row(found.cuda), toolkit.major_min_driver(found.cuda)
    if row is None or floor is None:
        return warn(f"CUDA {found.cuda} is not in envs/cuda_toolkits.toml", "update dsenv")
    evidence = [f"driver {have}; CUDA {found.cuda} needs >= {floor} (minor-version "
                f"compatibility), >= {row.min_driver} for everything (CUDA {row.version} GA)",
                "source: NVIDIA CUDA Toolkit release notes, driver table"]
    have_t = version_tuple(have)
    if have_t < version_tuple(floor):
        compat = _compat_libcuda(ctx)
        if compat:  # error 804 on GPUs without forward compatibility
            return mode_finding(fail, "gpu.forward-compat-unsupported",
                                f"driver {have} is too old for {found.describe()} and "
                                f"LD_LIBRARY_PATH puts a cuda-compat libcuda first ({compat[0]}): "
                                "CUDA fails to initialise unless the GPU supports forward "
                                "compatibility (error 804)", *evidence,
                                here=_wheel_fix(ctx, gpus))
        return mode_finding(fail, "gpu.driver-too-old",
                            f"driver {have} is too old for {found.describe()}: CUDA fails to "
                            "initialise", *evidence, here=_wheel_fix(ctx, gpus))
    if have_t < version_tuple(row.min_driver):
        # one gap, two consequences: PTX JIT fails, and NCCL's newer driver calls fail
        return mode_finding(warn, "gpu.ptx-newer-than-driver",
                            f"driver {have} runs CUDA {found.cuda} only through minor-version "
                            "compatibility: PTX JIT (and Triton kernels) can fail", *evidence,
                            "the same gap fails NCCL's first collective (catalogue: "
                            f"{mode_id('comm.nccl-newer-than-driver')})",
                            here=_wheel_fix(ctx, gpus))
    return ok(f"driver {have} supports CUDA {found.cuda}", *evidence)


def _driver_stack_mode(error: str) -> str:
    """The catalogue mode a CUDA initialisation error names, "" when none: 802 'system not
    yet initialized' (NVSwitch without Fabric Manager) or 999 'unknown error'."""
    if re.search(r"system not yet initiali[sz]ed|\b802\b", error, re.I):
        return mode_id("gpu.fabric-manager-not-running")
    if re.search(r"unknown error|\b999\b", error, re.I):
        return mode_id("gpu.cuda-unknown-error-driver")
    return ""


@check("torch.usable", "a kernel runs on each GPU")
def usable(ctx: Context):
    state = _gpu_torch(ctx)
    if not isinstance(state, tuple):
        return state
    found, gpus = state
    runtime = tp.torch_runtime(ctx)
    fix = ("run `python -c 'import torch; torch.cuda.init()'` to see the error; check "
           "torch.driver and that the job requested the GPUs")
    driver = runtime.source == "driver"
    who = "the CUDA driver" if driver else "torch"
    if runtime.hung:
        what = "initialising CUDA" if driver else "importing torch and initialising the GPUs"
        timeout = cuda_driver.probe_timeout(ctx) if driver else tp.probe_timeout(ctx)
        return fail(f"{what} did not finish within {timeout:g} s", fix, runtime.problem,
                    runtime.asked)
    if not runtime.ran:
        return fail(f"the {'CUDA driver' if driver else 'torch'} probe failed: "
                    f"{runtime.problem}", fix, *runtime.evidence, runtime.asked)
    if not runtime.available:
        summary = "the CUDA driver found no usable GPU" if driver else \
            "torch.cuda.is_available() is False"
        error = runtime.init_error or "no error reported by torch.cuda.init()"
        known = _driver_stack_mode(error)
        if known:
            return mode_finding(fail, known, summary, error, runtime.asked, here=fix)
        return fail(summary, fix, error, runtime.asked)
    broken = [d for d in runtime.devices if not d.usable]
    lines = [f"cuda:{d.index} {d.name} ({d.arch}): " + (d.error or f"sum={d.tensor_sum}")
             for d in runtime.devices]
    lines += [*runtime.evidence, runtime.asked]
    work = "a kernel" if driver else "a tensor op"
    if broken:
        known = _driver_stack_mode(" ".join(d.error or "" for d in broken))
        if known:
            return mode_finding(fail, known, f"{work} failed on {len(broken)} of "
                                f"{len(runtime.devices)} GPU(s)", *lines, here=fix)
        return fail(f"{work} failed on {len(broken)} of {len(runtime.devices)} GPU(s)",
                    fix, *lines)
    if runtime.device_count < len(gpus):
        return warn(f"{who} sees {runtime.device_count} GPU(s), nvidia-smi lists {len(gpus)}",
                    "compare CUDA_VISIBLE_DEVICES with `nvidia-smi -L`", *lines)
    how = " through the CUDA driver" if driver else ""
    took = f" in {runtime.seconds:.2f} s" if runtime.seconds is not None else ""
    return ok(f"{work} ran on {runtime.device_count} GPU(s){how}{took}", *lines)


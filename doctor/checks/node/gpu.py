"""gpu: vendor tools answering, the GPU inventory, and what *_VISIBLE_DEVICES leaves visible.

A CPU job is a job: on a compute target "no GPU visible" fails only when the job expects
GPUs (:func:`gpu_expectation`).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from dsenv.doctor.catalogue import mode_finding, mode_id
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs import archs
from dsenv.facts.gpu import inventory as probe
from dsenv.facts.gpu import libcuda
from dsenv.facts.host import machine as host
from dsenv.facts.python import pyenv, torch_info
from dsenv.provision.record.manifest import installed_versions
from dsenv.verdicts.findings import fail, info, ok, skip, warn
from dsenv.versions import version_tuple

HANG_FIX = ("the node's GPU driver is stuck (look for Xid errors in `dmesg`): tell the admins "
            "and keep jobs off the node: `sbatch --exclude=$(hostname)`")
NO_GPU_FIX = ("request GPUs from Slurm (`#SBATCH --gpus-per-node=4` or `--gres=gpu:4`); for a "
              "CPU job say so: `--gpus-per-node 0` or `export DS_ACCELERATOR=cpu`")
ALLOCATED_FIX = ("Slurm gave this job GPUs that no tool here can see: check `nvidia-smi` / "
                 "`rocm-smi` on the node and that nothing resets *_VISIBLE_DEVICES; tell the "
                 "admins and keep jobs off the node: `sbatch --exclude=$(hostname)`")
CONTAINER_FIX = ("start the container with the GPUs: `docker run --gpus all ...` (Podman: "
                 "`--device nvidia.com/gpu=all`; Kubernetes: a `nvidia.com/gpu` limit) on a "
                 "node with the NVIDIA driver and container toolkit")
UNKNOWN_FIX = ("say what the job runs on: `--gpus-per-node G` (0 for a CPU job) or "
               "`export DS_ACCELERATOR=cpu|cuda`")

# Set inside an allocation that has GPUs (sbatch/srun --gpus*, --gres=gpu:N).
SLURM_GPU_PREFIX = "SLURM_GPUS"  # SLURM_GPUS, _ON_NODE, _PER_NODE, _PER_TASK, _PER_SOCKET
SLURM_GPU_LISTS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")  # device indices: "0,1"
HIDING = ("", "-1", "NoDevFiles")  # *_VISIBLE_DEVICES values that hide every GPU on purpose


@dataclass(frozen=True)
class GpuExpectation:
    """Whether the job needs GPUs: True, False (a CPU job) or None (nothing says), and why."""

    expected: bool | None
    reason: str


def _counts_gpus(value: str) -> bool:
    """``4``, ``a100:2``, ``gpu:a100:2,v100:1``: any count above 0 (an unreadable value counts)."""
    counts = [int(m) for m in re.findall(r"(?:^|[:,])(\d+)(?=,|$)", value.strip())]
    return any(counts) if counts else bool(value.strip())


def slurm_gpu_variables(env) -> list[str]:
    """``NAME=value`` for each Slurm variable saying this allocation has GPUs."""
    found = []
    for name in sorted(env):
        value = env[name]
        if name.startswith(SLURM_GPU_PREFIX) and _counts_gpus(value):
            found.append(f"{name}={value}")
        elif name in SLURM_GPU_LISTS and value.strip():
            found.append(f"{name}={value}")
    return found


def gpu_expectation(ctx: Context) -> GpuExpectation:
    """What says the job needs GPUs, strongest first.

    The plan given on the command line (``--gpus-per-node``), then the allocation (Slurm's
    GPU variables, a *_VISIBLE_DEVICES that names devices), then DeepSpeed's accelerator
    (``DS_ACCELERATOR``), then the torch build. A CUDA torch wheel is pip's default on Linux,
    so an explicit ``DS_ACCELERATOR=cpu`` outweighs it.
    """
    planned = ctx.options.gpus_per_node
    if planned is not None:
        return GpuExpectation(planned > 0, f"--gpus-per-node {planned}")
    allocated = slurm_gpu_variables(ctx.env)
    if allocated:
        return GpuExpectation(True, "Slurm allocated GPUs: " + ", ".join(allocated))
    named = [f"{n}={ctx.env[n]}" for n in probe.VISIBILITY_NAMES
             if n in ctx.env and ctx.env[n].strip() not in HIDING]
    if named:
        return GpuExpectation(True, ", ".join(named) + " names GPUs")
    accelerator = ctx.env.get("DS_ACCELERATOR", "").strip().lower()
    if accelerator in ("cuda", "cpu"):
        return GpuExpectation(accelerator == "cuda", f"DS_ACCELERATOR={accelerator}")
    build = torch_info.torch_build(ctx)
    if build.installed:
        return GpuExpectation(build.gpu_build, build.describe())
    return GpuExpectation(None, "no --gpus-per-node, Slurm GPU variable, DS_ACCELERATOR or "
                          "torch build says whether the job needs a GPU")


# Runtimes that bring the host's GPUs into a container only when asked (docker run --gpus, a
# pod's nvidia.com/gpu limit); Apptainer binds the host's /dev whatever the flags, so there no
# device node means a host without GPUs.
GPUS_ON_REQUEST = ("Docker", "Podman", "Kubernetes")


def _no_driver_mode(ctx: Context) -> tuple[str, list[str]]:
    """The mode of a compute target with no driver at all, and the evidence for it: inside a
    container whose runtime brings GPUs only on request, that request was not made
    (container.no-gpu-runtime); anywhere else, the job runs on a node without the driver."""
    inside = host.container_runtime(ctx)
    if inside and inside[0] in GPUS_ON_REQUEST:
        return mode_id("container.no-gpu-runtime"), [
            f"inside a {inside[0]} container ({inside[1]}): no /dev/nvidia* and no driver "
            "tool, which the runtime brings in only for a container started with the GPUs"]
    return mode_id("gpu.no-gpu-on-node"), []


def _nvidia_mode(ctx: Context, outcome: probe.ToolOutcome) -> str:
    """The catalogue mode nvidia-smi's failure names, "" when its message names none."""
    text = outcome.detail
    if outcome.status == "hung" or re.search(r"fallen off the bus|GPU is lost|Unable to "
                                             r"determine the device handle", text, re.I):
        return mode_id("gpu.fallen-off-bus")
    if re.search(r"Driver/library version mismatch", text, re.I):
        return mode_id("gpu.driver-library-mismatch")
    if re.search(r"libnvidia-ml|NVML Shared Library Not Found", text, re.I):
        return (mode_id("container.ldcache-missing-driver-libs") if host.container_runtime(ctx)
                else mode_id("container.host-driver-missing"))
    if re.search(r"couldn't communicate with the NVIDIA driver", text, re.I):
        return mode_id("gpu.driver-module-not-loaded")
    return ""


def _rocm_mode(ctx: Context, outcome: probe.ToolOutcome) -> str:
    """The catalogue mode a ROCm tool's failure names, "" when its message names none."""
    text = outcome.detail
    # rocminfo / amd-smi say so themselves when amdgpu is not loaded; /dev/kfd is then missing
    # too, and the driver, not the device node, is what to fix
    if re.search(r"ROCk module is NOT loaded|amdgpu not found in modules", text, re.I):
        return mode_id("rocm.amdgpu-driver-not-loaded")
    if not ctx.path("/dev/kfd").exists():
        return mode_id("rocm.kfd-device-missing")
    if re.search(r"/dev/kfd.*Permission denied|Permission denied.*kfd", text, re.I | re.S):
        return mode_id("rocm.kfd-permission-denied")
    if re.search(r"not supported in kfd|HSA_STATUS_ERROR_OUT_OF_RESOURCES|/dev/kfd.*Cannot "
                 r"allocate memory", text, re.I | re.S):
        return mode_id("rocm.gpu-not-supported-by-kfd")
    return ""


def _tool_finding(ctx: Context, outcome: probe.ToolOutcome, error_fix: str, known: str = ""):
    """``known``: the catalogue mode the tool's failure names ("" for none)."""
    timeout = ctx.options.probe_timeout
    if outcome.status == "hung":
        summary = (f"{outcome.tool} did not answer within {timeout:g} s (driver hung? GPU "
                   "fallen off the bus?)")
        if known:
            return mode_finding(fail, known, summary, outcome.detail, here=HANG_FIX)
        return fail(summary, HANG_FIX, outcome.detail)
    if outcome.status == "error":
        finding = fail if ctx.is_compute else warn
        if known:
            return mode_finding(finding, known, f"{outcome.tool} failed", outcome.detail,
                                here=error_fix)
        return finding(f"{outcome.tool} failed", error_fix, outcome.detail)
    if outcome.listed == 0:  # it ran and named no GPU: nothing vouched for (gpu.devices judges)
        return info(f"{outcome.tool} answered in {outcome.seconds:.2f} s but listed no GPU")
    return ok(f"{outcome.tool} answered in {outcome.seconds:.2f} s: {outcome.detail}")


@check("gpu.nvidia-smi", "NVIDIA driver tool (nvidia-smi)")
def nvidia_smi(ctx: Context):
    outcome = probe.inventory(ctx).tool("nvidia-smi")
    if not outcome.found:
        return skip("no NVIDIA driver: nvidia-smi is not on PATH")
    return _tool_finding(ctx, outcome, "load the NVIDIA kernel module or ask the admins: "
                         "`nvidia-smi` must list the GPUs before CUDA can use them",
                         _nvidia_mode(ctx, outcome) if outcome.status != "ok" else "")


@check("gpu.libcuda", "the libcuda programs load matches the NVIDIA kernel module")
def libcuda_matches_module(ctx: Context):
    """A libcuda.so of another version than the loaded kernel module fails CUDA's start with
    error 803; the forward-compat libcuda is meant to be newer than the module (a data-center
    GPU on an older driver branch), never older."""
    module = libcuda.kernel_module_version(ctx)
    if module is None:
        return skip("no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)")
    lib = libcuda.loaded_libcuda(ctx)
    if lib is None:
        return skip(f"no {libcuda.SONAME} on LD_LIBRARY_PATH or in the ld.so cache")
    evidence = [f"{lib.found} ({lib.how}) -> {lib.target}", f"kernel module {module}"]
    if lib.version is None:
        return skip(f"{lib.target}: its name carries no driver version, so it is not compared")
    if lib.version == module:
        return ok(f"{lib.target} is driver {module}, the kernel module's", *evidence)
    newer = version_tuple(lib.version) > version_tuple(module)
    if lib.compat and newer:
        return info(f"forward compatibility: {lib.target} (driver {lib.version}) over kernel "
                    f"module {module}; it runs on data-center GPUs only (error 804 on others)",
                    *evidence)
    said = (f"programs load {lib.target} ({lib.how}), driver {lib.version}, while the kernel "
            f"module is {module}: CUDA fails to start with error 803 ('system has unsupported "
            "display driver / cuda driver combination')")
    if lib.compat:
        return mode_finding(fail, "gpu.compat-libcuda-mismatch", said, *evidence,
                            here=f"take {os.path.dirname(lib.found)} off LD_LIBRARY_PATH (or "
                            "out of /etc/ld.so.conf.d) on this node")
    return mode_finding(fail, "gpu.driver-library-mismatch", said, *evidence)


@check("gpu.rocm", "AMD GPU tools (amd-smi, rocminfo, rocm-smi)")
def rocm_tools(ctx: Context):
    tools = [o for o in probe.inventory(ctx).tools if o.tool != "nvidia-smi" and o.found]
    if not tools:
        return skip("no ROCm: no amd-smi, rocminfo or rocm-smi on PATH")
    bad = [o for o in tools if o.status != "ok"]
    if not bad and all(o.listed == 0 for o in tools):
        return info("; ".join(o.tool for o in tools) + " answered but listed no GPU")
    if not bad:
        return ok("; ".join(f"{o.tool}: {o.detail}" for o in tools))
    worst = next((o for o in bad if o.status == "hung"), bad[0])
    return _tool_finding(ctx, worst, "check the amdgpu driver (`lsmod | grep amdgpu`) and that "
                         "you may open /dev/kfd (group `render`/`video`)",
                         _rocm_mode(ctx, worst) if worst.status == "error" else "")


def _describe(gpus: list[probe.Gpu]) -> list[str]:
    lines = []
    for (name, arch, memory, driver), count in Counter(
            (g.name, g.arch or "arch unknown", g.memory_mib, g.driver) for g in gpus).items():
        arch_text = arch if arch.startswith(("gfx", "arch")) else f"compute capability {arch}"
        extras = [arch_text]
        if memory:
            extras.append(f"{memory / 1024:.0f} GiB")
        if driver:
            extras.append(f"driver {driver}")
        lines.append(f"{count} × {name} ({', '.join(extras)})")
    return lines


@check("gpu.devices", "GPUs visible to this job")
def devices(ctx: Context):
    view = probe.visibility(ctx)
    gpus = probe.visible_gpus(ctx)
    if not gpus:
        hidden = f"; {len(view.physical)} present but hidden by " + ", ".join(
            f"{k}={v!r}" for k, v in view.settings.items()) if view.physical else ""
        if not ctx.is_compute:
            return info("no GPU visible (normal on a login node)" + hidden)
        tools = [f"{o.tool}: {o.detail}" for o in probe.inventory(ctx).tools]
        expect = gpu_expectation(ctx)
        if expect.expected is False:
            return ok(f"no GPU visible, none needed: a CPU job ({expect.reason})" + hidden)
        # a driver (or GPUs hidden) here: the job was given none; no driver: the wrong node
        driver = view.physical or any(o.found for o in probe.inventory(ctx).tools)
        known, where = (mode_id("gpu.no-visible-gpu"), []) if driver else _no_driver_mode(ctx)
        if expect.expected is None:
            return mode_finding(warn, known, "no GPU visible on a compute target" + hidden,
                                expect.reason, *where, *tools, here=UNKNOWN_FIX)
        fix = (CONTAINER_FIX if where else ALLOCATED_FIX if expect.reason.startswith("Slurm")
               else NO_GPU_FIX)
        return mode_finding(fail, known, f"no GPU visible, but the job expects GPUs "
                            f"({expect.reason})" + hidden, *where, *tools, here=fix)
    lines = _describe(gpus)
    wanted = ctx.options.gpus_per_node
    if ctx.is_compute and wanted and len(gpus) < wanted:
        return fail(f"{len(gpus)} GPU(s) visible but --gpus-per-node {wanted} is planned",
                    f"request {wanted} GPUs per node (`#SBATCH --gpus-per-node={wanted}`)", *lines)
    unknown = [g.name for g in gpus if not g.arch]
    if unknown:
        return warn(f"{len(gpus)} GPU(s); architecture unknown for {', '.join(unknown)}",
                    "add the model to envs/gpu_archs.toml or update the driver so nvidia-smi "
                    "reports compute_cap", *lines)
    return ok(f"{len(gpus)} GPU(s): " + "; ".join(lines))


@check("gpu.visible-devices", "CUDA/ROCR/HIP_VISIBLE_DEVICES")
def visible_devices(ctx: Context):
    view = probe.visibility(ctx)
    if not view.physical:
        names = [n for n in probe.VISIBILITY_NAMES if n in ctx.env]
        return skip("no GPU: nothing to check " + (", ".join(names) or "*_VISIBLE_DEVICES")
                    + " against")
    if not view.settings:
        return ok(f"no *_VISIBLE_DEVICES set: all {len(view.physical)} GPU(s) visible")
    setting = ", ".join(f"{k}={v!r}" for k, v in view.settings.items())
    present = "present: " + ", ".join(f"{g.index} ({g.uuid or 'no uuid'})" for g in view.physical)
    finding = fail if ctx.is_compute else warn
    if not view.gpus:
        expect = gpu_expectation(ctx)
        if expect.expected is False:  # hiding them is how a CPU job keeps off the GPUs
            return info(f"{setting} hides every GPU: a CPU job ({expect.reason})", present)
    if view.unknown:
        return mode_finding(finding, "gpu.visible-devices-remapped",
                            f"{setting} names device(s) that do not exist: "
                            f"{', '.join(view.unknown)}; the runtime stops there and sees "
                            f"{len(view.gpus)} GPU(s)", present,
                            here="unset it inside Slurm jobs (Slurm sets it per task) or list "
                            "indices/UUIDs from `nvidia-smi -L`")
    if not view.gpus:
        return finding(f"{setting} hides every GPU", "unset it or name the GPUs to use, "
                       "e.g. `export CUDA_VISIBLE_DEVICES=0,1`", present)
    return ok(f"{setting}: {len(view.gpus)} of {len(view.physical)} GPU(s) visible")


# The oldest compute capability each kernel library of the job's stack runs on: FlashAttention
# 2 ships sm80+ kernels only; Triton (torch.compile's backend) supports 7.0 and newer.
FLASH_ATTN_FLOOR, TRITON_FLOOR = (8, 0), (7, 0)


def _below(gpus, floor: tuple[int, int]) -> str:
    """'Tesla V100-SXM2-32GB (7.0), ...' for the GPUs under ``floor``; '' when none is."""
    return ", ".join(sorted({f"{g.name} ({g.arch})" for g in gpus
                            if (archs.cuda_capability(g.arch) or floor) < floor}))


@check("gpu.kernel-floors", "GPUs new enough for FlashAttention-2 and Triton")
def kernel_floors(ctx: Context):
    gpus = [g for g in probe.visible_gpus(ctx) if g.vendor == "nvidia" and g.arch]
    if not gpus:
        return skip("no NVIDIA GPU to compare")
    installed = installed_versions(pyenv.search_path(ctx))
    flash = installed.get("flash-attn", "")
    flash = "" if flash.startswith("1.") else flash  # 1.x still runs on Turing
    triton = installed.get("triton", "")
    if not flash and not triton:
        return skip("neither flash-attn 2 nor triton is installed in the judged environment")
    evidence = [f"{name} {version} installed" for name, version in
                (("flash-attn", flash), ("triton", triton)) if version] + [
        f"GPU {g.index}: {g.name}, compute capability {g.arch}" for g in gpus]
    if flash and (below := _below(gpus, FLASH_ATTN_FLOOR)):
        return mode_finding(warn, "gpu.flash-attn-needs-ampere", f"FlashAttention-2 (2.x) cannot "
                            f"run on {below}: it needs compute capability 8.0 or newer", *evidence)
    if triton and (below := _below(gpus, TRITON_FLOOR)):
        return mode_finding(warn, "gpu.too-old-for-triton", f"torch.compile (Triton) cannot run "
                            f"on {below}: it needs compute capability 7.0 or newer", *evidence)
    return ok("every visible GPU is new enough for " + " and ".join(
        what for what, version in (("FlashAttention-2", flash), ("Triton", triton)) if version),
        *evidence)

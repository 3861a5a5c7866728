"""gpu: vendor tools answering, the GPU inventory, and what *_VISIBLE_DEVICES leaves visible."""

from __future__ import annotations

from collections import Counter

from ..probes import gpus as probe
from ..probes.context import Context
from ..probes.result import fail, info, ok, skip, warn
from ..registry import check

HANG_FIX = ("the node's GPU driver is stuck (look for Xid errors in `dmesg`): tell the admins "
            "and keep jobs off the node: `sbatch --exclude=$(hostname)`")
NO_GPU_FIX = ("request GPUs from Slurm (`#SBATCH --gpus-per-node=4` or `--gres=gpu:4`), or run "
              "`dsenv doctor --target login` when no GPU is meant to be here")


def _tool_finding(ctx: Context, outcome: probe.ToolOutcome, error_fix: str):
    timeout = ctx.options.probe_timeout
    if outcome.status == "hung":
        return fail(f"{outcome.tool} did not answer within {timeout:g} s (driver hung? GPU "
                    "fallen off the bus?)", HANG_FIX, outcome.detail)
    if outcome.status == "error":
        finding = fail if ctx.is_compute else warn
        return finding(f"{outcome.tool} failed", error_fix, outcome.detail)
    return ok(f"{outcome.tool} answered in {outcome.seconds:.2f} s: {outcome.detail}")


@check("gpu.nvidia-smi", "NVIDIA driver tool (nvidia-smi)")
def nvidia_smi(ctx: Context):
    outcome = probe.inventory(ctx).tool("nvidia-smi")
    if not outcome.found:
        return skip("nvidia-smi is not on PATH (no NVIDIA driver here)")
    return _tool_finding(ctx, outcome, "load the NVIDIA kernel module or ask the admins: "
                         "`nvidia-smi` must list the GPUs before CUDA can use them")


@check("gpu.rocm", "AMD GPU tools (amd-smi, rocminfo, rocm-smi)")
def rocm_tools(ctx: Context):
    tools = [o for o in probe.inventory(ctx).tools if o.tool != "nvidia-smi" and o.found]
    if not tools:
        return skip("no amd-smi, rocminfo or rocm-smi on PATH (no ROCm here)")
    bad = [o for o in tools if o.status != "ok"]
    if not bad:
        return ok("; ".join(f"{o.tool}: {o.detail}" for o in tools))
    worst = next((o for o in bad if o.status == "hung"), bad[0])
    return _tool_finding(ctx, worst, "check the amdgpu driver (`lsmod | grep amdgpu`) and that "
                         "you may open /dev/kfd (group `render`/`video`)")


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
        return fail("no GPU visible on a compute target" + hidden, NO_GPU_FIX,
                    *(f"{o.tool}: {o.detail}" for o in probe.inventory(ctx).tools))
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
        return skip("no GPU inventory to check " + (", ".join(names) or "the variables") + " against")
    if not view.settings:
        return ok(f"no *_VISIBLE_DEVICES set: all {len(view.physical)} GPU(s) visible")
    setting = ", ".join(f"{k}={v!r}" for k, v in view.settings.items())
    present = "present: " + ", ".join(f"{g.index} ({g.uuid or 'no uuid'})" for g in view.physical)
    finding = fail if ctx.is_compute else warn
    if view.unknown:
        return finding(f"{setting} names device(s) that do not exist: {', '.join(view.unknown)}; "
                       f"the runtime stops there and sees {len(view.gpus)} GPU(s)",
                       "unset it inside Slurm jobs (Slurm sets it per task) or list indices/"
                       "UUIDs from `nvidia-smi -L`", present)
    if not view.gpus:
        return finding(f"{setting} hides every GPU", "unset it or name the GPUs to use, "
                       "e.g. `export CUDA_VISIBLE_DEVICES=0,1`", present)
    return ok(f"{setting}: {len(view.gpus)} of {len(view.physical)} GPU(s) visible")

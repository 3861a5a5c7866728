"""Why a DeepSpeed op cannot be built: for the target itself (DeepSpeed's own rules, wherever
it is built) or on this node (no C++ compiler, no nvcc/hipcc, an nvcc that cannot build the
archs or whose CUDA major is not torch's (DeepSpeed's ``cuda_minor_mismatch_ok``), a torch
build that does not match the target). Each reason is one line that says how to fix it, and
ops that share a reason are shown as one line (:func:`group_omissions`: "14 GPU ops (...): no
hipcc here ...").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsenv.envs.op_failures import known_failure
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target, describe_arch, sm_name
from dsenv.facts.node import Node
from dsenv.facts.toolchain import toolkit
from dsenv.provision.ops.builders import OpInfo, OpsReport
from dsenv.provision.targets import nvcc_refusal
from dsenv.versions import major_minor, version_tuple

LINK_HINTS = {
    "dskernels": "pip install deepspeed-kernels (prebuilt CUTLASS kernels, NVIDIA only)",
}
# What an op's link error or compatibility warning names that exists for NVIDIA GPUs only:
# CUTLASS and DeepSpeed-Kernels (github.com/deepspeedai/DeepSpeed-Kernels) have no ROCm build,
# so advice to install them is wrong for an AMD target.
NVIDIA_ONLY = ("dskernels", "CUTLASS", "cutlass")


def target_reason(op: OpInfo, target: Target) -> str | None:
    """Why DeepSpeed's rules exclude ``op`` for the target itself (anywhere it is built)."""
    if op.sources == 0:
        return (f"not a buildable op: {op.builder} ({op.where}) has no sources (a placeholder "
                "for ops this accelerator does not implement)")
    if target.vendor == "nvidia" and op.gpu and op.arch_rule.get("error"):
        minimum = op.minimum_arch
        needs = f"needs {sm_name(minimum)} or newer" if minimum else "no target arch left"
        dropped = ", ".join(describe_arch(a) for a in target.archs)
        return (f"{needs}: {op.builder}.filter_ccs ({op.arch_rule.get('filter_where')}) drops "
                f"{dropped}, so DeepSpeed's build stops with \"{op.arch_rule['error']}\"")
    if op.lost_link_flags:
        return (f"its precompiled build would not load: {op.builder}.builder() "
                f"({op.builder_where}) drops {' '.join(op.lost_link_flags)} from the link, so "
                "the op fails with 'undefined symbol' (its JIT build links them: it "
                "JIT-compiles on first use)")
    if target.vendor == "amd" and any(word in text for text in (
            op.link_error or "", *op.compat_warnings) for word in NVIDIA_ONLY):
        return (f"NVIDIA only: {op.builder} needs CUTLASS kernels (nvidia-cutlass, "
                "deepspeed-kernels), which have no ROCm build")
    if target.vendor == "amd" and op.rocm_only_refusal:
        said = "; ".join(op.compat_warnings) or "is_compatible() is False on ROCm"
        return f"not supported on ROCm: {op.builder}.is_compatible ({op.where}): {said}"
    return None


def _link_reason(op: OpInfo) -> str:
    hint = next((h for key, h in LINK_HINTS.items() if key in (op.link_error or "")), None)
    return (f"cannot be linked here: {op.builder}.extra_ldflags() raises "
            f"{op.link_error}" + (f" ({hint})" if hint else ""))


@dataclass(frozen=True)
class Compilers:
    """The compilers on this node (the node-facts toolkit probes)."""

    cxx: object
    nvcc: object
    hipcc: object


def compilers_here(env=None) -> Compilers:
    ctx = Node(wanted_target="login",
                  env=dict(env if env is not None else os.environ))
    return Compilers(toolkit.cxx(ctx), toolkit.nvcc(ctx), toolkit.hipcc(ctx))


def _gpu_compiler_reason(target: Target, stack: Stack | None, tools: Compilers,
                          report: OpsReport, judge_torch: bool) -> str | None:
    """Why GPU (nvcc/hipcc) ops cannot be compiled here; None when they can."""
    torch = report.torch
    if target.vendor == "nvidia":
        nvcc = tools.nvcc
        if not nvcc.found:
            major = stack.toolkit_major if stack and stack.toolkit_major else 12
            return (f"no nvcc here ({nvcc.how}): load a CUDA {major}.x module (e.g. `module "
                    f"load cuda/{stack.toolkit if stack else '12.6'}`) or set CUDA_HOME")
        if not nvcc.version:
            return f"nvcc at {nvcc.path} did not say its version ({nvcc.how})"
        refusal = nvcc_refusal(nvcc.version, target, [stack] if stack else [])
        if refusal:
            return refusal
        torch_cuda = stack.toolkit if stack else torch.get("cuda")
        if torch_cuda:
            nvcc_mm = major_minor(nvcc.version)
            torch_mm = major_minor(torch_cuda)
            major = str(version_tuple(nvcc.version)[0])
            accepted = report.cuda_minor_mismatch_ok.get(major, [])
            if nvcc_mm != torch_mm and not (nvcc_mm in accepted and torch_mm in accepted):
                return (f"nvcc {nvcc.version} is CUDA {nvcc_mm} and torch is built with CUDA "
                        f"{torch_mm}: DeepSpeed refuses that pair (assert_no_cuda_mismatch, "
                        f"{report.builder_where.get('assert_no_cuda_mismatch')}; its "
                        f"cuda_minor_mismatch_ok for CUDA {major}: "
                        f"{', '.join(accepted) or 'none'}): load a CUDA {torch_mm} module (or "
                        "set DS_SKIP_CUDA_CHECK=1 and accept the risk)")
        if judge_torch and not torch.get("cuda"):
            wanted = stack.torch_version if stack else "a CUDA build"
            return (f"torch {torch.get('version')} in this interpreter is not a CUDA build: "
                    f"CUDA ops are compiled against the environment's torch ({wanted})")
        return None
    hipcc = tools.hipcc
    if not hipcc.found:
        return f"no hipcc here ({hipcc.how}): load the ROCm module or set ROCM_PATH"
    if judge_torch and not torch.get("hip"):
        wanted = stack.torch_version if stack else "a ROCm build"
        return (f"torch {torch.get('version')} in this interpreter is not a ROCm build: "
                f"HIP ops are compiled against the environment's torch ({wanted})")
    return None


def here_reasons(report: OpsReport, target: Target, stack: Stack | None, tools: Compilers,
                 judge_torch: bool = True) -> dict[str, str]:
    """op -> why it cannot be built on this node (ops DeepSpeed allows for the target)."""
    gpu_reason = None
    if target.is_gpu and any(op.gpu for op in report.ops.values()):
        gpu_reason = _gpu_compiler_reason(target, stack, tools, report, judge_torch)
    reasons = {}
    for name, op in report.ops.items():
        if not tools.cxx.found:
            reasons[name] = (f"no C++ compiler here ({tools.cxx.how}): install g++ or load a "
                             "GCC module")
        elif not op.compatible and not op.rocm_only_refusal:
            said = "; ".join(op.compat_warnings) or "no reason given"
            reasons[name] = f"DeepSpeed's {op.builder}.is_compatible() is False here: {said}"
        elif op.link_error:
            reasons[name] = _link_reason(op)
        elif op.gpu and gpu_reason:
            reasons[name] = gpu_reason
        elif op.gpu and target.vendor == "nvidia" and (failure := known_failure(
                name, report.deepspeed, tools.nvcc.version)):
            reasons[name] = (f"nvcc {tools.nvcc.version} cannot compile it with DeepSpeed "
                             f"{report.deepspeed}: {failure.error} ({failure.source})")
    return reasons


def group_omissions(omitted: dict[str, str], gpu_ops=()) -> list[str]:
    """The omitted ops as one line per reason, most ops first: ``14 GPU ops (async_io, ...):
    no hipcc here (...)`` rather than fourteen lines that repeat the reason. ``gpu_ops``:
    the names of the ops compiled with nvcc/hipcc (the group says "GPU ops" when all are)."""
    by_reason: dict[str, list[str]] = {}
    for op, reason in omitted.items():
        by_reason.setdefault(reason, []).append(op)
    lines = []
    for reason, ops in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        if len(ops) == 1:
            lines.append(f"{ops[0]}: {reason}")
            continue
        kind = "GPU ops" if all(op in gpu_ops for op in ops) else "ops"
        lines.append(f"{len(ops)} {kind} ({', '.join(ops)}): {reason}")
    return lines

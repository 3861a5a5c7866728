"""``--ops auto|none|all|LIST`` -> :class:`OpsChoice`: which DeepSpeed ops to precompile.

The rules are DeepSpeed's own, asked from the installed package in a subprocess of the
environment's interpreter (``import deepspeed`` costs seconds and must not happen in dsenv's
process): the op builders of the accelerator the build will use (``DS_ACCELERATOR=cuda``
for NVIDIA and AMD targets, ``cpu`` for the CPU target; setup.py enumerates
``op_builder/all_ops.py:ALL_OPS`` of that accelerator), each builder's ``BUILD_VAR``,
``is_compatible()`` with its warnings, and the architecture rules the builders carry:

- ``CUDAOpBuilder.compute_capability_args()`` (op_builder/builder.py) reads
  TORCH_CUDA_ARCH_LIST, passes it through the builder's ``filter_ccs()`` and raises
  "Unable to load X op due to no compute capabilities remaining after filtering" when
  nothing is left. It runs here with the target's archs, exactly as setup.py would run it;
  ``filter_ccs()`` on every known arch gives the builder's minimum.
- ``OpBuilder.is_rocm_pytorch()`` is answered with the target's platform (the cached
  ``OpBuilder._is_rocm_pytorch``), so ROCm-only refusals (gds) apply to AMD targets whatever
  torch the asking interpreter has.
- ``extra_ldflags()`` is called, because some builders only fail there (oneCCL's CCL_ROOT,
  the deepspeed-kernels package of cutlass_ops / ragged_device_ops).

Then what cannot be built *here* is taken off, each with its reason: no C++ compiler, no
nvcc/hipcc, an nvcc that cannot build the archs or whose CUDA major is not torch's
(DeepSpeed's ``cuda_minor_mismatch_ok``), a torch build that does not match the target.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target, describe_arch, known_archs, sm_name

from dsenv import proc
from dsenv.versions import major_minor, version_tuple

from . import ProvisionError

MODES = ("auto", "none", "all")
JSON_MARK = "DSENV-OPS-JSON "
BUILD_OPS_VAR = "DS_BUILD_OPS"  # setup.py: BUILD_OP_DEFAULT = DS_BUILD_OPS (0 on Linux)
# setup.py (sdist deepspeed-0.19.8, lines 182-191): async_io and gds load pin_memory's shared
# manager at runtime, so precompiling either precompiles pin_memory too.
PIN_MEMORY_DEPENDENTS = ("async_io", "gds")
LINK_HINTS = {
    "dskernels": "pip install deepspeed-kernels (prebuilt CUTLASS kernels, NVIDIA only)",
}

PROBE_SCRIPT = r'''
import contextlib, importlib, inspect, io, json, os, re, sys
request = json.loads(sys.argv[1])
vendor, target_archs, known = request["vendor"], request["archs"], request["known"]
accelerator = "cpu" if vendor == "cpu" else "cuda"
os.environ["DS_ACCELERATOR"] = accelerator
os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
result = {}
try:
    import deepspeed
    import torch
    from deepspeed.ops.op_builder import builder as bmod
    from deepspeed.ops.op_builder import all_ops
    base = os.path.dirname(os.path.dirname(deepspeed.__file__))

    def where(obj):
        try:
            path = inspect.getsourcefile(obj)
            return f"{os.path.relpath(path, base)}:{inspect.getsourcelines(obj)[1]}"
        except Exception:
            return None

    def call(func, *args):
        out = io.StringIO()
        error = None
        value = None
        try:
            with contextlib.redirect_stdout(out):
                value = func(*args)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        lines = [ANSI.sub("", line).replace("[WARNING]", "").strip()
                 for line in out.getvalue().splitlines() if "WARNING" in line]
        return value, error, [line for line in lines if line]

    def compatible(builder, rocm):
        bmod.OpBuilder._is_rocm_pytorch = rocm
        builder.error_log = None
        value, error, warnings = call(builder.is_compatible, True)
        return bool(value) and error is None, error, warnings

    CUDAOpBuilder = bmod.CUDAOpBuilder
    ops = {}
    for name, builder in sorted(all_ops.ALL_OPS.items()):
        cls = type(builder)
        gpu = isinstance(builder, CUDAOpBuilder)
        info = {"build_var": getattr(builder, "BUILD_VAR", None), "builder": cls.__name__,
                "where": where(cls), "gpu": gpu}
        ok, error, warnings = compatible(builder, vendor == "amd")
        info.update(compatible=ok, compat_error=error, warnings=warnings)
        if vendor == "amd" and not ok:
            # Refused on ROCm for a reason of its own (not the one it gives elsewhere)?
            off_ok, off_error, off_warnings = compatible(builder, False)
            info["rocm_refusal"] = off_ok or (off_error, off_warnings) != (error, warnings)
        bmod.OpBuilder._is_rocm_pytorch = vendor == "amd"
        if vendor == "nvidia" and gpu:
            own = cls.filter_ccs is not CUDAOpBuilder.filter_ccs
            kept, _, _ = call(builder.filter_ccs, list(known))
            info["arch_rule"] = {
                "own_filter": own, "filter_where": where(cls.filter_ccs) if own else None,
                "minimum": ".".join(kept[0]) if kept else None}
            os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(target_archs)
            args, error, warnings = call(builder.compute_capability_args)
            left = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            info["arch_rule"].update(
                error=error, warnings=warnings, bf16=bool(builder.enable_bf16),
                kept=[] if error else [a.replace("+PTX", "") for a in left.split(";") if a],
                where=where(CUDAOpBuilder.compute_capability_args))
        _, info["link_error"], _ = call(builder.extra_ldflags)
        sources, error, _ = call(builder.sources)
        info["sources"] = len(sources or []) if error is None else -1
        ops[name] = info
    result["accelerator"] = all_ops.accelerator_name
    result["ops"] = ops
    other = "cuda" if accelerator == "cpu" else "cpu"
    try:
        from deepspeed.accelerator import real_accelerator
        real_accelerator.ds_accelerator = None
        os.environ["DS_ACCELERATOR"] = other
        with contextlib.redirect_stdout(io.StringIO()):
            importlib.reload(all_ops)
        result["other"] = {"accelerator": other, "ops": sorted(all_ops.ALL_OPS)}
    except Exception as exc:
        result["other"] = {"accelerator": other, "ops": [], "error": str(exc)}
    result["deepspeed"] = deepspeed.__version__
    result["deepspeed_dir"] = os.path.dirname(deepspeed.__file__)
    result["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                       "hip": getattr(torch.version, "hip", None)}
    result["cuda_minor_mismatch_ok"] = {str(k): v for k, v in bmod.cuda_minor_mismatch_ok.items()}
    result["builder_where"] = {
        "compute_capability_args": where(CUDAOpBuilder.compute_capability_args),
        "assert_no_cuda_mismatch": where(bmod.assert_no_cuda_mismatch),
        "nvcc_args": where(CUDAOpBuilder.nvcc_args),
        "builder": where(CUDAOpBuilder.builder)}
except Exception as exc:
    result = {"error": f"{type(exc).__name__}: {exc}"}
sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
'''.replace("MARK", repr(JSON_MARK))


# -- what DeepSpeed says ------------------------------------------------------------------
@dataclass(frozen=True)
class OpInfo:
    """One op builder of the installed DeepSpeed, judged for a target."""

    name: str
    build_var: str
    builder: str  # class name
    where: str  # file:line of the builder class, relative to site-packages
    gpu: bool  # a CUDAOpBuilder (compiled with nvcc/hipcc)
    compatible: bool  # is_compatible() for the target's platform
    compat_warnings: tuple[str, ...] = ()
    rocm_only_refusal: bool = False  # is_compatible() refuses on ROCm for a ROCm reason
    arch_rule: dict = field(default_factory=dict)  # filter_ccs facts (NVIDIA GPU ops)
    link_error: str | None = None
    sources: int = 0

    @property
    def minimum_arch(self) -> str | None:
        if self.arch_rule.get("own_filter"):
            return self.arch_rule.get("minimum")
        return None

    @property
    def kept_archs(self) -> tuple[str, ...]:
        return tuple(self.arch_rule.get("kept", ()))


@dataclass(frozen=True)
class OpsReport:
    """Everything the subprocess learned from the installed DeepSpeed for one target."""

    accelerator: str
    ops: dict[str, OpInfo]
    other_accelerator: str
    other_ops: tuple[str, ...]
    deepspeed: str
    deepspeed_dir: str
    torch: dict
    cuda_minor_mismatch_ok: dict[str, list[str]]
    builder_where: dict[str, str]


def parse_probe_output(stdout: str) -> dict | None:
    return proc.marked_json(stdout, JSON_MARK)


def inspect_ops(target: Target, python: str = sys.executable, timeout: float = 120,
                env=None) -> OpsReport:
    """Ask the DeepSpeed installed for ``python`` about its op builders, for ``target``."""
    request = {"vendor": target.vendor, "archs": list(target.archs),
               "known": list(known_archs("nvidia"))}
    run_env = dict(os.environ if env is None else env)
    run_env.pop("DS_ACCELERATOR", None)
    run = proc.run([python, "-c", PROBE_SCRIPT, json.dumps(request)], timeout, env=run_env)
    if run.timed_out:
        raise ProvisionError(f"asking DeepSpeed about its ops with {python} took more than "
                             f"{timeout:.0f} s (killed): check that `{python} -c 'import "
                             "deepspeed'` works on this node")
    data = parse_probe_output(run.stdout)
    if data is None:
        raise ProvisionError(f"cannot ask DeepSpeed about its ops: {run.describe()}")
    if "error" in data:
        raise ProvisionError(f"cannot ask DeepSpeed about its ops with {python}: "
                             f"{data['error']} (install deepspeed and torch in that "
                             "environment first)")
    ops = {}
    for name, raw in data["ops"].items():
        ops[name] = OpInfo(
            name=name, build_var=raw["build_var"] or "", builder=raw["builder"],
            where=raw["where"] or "?", gpu=raw["gpu"], compatible=raw["compatible"],
            compat_warnings=tuple(raw["warnings"]) + ((raw["compat_error"],)
                                                       if raw["compat_error"] else ()),
            rocm_only_refusal=bool(raw.get("rocm_refusal")) and not raw["compatible"],
            arch_rule=raw.get("arch_rule") or {}, link_error=raw["link_error"],
            sources=raw["sources"])
    return OpsReport(data["accelerator"], ops, data["other"]["accelerator"],
                     tuple(data["other"]["ops"]), data["deepspeed"], data["deepspeed_dir"],
                     data["torch"], data["cuda_minor_mismatch_ok"], data["builder_where"])


# -- why an op cannot be built -------------------------------------------------------------
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
    if target.vendor == "amd" and op.rocm_only_refusal:
        said = "; ".join(op.compat_warnings) or "is_compatible() is False on ROCm"
        return f"not supported on ROCm: {op.builder}.is_compatible ({op.where}): {said}"
    return None


def _link_reason(op: OpInfo) -> str:
    hint = next((h for key, h in LINK_HINTS.items() if key in (op.link_error or "")), None)
    return (f"cannot be linked here: {op.builder}.extra_ldflags() raises "
            f"{op.link_error}" + (f" ({hint})" if hint else ""))


@dataclass(frozen=True)
class Toolchain:
    """The compilers on this node (the doctor's toolkit probes)."""

    cxx: object
    nvcc: object
    hipcc: object


def toolchain_here(env=None) -> Toolchain:
    from dsenv.doctor.probes import toolkit
    from dsenv.doctor.probes.context import Context, Options

    ctx = Context(options=Options(target="login"),
                  env=dict(env if env is not None else os.environ))
    return Toolchain(toolkit.cxx(ctx), toolkit.nvcc(ctx), toolkit.hipcc(ctx))


def _gpu_toolchain_reason(target: Target, stack: Stack | None, tools: Toolchain,
                          report: OpsReport, judge_torch: bool) -> str | None:
    """Why GPU (nvcc/hipcc) ops cannot be compiled here; None when they can."""
    from .targets import _nvcc_refusal

    torch = report.torch
    if target.vendor == "nvidia":
        nvcc = tools.nvcc
        if not nvcc.found:
            major = stack.toolkit_major if stack and stack.toolkit_major else 12
            return (f"no nvcc here ({nvcc.how}): load a CUDA {major}.x module (e.g. `module "
                    f"load cuda/{stack.toolkit if stack else '12.6'}`) or set CUDA_HOME")
        if not nvcc.version:
            return f"nvcc at {nvcc.path} did not say its version ({nvcc.how})"
        refusal = _nvcc_refusal(nvcc.version, target, [stack] if stack else [])
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


def here_reasons(report: OpsReport, target: Target, stack: Stack | None, tools: Toolchain,
                 judge_torch: bool = True) -> dict[str, str]:
    """op -> why it cannot be built on this node (ops DeepSpeed allows for the target)."""
    gpu_reason = None
    if target.is_gpu and any(op.gpu for op in report.ops.values()):
        gpu_reason = _gpu_toolchain_reason(target, stack, tools, report, judge_torch)
    reasons = {}
    for name, op in report.ops.items():
        if not tools.cxx.found:
            reasons[name] = f"no C++ compiler here ({tools.cxx.how}): install g++ or load a GCC module"
        elif not op.compatible and not op.rocm_only_refusal:
            said = "; ".join(op.compat_warnings) or "no reason given"
            reasons[name] = f"DeepSpeed's {op.builder}.is_compatible() is False here: {said}"
        elif op.link_error:
            reasons[name] = _link_reason(op)
        elif op.gpu and gpu_reason:
            reasons[name] = gpu_reason
    return reasons


# -- the choice ----------------------------------------------------------------------------
@dataclass(frozen=True)
class OpsChoice:
    mode: str  # as given: "auto", "none", "all" or the list
    accelerator: str  # the DeepSpeed accelerator whose op builders were asked ("cuda" | "cpu")
    build: tuple[str, ...]  # op names (deepspeed's ALL_OPS / installed_ops keys)
    omitted: dict[str, str] = field(default_factory=dict)  # op -> one-line reason
    notes: dict[str, str] = field(default_factory=dict)  # op -> caveat for an op built
    warnings: tuple[str, ...] = ()  # caveats for the whole build
    build_vars: dict[str, str] = field(default_factory=dict)  # every op -> its DS_BUILD_* var
    deepspeed: str = ""  # the DeepSpeed version whose builders decided

    def env(self) -> dict[str, str]:
        """The variables for ``pip install deepspeed`` (setup.py): DS_BUILD_OPS=0, then
        DS_BUILD_<OP>=1 for each op to build and =0 for every other op (so a stray variable
        in the caller's shell cannot add one), and DS_ACCELERATOR, because setup.py takes
        the op list from the accelerator it detects (cpu on a node without GPUs)."""
        env = {BUILD_OPS_VAR: "0", "DS_ACCELERATOR": self.accelerator}
        for op, var in sorted(self.build_vars.items()):
            if var:
                env[var] = "1" if op in self.build else env.get(var, "0")
        return env

    def to_json(self) -> dict:
        return {"mode": self.mode, "accelerator": self.accelerator, "build": list(self.build),
                "omitted": dict(self.omitted), "notes": dict(self.notes),
                "warnings": list(self.warnings), "deepspeed": self.deepspeed}


def parse_mode(mode: str) -> tuple[str, list[str]]:
    text = (mode or "").strip()
    if text.lower() in MODES:
        return text.lower(), []
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ProvisionError("--ops is empty: pass auto, none, all or a comma list of op names")
    return "list", names


def _arch_notes(report: OpsReport, target: Target, build: list[str]) -> dict[str, str]:
    notes = {}
    if target.vendor != "nvidia":
        return notes
    for name in build:
        op = report.ops[name]
        kept = op.kept_archs
        if op.gpu and kept and len(kept) < len(target.archs):
            dropped = [a for a in target.archs if a not in kept]
            notes[name] = (f"built for {', '.join(map(sm_name, kept))} only: "
                           f"{op.builder}.filter_ccs ({op.arch_rule.get('filter_where')}) "
                           f"drops {', '.join(describe_arch(a) for a in dropped)} (needs "
                           f"{sm_name(op.minimum_arch or kept[0])} or newer)")
    return notes


def _warnings(report: OpsReport, target: Target, build: list[str]) -> tuple[str, ...]:
    gpu_ops = [n for n in build if report.ops[n].gpu]
    found = []
    if target.vendor == "nvidia" and gpu_ops:
        old = [a for a in target.archs if int(a.split(".")[0]) <= 7]
        if old and len(old) < len(target.archs):
            found.append(
                f"{', '.join(map(sm_name, old))} in the arch list turns off DeepSpeed's bf16 "
                "kernels for every arch of these ops (enable_bf16 is False when any arch is "
                f"7.x or older: CUDAOpBuilder.compute_capability_args, "
                f"{report.builder_where.get('compute_capability_args')}): build separate "
                "environments for the old and the new GPUs to keep bf16")
    if target.vendor == "amd" and gpu_ops and len(target.archs) > 1:
        found.append(
            "on a node whose rocminfo lists a GPU, DeepSpeed replaces PYTORCH_ROCM_ARCH with "
            f"that GPU's arch ({report.builder_where.get('builder')}): build on a node without "
            f"GPUs (login node) to get {', '.join(target.archs)}")
    return tuple(found)


def choose_ops(target: Target, stack: Stack | None, mode: str, python: str = sys.executable,
               timeout: float = 120, *, env=None, judge_torch: bool = True,
               report: OpsReport | None = None) -> OpsChoice:
    """Decide which DeepSpeed ops to precompile for ``target`` with ``stack``.

    ``mode``: "auto" (every op DeepSpeed allows for the target that can be built here; the
    rest in ``omitted`` with reasons), "none", "all" (every op DeepSpeed allows for the
    target; ProvisionError when one of them cannot be built here) or a comma list of op
    names (ProvisionError for an unknown op, or one that cannot be built for this target or
    here). ``python`` is the interpreter whose DeepSpeed is asked (the environment's).
    ``env`` is the environment whose PATH/CUDA_HOME/ROCM_PATH locate the compilers
    (default: this process's). ``judge_torch=False`` skips the check that the interpreter's
    torch is the target's kind of build (for planning before the environment's torch exists).
    ``report``: a :func:`inspect_ops` answer for this target to reuse (no subprocess).
    """
    kind, names = parse_mode(mode)
    if report is None:
        report = inspect_ops(target, python, timeout, env)
    build_vars = {name: op.build_var for name, op in report.ops.items()}
    common = {"mode": mode, "accelerator": report.accelerator, "build_vars": build_vars,
              "deepspeed": report.deepspeed}
    if kind == "none":
        return OpsChoice(build=(), **common)
    tools = toolchain_here(env)
    by_target = {n: r for n, op in report.ops.items() if (r := target_reason(op, target))}
    by_here = {n: r for n, r in here_reasons(report, target, stack, tools, judge_torch).items()
               if n not in by_target}
    omitted: dict[str, str] = {}
    if kind == "list":
        unknown = [n for n in names if n not in report.ops]
        if unknown:
            elsewhere = [n for n in unknown if n in report.other_ops]
            extra = ""
            if elsewhere:
                extra = (f"; {', '.join(elsewhere)} belong to DeepSpeed's "
                         f"{report.other_accelerator} accelerator, not to the "
                         f"{report.accelerator} accelerator a {target.vendor} target builds")
            raise ProvisionError(
                f"--ops {mode}: unknown op(s) {', '.join(unknown)}{extra}; DeepSpeed "
                f"{report.deepspeed} ({report.accelerator}) knows: {', '.join(report.ops)}")
        bad = {n: by_target.get(n) or by_here.get(n) for n in names
               if n in by_target or n in by_here}
        if bad:
            raise ProvisionError(
                f"--ops {mode}: cannot build for {target.describe()}: "
                + "; ".join(f"{n}: {r}" for n, r in bad.items()))
        build = list(dict.fromkeys(names))
    else:
        candidates = [n for n in report.ops if n not in by_target]
        omitted.update(by_target)
        if kind == "all":
            blocked = {n: by_here[n] for n in candidates if n in by_here}
            if blocked:
                raise ProvisionError(
                    f"--ops all: {len(blocked)} op(s) DeepSpeed allows for "
                    f"{target.describe()} cannot be built here: "
                    + "; ".join(f"{n}: {r}" for n, r in blocked.items())
                    + " (fix those, or use --ops auto to build the rest)")
        omitted.update({n: by_here[n] for n in candidates if n in by_here})
        build = [n for n in candidates if n not in by_here]
    notes = {}
    dependents = [n for n in PIN_MEMORY_DEPENDENTS if n in build]
    if dependents and "pin_memory" in report.ops and "pin_memory" not in build:
        why = by_target.get("pin_memory") or by_here.get("pin_memory")
        if why is None:
            build.append("pin_memory")
            notes["pin_memory"] = (f"built too: DeepSpeed's setup.py precompiles pin_memory "
                                   f"with {', '.join(dependents)}, which load its shared "
                                   "manager at runtime")
        elif kind == "list":
            raise ProvisionError(f"--ops {mode}: {', '.join(dependents)} need pin_memory, "
                                 f"which cannot be built: {why}")
        else:
            for name in dependents:
                build.remove(name)
                omitted[name] = f"needs pin_memory, which cannot be built: {why}"
    order = list(report.ops)
    build.sort(key=order.index)
    notes.update(_arch_notes(report, target, build))
    return OpsChoice(build=tuple(build), omitted=dict(sorted(omitted.items())), notes=notes,
                     warnings=_warnings(report, target, build), **common)

"""What the installed DeepSpeed says about its op builders, for one target.

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

Why an op cannot be built is ops_reasons.py's question; which ops to build, ops.py's.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from dsenv import proc
from dsenv.envs.targets import Target, known_archs
from dsenv.provision import ProvisionError

JSON_MARK = "DSENV-OPS-JSON "

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
    try:
        # py-cpuinfo answers every get_cpu_info() with a fresh subprocess (1-1.5 s each) and
        # DeepSpeed's builders ask twice per CPU op (cpu_arch, simd_width, from cpuinfo
        # import get_cpu_info at call time): one answer per probe is enough (the CPU stays).
        import functools
        import cpuinfo
        cpuinfo.get_cpu_info = functools.lru_cache(maxsize=None)(cpuinfo.get_cpu_info)
    except ImportError:
        pass

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
        flags, info["link_error"], _ = call(builder.extra_ldflags)
        if not gpu and not info["link_error"]:
            # Does the extension setup.py compiles keep the builder's own -l flags? (the CPU
            # builders' builder() passes no extra_link_args: a precompiled async_io then
            # fails to load with "undefined symbol: io_submit", while its JIT build links)
            ext, error, _ = call(builder.builder)
            if ext is not None and error is None:
                kept = set(getattr(ext, "libraries", None) or [])
                kept |= set(getattr(ext, "extra_link_args", None) or [])
                info["lost_link_flags"] = [f for f in (flags or []) if f.startswith("-l")
                                           and f not in kept and f[2:] not in kept]
                info["builder_where"] = where(type(builder).builder)
        sources, error, _ = call(builder.sources)
        info["sources"] = len(sources or []) if error is None else -1
        # device code is compiled from .cu (CUDA) sources only: async_io, gds and dc are
        # CUDA-builder ops of host code, whose shared objects hold no kernels at all
        info["device_sources"] = sum(str(x).endswith(".cu") for x in sources or [])
        # where setup.py puts the extension: inference v2 ops live outside deepspeed/ops
        # (0.19.8's InferenceCoreBuilder even says "deepspeed.inference.v2.kernelsinference_
        # core_ops", without the dot), so the package is asked rather than guessed
        info["module"], _, _ = call(builder.absolute_name)
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
    device_sources: int = 0  # .cu sources: 0 for host-code ops even under a CUDA builder
    module: str = ""  # the extension's module name (builder.absolute_name())
    lost_link_flags: tuple[str, ...] = ()  # -l flags the precompiled extension would drop
    builder_where: str = ""  # file:line of the builder() that makes the extension

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
            sources=raw["sources"], device_sources=raw.get("device_sources", 0),
            module=raw.get("module") or "", lost_link_flags=tuple(raw.get("lost_link_flags") or ()),
            builder_where=raw.get("builder_where") or "")
    return OpsReport(data["accelerator"], ops, data["other"]["accelerator"],
                     tuple(data["other"]["ops"]), data["deepspeed"], data["deepspeed_dir"],
                     data["torch"], data["cuda_minor_mismatch_ok"], data["builder_where"])

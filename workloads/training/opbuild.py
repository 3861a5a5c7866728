"""DeepSpeed's JIT op builds as a smoke or run sees them: the arch list handed to them, and
a failed build told in one line.

Before the engine starts (:func:`prepare_arch_list`), a TORCH_CUDA_ARCH_LIST that torch's
extension builder reads but DeepSpeed's op builders cannot (``9.0a``: DeepSpeed 0.19.8's
``compute_capability_args`` raises "invalid literal for int() with base 10: '0a'") is handed
to DeepSpeed in the plain numbers torch itself makes of it, said in one line; one neither can
use is refused. Both questions are put to torch's and DeepSpeed's own code
(:mod:`dsenv.facts.toolchain.arch_parsers`).

Around the calls that JIT-build ops (:func:`reported`), an exception that came through an op
builder's ``jit_load`` becomes :class:`OpBuildError`: the op, the compiler and archs, the
log file holding the whole failure, and the doctor check to run; exit 1, no traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsenv.facts.toolchain import arch_parsers
from dsenv.workloads.errors import WorkloadError

VARIABLE = arch_parsers.VARIABLE
LOG_NAME = "dsenv-build-failure.log"
# The failure's text -> (the doctor check that judges its cause, the `dsenv explain` id).
CAUSES = (
    (r"compute_capability_args|Unknown CUDA arch", "toolkit.arch-support",
     "jit.arch-list-variant"),
    (r"Ninja is required", "toolkit.ninja", "jit.ninja-missing"),
    (r"CUDA_HOME does not exist|MissingCUDAException", "toolkit.cuda-home",
     "jit.cuda-home-missing"),
    (r"does not match the version torch was compiled with|CUDAMismatchException",
     "toolkit.nvcc", "jit.cuda-major-mismatch"),
    (r"unsupported GNU version", "toolkit.compiler", "jit.gcc-too-new-for-nvcc"),
    (r"Permission denied", "deepspeed.extensions-dir", "jit.extensions-dir-not-writable"),
)
DEFAULT_CAUSE = ("toolkit.compiler", None)


class OpBuildError(WorkloadError):
    """A DeepSpeed op failed to JIT-build: the run cannot go on."""

    exit_code = 1


# ----------------------------------------------------------------------------- arch list
def plan_arch_list(answer: dict, gpu_arch: str | None = None) -> tuple[str | None, str]:
    """(the list to hand DeepSpeed, the run's one line about it) from
    :func:`arch_parsers.ask`'s ``answer``; (None, "") when DeepSpeed reads the list as it is.
    Raises :class:`WorkloadError` (one line, with the fix) when no op could be built."""
    value = answer["value"]
    fix = (f'export {VARIABLE}="{gpu_arch}" (this GPU\'s compute capability) and rerun'
           if gpu_arch else f'export {VARIABLE} with plain numbers such as "9.0" and rerun')
    bad_torch = [e for e, said in answer["entries"].items() if said.get("torch")]
    if answer.get("torch_error") and not (answer.get("deepspeed_archs") or "").endswith(
            arch_parsers.IGNORED):  # DeepSpeed before 0.19 hands torch flags, not the list
        named = ", ".join(bad_torch) or value
        raise WorkloadError(f"{VARIABLE}={value}: torch {answer['torch']}'s extension builder "
                            f"rejects {named} ({answer['torch_error']}), so no DeepSpeed op "
                            f"can be JIT-built; {fix}")
    if not answer.get("deepspeed_error"):
        return None, ""
    ds = f"DeepSpeed {answer['deepspeed']}'s op builders"
    changed = {e: said["numbers"] for e, said in answer["entries"].items()
               if said.get("deepspeed") and said.get("numbers")}
    named = ", ".join(changed) or value
    why = answer["deepspeed_error"] + (f" at {answer['deepspeed_where']}"
                                       if answer.get("deepspeed_where") else "")
    new = answer.get("translated")
    if not new:
        raise WorkloadError(f"{VARIABLE}={value}: {ds} cannot read {named} ({why}) and no "
                            f"plain-number spelling of it works; {fix}")
    built = answer.get("translated_archs") or new
    return new, (f"{VARIABLE}={value}: {ds} cannot read {named} ({why}), so this run hands "
                 f"them {new} (they build {built}); that drops {arch_parsers.dropped(changed)}")


def gpu_arch(rt) -> str | None:
    """This rank's GPU as a compute capability, '9.0'."""
    if not rt.on_gpu:
        return None
    import torch  # torch: only once a run starts

    major, minor = torch.cuda.get_device_capability(rt.device)
    return f"{major}.{minor}"


def prepare_arch_list(rt, env=None) -> dict | None:
    """Before any op is JIT-built on a CUDA GPU: hand DeepSpeed an arch list it reads
    (``env`` changed, one line logged), or refuse the run. The report's record, or None."""
    env = os.environ if env is None else env
    value = env.get(VARIABLE, "")
    if not rt.on_gpu or not value.strip():
        return None
    answer = arch_parsers.ask(value)
    if answer["hip"] or not answer["cuda"]:
        return None  # ROCm: PYTORCH_ROCM_ARCH, not this list
    new, line = plan_arch_list(answer, gpu_arch(rt))
    if new is None:
        return {"value": value, "deepspeed_builds": answer.get("deepspeed_archs")}
    env[VARIABLE] = new
    rt.log(f"[yellow]{line}[/]")
    return {"value": value, "handed_to_deepspeed": new,
            "deepspeed_builds": answer.get("translated_archs"), "why": answer["deepspeed_error"]}


# ----------------------------------------------------------------------------- failures
def failed_builder(exc: BaseException):
    """The DeepSpeed op builder whose ``jit_load`` the exception (or one it was raised while
    handling) came through; None when no op build was under way."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "jit_load" and "op_builder" in code.co_filename:
                builder = tb.tb_frame.f_locals.get("self")
                if getattr(builder, "name", None):
                    return builder
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return None


def _headline(exc: BaseException) -> str:
    """The failure in a few words: the compiler's first error line when the message holds
    the build's output, else its first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = next((line for line in lines[1:] if re.search(r"\berror\b", line, re.I)),
                 lines[0] if lines else "")
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _compilers(builder) -> tuple[str, bool]:
    """('nvcc /usr/local/cuda/bin/nvcc and C++ compiler c++ (/usr/bin/c++)', CUDA build?)"""
    cxx = os.environ.get("CXX") or "c++"
    found = shutil.which(cxx)
    cpp = f"C++ compiler {cxx}" + (f" ({found})" if found and found != cxx else "") + \
        (" (CXX)" if os.environ.get("CXX") else "")
    try:
        from deepspeed.ops.op_builder.builder import CUDAOpBuilder  # deepspeed: loaded by now
    except ImportError:
        return cpp, False
    if not isinstance(builder, CUDAOpBuilder) or getattr(builder, "build_for_cpu", True):
        return cpp, False
    from torch.utils import cpp_extension  # torch: loaded by now

    home = cpp_extension.CUDA_HOME
    nvcc = os.environ.get("PYTORCH_NVCC") or (os.path.join(home, "bin", "nvcc") if home
                                              else "no nvcc (CUDA_HOME unset)")
    return f"nvcc {nvcc} and {cpp}", True


def _archs(builder, cuda: bool) -> str:
    if not cuda:
        try:
            return f"the host CPU ({builder.cpu_arch() or 'no -march'})"
        except Exception:  # noqa: BLE001 - lscpu/cpuinfo trouble: the CPU is still the target
            return "the host CPU"
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        return "the visible GPUs (TORCH_CUDA_ARCH_LIST unset)"
    archs, error, _ = arch_parsers.deepspeed_archs(value)
    return f"archs {archs}" if archs else f"{VARIABLE}={value} ({error})"


def _write_log(op: str, exc: BaseException, header: list[str], rank: int) -> Path:
    """The whole failure, traceback and build output, in the op's build folder (where torch
    keeps build.ninja), else in the temporary folder."""
    text = "\n".join(header) + "\n\n" + "".join(traceback.format_exception(exc))
    name = LOG_NAME if rank == 0 else LOG_NAME.replace(".log", f".rank{rank}.log")
    try:
        from torch.utils import cpp_extension  # torch: loaded by now

        folder = Path(cpp_extension._get_build_directory(op, verbose=False))
        (folder / name).write_text(text)
        return folder / name
    except Exception:  # noqa: BLE001 - an unwritable extensions folder: the log goes elsewhere
        fd, path = tempfile.mkstemp(prefix=f"dsenv-{op}-build-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return Path(path)


def describe_failure(builder, exc: BaseException, rank: int = 0) -> str:
    """One line: the op, why, compiler and archs, the log, what to run next."""
    op = builder.name
    compilers, cuda = _compilers(builder)
    archs = _archs(builder, cuda)
    whole = "".join(traceback.format_exception(exc))
    check, explain = next(((c, e) for pattern, c, e in CAUSES if re.search(pattern, whole)),
                          DEFAULT_CAUSE)
    log = _write_log(op, exc, [f"DeepSpeed op {op}: JIT build failed", f"compilers: {compilers}",
                               f"targets: {archs}", f"TORCH_EXTENSIONS_DIR="
                               f"{os.environ.get('TORCH_EXTENSIONS_DIR', '(default)')}",
                               f"time: {time.strftime('%Y-%m-%d %H:%M:%S')}"], rank)
    also = f", `dsenv explain {explain}`" if explain else ""
    return (f"DeepSpeed op {op} failed to JIT-build ({_headline(exc)}) with {compilers} for "
            f"{archs}; full log: {log}; check: `dsenv doctor --only "
            f"{check.split('.')[0]}` ({check}){also}")


@contextmanager
def reported() -> Iterator[None]:
    """Around calls that JIT-build DeepSpeed ops: a failed build is :class:`OpBuildError`."""
    try:
        yield
    except Exception as exc:
        builder = failed_builder(exc)
        if builder is None:
            raise
        import torch.distributed as dist  # torch: loaded by now

        started = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if started else int(os.environ.get("RANK", "0") or 0)
        message = describe_failure(builder, exc, rank)
        if started and dist.get_world_size() == 1:  # else NCCL warns at exit; peers may wait
            dist.destroy_process_group()
        raise OpBuildError(message) from None

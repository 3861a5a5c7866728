"""Precompile DeepSpeed ops into an environment: ``DS_BUILD_<OP>=1`` reinstall, then verify.

DeepSpeed JIT-compiles its C++/CUDA ops on first use unless they were built when it was
installed. :func:`build_ops` reinstalls the locked deepspeed release from its sdist into the
env with the ops switched on::

    DS_BUILD_CPU_ADAM=1 TORCH_CUDA_ARCH_LIST=... MAX_JOBS=N \\
        uv pip install --python ENV/bin/python --no-build-isolation --reinstall --no-deps \\
        --no-cache deepspeed==0.19.8

* ``--no-build-isolation``: the build must see the env's torch (DeepSpeed's setup.py imports
  it to compile against it); with isolation it fails ("Unable to pre-compile cpu_adam,
  please first install torch"). uv runs setup.py with ``--python``'s interpreter and passes
  the environment (``DS_BUILD_*``, ``TORCH_CUDA_ARCH_LIST``, ``MAX_JOBS``) through.
* ``--no-cache``: uv's cache keys a wheel built from an sdist by the sdist, not by the
  ``DS_BUILD_*`` variables, so a cached build (with other ops, or none) would be reused.
  ``keep_wheel``: a fresh ``--cache-dir`` instead, whose wheel dsenv's ops cache keeps.
* Inherited ``DS_BUILD_*``, ``TORCH_CUDA_ARCH_LIST`` and ``PYTORCH_ROCM_ARCH`` are dropped:
  ``ops_env`` and ``arch_env`` alone say what is built. The env's ``bin`` goes first on PATH
  (its ninja, its python). ``arch_env`` may also carry ``DS_ACCELERATOR`` (e.g. ``cuda`` on a
  login node without GPUs, where DeepSpeed would otherwise pick its CPU accelerator and its
  CPU op set), ``CUDA_HOME`` or ``ROCM_PATH``.
* All output goes to ``log`` (appended, live, so it can be followed); the terminal gets one
  spinner line when a rich console is given.

DeepSpeed skips a requested op that its builder finds incompatible without failing the
install (and without a warning when ``DS_BUILD_<OP>`` is set explicitly), so the result is
checked: ``deepspeed/git_version_info_installed.py``'s ``installed_ops`` in the env must list
exactly the requested ops (:func:`verify_installed_ops`), or :class:`ProvisionError` names
the difference and the log.

CPU ops (cpu_adam, cpu_adagrad, cpu_lion, shm_comm, async_io, ...) are compiled with
``-march=native`` for the CPU of the machine that builds them (DeepSpeed's
``OpBuilder.cpu_arch()`` on x86_64 and ARM): build on the compute nodes' CPU type, or the op
may die with SIGILL (illegal instruction) on an older CPU. provision records the CPU flags
the compiler enabled in the manifest, and ``dsenv doctor`` (deepspeed.cpu-flags) fails a node
that lacks one.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from dsenv import proc
from dsenv.errors import UsageError
from dsenv.facts.node import Node
from dsenv.facts.python import deepspeed_info, target_env
from dsenv.provision import ProvisionError
from dsenv.provision.ops.command import BUILD_SCRATCH, build_command, requirement_file
from dsenv.provision.shown import as_log, log_command, temporary_names
from dsenv.provision.uvcmd import Sources, run_uv, uv_env

DEFAULT_BUILD_TIMEOUT = 3 * 3600.0
ARCH_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM_ARCH")
# Ops DeepSpeed's setup.py adds by itself: async_io and gds load pin_memory at run time.
IMPLIED_OPS = {"async_io": ("pin_memory",), "gds": ("pin_memory",)}


@dataclass(frozen=True)
class BuiltOps:
    """What :func:`build_ops` built, read back from the env."""

    python: Path
    requested: tuple[str, ...]
    installed_ops: dict[str, bool]  # DeepSpeed's installed_ops (op name -> precompiled)
    deepspeed_version: str
    accelerator: str  # DeepSpeed's accelerator_name at build time (cpu, cuda, ...)
    torch_info: dict = field(default_factory=dict)  # torch version/cuda/hip built against
    seconds: float = 0.0
    log: Path | None = None
    variables: dict[str, str] = field(default_factory=dict)  # DS_BUILD_*, archs, MAX_JOBS
    command: tuple[str, ...] = ()
    wheel: Path | None = None  # the built wheel, kept when build_ops was given keep_wheel
    cache: dict = field(default_factory=dict)  # ops_cache's record: dir, key, hit or miss
    cpu: dict = field(default_factory=dict)  # -march=native's CPU flags (ops_cache.cpu_record)

    @property
    def ops(self) -> list[str]:
        """The ops precompiled into the env."""
        return sorted(name for name, built in self.installed_ops.items() if built)


# ----------------------------------------------------------------------------- reading back
def read_deepspeed(python: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                   timeout: float = 60.0) -> dict | None:
    """What the env's deepspeed says about itself, for the build, without importing it (no
    torch import): the env's interpreter says where its deepspeed is, and
    dsenv/facts/python/deepspeed_info.py (the one reader of an install) reads it from files:
    ``version``, ``installed_ops``, ``accelerator_name``, ``torch_info`` from
    ``git_version_info_installed.py``, and ``variables`` ({DS_BUILD_X: [op names]}) from its
    op builders. None when deepspeed is not installed there."""
    node = Node(wanted_target="login", environment=os.fspath(python), probe_timeout=timeout,
                env=dict(os.environ if env is None else env))
    try:
        probed = target_env.environment(node)
    except UsageError as exc:
        probed, problem = None, str(exc)
    else:
        problem = probed.problem
    if probed is None or not probed.probed:
        raise ProvisionError(f"DeepSpeed ops: cannot read deepspeed's install info with "
                             f"{python}: {problem}")
    ds = deepspeed_info.deepspeed_of(node)
    if ds is None:
        return None
    return {"path": str(ds.folder), "version": ds.version, "installed_ops": ds.installed_ops,
            "accelerator_name": ds.accelerator_name, "torch_info": ds.torch_info,
            "variables": deepspeed_info.op_switches(ds.folder)}


def verify_installed_ops(python: str | os.PathLike, requested: Iterable[str], *,
                         env: Mapping[str, str] | None = None,
                         timeout: float = 60.0) -> tuple[list[str], list[str]]:
    """``(missing, unexpected)``: requested ops the env's deepspeed did not precompile, and
    precompiled ops nobody asked for (pin_memory counts as asked with async_io or gds)."""
    info = read_deepspeed(python, env=env, timeout=timeout)
    if info is None:
        raise ProvisionError(f"DeepSpeed ops: deepspeed is not installed in the env of {python}:"
                             " install it from the lock first")
    return compare_ops(info.get("installed_ops") or {}, requested)


def compare_ops(installed_ops: Mapping[str, object],
                requested: Iterable[str]) -> tuple[list[str], list[str]]:
    """The (missing, unexpected) of :func:`verify_installed_ops` for given installed_ops."""
    wanted = set(requested)
    built = {name for name, value in installed_ops.items() if value}
    implied = {dep for name in wanted for dep in IMPLIED_OPS.get(name, ())}
    return sorted(wanted - built), sorted(built - wanted - implied)


def requested_ops(ops_env: Mapping[str, str], variables: Mapping[str, list[str]],
                  known_ops: Iterable[str]) -> list[str]:
    """The op names ``ops_env`` asks DeepSpeed to build. ``variables``: {DS_BUILD_X: [names]}
    from the op builders; ``known_ops``: the ops of the accelerator built for (installed_ops'
    keys). ``DS_BUILD_OPS=1`` asks for every op not switched off one by one."""
    known = list(known_ops)
    default = _flag(ops_env.get("DS_BUILD_OPS", "0"))
    wanted: list[str] = []
    if default:
        by_name = {n: var for var, names in variables.items() for n in names}
        wanted += [op for op in known if _flag(ops_env.get(by_name.get(op, ""), "1"))]
    for var, value in ops_env.items():
        if var == "DS_BUILD_OPS" or not _flag(value):
            continue
        names = variables.get(var) or [var.removeprefix("DS_BUILD_").lower()]
        name = next((n for n in names if n in known), names[0])
        if name not in wanted:
            wanted.append(name)
    return sorted(wanted)


def _flag(value: str) -> bool:
    try:
        return int(str(value).strip() or "0") != 0
    except ValueError:
        return False


# ----------------------------------------------------------------------------- build
def build_ops(
    python: str | os.PathLike,
    ops_env: Mapping[str, str],
    arch_env: Mapping[str, str],
    *,
    deepspeed_requirement: str,
    log: str | os.PathLike,
    jobs: int | None = None,
    timeout: float = DEFAULT_BUILD_TIMEOUT,
    sources: Sources | None = None,
    compile_bytecode: bool = True,
    env: Mapping[str, str] | None = None,
    console=None,
    keep_wheel: str | os.PathLike | None = None,
) -> BuiltOps:
    """Reinstall deepspeed into the env of ``python`` with ops precompiled, then verify.

    ``ops_env``: the ``DS_BUILD_*`` switches (``{"DS_BUILD_CPU_ADAM": "1"}``; ``DS_BUILD_OPS``
    for all). ``arch_env``: ``TORCH_CUDA_ARCH_LIST`` / ``PYTORCH_ROCM_ARCH`` (and optionally
    ``DS_ACCELERATOR``, ``CUDA_HOME``, ``ROCM_PATH``). ``deepspeed_requirement``: what to
    reinstall, normally the lock's line with its hashes (``locks.locked_requirement(lock,
    "deepspeed").line()``; the hashes are then required) or ``deepspeed==0.19.8``.
    ``log``: build output is appended there. ``sources``: where uv finds the deepspeed sdist
    (default PyPI). ``jobs``: ``MAX_JOBS`` (default: the CPUs this process may use).
    ``console``: a rich Console for a spinner line (None: silent). ``keep_wheel``: a folder
    the built deepspeed wheel is copied into (for the ops cache, provision/ops/cache.py).

    Returns :class:`BuiltOps` (with the build's seconds). Raises :class:`ProvisionError`
    naming the log, with its last error lines, when the build fails or times out, or when
    installed_ops differs from what was requested.
    """
    python = Path(python)
    log = as_log(log)
    if not python.exists():
        raise ProvisionError(f"DeepSpeed ops: no interpreter at {python}: create the env first")
    bad = [name for name in ops_env if not name.startswith("DS_BUILD_")]
    if bad:
        raise ProvisionError(f"DeepSpeed ops: {', '.join(bad)} are not DS_BUILD_* switches: put "
                             "architecture and toolkit variables in arch_env")
    before = read_deepspeed(python, env=env)
    if before and before.get("variables"):
        unknown = [v for v in ops_env if v != "DS_BUILD_OPS" and v not in before["variables"]]
        if unknown:
            raise ProvisionError(
                f"DeepSpeed ops: {', '.join(unknown)} is not a switch of DeepSpeed "
                f"{before.get('version', '?')} (known: "
                f"{', '.join(sorted(before['variables']))[:300]}): fix the op name")
    jobs = jobs or available_cpus()
    variables = {**{k: str(v) for k, v in arch_env.items()},
                 **{k: str(v) for k, v in ops_env.items()}}
    variables.setdefault("MAX_JOBS", str(jobs))
    build_env = ops_build_env(env, python, variables)
    sources = sources or Sources()

    log.path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=BUILD_SCRATCH) as scratch:
        # uv keeps the wheel it builds in its cache (sdists-v*/.../NAME.whl): with a cache of
        # its own for this build, the only deepspeed wheel there is this build's
        command = build_command(python, deepspeed_requirement, sources=sources,
                                compile_bytecode=compile_bytecode, scratch=Path(scratch),
                                keep_wheel=bool(keep_wheel), variables=variables)
        if "--hash" in deepspeed_requirement:
            requirement_file(Path(scratch)).write_text(deepspeed_requirement.strip() + "\n")
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"\n=== dsenv: DeepSpeed ops build, "
                         f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}\n")
        log_command(log, command, temporary_names(scratch, BUILD_SCRATCH))
        start_size = log.path.stat().st_size
        started = time.monotonic()
        result = _run_with_spinner(command.args, build_env, log, timeout, console,
                                   _ops_label(ops_env))
        seconds = time.monotonic() - started
        wheel = (_keep_built_wheel(Path(scratch) / "uv-cache", keep_wheel)
                 if keep_wheel and result.ok else None)
    what = f"DeepSpeed ops build ({_ops_label(ops_env)})"
    if not result.ok:
        how = (f"timed out after {seconds:.0f} s" if result.timed_out
               else f"failed after {seconds:.0f} s")
        raise ProvisionError(f"{what} {how}: {error_summary(log, start_size)}; full log: "
                             f"{log.path}")
    built = verified_ops(python, ops_env, what=what, log=log.path, start=start_size, env=env,
                         seconds=seconds, variables=variables, command=command.argv)
    return replace(built, wheel=wheel)


def verified_ops(python: Path, ops_env: Mapping[str, str], *, what: str, log: Path,
                 start: int, env: Mapping[str, str] | None, seconds: float,
                 variables: Mapping[str, str], command: tuple[str, ...],
                 verb: str = "built") -> BuiltOps:
    """The env's installed_ops checked against ``ops_env``: :class:`BuiltOps`, or
    :class:`ProvisionError` naming the difference and the log (from byte ``start``)."""
    info = read_deepspeed(python, env=env)
    if info is None:
        raise ProvisionError(f"{what}: uv reported success but deepspeed is not importable "
                             f"from {python}; full log: {log}")
    installed_ops = info.get("installed_ops") or {}
    requested = requested_ops(ops_env, info.get("variables") or {}, installed_ops)
    missing, unexpected = compare_ops(installed_ops, requested)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"requested but not precompiled: {', '.join(missing)}")
        if unexpected:
            parts.append(f"precompiled but not requested: {', '.join(unexpected)}")
        accelerator = info.get("accelerator_name") or "?"
        raise ProvisionError(
            f"{what}: installed_ops differs from the request ({'; '.join(parts)}; DeepSpeed "
            f"built for its {accelerator} accelerator and skips ops it finds incompatible "
            f"there — `ds_report` in the env says why; set DS_ACCELERATOR in arch_env if "
            f"{accelerator} is wrong){skip_reasons(log, start, missing)}; full log: {log}")
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"=== dsenv: {verb} {', '.join(requested) or 'no ops'} in {seconds:.1f} s\n")
    return BuiltOps(python=python, requested=tuple(requested),
                    installed_ops={k: bool(v) for k, v in installed_ops.items()},
                    deepspeed_version=str(info.get("version", "")),
                    accelerator=str(info.get("accelerator_name", "")),
                    torch_info=dict(info.get("torch_info") or {}), seconds=seconds, log=log,
                    variables=dict(variables), command=tuple(command))


def _keep_built_wheel(uv_cache: Path, folder: str | os.PathLike) -> Path | None:
    """The deepspeed wheel uv built, copied into ``folder`` (None: uv kept none)."""
    found = sorted(uv_cache.rglob("deepspeed-*.whl"))
    if len(found) != 1:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(found[0], Path(folder) / found[0].name))


def available_cpus() -> int:
    """The CPUs this process may use (its affinity mask): MAX_JOBS of a build."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def ops_build_env(env: Mapping[str, str] | None, python: Path,
                  variables: Mapping[str, str]) -> dict[str, str]:
    """The environment an ops build runs in: ``env`` (default os.environ) without inherited
    op switches and arch variables, the env's ``bin`` first on PATH, ``variables`` added."""
    base = {k: v for k, v in (env if env is not None else os.environ).items()
            if not k.startswith("DS_BUILD_") and k not in ARCH_VARIABLES}
    base["PATH"] = os.pathsep.join(filter(None, [str(python.parent), base.get("PATH", "")]))
    return uv_env(base, extra=variables)


def switched_on(ops_env: Mapping[str, str]) -> list[str]:
    """The ``DS_BUILD_X`` switches set to 1, as ``x`` (``DS_BUILD_AIO`` -> ``aio``)."""
    return [k.removeprefix("DS_BUILD_").lower() for k, v in ops_env.items() if _flag(v)]


def _ops_label(ops_env: Mapping[str, str]) -> str:
    return ", ".join(switched_on(ops_env)) or "no ops"


_BUILDING = re.compile(r"building '([^']+)' extension")


def _run_with_spinner(args: list[str], env: Mapping[str, str], log: Path, timeout: float,
                      console, label: str) -> proc.CommandResult:
    """``uv ARGS`` with output to ``log``; a spinner line on ``console`` while it runs."""
    if console is None:
        return run_uv(args, timeout=timeout, env=env, output=log)
    box: dict[str, proc.CommandResult] = {}
    worker = threading.Thread(
        target=lambda: box.setdefault("result", run_uv(args, timeout=timeout, env=env,
                                                       output=log)), daemon=True)
    started = time.monotonic()
    worker.start()
    with console.status(f"building DeepSpeed ops ({label})") as status:
        while worker.is_alive():
            worker.join(0.5)
            step = _last_match(log, _BUILDING)
            status.update(f"building DeepSpeed ops ({label}): {time.monotonic() - started:.0f} s"
                          + (f", compiling {step}" if step else "") + f"  (log: {log})")
    return box["result"]


def _last_match(log: Path, pattern: re.Pattern) -> str | None:
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log) - 65536))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    found = pattern.findall(text)
    return found[-1] if found else None


_SKIP_HINT = re.compile(r"Setting accelerator to|Skip pre-compile|incompatible|"
                        r"not compatible|Unable to pre-compile")


def skip_reasons(log: str | os.PathLike, start: int, missing: Iterable[str]) -> str:
    """``: LINE | LINE`` with what DeepSpeed's setup.py said about skipped ops (the
    accelerator it picked, "Skip pre-compile of incompatible X"), or "" when it said
    nothing."""
    names = [name for name in missing if name]
    picked = []
    for line in _log_lines(log, start):
        if line.startswith(("copying ", "creating ", "adding ")):
            continue
        if _SKIP_HINT.search(line) or any(f" {n} " in f" {line} " for n in names):
            picked.append(re.sub(r"^\[[^]]*\] ", "", line)[:200])
    picked = list(dict.fromkeys(picked))[-2:]
    return (": " + " | ".join(picked)) if picked else ""


def _log_lines(log: str | os.PathLike, start: int) -> list[str]:
    try:
        with open(log, "rb") as handle:
            handle.seek(start)
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    lines = [re.sub(r"^(DEBUG|INFO|WARN)\s+|^\s*(cause|Caused by): ", "", line).strip()
             for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("===")]


_NOISE = re.compile(r"Failed to reflink|falling back|fatal: (not a git repository|invalid "
                    r"gitfile)")
_ERROR_LINE = re.compile(r"(error|Error|ERROR|fatal|FAILED|Traceback|No such file|"
                         r"not found|killed|Killed|AssertionError|RuntimeError)")


def error_summary(log: str | os.PathLike, start: int = 0, count: int = 3) -> str:
    """The last ``count`` error-looking lines the build wrote to ``log`` (from byte
    ``start``), joined into one line; the last line when none looks like an error."""
    if not os.path.exists(log):
        return "(no build log)"
    lines = [line for line in _log_lines(log, start) if not _NOISE.search(line)]
    errors = [line for line in lines if _ERROR_LINE.search(line)
              and "-Werror" not in line and not line.startswith(("g++ ", "gcc ", "c++ ",
                                                                 "nvcc ", "hipcc "))]
    picked = [line if len(line) <= 200 else line[:197] + "..."
              for line in dict.fromkeys(errors[-count:])] or lines[-1:] or ["(empty log)"]
    text = " | ".join(picked)
    return text if len(text) <= 600 else text[:597] + "..."

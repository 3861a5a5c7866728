"""A :class:`~dsenv.provision.plan.Plan` -> the environment at its prefix (``dsenv provision``
after plan.py; it shows its progress on a rich console).

    staging folder beside --prefix:   env from the lock (venv | container | conda)
                                      -> DeepSpeed ops chosen by the env's DeepSpeed
                                      -> DS_BUILD_* rebuild, installed_ops verified
                                      -> import / shared-library checks (container)
                                      -> activate script + manifest
    rename the staging folder to --prefix (a failure or Ctrl-C leaves --prefix untouched)

The plan is read, never changed: the lock it names is set once (a lock made on site is
installed from its draft beside the prefix and recorded at the place the plan names), the
manifest is written once. Each command runs through the builder function that gave the plan
its step (steps.py) and is logged first, as the dry run printed it (``$ uv ...`` in
dsenv-build.log, the staging folder shown as the prefix); where the environment's DeepSpeed
chooses other ops than the plan assumed, one line says so.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from dsenv import proc, targetlock
from dsenv.jsonfiles import read_json, write_json_atomically
from dsenv.provision import ProvisionError
from dsenv.provision.conda.install import install_conda
from dsenv.provision.container import create_container_env
from dsenv.provision.locks import lock_on_site, locked_requirement
from dsenv.provision.ops.build import BuiltOps, read_deepspeed
from dsenv.provision.ops.builders import inspect_ops
from dsenv.provision.ops.cache import provide_ops
from dsenv.provision.ops.choose import OpsChoice, choose_ops
from dsenv.provision.ops.cuda import CudaBuild, prepare_cuda_build
from dsenv.provision.plan import SITE_LOCK_NAME, Plan, make_plan
from dsenv.provision.prefix import check_absent, out_of_space_message
from dsenv.provision.record.activation import ACTIVATE_NAME, render_activation
from dsenv.provision.record.manifest import env_versions, manifest_path, write_manifest
from dsenv.provision.record.modulefile import MANIFEST_KEY as MODULEFILE_KEY
from dsenv.provision.record.modulefile import (
    about_manifest,
    check_modulefile,
    render_modulefile,
    stage_modulefile,
)
from dsenv.provision.record.settings import environment_settings
from dsenv.provision.shown import BuildLog
from dsenv.provision.steps import ops_variables
from dsenv.provision.venv import create_venv
from dsenv.provision.verify.imports import import_check, import_check_lock, import_names
from dsenv.provision.verify.shared_libs import missing_shared_libraries
from dsenv.staging import staged_dir


def provision_command(args, argv: list[str]) -> int:
    """``dsenv provision`` (not openmpi): the plan, printed for --dry-run or carried out."""
    console = Console(highlight=False)
    plan = make_plan(args)
    if plan.dry_run:
        console.print(plan.render(), markup=False, soft_wrap=True)  # commands stay whole
        if plan.stop:  # the status the real run would end with, and its one line
            raise ProvisionError(plan.stop)
        return 0
    for line in plan.header():
        console.print(line, markup=False)

    def say_wait(owner) -> None:
        console.print(targetlock.waiting_line(plan.prefix, owner), markup=False)

    with targetlock.hold(plan.prefix, "dsenv provision", wait=plan.wait, on_wait=say_wait):
        # another run may have built the prefix while this one waited for it
        check_absent(plan.prefix, plan.force, " (another dsenv run built it meanwhile)")
        clear_dead_logs(plan.prefix)  # we hold the lock: their runs are gone
        result = provision(plan, argv, console)
    console.print(f"[bold green]environment ready[/]: {plan.prefix} in "
                  f"{result['timings']['total_s']:.0f} s; activate with "
                  f"`. {plan.prefix}/activate`")
    module = result.get("modulefile")
    if module:
        console.print(f"[green]✓[/] modulefile {module.path}: `module use {module.root}; "
                      f"module load {module.module}`", soft_wrap=True)  # the command whole
    return 0


def provision(plan: Plan, argv: list[str], console: Console) -> dict:
    """Build the environment in the staging folder, verify it, rename it into place."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    # the build log lives beside the prefix, so a failed build's log outlives the staging
    # folder (one per run: two runs never write one log); a finished environment keeps it
    # as dsenv-build.log
    log_path = run_log(plan.prefix)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# dsenv provision {' '.join(argv[2:])}\n")
    step = Step(f"installing {plan.lock.name}")
    draft = site_lock_draft(plan.prefix)
    # the file installed from: a lock made on site is a draft beside the prefix until it
    # moves into the environment, where the plan (and the manifest) name it
    lock = draft if plan.site_lock else plan.lock
    module, staged_module = None, None
    try:
        with staged_dir(plan.prefix, "dsenv provision") as staging:
            # each command is logged as the plan showed it: staging as the final prefix
            log = BuildLog(log_path, ((str(staging), str(plan.prefix)),
                                      (str(draft), str(plan.lock))))
            if plan.site_lock:
                step.now = "locking on site"
                _lock_on_site(plan, draft, log, console, timings)
                step.now = f"installing {plan.lock.name}"
            python = _create(plan, lock, staging, log, console, timings)
            step.now = "building DeepSpeed ops"
            choice, built, cuda = _ops(plan, lock, python, log, console, timings)
            step.now = "checking the environment"
            if plan.kind == "container":
                _container_checks(plan, lock, python, staging, console)
            _ready_check(lock, python, console, timings)
            step.now = "writing the activate script and manifest"
            # one description of what activating the env sets (record/settings.py): the
            # activate script and the modulefile both render it
            toolkit = cuda.settings(staging, plan.prefix)
            (staging / ACTIVATE_NAME).write_text(render_activation(
                plan.prefix, plan.site, plan.target, plan.stack,
                kind=_activation_kind(plan.kind), extra=toolkit))
            installed = built.installed_ops if built else _installed_ops(python)
            manifest = write_manifest(
                staging, kind=plan.kind, site=plan.site.name, stack=plan.stack,
                target=plan.target, lock_file=lock, ops_mode=plan.ops_mode,
                ops_requested=list(choice.build), ops_installed=installed,
                ops_omitted=choice.omitted, versions=env_versions(staging), command=argv,
                ops_extra={**({"cpu_flags": built.cpu, "cache": built.cache} if built else {}),
                           **cuda.manifest(staging, plan.prefix)},
                recorded_as=plan.prefix, lock_extra=_lock_record(plan))
            if plan.modulefile:
                step.now = "writing the modulefile"
                module, staged_module = _stage_modulefile(plan, staging, manifest, toolkit)
            if plan.site_lock:  # kept in the environment, named by its manifest
                os.replace(draft, staging / SITE_LOCK_NAME)
            os.replace(log_path, staging / "dsenv-build.log")
            step.now = f"moving the environment to {plan.prefix}"
        if staged_module is not None:  # the environment is in place: now its module
            os.replace(staged_module, module.path)
            staged_module = None
    except (OSError, ProvisionError) as exc:
        if out_of_space(exc, log_path):
            raise ProvisionError(out_of_space_message(plan.prefix, plan.stack,
                                                      step.now)) from None
        raise
    finally:
        draft.unlink(missing_ok=True)
        if staged_module is not None:
            staged_module.unlink(missing_ok=True)
    timings["total_s"] = time.perf_counter() - started
    return {"manifest": manifest, "ops": choice, "built": built, "timings": timings,
            "modulefile": module}


def _stage_modulefile(plan: Plan, staging: Path, manifest, toolkit):
    """The modulefile rendered from the same settings as the activate script, written
    hidden beside its place (renamed there after the environment), and named in the
    manifest (``modulefile``: `dsenv provision openmpi --env` adds its module to it)."""
    module = plan.modulefile.with_lock(manifest.lock["sha256"], plan.target)
    check_modulefile(module, plan.prefix, plan.force)  # a site lock's hash is known now
    groups = environment_settings(plan.prefix, plan.site, plan.target, plan.stack,
                                  kind=_activation_kind(plan.kind), extra=toolkit)
    text = render_modulefile(groups, module=module.module, prefix=plan.prefix,
                             about=about_manifest(manifest))
    record = read_json(manifest_path(staging), "environment manifest")
    record[MODULEFILE_KEY] = {"path": str(module.path), "module": module.module,
                              "root": str(module.root)}
    write_json_atomically(manifest_path(staging), record, indent=2)
    return module, stage_modulefile(module.path, text)


def _lock_record(plan: Plan) -> dict:
    """What the manifest's ``lock`` says beyond the file's hash and pins: where a lock made
    on site is kept, and how it was made."""
    if not plan.site_lock:
        return {}
    return {"file": plan.lock.name, "path": str(plan.lock),
            "locked_on_site": plan.site_lock.to_json()}


class Step:
    """What the build is doing now, for the one line a full disk gets."""

    def __init__(self, now: str):
        self.now = now


def run_log(prefix: Path) -> Path:
    """This run's build log beside the prefix: ``NAME.build-PID.log``."""
    return prefix.with_name(f"{prefix.name}.build-{os.getpid()}.log")


def site_lock_draft(prefix: Path) -> Path:
    """Where this run writes a lock made on site, beside the prefix (the staging folder must
    stay empty for ``uv venv``), until it moves into the environment."""
    return prefix.with_name(f"{prefix.name}.lock-{os.getpid()}.txt")


def _lock_on_site(plan: Plan, draft: Path, log: BuildLog, console, timings: dict) -> None:
    begin = time.perf_counter()
    site = plan.site_lock
    with console.status(f"locking {site.requirements.name} on site against "
                        f"{site.describe()}"):
        lock_on_site(site.stack, site.requirements, draft, sources=plan.sources,
                     python_version=site.python_version, kept_as=SITE_LOCK_NAME, log=log)
    timings["site_lock_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] locked {site.requirements.name} on site against "
                  f"{site.describe()} ({timings['site_lock_s']:.0f} s): kept as "
                  f"{plan.lock}")


def clear_dead_logs(prefix: Path) -> None:
    """Logs (and site-lock drafts) earlier runs left beside ``prefix``; call only while
    holding its lock (every other run that wrote one is then gone)."""
    for pattern in (f"{prefix.name}.build-*.log", f"{prefix.name}.build.log",
                    f"{prefix.name}.lock-*.txt"):
        for stale in prefix.parent.glob(pattern):
            stale.unlink(missing_ok=True)


def out_of_space(exc: BaseException, log: Path) -> bool:
    """ENOSPC in this process, or a tool of the build that died of it (its log says so)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    if NO_SPACE in str(exc):
        return True
    try:
        return NO_SPACE in log.read_text(errors="replace")[-20000:]
    except OSError:
        return False


NO_SPACE = "No space left on device"  # strerror(ENOSPC), as tools print it
READY_TIMEOUT = 300.0  # seconds for the whole import of the key packages

# The packages a training job imports first; each one the lock holds must import in the
# staged environment before it is called ready.
READY_DISTRIBUTIONS = ("torch", "deepspeed", "transformers", "datasets", "accelerate",
                       "tokenizers", "mpi4py")


def _ready_check(lock: Path, python: Path, console, timings: dict) -> None:
    """The staged env's interpreter starts and the lock's key packages import, in the env's
    own interpreter with a timeout (never in this process)."""
    begin = time.perf_counter()
    lock_text = lock.read_text(errors="replace").lower()
    wanted = [d for d in READY_DISTRIBUTIONS
              if re.search(rf"(?m)^\s*(-\s*)?(name:\s*)?{d}\s*(==|:|=|\s|$)", lock_text)]
    names = import_names(python, wanted)
    missing = [d for d, tops in names.items() if tops is None]
    if missing:
        raise ProvisionError(f"the staged environment lacks {', '.join(missing)}, which the "
                             f"lock {lock.name} holds: the install did not finish; see "
                             "the build log")
    modules = wanted  # each of these distributions imports under its own name
    failures = import_check(python, modules, timeout=READY_TIMEOUT)
    if failures:
        raise ProvisionError(f"the staged environment does not import what the lock holds: "
                             f"{failures[0]}" + (f" (and {len(failures) - 1} more)"
                                                 if len(failures) > 1 else ""))
    timings["ready_check_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] the environment imports {', '.join(modules) or 'its packages'} "
                  f"({timings['ready_check_s']:.0f} s)")


def _activation_kind(kind: str) -> str:
    return "conda" if kind == "conda" else "venv"


def _create(plan: Plan, lock: Path, staging: Path, log: BuildLog, console,
            timings: dict) -> Path:
    begin = time.perf_counter()
    with console.status(f"installing {plan.lock.name} into {plan.kind} environment"):
        if plan.kind == "venv":
            staging.rmdir()  # uv venv wants an absent or empty folder: it is empty
            create_venv(staging, lock, python=plan.python, sources=plan.sources,
                        compile_bytecode=plan.bytecode, log=log)
        elif plan.kind == "container":
            staging.rmdir()
            container = create_container_env(
                staging, lock, base_python=plan.python, sources=plan.sources,
                compile_bytecode=plan.bytecode, log=log)
            console.print(f"image: {container.summary()}")
        else:
            install_conda(lock, staging, final_prefix=plan.prefix)
    timings["install_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] {plan.kind} environment from {plan.lock.name} "
                  f"({timings['install_s']:.0f} s)")
    return staging / "bin" / "python"


def _ops(plan: Plan, lock: Path, python: Path, log: BuildLog, console,
         timings: dict) -> tuple[OpsChoice, BuiltOps | None, CudaBuild]:
    # the nvcc of CUDA ops (the node's, or NVIDIA's wheels installed now) and the env's
    # NVIDIA headers: provision/ops/cuda.py
    cuda = prepare_cuda_build(plan.toolkit, python, sources=plan.sources, log=log)
    if cuda.choice.kind == "wheels":
        console.print(f"[green]✓[/] CUDA {cuda.choice.cuda} toolkit from NVIDIA's wheels in the "
                      f"env: CUDA_HOME={cuda.home} ({cuda.choice.reason})")
    if plan.ops.none:  # nothing to ask DeepSpeed (may be absent)
        console.print("[green]✓[/] DeepSpeed ops: none precompiled (--ops none); they "
                      "JIT-compile on first use")
        return OpsChoice("none", "", ()), None, cuda
    report = inspect_ops(plan.target, str(python), env=cuda.env)
    choice = choose_ops(plan.target, plan.stack, plan.ops_mode, python=str(python),
                        env=cuda.env, report=report)
    for line in choice.omitted_lines():  # one line per reason, not per op
        console.print(f"  – {line}", style="dim", markup=False)
    differs = plan.ops.difference(choice)  # the plan asked dsenv's DeepSpeed, not the env's
    if differs:
        console.print(f"  ! {differs}", style="yellow", markup=False)
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"=== dsenv: {differs}\n")
    for warning in choice.warnings:
        console.print(f"  [yellow]! {warning}[/]")
    if not choice.build:
        console.print(f"[green]✓[/] DeepSpeed ops: none precompiled (--ops {plan.ops_mode}); "
                      "they JIT-compile on first use")
        return choice, None, cuda
    if plan.kind == "conda":
        requirement = "deepspeed==" + _installed_version(python, "deepspeed")
    else:
        requirement = locked_requirement(lock, "deepspeed").line()
    begin = time.perf_counter()
    # the ops build runs without --no-index: uv may fetch the deepspeed sdist from the index
    sources = replace(plan.sources, no_index=False)
    # the ops cache (provision/ops/cache.py) reuses the wheel of an earlier identical build
    switches, arch = ops_variables(plan.target, choice)  # as the plan's ops step shows them
    built = provide_ops(python, switches, arch, deepspeed_requirement=requirement, log=log,
                        cache=plan.ops_cache, sources=sources, compile_bytecode=plan.bytecode,
                        env={**cuda.env, "DS_ACCELERATOR": choice.accelerator},
                        console=console, wait=plan.wait,
                        say=lambda line: console.print(f"  ! {line}", style="yellow",
                                                       markup=False))
    timings["ops_build_s"] = time.perf_counter() - begin
    how = ("from the ops cache" if built.cache.get("result") == "hit"
           else "precompiled")
    console.print(f"[green]✓[/] DeepSpeed ops {how} and verified: "
                  f"{', '.join(built.ops)} ({timings['ops_build_s']:.0f} s, log dsenv-build.log)")
    cuda.verify(python, built.ops, plan.target, report, log)
    if cuda.archs is not None and cuda.archs.describe():
        console.print("✓ device code read from each op (.nv_fatbin): "
                      + "; ".join(cuda.archs.describe()), style="green", markup=False)
    return choice, built, cuda


def _installed_version(python: Path, dist: str) -> str:
    result = proc.run([str(python), "-c", f"import importlib.metadata as m; "
                       f"print(m.version({dist!r}))"], timeout=60)
    if result.returncode != 0:
        raise ProvisionError(f"the environment has no {dist}: add it to the lock")
    return result.stdout.strip()


def _installed_ops(python: Path) -> dict:
    try:
        info = read_deepspeed(python)
    except ProvisionError:
        return {}
    return (info or {}).get("installed_ops") or {}


def _container_checks(plan: Plan, lock: Path, python: Path, staging: Path, console) -> None:
    failures = import_check_lock(python, lock)
    if failures:
        first = failures[0]
        raise ProvisionError(f"{len(failures)} locked package(s) do not import in the "
                             f"container environment, first: {first}")
    missing = missing_shared_libraries([staging])
    for item in missing:  # the fix lines must name the final prefix, not the staging folder
        console.print(f"[yellow]! {str(item).replace(str(staging), str(plan.prefix))}[/]")
    console.print(f"[green]✓[/] every locked package imports; "
                  f"{'no' if not missing else len(missing)} missing shared libraries")

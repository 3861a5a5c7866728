"""A :class:`~dsenv.provision.plan.Plan` -> the environment at its prefix (``dsenv provision``
after plan.py; it shows its progress on a rich console).

    staging folder beside --prefix:   env from the lock (venv | container | conda)
                                      -> DeepSpeed ops chosen by the env's DeepSpeed
                                      -> DS_BUILD_* rebuild, installed_ops verified
                                      -> import / shared-library checks (container)
                                      -> activate script + manifest
    rename the staging folder to --prefix (a failure or Ctrl-C leaves --prefix untouched)
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from dsenv import proc
from dsenv.jsonfiles import read_json, write_json_atomically
from dsenv.staging import staged_dir

from . import ProvisionError
from .activation import ACTIVATE_NAME, render_activation
from .build_ops import BuiltOps, build_ops, read_deepspeed
from .conda_install import install_conda
from .container import create_container_env
from .import_check import import_check_lock
from .locks import locked_requirement
from .manifest import env_versions, manifest_path, write_manifest
from .ops import OpsChoice, choose_ops
from .plan import Plan, make_plan
from .shared_libs import missing_shared_libraries
from .venv import create_venv


def provision_command(args, argv: list[str]) -> int:
    """``dsenv provision`` (not openmpi): the plan, printed for --dry-run or carried out."""
    console = Console(highlight=False)
    plan = make_plan(args)
    if plan.dry_run:
        console.print(plan.render(), markup=False)
        return 0
    for line in plan.header():
        console.print(line, markup=False)
    try:
        result = provision(plan, argv, console)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ProvisionError(f"no space left on the device ({exc.filename or ''}): "
                                 "nothing was installed at the prefix; free space or pass "
                                 "--prefix on another file system") from None
        raise
    console.print(f"[bold green]environment ready[/]: {plan.prefix} in "
                  f"{result['timings']['total_s']:.0f} s; activate with "
                  f"`. {plan.prefix}/activate`")
    return 0


def provision(plan: Plan, argv: list[str], console: Console) -> dict:
    """Build the environment in the staging folder, verify it, rename it into place."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    # the build log lives beside the prefix, so a failed build's log outlives the staging
    # folder; a finished environment keeps it as dsenv-build.log
    log = plan.prefix.with_name(f"{plan.prefix.name}.build.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# dsenv provision {' '.join(argv[2:])}\n")
    with staged_dir(plan.prefix) as staging:
        python = _create(plan, staging, log, console, timings)
        choice, built = _ops(plan, python, log, console, timings)
        if plan.kind == "container":
            _container_checks(plan, python, staging, console)
        (staging / ACTIVATE_NAME).write_text(render_activation(
            plan.prefix, plan.site, plan.target, plan.stack, kind=_activation_kind(plan.kind)))
        installed = built.installed_ops if built else _installed_ops(python)
        manifest = write_manifest(
            staging, kind=plan.kind, site=plan.site.name, stack=plan.stack,
            target=plan.target, lock_file=plan.lock, ops_mode=plan.ops_mode,
            ops_requested=list(choice.build), ops_installed=installed,
            ops_omitted=choice.omitted, versions=env_versions(staging), command=argv)
        _relocate_manifest(staging, plan.prefix)
        os.replace(log, staging / "dsenv-build.log")
    timings["total_s"] = time.perf_counter() - started
    return {"manifest": manifest, "ops": choice, "built": built, "timings": timings}


def _activation_kind(kind: str) -> str:
    return "conda" if kind == "conda" else "venv"


def _relocate_manifest(staging: Path, prefix: Path) -> None:
    """The manifest was written inside the staging folder: record the final location."""
    path = manifest_path(staging)
    data = read_json(path, "manifest")
    data["env_dir"] = str(prefix)
    write_json_atomically(path, data, indent=2)


def _create(plan: Plan, staging: Path, log: Path, console, timings: dict) -> Path:
    begin = time.perf_counter()
    with console.status(f"installing {plan.lock.name} into {plan.kind} environment"):
        if plan.kind == "venv":
            staging.rmdir()  # uv venv wants an absent or empty folder: it is empty
            create_venv(staging, plan.lock, python=plan.python, sources=plan.sources,
                        compile_bytecode=plan.bytecode, log=log)
        elif plan.kind == "container":
            staging.rmdir()
            container = create_container_env(
                staging, plan.lock, base_python=plan.python, sources=plan.sources,
                compile_bytecode=plan.bytecode, log=log)
            console.print(f"image: {container.summary()}")
        else:
            install_conda(plan.lock, staging, final_prefix=plan.prefix)
    timings["install_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] {plan.kind} environment from {plan.lock.name} "
                  f"({timings['install_s']:.0f} s)")
    return staging / "bin" / "python"


def _ops(plan: Plan, python: Path, log: Path, console,
         timings: dict) -> tuple[OpsChoice, BuiltOps | None]:
    if plan.ops_mode.strip().lower() == "none":  # nothing to ask DeepSpeed (may be absent)
        console.print("[green]✓[/] DeepSpeed ops: none precompiled (--ops none); they "
                      "JIT-compile on first use")
        return OpsChoice("none", "", ()), None
    choice = choose_ops(plan.target, plan.stack, plan.ops_mode, python=str(python))
    for op, reason in choice.omitted.items():
        console.print(f"  [dim]– {op}: {reason}[/]")
    for warning in choice.warnings:
        console.print(f"  [yellow]! {warning}[/]")
    if not choice.build:
        console.print(f"[green]✓[/] DeepSpeed ops: none precompiled (--ops {plan.ops_mode}); "
                      "they JIT-compile on first use")
        return choice, None
    if plan.kind == "conda":
        requirement = "deepspeed==" + _installed_version(python, "deepspeed")
    else:
        requirement = locked_requirement(plan.lock, "deepspeed").line()
    begin = time.perf_counter()
    # the ops build runs without --no-index: uv may fetch the deepspeed sdist from the index
    sources = replace(plan.sources, no_index=False)
    built = build_ops(python, {k: v for k, v in choice.env().items() if k.startswith("DS_BUILD")},
                      plan.target.arch_env(), deepspeed_requirement=requirement, log=log,
                      sources=sources, compile_bytecode=plan.bytecode,
                      env={**os.environ, "DS_ACCELERATOR": choice.accelerator},
                      console=console)
    timings["ops_build_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] DeepSpeed ops precompiled and verified: "
                  f"{', '.join(built.ops)} ({timings['ops_build_s']:.0f} s, log dsenv-build.log)")
    return choice, built


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


def _container_checks(plan: Plan, python: Path, staging: Path, console) -> None:
    failures = import_check_lock(python, plan.lock)
    if failures:
        first = failures[0]
        raise ProvisionError(f"{len(failures)} locked package(s) do not import in the "
                             f"container environment, first: {first}")
    missing = missing_shared_libraries([staging])
    for item in missing:  # the fix lines must name the final prefix, not the staging folder
        console.print(f"[yellow]! {str(item).replace(str(staging), str(plan.prefix))}[/]")
    console.print(f"[green]✓[/] every locked package imports; "
                  f"{'no' if not missing else len(missing)} missing shared libraries")

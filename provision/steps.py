"""The steps of a :class:`~dsenv.provision.plan.Plan`, each with the commands it runs.

A step's commands come from the builder that runs them (venv.venv_command,
venv.sync_command, container.install_lines_command, locks.compile_command,
ops.cuda.toolkit_command, ops.command.build_command), called here with the plan's values:
``--dry-run`` prints them, the real run logs the same text before it runs each one (shown.py).
What the plan cannot know yet is said as an assumption in its step, and the real run says
in one line where it found otherwise: which ops the new environment's DeepSpeed allows
(:class:`OpsPlan`; the plan asks dsenv's own), an ops cache that already holds the build,
the packages a container image lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dsenv.envs.targets import Target
from dsenv.provision.container import MISSING_SCRATCH, install_lines_command
from dsenv.provision.locks import LOCK_SCRATCH, compile_command
from dsenv.provision.ops.build import available_cpus
from dsenv.provision.ops.choose import OpsChoice
from dsenv.provision.ops.command import BUILD_SCRATCH, build_command
from dsenv.provision.ops.cuda import toolkit_command
from dsenv.provision.shown import PLAN_MARK, Command, Names, temporary
from dsenv.provision.venv import sync_command, venv_command

if TYPE_CHECKING:  # plan.py imports this module
    from dsenv.provision.plan import Plan

StepKind = Literal["lock", "create", "install", "toolkit", "ops", "verify", "record", "rename"]
STOP = "STOPS THE REAL RUN HERE"


@dataclass(frozen=True)
class Step:
    kind: StepKind
    title: str
    detail: str = ""
    commands: tuple[Command, ...] = ()
    stop: str = ""  # the one line the real run stops with here ("" when it goes on)

    def render(self, names: Names = ()) -> list[str]:
        lines = [f"- {self.title}" + (f": {self.detail}" if self.detail else "")]
        return lines + [PLAN_MARK + command.render(names) for command in self.commands]


@dataclass(frozen=True)
class OpsPlan:
    """``--ops`` as planned: the choice assumed from dsenv's own DeepSpeed (None: it could
    not say, ``unknown`` says why), and in a dry run why the real run would stop at the ops.
    The real run chooses with the new environment's DeepSpeed and reports a difference."""

    mode: str
    assumed: OpsChoice | None = None
    unknown: str = ""
    stop: str = ""

    @property
    def none(self) -> bool:
        return self.mode.strip().lower() == "none"

    def difference(self, choice: OpsChoice) -> str | None:
        """One line when the environment's ``choice`` is not what the plan assumed."""
        if self.none:
            return None
        now = f"the environment's DeepSpeed {choice.deepspeed} builds " + _ops(choice.build)
        if self.assumed is None:
            return f"ops: the plan could not say which ({self.unknown}); {now}"
        before = self.assumed
        if before.build == choice.build and before.env() == choice.env():
            return None
        why = ("" if before.build != choice.build
               else f" (its DS_BUILD_* switches differ: {_switches(before, choice)})")
        return (f"ops differ from the plan: {now}{why}; the plan assumed "
                f"{_ops(before.build)} from DeepSpeed {before.deepspeed} of dsenv's "
                "interpreter")


def _ops(names) -> str:
    return ", ".join(names) or "none"


def _switches(before: OpsChoice, now: OpsChoice) -> str:
    old, new = before.env(), now.env()
    return ", ".join(f"{k}={new.get(k, '(unset)')} (plan {old.get(k, '(unset)')})"
                     for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))


def ops_variables(target: Target, choice: OpsChoice) -> tuple[dict[str, str], dict[str, str]]:
    """(the DS_BUILD_* switches, the arch variables with DS_ACCELERATOR) of an ops build."""
    switches = {k: v for k, v in choice.env().items() if k.startswith("DS_BUILD")}
    return switches, {**target.arch_env(), "DS_ACCELERATOR": choice.accelerator}


def plan_steps(plan: Plan) -> tuple[Step, ...]:
    """Every step of ``plan`` in the order the real run carries them out."""
    python = plan.staging / "bin" / "python"
    steps = [*_lock_steps(plan), *_install_steps(plan, python), *_ops_steps(plan, python)]
    steps.append(Step("verify", "verify", "DeepSpeed's installed_ops equals the requested ops"
                      + ("; every locked package imports; no shared library is missing"
                         if plan.kind == "container" else "")))
    steps.append(Step("record", "write activate and dsenv-env.json",
                      f"site {plan.site.name}: modules {', '.join(plan.site.modules) or 'none'}"
                      "; TORCH_EXTENSIONS_DIR in the env; HF offline variables inside Slurm "
                      "jobs"))
    steps.append(Step("rename", f"rename {plan.staging.name} to {plan.prefix}",
                      "replacing the old environment" if plan.force else ""))
    if plan.modulefile:
        steps.append(_modulefile_step(plan))
    # a refusal is raised while the real run plans, before its first step: it is the plan
    stop = next((step for step in steps if step.stop), None)
    return (stop,) if stop else tuple(steps)


def _lock_steps(plan: Plan) -> list[Step]:
    lock = plan.site_lock
    if lock and lock.problem:  # the index or the requirements are missing: nothing to run
        return [Step("lock", f"lock on site against {lock.describe()}: {STOP}", lock.problem,
                     stop=lock.problem)]
    if lock:
        return [Step(
            "lock", f"lock on site against {lock.describe()}",
            f"no lock is committed for stack {lock.stack}: {lock.requirements.name} resolved "
            f"with hashes for Python {lock.python_version}, kept as {plan.lock} and named in "
            "the manifest (rebuild the same env with --lock FILE)",
            (compile_command(lock.requirements, temporary(LOCK_SCRATCH), lock.python_version,
                             lock.sources),))]
    if not plan.lock.is_file():  # a dry run of a conda env whose stack has no conda lock
        stop = missing_lock(plan.kind, plan.stack, plan.lock)
        return [Step("lock", f"no conda lock for stack {plan.stack.name}: {STOP}", stop,
                     stop=stop)]
    return []


def missing_lock(kind: str, stack, lock: Path) -> str:
    """The line a run stops with when the lock to install does not exist."""
    regenerate = (f"dsenv lock --kind conda --stack {stack.name}" if kind == "conda"
                  else f"dsenv lock --stack {stack.name}")
    return (f"no lock for stack {stack.name} ({kind}): {lock} does not exist; generate it "
            f"with `{regenerate}` where the stack's package index ({stack.index_url}) is "
            "reachable, or pass --lock FILE")


def _install_steps(plan: Plan, python: Path) -> list[Step]:
    if plan.kind == "venv":
        return [Step("create", "create the venv", "relocatable, so it survives the rename",
                     (venv_command(plan.staging, plan.python),)),
                Step("install", "install the lock, hashes required",
                     "once more with --offline (uv's cache alone) if the index cannot be "
                     "reached", (sync_command(python, plan.lock, plan.sources, plan.bytecode),))]
    if plan.kind == "container":
        return [Step("create", "create a venv on the image's Python",
                     "--system-site-packages: the image's torch/DeepSpeed stay",
                     (venv_command(plan.staging, plan.python, system_site_packages=True),)),
                Step("install", "install what the image lacks",
                     f"the lock's lines whose version the image does not have, in "
                     f"{temporary(MISSING_SCRATCH).name}/missing.txt, hashes required, "
                     "--no-deps; skipped when the image has them all",
                     (install_lines_command(python, temporary(MISSING_SCRATCH), plan.sources,
                                            plan.bytecode),))]
    return [Step("install", "install the conda lock",
                 "in dsenv's process: every package's sha256/md5 checked against the lock, "
                 f"linked by py-rattler for the final prefix {plan.prefix}, then the pip "
                 "part with uv --require-hashes")]


def _ops_steps(plan: Plan, python: Path) -> list[Step]:
    ops = plan.ops
    steps = []
    if ops.stop:  # the real run refuses here; nothing after it runs
        return [Step("ops", f"DeepSpeed ops --ops {ops.mode}: {STOP}", ops.stop, stop=ops.stop)]
    if plan.toolkit is not None and plan.toolkit.kind == "wheels":
        steps.append(Step("toolkit", f"CUDA {plan.toolkit.cuda}'s nvcc from NVIDIA's wheels",
                          "into the env, CUDA_HOME for the ops build",
                          (toolkit_command(python, plan.toolkit.wheels, plan.sources),)))
    title = f"DeepSpeed ops --ops {ops.mode}"
    if ops.none:
        return steps + [Step("ops", title, "none precompiled; they JIT-compile on first use")]
    choice = ops.assumed
    cache = plan.ops_cache.describe() if plan.ops_cache else "off"
    if choice is None:
        assumed = (f"which ops is decided by the new environment's DeepSpeed (dsenv's own "
                   f"could not say: {ops.unknown}); DS_BUILD_<OP>=1 for each")
        choice = OpsChoice(ops.mode, "cpu" if plan.target.vendor == "cpu" else "cuda", ())
    elif not choice.build:
        return steps + [Step("ops", title, f"none to precompile (as DeepSpeed "
                             f"{choice.deepspeed} here says; the run asks the new "
                             "environment's): they JIT-compile on first use")]
    else:
        assumed = (f"builds {_ops(choice.build)}, as DeepSpeed {choice.deepspeed} here "
                   "chooses (assumed: the run asks the new environment's DeepSpeed and "
                   "says in one line if it chooses otherwise)")
    switches, arch = ops_variables(plan.target, choice)
    hashed = plan.kind != "conda"  # a conda env's deepspeed is its installed version
    command = build_command(
        python, "deepspeed --hash=<the lock's>" if hashed else "deepspeed==<the env's>",
        sources=replace(plan.sources, no_index=False), compile_bytecode=plan.bytecode,
        scratch=temporary(BUILD_SCRATCH), keep_wheel=bool(plan.ops_cache and
                                                          plan.ops_cache.path),
        variables={**arch, **switches, "MAX_JOBS": str(available_cpus())})
    return steps + [Step(
        "ops", title, f"{assumed}; "
        + ("deepspeed.txt holds the lock's deepspeed line with its hashes; " if hashed else "")
        + f"ops cache {cache}: assumed to hold no identical earlier build (a hit installs "
        "that wheel instead, hash-checked)", (command,))]


def _modulefile_step(plan: Plan) -> Step:
    """The Lmod modulefile: written beside its place before the rename, renamed into place
    after the environment."""
    module = plan.modulefile
    if plan.modulefile_stop:
        return Step("record", f"modulefile {module.module}: {STOP}", plan.modulefile_stop,
                    stop=plan.modulefile_stop)
    hashed = "" if module.version else " (the version is the hash of the lock made on site)"
    return Step("record", f"modulefile {module.module} at {module.path}",
                "Lmod Lua from the settings the activate script renders (PATH, "
                f"{_prefix_variable(plan.kind)} and DSENV_ENV, TORCH_EXTENSIONS_DIR, arch, "
                "offline and site variables, site modules as depends_on); written hidden "
                "beside it before the rename, renamed into place after it; load with "
                f"`module use {module.root}; module load {module.module}`{hashed}")


def _prefix_variable(kind: str) -> str:
    return "CONDA_PREFIX" if kind == "conda" else "VIRTUAL_ENV"

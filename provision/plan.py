"""``dsenv provision``'s arguments -> :class:`Plan`: everything decided and checked before a
file is written.

    site profile + --arch  -> Target             (targets.py; `auto` through the GPU probes)
    Target + this nvcc     -> Stack              (targets.py; nvcc only when ops are built)
    Stack + --kind         -> lock               (committed, --lock FILE, or none: then the
                                                  stack's requirements are locked on the site
                                                  against its index, the first step)
    --prefix               -> absolute prefix    (prefix.py; symlinks resolved, free space)
    Stack + --find-links.. -> Sources            (uvcmd.py)
    --ops + dsenv's DeepSpeed -> the ops assumed (ops/choose.py; the run asks the new
                                                  environment's DeepSpeed and says in one
                                                  line if it chooses otherwise)
    then the steps (steps.py), each with the commands its builder will run (what --dry-run
    prints: always the whole plan, arch variables and ops included; what would stop the
    real run is said in the step it concerns). The plan is frozen: the run reads it and
    never changes it.

Carrying a plan out is build.py's job: it runs each step's commands through the same
builder functions and logs each one as the plan shows it.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv import proc
from dsenv.envs.sites import Site, load_site
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target
from dsenv.provision import ProvisionError
from dsenv.provision.conda.recipe import lock_path as conda_lock_path
from dsenv.provision.locks import requirements_path
from dsenv.provision.ops.cache import CacheDir, resolve_dir
from dsenv.provision.ops.choose import parse_mode, preview_ops
from dsenv.provision.ops.cuda import ToolkitChoice
from dsenv.provision.prefix import check_absent, default_prefix, free_space_check, resolve_prefix
from dsenv.provision.record.manifest import sha256_text
from dsenv.provision.record.modulefile import ModulefilePlan, check_modulefile, plan_modulefile
from dsenv.provision.shown import Names
from dsenv.provision.steps import OpsPlan, Step, missing_lock, plan_steps
from dsenv.provision.targets import choose_stack_and_toolkit, resolve_arch
from dsenv.provision.uvcmd import Sources, index_unreachable, stack_sources

SITE_LOCK_NAME = "dsenv-lock.txt"  # a lock made on the site, kept inside the environment
INDEX_PROBE_TIMEOUT = 10.0  # seconds a package index has to answer before locking on site


@dataclass(frozen=True)
class SiteLock:
    """No lock is committed for the stack (and none given): its requirements are locked here,
    against the stack's sources, before the install; the lock is kept in the environment
    (``SITE_LOCK_NAME``) and named by its manifest, so ``--lock`` rebuilds the same env."""

    stack: str
    requirements: Path
    sources: Sources
    python_version: str
    problem: str | None = None  # why the real run would stop (no requirements, no index)

    def describe(self) -> str:
        return (" and ".join(dict.fromkeys(self.sources.indexes()))
                or ", ".join(self.sources.find_links))

    def to_json(self) -> dict:
        return {"stack": self.stack, "requirements": self.requirements.name,
                "sources": self.sources.describe(), "python": self.python_version}


@dataclass(frozen=True)
class Plan:
    """Everything ``dsenv provision`` will do, decided before a file is written; immutable.
    ``steps`` (steps.py) hold the commands the run carries out, as --dry-run prints them."""

    kind: str
    site: Site
    target: Target
    stack: Stack
    lock: Path  # the lock installed; with a site lock, where the environment keeps it
    prefix: Path
    python: str
    ops: OpsPlan
    sources: Sources
    force: bool
    bytecode: bool = True
    dry_run: bool = False  # print the plan, write nothing
    wait: float | None = None  # seconds to wait for another run building the prefix
    ops_cache: CacheDir | None = None  # where built DeepSpeed wheels are kept (ops/cache.py)
    toolkit: ToolkitChoice | None = None  # the nvcc of the CUDA ops (ops/cuda.py)
    notes: tuple[str, ...] = ()
    site_lock: SiteLock | None = None  # set when the lock is made on the site
    modulefile: ModulefilePlan | None = None  # the env's Lmod modulefile (--modulefile)
    modulefile_stop: str = ""  # why the real run would refuse to write it
    steps: tuple[Step, ...] = ()

    @property
    def stop(self) -> str:
        """The line the real run would stop with ("" when it would go through)."""
        return next((step.stop for step in self.steps if step.stop), "")

    @property
    def ops_mode(self) -> str:
        return self.ops.mode

    @property
    def staging(self) -> Path:
        return self.prefix.with_name(f".{self.prefix.name}.tmp-{os.getpid()}")

    @property
    def names(self) -> Names:
        """How the plan's commands show the staging folder: as the final prefix."""
        return ((str(self.staging), str(self.prefix)),)

    def header(self) -> list[str]:
        return [f"dsenv provision: {self.kind} environment at {self.prefix}",
                f"  site    {self.site.name} ({self.site.title})",
                f"  target  {self.target.describe()} ({self.target.source})",
                f"  stack   {self.stack.name}: {self.stack.torch_requirement}"
                + (f", {self.stack.toolkit}" if self.stack.toolkit else ""),
                f"  lock    {self.lock}" + (
                    f" (none committed for stack {self.stack.name}: locked on site against "
                    f"{self.site_lock.describe()}, the first step)" if self.site_lock else ""),
                f"  arch    {_arch_line(self.target)}",
                f"  python  {self.python}",
                *([f"  module  {self.modulefile.module} ({self.modulefile.path}, from "
                   f"{self.modulefile.source})"] if self.modulefile else []),
                *[f"  note    {note}" for note in self.notes]]

    def render(self) -> str:
        lines = self.header() + ["", "steps (in a staging folder, renamed into place at the "
                                     "end; each command as the run logs it):" if not self.stop
                                 else "steps: none: the real run stops while it plans:"]
        for step in self.steps:
            lines += step.render(self.names)
        return "\n".join(lines)


def make_plan(args) -> Plan:
    """The parsed ``dsenv provision`` arguments -> Plan (ProvisionError, one line, on bad
    input). The only place that reads them."""
    site = load_site(args.site)
    kind = args.kind or site.default_kind
    target = resolve_arch(args.arch or site.default_arch or "auto")
    # the stack, and the nvcc its CUDA ops compile with (the node's, or NVIDIA's wheels)
    wheels = not getattr(args, "no_toolkit_wheels", False)
    ops_stop = ""  # a dry run always plans: a toolkit refusal becomes the ops step's stop
    try:
        stack, toolkit, toolkit_notes = choose_stack_and_toolkit(
            target, args.ops, args.stack or site.default_stack or None, toolkit_wheels=wheels)
    except ProvisionError as exc:
        if not args.dry_run or args.ops.strip().lower() == "none":
            raise
        ops_stop = str(exc)  # the stack as --ops none takes it; the refusal stays visible
        stack, toolkit, toolkit_notes = choose_stack_and_toolkit(
            target, "none", args.stack or site.default_stack or None, toolkit_wheels=wheels)
    prefix = resolve_prefix(args.prefix or default_prefix(site, kind, stack))
    check_absent(prefix, args.force)
    sources = stack_sources(stack, args.find_links, args.index_url, args.no_index)
    python = args.python or sys.executable
    lock = _lock(kind, stack, args.lock, args.dry_run)
    site_lock = None
    if lock is None:  # nothing committed: lock on the site (a step, checked before it runs)
        site_lock = _site_lock(stack, sources, python, args.dry_run)
        lock = prefix / SITE_LOCK_NAME
    # the ops the plan assumes, asked of dsenv's own DeepSpeed (an unknown op is a usage
    # error before anything is installed); the run asks the new environment's again
    ops, ops_notes = _assume_ops(target, stack, args.ops, ops_stop, args.dry_run)
    # notes say only what will happen: none on ops when the run stops before them
    stops = bool(ops_stop or (site_lock and site_lock.problem)
                 or (kind == "conda" and not lock.is_file()))
    notes = [*toolkit_notes, *(([] if stops else ops_notes) if args.dry_run
                               else [free_space_check(prefix, stack)])]
    modulefile, modulefile_stop = _modulefile(args, site, stack, target, lock, site_lock,
                                              prefix)
    plan = Plan(kind, site, target, stack, lock.resolve(), prefix, python, ops, sources,
                args.force, not args.no_bytecode, args.dry_run, getattr(args, "wait", None),
                resolve_dir(getattr(args, "ops_cache", None), site.ops_cache, site.name),
                toolkit, tuple(notes), site_lock, modulefile, modulefile_stop)
    return replace(plan, steps=plan_steps(plan))


def _modulefile(args, site: Site, stack: Stack, target: Target, lock: Path,
                site_lock: SiteLock | None,
                prefix: Path) -> tuple[ModulefilePlan | None, str]:
    """The modulefile asked for (--modulefile, else the site's), its name from the lock's
    hash (known later for a lock made on site), checked: a real run refuses here, a dry
    run shows the refusal in the modulefile's step."""
    sha = sha256_text(lock.read_text(encoding="utf-8")) \
        if not site_lock and lock.is_file() else ""
    modulefile = plan_modulefile(getattr(args, "modulefile", None),
                                 getattr(args, "module_name", None), site.modulefiles,
                                 site.name, stack.name, sha, target)
    if modulefile is None:
        return None, ""
    try:
        check_modulefile(modulefile, prefix, args.force)
    except ProvisionError as exc:
        if not args.dry_run:
            raise
        return modulefile, str(exc)
    return modulefile, ""


def _assume_ops(target: Target, stack: Stack, mode: str, stop: str,
                dry_run: bool) -> tuple[OpsPlan, list[str]]:
    """The ops the plan assumes and the dry run's notes on them; a real run with --ops none
    asks nothing."""
    if not dry_run and parse_mode(mode)[0] == "none":
        return OpsPlan(mode, stop=stop), []
    choice, notes = preview_ops(target, stack, mode)
    unknown = notes[0].removeprefix("ops: ") if choice is None and notes else ""
    return OpsPlan(mode, choice, unknown, stop), notes


def _arch_line(target: Target) -> str:
    """The variable DeepSpeed's op builds read the archs from, as the build sets it."""
    variables = target.arch_env()
    if not variables:
        return "none (CPU target: no TORCH_CUDA_ARCH_LIST / PYTORCH_ROCM_ARCH)"
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())


def _lock(kind: str, stack: Stack, given: str | None, dry_run: bool) -> Path | None:
    """The lock to install: ``given``, else the stack's (conda-lock.yml for --kind conda);
    None when the stack has none committed and a venv/container env can lock on site."""
    if kind == "conda":
        lock = Path(given) if given else conda_lock_path(stack.name)
    else:
        lock = Path(given) if given else stack.lock_path
        if not given and not lock.is_file():
            return None
    if not lock.is_file() and not (dry_run and not given):
        raise ProvisionError(missing_lock(kind, stack, lock))
    return lock


def _site_lock(stack: Stack, sources: Sources, python: str, dry_run: bool) -> SiteLock:
    """What locking on site needs, checked now: the stack's requirements file and an index
    that answers. The real run stops here with one line; a dry run shows it in the step."""
    requirements = requirements_path(stack.name)
    problem = None
    fix = f"run `dsenv lock --stack {stack.name} --out FILE` where it is reachable and pass "
    if not requirements.is_file():
        problem = (f"no lock is committed for stack {stack.name} and there are no "
                   f"requirements to lock on site: {requirements} does not exist; pass "
                   "--lock FILE")
    else:
        for index in dict.fromkeys(sources.indexes()):
            cause = index_unreachable(index, INDEX_PROBE_TIMEOUT)
            if cause:
                # torch's own index is left out when a wheel folder has torch; PyPI's place
                # takes a mirror
                other = ("--find-links DIR with its torch wheel"
                         if index.rstrip("/") == stack.index_url.rstrip("/")
                         and index != sources.index_url else "--index-url MIRROR")
                problem = (f"no lock is committed for stack {stack.name} and its package "
                           f"index {index} cannot be reached from here ({cause}) to lock "
                           f"on site: {fix}--lock FILE, or give {other}")
                break
    if problem and not dry_run:
        raise ProvisionError(problem)
    return SiteLock(stack.name, requirements, sources, _python_version(python), problem)


def _python_version(python: str) -> str:
    """``3.11``: the version of the interpreter the environment is built on (a site lock
    resolves for it); a version string given as --python is taken as it is."""
    result = proc.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                      timeout=30)
    if result.ok and result.stdout.strip():
        return result.stdout.strip()
    given = Path(python).name.removeprefix("python")
    return given if given.replace(".", "").isdigit() else "{}.{}".format(*sys.version_info[:2])

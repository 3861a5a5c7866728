"""``dsenv provision``'s arguments -> :class:`Plan`: everything decided and checked before a
file is written.

    site profile + --arch  -> Target             (targets.py; `auto` through the GPU probes)
    Target + this nvcc     -> Stack              (targets.py; nvcc only when ops are built)
    Stack + --kind         -> lock               (must exist: `dsenv lock` makes it)
    --prefix               -> absolute prefix    (prefix.py; symlinks resolved, free space)
    Stack + --find-links.. -> Sources            (uvcmd.py)
    then the steps, each with its command and variables (what --dry-run prints)

Carrying a plan out is build.py's job.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.envs.sites import Site, load_site
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target

from . import ProvisionError
from .build_ops import available_cpus
from .conda import lock_path as conda_lock_path
from .ops import preview_ops
from .prefix import check_absent, default_prefix, free_space_check, resolve_prefix
from .targets import choose_stack, node_nvcc_version, resolve_arch
from .uvcmd import Sources, stack_sources


@dataclass
class Step:
    title: str
    detail: str = ""
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def render(self) -> list[str]:
        lines = [f"- {self.title}" + (f": {self.detail}" if self.detail else "")]
        if self.command:
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
            lines.append("    $ " + (prefix + " " if prefix else "")
                         + " ".join(shlex.quote(part) for part in self.command))
        elif self.env:
            lines += [f"    {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return lines


@dataclass
class Plan:
    kind: str
    site: Site
    target: Target
    stack: Stack
    lock: Path
    prefix: Path
    python: str
    ops_mode: str
    sources: Sources
    force: bool
    bytecode: bool = True
    dry_run: bool = False  # print the plan, write nothing
    wait: float | None = None  # seconds to wait for another run building the prefix
    notes: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def staging(self) -> Path:
        return self.prefix.with_name(f".{self.prefix.name}.tmp-{os.getpid()}")

    def header(self) -> list[str]:
        return [f"dsenv provision: {self.kind} environment at {self.prefix}",
                f"  site    {self.site.name} ({self.site.title})",
                f"  target  {self.target.describe()} ({self.target.source})",
                f"  stack   {self.stack.name}: {self.stack.torch_requirement}"
                + (f", {self.stack.toolkit}" if self.stack.toolkit else ""),
                f"  lock    {self.lock}",
                f"  python  {self.python}",
                *[f"  note    {note}" for note in self.notes]]

    def render(self) -> str:
        lines = self.header() + ["", "steps (in a staging folder, renamed into place at the "
                                     "end):"]
        for step in self.steps:
            lines += step.render()
        return "\n".join(lines)


def make_plan(args) -> Plan:
    """The parsed ``dsenv provision`` arguments -> Plan (ProvisionError, one line, on bad
    input). The only place that reads them."""
    site = load_site(args.site)
    kind = args.kind or site.default_kind
    target = resolve_arch(args.arch or site.default_arch or "auto")
    # nvcc only matters when ops are compiled: with --ops none it is never used
    toolkit_version = (node_nvcc_version() if target.vendor == "nvidia" and args.ops != "none"
                       else None)
    stack = choose_stack(target, toolkit_version, args.stack or site.default_stack or None)
    lock = _lock(kind, stack, args.lock)
    prefix = resolve_prefix(args.prefix or default_prefix(site, kind, stack))
    check_absent(prefix, args.force)
    sources = stack_sources(stack, args.find_links, args.index_url, args.no_index)
    plan = Plan(kind, site, target, stack, lock.resolve(), prefix, args.python or sys.executable,
                args.ops, sources, args.force, not args.no_bytecode, args.dry_run,
                getattr(args, "wait", None))
    if toolkit_version:
        plan.notes.append(f"ops compile with this node's nvcc {toolkit_version}")
    if plan.dry_run:
        plan.notes += preview_ops(target, stack, plan.ops_mode)
    else:
        plan.notes.append(free_space_check(prefix, stack))
    _add_steps(plan)
    return plan


def _lock(kind: str, stack: Stack, given: str | None) -> Path:
    """The lock to install: ``given``, else the stack's (conda-lock.yml for --kind conda)."""
    if kind == "conda":
        lock = Path(given) if given else conda_lock_path(stack.name)
        regenerate = f"dsenv lock --kind conda --stack {stack.name}"
    else:
        lock = Path(given) if given else stack.lock_path
        regenerate = f"dsenv lock --stack {stack.name}"
    if not lock.is_file():
        raise ProvisionError(f"no lock for stack {stack.name} ({kind}): {lock} does not exist; "
                             f"generate it with `{regenerate}` where the stack's package "
                             f"index ({stack.index_url}) is reachable, or pass --lock FILE")
    return lock


def _add_steps(plan: Plan) -> None:
    env_python = str(plan.staging / "bin" / "python")
    source_args = plan.sources.args()
    if plan.kind == "venv":
        plan.steps.append(Step("create the venv", "relocatable, so it survives the rename",
                               ["uv", "venv", str(plan.staging), "--relocatable", "--python",
                                plan.python]))
        bytecode = ["--compile-bytecode"] if plan.bytecode else []
        plan.steps.append(Step("install the lock, hashes required", "",
                               ["uv", "pip", "sync", "--require-hashes", *bytecode,
                                "--python", env_python, *source_args, str(plan.lock)]))
    elif plan.kind == "container":
        plan.steps.append(Step("create a venv on the image's Python",
                               "--system-site-packages: the image's torch/DeepSpeed stay",
                               ["uv", "venv", str(plan.staging), "--relocatable",
                                "--system-site-packages", "--python", plan.python]))
        plan.steps.append(Step("install what the image lacks", "the lock's lines whose "
                               "version the image does not have, hashes required, --no-deps",
                               ["uv", "pip", "install", "--require-hashes", "--no-deps",
                                "--python", env_python, *source_args, "-r", "<missing lines>"]))
    else:
        plan.steps.append(Step("install the conda lock", "every package's sha256/md5 checked "
                               "against the lock, linked by py-rattler for the final prefix, "
                               "then the pip part with uv --require-hashes",
                               ["dsenv-internal", "install_conda", str(plan.lock),
                                str(plan.staging), f"--final-prefix={plan.prefix}"]))
    ops_env = {"DS_BUILD_OPS": "0", **plan.target.arch_env(), "MAX_JOBS": str(available_cpus())}
    plan.steps.append(Step(
        f"DeepSpeed ops --ops {plan.ops_mode}",
        "chosen by the env's own DeepSpeed op builders for this target; each chosen op gets "
        "DS_BUILD_<OP>=1; skipped when none is chosen",
        ["uv", "pip", "install", "--no-build-isolation", "--reinstall", "--no-deps",
         "--no-cache", "--python", env_python, *source_args, "deepspeed==<locked, hashes>"],
        ops_env))
    plan.steps.append(Step("verify", "DeepSpeed's installed_ops equals the requested ops"
                           + ("; every locked package imports; no shared library is missing"
                              if plan.kind == "container" else "")))
    plan.steps.append(Step("write activate and dsenv-env.json",
                           f"site {plan.site.name}: modules "
                           f"{', '.join(plan.site.modules) or 'none'}; TORCH_EXTENSIONS_DIR in "
                           "the env; HF offline variables inside Slurm jobs"))
    plan.steps.append(Step(f"rename {plan.staging.name} to {plan.prefix}",
                           "replacing the old environment" if plan.force else ""))

"""``dsenv provision`` and ``dsenv lock``: the plan, its dry run, and carrying it out.

    site + --arch -> Target -> Stack -> lock  (checked before anything is written)
    staging folder beside --prefix:           env from the lock (venv | container | conda)
                                              -> DeepSpeed ops chosen by the env's DeepSpeed
                                              -> DS_BUILD_* rebuild, installed_ops verified
                                              -> import / shared-library checks (container)
                                              -> activate script + manifest
    rename the staging folder to --prefix     (a failure or Ctrl-C leaves --prefix untouched)

``--dry-run`` prints every step with its command and variables and writes nothing.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import ProvisionError

KINDS = ("venv", "container", "conda")
# Disk an environment of each vendor's stack takes once installed, with headroom for the op
# build (measured here: the CPU stack's venv is ~1.5 GB; CUDA and ROCm torch wheels with their
# libraries are 5-15 GB installed).
NEEDED_GIB = {"cpu": 3, "nvidia": 12, "amd": 20}


# ----------------------------------------------------------------------------- the plan
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
    site: object  # envs.sites.Site
    target: object  # envs.targets.Target
    stack: object  # envs.stacks.Stack
    lock: Path
    prefix: Path
    python: str
    ops_mode: str
    sources: object  # provision.uvcmd.Sources
    force: bool
    bytecode: bool = True
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


def resolve_prefix(text: str) -> Path:
    """The absolute prefix with every symlink on the way resolved: seed 003's environment
    under /home (a symlink to /s/ls4/users) could not be activated on compute nodes that
    see only the real path."""
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    parent = path.parent.resolve()  # strict=False: a missing parent is created later
    return parent / path.name


def _default_prefix(site, kind: str, stack) -> str:
    root = os.path.expandvars(site.env_root) if site.env_root else "dsenv-envs"
    return os.path.join(root, f"{stack.name}-{kind}")


def _free_space_check(prefix: Path, stack) -> str:
    needed = NEEDED_GIB.get(stack.vendor, 12)
    probe = prefix.parent
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if free < needed:
        raise ProvisionError(
            f"no space for the environment: {free:.1f} GiB free on the file system of "
            f"{probe}, a {stack.name} environment needs about {needed} GiB: free some space "
            "or pass --prefix on another file system")
    return f"{free:.0f} GiB free (needs ~{needed} GiB)"


def _toolkit_version(target) -> str | None:
    """The node's nvcc (CUDA targets) through the doctor's probe; None when there is none."""
    if target.vendor != "nvidia":
        return None
    from dsenv.doctor.probes import toolkit
    from dsenv.doctor.probes.context import Context, Options

    tool = toolkit.nvcc(Context(Options(), env=dict(os.environ)))
    return tool.version if tool.found else None


def make_plan(args) -> Plan:
    """Everything decided and checked before a file is written (one line on bad input)."""
    from dsenv.envs.sites import load_site

    from .targets import choose_stack, resolve_arch

    site = load_site(args.site)
    kind = args.kind or site.default_kind
    arch = args.arch or site.default_arch or "auto"
    target = resolve_arch(arch)
    toolkit_version = _toolkit_version(target) if args.ops != "none" else None
    stack = choose_stack(target, toolkit_version, args.stack or site.default_stack or None)
    if kind == "conda":
        from .conda import lock_path as conda_lock_path

        lock = Path(args.lock) if args.lock else conda_lock_path(stack.name)
        regenerate = f"dsenv lock --kind conda --stack {stack.name}"
    else:
        lock = Path(args.lock) if args.lock else stack.lock_path
        regenerate = f"dsenv lock --stack {stack.name}"
    if not lock.is_file():
        raise ProvisionError(f"no lock for stack {stack.name} ({kind}): {lock} does not exist; "
                             f"generate it with `{regenerate}` where the stack's package "
                             f"index ({stack.index_url}) is reachable, or pass --lock FILE")
    prefix = resolve_prefix(args.prefix or _default_prefix(site, kind, stack))
    if (prefix.exists() or prefix.is_symlink()) and not args.force:
        raise ProvisionError(f"{prefix} already exists: pass --force to replace it (the new "
                             "environment is built beside it and swapped in only when "
                             "complete), or choose another --prefix")
    sources = stack_sources(stack, args.find_links, args.index_url, args.no_index)
    plan = Plan(kind, site, target, stack, lock.resolve(), prefix, args.python or sys.executable,
                args.ops, sources, args.force, not args.no_bytecode)
    if toolkit_version:
        plan.notes.append(f"ops compile with this node's nvcc {toolkit_version}")
    if args.dry_run:
        plan.notes += _ops_preview(target, stack, args.ops)
    else:
        plan.notes.append(_free_space_check(prefix, stack))
    _add_steps(plan)
    return plan


def _ops_preview(target, stack, mode: str) -> list[str]:
    """What --ops would choose, asked of this interpreter's DeepSpeed (the real run asks the
    new environment's DeepSpeed, whose version the lock fixes)."""
    from .ops import choose_ops

    try:
        choice = choose_ops(target, stack, mode, judge_torch=False)
    except ProvisionError as exc:
        return [f"ops: {exc}"]
    lines = [f"ops (DeepSpeed {choice.deepspeed} here): build "
             f"{', '.join(choice.build) or 'none'}"]
    lines += [f"ops: omit {op}: {reason}" for op, reason in choice.omitted.items()]
    lines += [f"ops: {warning}" for warning in choice.warnings]
    return lines


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
    ops_env = {"DS_BUILD_OPS": "0", **plan.target.arch_env(), "MAX_JOBS": str(_jobs())}
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


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- carrying out
def provision(plan: Plan, argv: list[str], console) -> dict:
    """Build the environment in the staging folder, verify it, rename it into place."""
    from dsenv.staging import staged_dir

    from .activation import render_activation
    from .manifest import env_versions, write_manifest

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
        (staging / "activate").write_text(render_activation(
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
    from dsenv.jsonfiles import read_json, write_json_atomically

    from .manifest import manifest_path

    path = manifest_path(staging)
    data = read_json(path, "manifest")
    data["env_dir"] = str(prefix)
    write_json_atomically(path, data, indent=2)


def _create(plan: Plan, staging: Path, log: Path, console, timings: dict) -> Path:
    begin = time.perf_counter()
    sources = plan.sources
    with console.status(f"installing {plan.lock.name} into {plan.kind} environment"):
        if plan.kind == "venv":
            from .venv import create_venv

            staging.rmdir()  # uv venv wants an absent or empty folder: it is empty
            create_venv(staging, plan.lock, python=plan.python,
                        find_links=sources.find_links, index_url=sources.index_url,
                        extra_index_urls=sources.extra_index_urls, no_index=sources.no_index,
                        compile_bytecode=plan.bytecode, log=log)
        elif plan.kind == "container":
            from .container import create_container_env

            staging.rmdir()
            container = create_container_env(
                staging, plan.lock, base_python=plan.python, find_links=sources.find_links,
                index_url=sources.index_url, extra_index_urls=sources.extra_index_urls,
                no_index=sources.no_index, compile_bytecode=plan.bytecode, log=log)
            console.print(f"image: {container.summary()}")
        else:
            from .conda import install_conda

            install_conda(plan.lock, staging, final_prefix=plan.prefix)
    timings["install_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] {plan.kind} environment from {plan.lock.name} "
                  f"({timings['install_s']:.0f} s)")
    return staging / "bin" / "python"


def _ops(plan: Plan, python: Path, log: Path, console, timings: dict):
    from .build_ops import build_ops
    from .locks import locked_requirement
    from .ops import OpsChoice, choose_ops

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
    built = build_ops(python, {k: v for k, v in choice.env().items() if k.startswith("DS_BUILD")},
                      plan.target.arch_env(), deepspeed_requirement=requirement, log=log,
                      find_links=plan.sources.find_links, index_url=plan.sources.index_url,
                      extra_index_urls=plan.sources.extra_index_urls,
                      compile_bytecode=plan.bytecode,
                      env={**os.environ, "DS_ACCELERATOR": choice.accelerator},
                      console=console)
    timings["ops_build_s"] = time.perf_counter() - begin
    console.print(f"[green]✓[/] DeepSpeed ops precompiled and verified: "
                  f"{', '.join(built.ops)} ({timings['ops_build_s']:.0f} s, log dsenv-build.log)")
    return choice, built


def _installed_version(python: Path, dist: str) -> str:
    from dsenv import proc

    result = proc.run([str(python), "-c", f"import importlib.metadata as m; "
                       f"print(m.version({dist!r}))"], timeout=60)
    if result.returncode != 0:
        raise ProvisionError(f"the environment has no {dist}: add it to the lock")
    return result.stdout.strip()


def _installed_ops(python: Path) -> dict:
    from .build_ops import read_deepspeed

    try:
        info = read_deepspeed(python)
    except ProvisionError:
        return {}
    return (info or {}).get("installed_ops") or {}


def _container_checks(plan: Plan, python: Path, staging: Path, console) -> None:
    from .container import import_check_lock, missing_shared_libraries

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


# ----------------------------------------------------------------------------- CLI
def add_parsers(subparsers) -> None:
    from dsenv.envs.sites import site_names

    p = subparsers.add_parser(
        "provision", help="build a locked environment with DeepSpeed ops precompiled for a "
                          "GPU arch",
        description="Build a reproducible environment from a lock (venv with uv, a venv inside "
                    "a vendor container, or conda), precompile DeepSpeed's ops for the GPU "
                    "architecture, verify them, and write an activate script and a manifest. "
                    "Built beside --prefix and renamed into place at the end. Exit 0: done; "
                    "2: bad input or a failed step (one line).")
    p.add_argument("--arch", metavar="SPEC",
                   help="7.0, 8.0;9.0, sm_80, gfx90a, a GPU name (V100, A100, H100, MI250X...), "
                        "cpu, or auto (the GPUs of this node; default: the site's, else auto)")
    p.add_argument("--kind", choices=KINDS, help="environment kind (default: the site's)")
    p.add_argument("--site", choices=site_names(), help="site profile (default generic)")
    p.add_argument("--stack", metavar="NAME", help="software stack from envs/stacks.toml "
                                                   "(default: chosen from the arch)")
    p.add_argument("--ops", default="auto", metavar="auto|none|all|LIST",
                   help="DeepSpeed ops to precompile (default auto: every op DeepSpeed allows "
                        "for the arch that can be built here)")
    p.add_argument("--prefix", metavar="DIR", help="where the environment goes (default: "
                                                   "the site's env root, else ./dsenv-envs/"
                                                   "STACK-KIND)")
    p.add_argument("--lock", metavar="FILE", help="install this lock instead of the stack's")
    p.add_argument("--python", metavar="PY", help="interpreter the venv is based on (default: "
                                                  "this one; --kind container: the image's)")
    p.add_argument("--find-links", action="append", metavar="DIR",
                   help="local wheel folder (default: the stack's, when present)")
    p.add_argument("--index-url", metavar="URL", help="package index (default PyPI)")
    p.add_argument("--no-index", action="store_true",
                   help="install only from --find-links folders and uv's cache (offline)")
    p.add_argument("--no-bytecode", action="store_true",
                   help="do not write .pyc files at install (faster install, slower first "
                        "import)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan: every step, command and variable; write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing --prefix")
    from .openmpi_cli import add_openmpi_parser

    what = p.add_subparsers(dest="provision_what", metavar="WHAT", required=False,
                            title="also provisions (optional)")
    add_openmpi_parser(what)

    lock = subparsers.add_parser(
        "lock", help="regenerate a stack's hashed lock (uv pip compile / conda-lock)",
        description="Resolve envs/requirements/STACK.in (venv) or envs/conda/STACK.yml (conda) "
                    "into a lock with hashes, written atomically into envs/.")
    lock.add_argument("--kind", choices=("venv", "conda"), default="venv")
    lock.add_argument("--stack", required=True, metavar="NAME")
    lock.add_argument("--find-links", action="append", metavar="DIR")
    lock.add_argument("--index-url", metavar="URL")
    lock.add_argument("--out", metavar="FILE", help="write here instead of envs/")
    lock.add_argument("--upgrade", action="store_true", help="re-resolve to newest versions")
    lock.add_argument("--conda", metavar="EXE", help="conda/mamba/micromamba for conda-lock")


def run_provision(args, argv: list[str]) -> int:
    if getattr(args, "provision_what", None) == "openmpi":
        from .openmpi_cli import run_openmpi

        return run_openmpi(args, argv)
    from rich.console import Console

    console = Console(highlight=False)
    plan = make_plan(args)
    if args.dry_run:
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


def run_lock(args) -> int:
    from dsenv.envs.stacks import get_stack

    stack = get_stack(args.stack)
    if args.kind == "conda":
        from .conda import lock_conda, lock_path, recipe_path

        out = lock_conda(recipe_path(stack.name), Path(args.out or lock_path(stack.name)),
                         conda_exe=args.conda)
    else:
        from .locks import LINUX_X86_64, compile_lock, lock_path, requirements_path

        sources = stack_sources(stack, args.find_links, args.index_url)
        command = ["dsenv lock --stack", stack.name]
        command += [f"--find-links {link}" for link in sources.find_links]
        if args.index_url:
            command.append(f"--index-url {args.index_url}")
        out = compile_lock(requirements_path(stack.name),
                           Path(args.out or lock_path(stack.name)),
                           python_platform=LINUX_X86_64, find_links=sources.find_links,
                           index_url=sources.index_url,
                           extra_index_urls=sources.extra_index_urls,
                           regenerate=" ".join(command), upgrade=args.upgrade)
    print(f"dsenv lock: wrote {out}")
    return 0


def stack_sources(stack, find_links=None, index_url=None, no_index=False):
    """Where a stack's packages come from: PyPI (or ``index_url``), plus torch's own index
    (download.pytorch.org/whl/cu126 ...) as an extra index, which uv asks first, unless
    the stack's torch is on PyPI or in a local wheel folder (CI keeps the CPU wheel there)."""
    from .uvcmd import PYPI, Sources

    links = list(find_links or stack.available_find_links())
    torch_index = stack.index_url.rstrip("/")
    extra = [] if torch_index in (PYPI.rstrip("/"), "") or links else [stack.index_url]
    return Sources.of(links, index_url, extra, no_index)


"""python: the environment under test (the job's: --env, else the activated one), its
interpreter, symlinked prefixes, what the job will really import (PYTHONPATH, user site, .pth
files, two copies of a package), broken requirements, drift from the lock a
dsenv-provisioned environment was installed from."""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from dsenv.data import load_table
from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.python import (
    build_imports,
    deepspeed_info,
    imports,
    launchers,
    pyenv,
    sharedlibs,
    target_env,
)
from dsenv.facts.python.torch_info import NOT_INSTALLED
from dsenv.provision import ProvisionError
from dsenv.provision.record import manifest as env_manifest
from dsenv.verdicts import job_env
from dsenv.verdicts.findings import fail, ok, skip, warn
from dsenv.workloads import registry
from dsenv.workloads.errors import WorkloadError


@check("python.interpreter", "Interpreter and environment")
def interpreter(ctx: Context):
    """The environment under test: which one, why, and whether its interpreter runs."""
    env = target_env.environment(ctx)
    interp = pyenv.interpreter(ctx)
    evidence = [f"judged: {env.why}", f"prefix: {interp.prefix}"]
    if env.probed:
        evidence.append("sys.path: " + " ".join(env.path))
        if env.user_site:
            evidence.append(f"user site enabled: {env.user_site}")
    if interp.conda_prefix_env and interp.kind != "conda":
        evidence.append(f"CONDA_PREFIX={interp.conda_prefix_env} (a conda env is active, "
                        "but this interpreter is not its python)")
    if env.preloaded:
        evidence.append(f"a .pth file imports {', '.join(env.preloaded)} at every start of "
                        "this interpreter")
    if not env.probed:
        what = (f"{env.python} cannot run here ({env.problem})" if env.python else
                f"no python in {interp.prefix}/bin")
        return warn(f"{what}: {interp.prefix} was judged from its files only, without "
                    "PYTHONPATH, .pth files or the user site",
                    "judge the environment through an interpreter that runs: `dsenv doctor "
                    "--env /path/to/env/bin/python` (on a node of the job's architecture)",
                    *evidence)
    summary = f"Python {interp.version} at {interp.executable}"
    runs = env.sys_prefix
    unseen = [str(d) for d in pyenv.site_dirs(interp.prefix)
              if not any(_same(d, entry) for entry in env.path)]
    if runs is not None and not _same(runs, interp.prefix) and unseen:
        return warn(f"{interp.executable} runs with sys.prefix {runs}, not {interp.prefix}: "
                    f"the packages installed in {interp.prefix} are not on its path",
                    f"recreate the environment so its python belongs to it (`python -m venv "
                    f"{interp.prefix}`), or give the right interpreter with --env", *evidence)
    if interp.kind == "venv":
        base = interp.base_prefix
        evidence.append(f"pyvenv.cfg home = {interp.venv_config.get('home', '?')}")
        if not interp.system_site_packages:
            return ok(f"{summary} (venv)", *evidence)
        shadowed = pyenv.shadowed_packages(interp)
        summary += f" (venv with system site packages from {base})"
        if shadowed:
            names = " ".join(name for name, _, _ in shadowed)
            return warn(
                summary + ": the venv installs its own "
                + ", ".join(f"{n} {mine} over the base's {theirs}" for n, mine, theirs in shadowed),
                f"keep the base environment's builds: `{interp.executable} -m pip uninstall -y "
                f"{names}` (then install with --no-deps where pip wanted to replace them)",
                *evidence)
        return ok(summary, *evidence)
    if interp.kind == "conda":
        return ok(f"{summary} (conda env)", *evidence)
    return ok(f"{summary} (base interpreter, no venv or conda env)", *evidence)


def _same(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@check("python.shadowing", "What the job will import")
def shadowing(ctx: Context):
    """Each training package as `import` will load it, against every other copy on the path."""
    env = target_env.environment(ctx)
    python = env.python or "python"
    found, problems = [], []
    for name in pyenv.TRAINING_PACKAGES:
        view = imports.view(ctx, name)
        if not view.copies:
            continue
        found.append(_where(view))
        problems += shadow_problems(view, python)
    if not found:
        return skip(f"none of the training packages is installed in {env.prefix}: nothing "
                    "to compare (torch.build and deepspeed.install say what is missing)")
    if problems:
        summaries = [summary for summary, _ in problems]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        fixes = list(dict.fromkeys(fix for _, fix in problems))
        return warn(summaries[0] + more, "; ".join(fixes), *summaries[1:], *found)
    return ok(f"{len(found)} training packages, each imported from the one copy its metadata "
              "describes", *found)


def _where(view: imports.PackageView) -> str:
    if view.imported is None:
        return f"{view.name}: metadata only, `import {view.module}` fails"
    return (f"{view.name} {view.imported_version or '(version unknown)'} from "
            f"{view.imported.module} ({view.imported.where})")


def _same_release(a: str | None, b: str | None) -> bool:
    """'2.1.0+cu121' and '2.1.0' are one release (conda records no local label)."""
    if a is None or b is None:
        return False
    try:
        return Version(a).public == Version(b).public
    except InvalidVersion:
        return a == b


LEAKS = ("PYTHONPATH", "user", "pth")  # copies that come from outside the environment


def _fix_for(imported: imports.Copy, other: imports.Copy, name: str, python: str) -> str:
    """Remove whichever copy comes from outside the environment (the imported one first)."""
    copy = imported if imported.origin in LEAKS or other.origin not in LEAKS else other
    if copy.origin == "PYTHONPATH":
        return (f"unset PYTHONPATH (or drop {copy.entry} from it) where the job starts: job "
                "script, shell startup files, modules")
    if copy.origin == "user":
        files = " ".join([str(copy.module), *(d.path for d in copy.dists)])
        return ("export PYTHONNOUSERSITE=1 in the job script (containers bind $HOME, so "
                f"~/.local comes along), or remove the user copy: `rm -r {files}`")
    if copy.origin == "pth":
        return f"remove the line that adds {copy.entry} from {copy.detail}"
    return (f"remove the copy you do not want: `{python} -m pip uninstall -y {name}` (repeat "
            "until none is left), then install one")


def shadow_problems(view: imports.PackageView, python: str) -> list[tuple[str, str]]:
    """(what is wrong, the fix) for one package: another copy under the imported one,
    metadata that describes another copy, two installs in one folder, pip over conda."""
    found = []
    name, imported, version = view.name, view.imported, view.imported_version
    shown = version or "(version unknown)"
    if imported is not None:
        for other in view.others():
            if imported.origin == "env" and other.origin == "base":
                continue  # a venv's own copy over its base's: python.interpreter says it
            theirs = imports.own_version(other.module, view.module) or next(
                (d.version for d in other.dists), None)
            if version is not None and theirs is not None and _same_release(version, theirs):
                continue
            found.append((f"{name} {shown} from {imported.where} ({imported.entry}) shadows "
                          f"{name} {theirs or '(version unknown)'} in {other.where} "
                          f"({other.entry})", _fix_for(imported, other, name, python)))
        for stale in (c for c in view.copies if not c.module and version is not None):
            for dist in stale.dists:
                if not dist.editable and not _same_release(dist.version, version):
                    found.append((f"{dist.path} ({stale.where}) says {name} {dist.version}, but "
                                  f"holds no {view.module} package: pip and importlib.metadata "
                                  f"report it while `import` loads {shown} from "
                                  f"{imported.module}", f"remove the stale metadata: `rm -r "
                                  f"{dist.path}`"))
    for copy in view.copies:
        if len(copy.dists) > 1:
            listed = " and ".join(d.describe() for d in copy.dists)
            found.append((f"{name} is installed twice in {copy.entry} ({copy.where}): {listed}; "
                          f"its files are whichever was written last ({shown})",
                          f"remove both and install one: `{python} -m pip uninstall -y {name}` "
                          "(repeat until none is left), then reinstall it"))
    if view.conda_version and imported is not None and version is not None and \
            not _same_release(view.conda_version, version):
        conda_name = next((k for k, v in imports.CONDA_NAMES.items() if v == name), name)
        found.append((f"conda's record says {conda_name} {view.conda_version}, but {name} "
                      f"{version} is what imports ({imported.module}): pip installed over "
                      "conda's package", f"keep one installer: `conda remove --force "
                      f"{conda_name}` (keeps pip's), or `{python} -m pip uninstall -y {name} && "
                      f"conda install --force-reinstall {conda_name}`"))
    return found


@check("python.prefix-symlink", "Environment prefix reached through a symlink")
def prefix_symlink(ctx: Context):
    interp = pyenv.interpreter(ctx)
    found = pyenv.symlinked_component(interp.prefix)
    if found is None:
        return ok(f"{interp.prefix} is a real path")
    link, target = found
    real_prefix = target / interp.prefix.absolute().relative_to(link)
    if interp.kind == "conda":
        fix = (f"recreate the env under the real path (`conda create -p {real_prefix} ...`) "
               f"or activate it through it in batch scripts: `conda activate {real_prefix}`")
    elif interp.kind == "venv":
        fix = f"recreate the venv through the real path: `python -m venv {real_prefix}`"
    else:
        fix = f"call the interpreter through the real path: {real_prefix}/bin/python"
    return warn(
        f"the {interp.kind} prefix {interp.prefix} goes through the symlink {link} -> {target}; "
        "batch jobs where that link is missing or different cannot activate it",
        fix, f"real prefix: {real_prefix}")


@check("python.launcher-scripts", "Launcher scripts on PATH (deepspeed, torchrun, accelerate)")
def launcher_scripts(ctx: Context):
    """What `deepspeed ...` or `torchrun ...` in a job script starts: the environment's own
    script, another environment's, or nothing (DeepSpeed#3308, #1927)."""
    found = launchers.launchers(ctx)
    installed = [f for f in found if f.own is not None]
    if not installed:
        return skip(f"{target_env.environment(ctx).prefix} has no launcher script "
                    f"({', '.join(launchers.NAMES)}): nothing of it to find on PATH")
    evidence = [f"{f.name}: PATH finds {f.on_path or 'nothing'}"
                + (f" (runs {f.runs})" if f.on_path and f.runs else "")
                + f"; the environment's is {f.own}" for f in installed]
    missing = [f for f in installed if f.on_path is None]
    if missing:
        folder = missing[0].own.parent
        return mode_finding(
            fail, "env.scripts-not-on-path",
            f"{', '.join(f.name for f in missing)} {'is' if len(missing) == 1 else 'are'} "
            f"installed in {folder} but {folder} is not on PATH: a job script's "
            f"`{missing[0].name} ...` says command not found", *evidence,
            here=f"export PATH={folder}:$PATH in the job script, or "
                 f"`{folder.parent / 'bin' / 'python'} -m deepspeed.launcher.runner`")
    other = [f for f in installed if not f.is_own]
    if other:
        first = other[0]
        return warn(f"`{first.name}` on PATH is {first.on_path}"
                    + (f" (it runs {first.runs})" if first.runs else "")
                    + f", not this environment's {first.own}: a job script would launch "
                    "another environment's training stack",
                    f"put {first.own.parent} first on PATH in the job script (activate the "
                    f"environment), or call {first.own} by its full path", *evidence)
    return ok(f"{', '.join(f.name for f in installed)} on PATH "
              f"{'is' if len(installed) == 1 else 'are'} this environment's own", *evidence)


@check("python.requirements", "Training packages' requirements (pip check)")
def requirements(ctx: Context):
    report = pyenv.requirement_report(ctx)
    if not report.checked:
        return skip(f"none of the training packages is installed in "
                    f"{target_env.environment(ctx).prefix}: no requirement to check "
                    "(torch.build and deepspeed.install say what is missing)")
    if report.problems:
        interp = pyenv.interpreter(ctx)
        # An installed DeepSpeed older than a package asks for; torchvision/torchaudio pinned
        # to another torch than the installed one (their operators are built for it); else two
        # packages of the stack from releases apart.
        problems = report.problems
        old_deepspeed = any(p.name.lower() == "deepspeed" and p.installed for p in problems)
        vision_for_other_torch = any(
            p.package.lower() in ("torchvision", "torchaudio") and p.name.lower() == "torch"
            and p.installed for p in problems)
        return mode_finding(
            fail, "deepspeed.version-too-old" if old_deepspeed else
            "env.torchvision-other-torch" if vision_for_other_torch else
            "env.package-version-mismatch",
            f"{len(report.problems)} broken requirement(s) among the training packages",
            *(p.describe() for p in report.problems),
            here=pyenv.pip_install_command(interp.executable, report.problems))
    return ok(f"{len(report.checked)} training packages and direct requirements consistent",
              ", ".join(report.checked))


@check("python.workload-packages", "Packages the workload imports")
def workload_packages(ctx: Context):
    workload = ctx.options.workload
    if not workload:
        return skip("no --for WORKLOAD given")
    try:
        wanted = registry.entry(workload).imports
    except WorkloadError as exc:
        return skip(str(exc))
    env = target_env.environment(ctx)
    missing = job_env.missing_imports(ctx, wanted)
    if missing:  # the run stops at its first import: not ready, on any target
        return mode_finding(
            fail, "env.package-missing",
            f"{', '.join(missing)} not installed in {env.prefix}, the environment judged "
            f"({env.why}): `dsenv run {workload}` stops at its imports",
            here="build the environment with `dsenv provision` (its lock has them), or "
                 f"`{env.python or 'python'} -m pip install {' '.join(missing)}`")
    have = job_env.installed(ctx)
    return ok(f"{len(wanted)} packages {workload} imports are installed",
              ", ".join(f"{n} {have[job_env.canonical(n)]}" for n in wanted))


@check("python.system-libraries", "System libraries packages load (ldd)")
def system_libraries(ctx: Context):
    """Packages whose extension modules link system libraries a slim image or a minimal node
    lacks (envs/training_stack.toml: opencv-python's cv2 and X11/OpenGL/GLib): ldd says
    which the import would not find, before the job's first `import cv2` does."""
    env = target_env.environment(ctx)
    rows = load_table("dsenv.envs", "training_stack.toml")["python"]["system_library_users"]
    files: list[Path] = []
    users = []
    for row in rows:
        folder = target_env.module_folder(ctx, row["module"])
        found = sorted(p for pattern in row["files"] for p in folder.glob(pattern)) if folder \
            else []
        if found:
            users.append(row)
            files += found[:4]  # one build per wheel: a few files say it all
    if not files:
        names = ", ".join(r["module"] for r in rows)
        return skip(f"no package that links system libraries ({names}) has an extension "
                    f"module in {env.prefix}: nothing to look at")
    if ctx.which("ldd") is None:
        return skip("ldd is not on PATH: the extension modules' libraries cannot be listed")
    report = sharedlibs.unresolved(ctx, files)
    if not report.read:
        return skip("ldd could not read the extension modules: " + "; ".join(
            f"{Path(f).name}: {why}" for f, why in report.unread.items()))
    absent = sorted({lib for libs in report.missing.values() for lib in libs})
    evidence = [f"{f}: {', '.join(libs) or 'all found'}" for f, libs in report.missing.items()]
    if absent:
        row = users[0]
        return mode_finding(
            fail, "loader.system-library-missing",
            f"{', '.join(absent)} not found for {', '.join(r['module'] for r in users)} in "
            f"{env.prefix}: `import {row['module']}` fails with \"cannot open shared object "
            "file\"", *evidence,
            here=f"install the system packages that provide {', '.join(absent)} on this node or "
                 f"in the image ({row['needs']}), or use {row['headless']}")
    return ok(f"{', '.join(r['module'] for r in users)}: every library its extension modules "
              "link is found", *evidence)


@check("python.build-imports", "pkg_resources for torch's op builds")
def build_imports_check(ctx: Context):
    """torch <= 2.1's cpp_extension, which every op build imports, takes ``packaging`` from
    pkg_resources: setuptools 70.x does not export it and setuptools >= 82 has no
    pkg_resources (DeepSpeed#5649, pytorch/pytorch#187188). The statements are run in the
    job's interpreter, as the build will run them."""
    found = build_imports.build_imports(ctx)
    prefix = target_env.environment(ctx).prefix
    if found.torch_version is None:
        return skip(f"{NOT_INSTALLED}: no extension builder to judge")
    if found.builder is None:
        return ok(f"torch {found.torch_version}'s extension builder imports nothing from "
                  "pkg_resources: any setuptools serves it")
    statements = "; ".join(found.statements)
    evidence = (f"{found.builder}: {statements}",
                f"setuptools in {prefix}: {found.setuptools or 'not installed'}")
    if not found.asked:
        return skip(f"`{statements}` was not run ({found.not_asked}): whether the op builds "
                    "can import it is not known", *evidence)
    if found.error:
        python = target_env.environment(ctx).python
        return mode_finding(
            fail, "env.pkg-resources-unavailable",
            f"torch {found.torch_version}'s extension builder runs `{statements}`, which "
            f"fails in {prefix} (setuptools {found.setuptools or 'not installed'}): every op "
            "build stops there", *evidence, f"{python}: {found.error}",
            here=f"{python} -m pip install 'setuptools>=71,<82' (or torch >= 2.2, whose "
                 "extension builder does not import pkg_resources)")
    return ok(f"torch {found.torch_version}'s extension builder imports pkg_resources; "
              f"setuptools {found.setuptools} provides what it asks", *evidence)


@check("python.env-drift", "Environment matches its dsenv lock")
def env_drift(ctx: Context):
    """The environment under test against the manifest `dsenv provision` wrote into it."""
    prefix = Path(target_env.environment(ctx).prefix)
    try:
        recorded = env_manifest.read_manifest(prefix)
    except ProvisionError as exc:
        return warn(f"the environment's manifest cannot be read: {exc}",
                    f"re-provision the environment (`dsenv provision ... --force`) or delete "
                    f"{prefix / env_manifest.MANIFEST_NAME} if dsenv no longer manages it")
    if recorded is None:
        return skip(f"not provisioned by dsenv (no {env_manifest.MANIFEST_NAME} in {prefix})")
    lock_path = Path(recorded.lock.get("path", ""))
    lock_text = lock_path.read_text(errors="replace") if lock_path.is_file() else None
    installed = env_manifest.installed_versions(pyenv.search_path(ctx))
    ds, _ = deepspeed_info.installs(ctx)
    problems = env_manifest.drift(recorded, installed, lock_text,
                                  ds.installed_ops if ds is not None else None)
    evidence = [f"provisioned {recorded.created} on {recorded.host}: {recorded.kind}, stack "
                f"{recorded.stack}, lock {recorded.lock.get('file')}",
                f"precompiled ops recorded: {', '.join(recorded.ops.get('installed', ())) or 'none'}"]
    if lock_text is None:
        evidence.append(f"lock {lock_path} is gone: compared with the pins recorded in the "
                        "manifest")
    if not problems:
        return ok(f"{len(recorded.packages)} locked packages as provisioned (stack "
                  f"{recorded.stack}, {recorded.lock.get('file')})", *evidence)
    command = " ".join(recorded.command) if recorded.command else "dsenv provision ..."
    if "--force" not in recorded.command:
        command += " --force"
    python = target_env.environment(ctx).python or prefix / "bin" / "python"
    sync = (f"uv pip sync --require-hashes --python {python} {lock_path}" if lock_text
            else None)
    changed_lock = any(p.startswith("lock ") for p in problems)
    fix = f"re-provision: `{command}`"
    if sync and not changed_lock:
        fix += f", or put the locked versions back in place: `{sync}`"
    shown = ", ".join(p.split(":")[0] for p in problems[:5]) + (" ..." if len(problems) > 5
                                                                else "")
    return warn(f"{len(problems)} difference(s) from the environment dsenv provisioned: {shown}",
                fix, *problems, *evidence)

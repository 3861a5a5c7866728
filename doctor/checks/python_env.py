"""python: interpreter and environment kind, symlinked prefixes, broken requirements, drift
from the lock a dsenv-provisioned environment was installed from."""

from __future__ import annotations

from pathlib import Path

from dsenv.provision import ProvisionError
from dsenv.provision import manifest as env_manifest

from ..probes import deepspeed_info, pyenv
from ..probes.context import Context
from ..probes.result import fail, ok, skip, warn
from ..registry import check


@check("python.interpreter", "Interpreter and environment")
def interpreter(ctx: Context):
    interp = pyenv.interpreter(ctx)
    summary = f"Python {interp.version} at {interp.executable}"
    evidence = [f"prefix: {interp.prefix}"]
    if interp.conda_prefix_env and interp.kind != "conda":
        evidence.append(f"CONDA_PREFIX={interp.conda_prefix_env} (a conda env is active, "
                        "but this interpreter is not its python)")
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


@check("python.requirements", "Training packages' requirements (pip check)")
def requirements(ctx: Context):
    report = pyenv.requirement_report(ctx)
    if not report.checked:
        return ok("none of the training packages is installed here; nothing to check")
    if report.problems:
        interp = pyenv.interpreter(ctx)
        return fail(
            f"{len(report.problems)} broken requirement(s) among the training packages",
            pyenv.pip_install_command(interp.executable, report.problems),
            *(p.describe() for p in report.problems))
    return ok(f"{len(report.checked)} training packages and direct requirements consistent",
              ", ".join(report.checked))


@check("python.env-drift", "Environment matches its dsenv lock")
def env_drift(ctx: Context):
    """The running environment against the manifest `dsenv provision` wrote into it."""
    prefix = Path(ctx.python_prefix)
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
    python = prefix / "bin" / "python"
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

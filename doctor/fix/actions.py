"""Fixes as data, built by the checks: what `dsenv doctor --fix` may change, or the command to
run by hand (dsenv/verdicts/findings.py's FixAction; doctor/fix/fixers.py applies them).

Only safe, local, reversible changes are applicable:

- ``activate-offline-vars``, ``activate-extensions-dir``, ``activate-nccl-vars``,
  ``activate-cache-vars`` (Triton/MIOpen caches on node-local disk): a marked block of
  exports in the environment's activate script (the one `dsenv provision` writes;
  a backup beside it, and deleting the block undoes it);
- ``remove-stale-lock``: a torch-extensions ``lock`` that no process holds;
- ``create-cache-dir``: a missing cache folder, private (0700) under the home folder,
  0755 elsewhere.

Anything else (system files, packages, a script another user owns) is left to the user with
the command that does it.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path

from dsenv.doctor.context import Context
from dsenv.facts.host.mounts import nearest_existing
from dsenv.facts.python import target_env
from dsenv.provision.record.activation import ACTIVATE_NAME
from dsenv.verdicts.findings import FixAction

# The fix kinds: their one home. doctor/fix/fixers.py's FIXERS has one fixer per kind, the
# report schema's action.kind enum and doctor/modes/*.toml's `fixable` name only these
# (tests/test_tables_agree.py).
OFFLINE, EXTENSIONS, NCCL, CACHE = ("activate-offline-vars", "activate-extensions-dir",
                                    "activate-nccl-vars", "activate-cache-vars")
REMOVE_LOCK, CREATE_DIR = "remove-stale-lock", "create-cache-dir"
ACTIVATE_KINDS = (OFFLINE, EXTENSIONS, NCCL, CACHE)
KINDS = (*ACTIVATE_KINDS, REMOVE_LOCK, CREATE_DIR)
DSENV_HEADER = "# dsenv environment "  # the first line of every activate script dsenv writes
PRIVATE, SHARED = 0o700, 0o755


def activate_script(ctx: Context) -> tuple[Path | None, str | None]:
    """(the activate script of the environment under test, None), or (None, why `--fix`
    cannot write one): it must be dsenv's, yours and writable."""
    try:
        python, prefix, _source, _chosen = target_env.choose(ctx)
    except Exception as exc:  # noqa: BLE001 - a bad --env is reported before any check
        return None, f"the environment could not be resolved ({exc})"
    if prefix is None:
        prefix = Path(python).absolute().parent.parent if python else None
    if prefix is None:
        return None, "no environment under test"
    script = Path(prefix) / ACTIVATE_NAME
    return script, writable_script(script)


def writable_script(script: Path) -> str | None:
    """None when `--fix` may rewrite ``script``, else why not."""
    try:
        with open(script, encoding="utf-8", errors="replace") as handle:
            head = handle.readline()
        info = script.stat()
    except OSError:
        return (f"{script.parent} has no activate script of `dsenv provision` (add the "
                "exports to the job script)")
    if not head.startswith(DSENV_HEADER):
        return f"{script} was not written by `dsenv provision`: dsenv edits only its own"
    if info.st_uid != os.geteuid():
        return f"{script} belongs to uid {info.st_uid}, not to you"
    if not (os.access(script, os.W_OK) and os.access(script.parent, os.W_OK | os.X_OK)):
        return f"{script} (or its folder) is not writable"
    return None


def exports_text(variables: Mapping[str, str] | tuple[tuple[str, str], ...]) -> str:
    pairs = variables.items() if isinstance(variables, Mapping) else variables
    return " ".join(f"{name}={shlex.quote(value) if '$' not in value else value}"
                    for name, value in pairs)


def activate_exports(ctx: Context, kind: str, variables: Mapping[str, str],
                     guard: str | None = None, unset: tuple[str, ...] = (),
                     why_not: str | None = None) -> FixAction:
    """Export ``variables`` (and unset ``unset``) in the environment's activate script
    (``guard`` "slurm": only inside a Slurm job, as `dsenv provision` writes the offline
    variables). ``why_not``: a reason the check knows to leave it to the user."""
    assert kind in ACTIVATE_KINDS, kind
    script, no_script = activate_script(ctx)
    why_not = why_not or no_script
    steps = ([f"export {exports_text(variables)}"] if variables else []) + \
        ([f"unset {' '.join(unset)}"] if unset else [])
    shown = "; ".join(steps)
    when = " inside Slurm jobs (SLURM_JOB_ID set)" if guard == "slurm" else ""
    pairs = tuple(variables.items())
    if script is None or why_not:
        return FixAction(kind, f"`{shown}`{when} in the job script", None, False, shown,
                         pairs, unset, guard, why_not=why_not)
    return FixAction(kind, f"write `{shown}`{when} into {script}", str(script), True, shown,
                     pairs, unset, guard)


# NCCL variables whose value means "NCCL's default": exported, they also override a line in
# NCCL's configuration files (a variable set in the environment always wins over them).
NCCL_NEUTRAL = {"NCCL_P2P_DISABLE": "0", "NCCL_SHM_DISABLE": "0", "NCCL_IB_DISABLE": "0"}


def nccl_reset(ctx: Context, settings: list[tuple[str, str]]) -> FixAction:
    """Put NCCL variables back to NCCL's default from the activate script. ``settings``:
    (name, where it is set: "environment" or a configuration file). A neutral value where
    NCCL has one, else ``unset`` (which only helps for a variable from the environment)."""
    variables, unset, files = {}, [], []
    for name, source in settings:
        if name in NCCL_NEUTRAL:
            variables[name] = NCCL_NEUTRAL[name]
        elif source == "environment":
            unset.append(name)
        else:
            files.append(f"{name} is set in {source}")
    why_not = (f"{'; '.join(files)}: delete the line there (dsenv edits no configuration "
               "file)") if files else None
    return activate_exports(ctx, NCCL, variables, unset=tuple(dict.fromkeys(unset)),
                            why_not=why_not)


def remove_locks(locks: list[Path], why_not: str | None = None) -> FixAction:
    """Remove build locks that no process holds (``why_not``: one may still be live)."""
    shown = ", ".join(map(str, locks))
    return FixAction(REMOVE_LOCK, f"remove the stale build lock(s) {shown}", str(locks[0]),
                     why_not is None, "rm " + " ".join(shlex.quote(str(p)) for p in locks),
                     why_not=why_not, paths=tuple(map(str, locks)))


def folder_mode(path: Path, env: Mapping[str, str]) -> int:
    """0700 for a cache under the home folder (yours alone), 0755 elsewhere (a project or
    scratch folder others of the group may read)."""
    home = env.get("HOME") or os.path.expanduser("~")
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(home))
        return PRIVATE
    except ValueError:
        return SHARED


def may_create_in(parent: Path | None) -> str | None:
    """None when `--fix` may create folders under ``parent`` (an existing folder you own and
    can write, or a sticky world-writable one such as /tmp), else why not."""
    if parent is None or not parent.is_dir():
        return f"{parent} is not a folder" if parent else "no part of the path exists"
    try:
        info = parent.stat()
    except OSError as exc:
        return f"{parent}: {exc.strerror}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    if info.st_uid != os.geteuid() and not info.st_mode & stat.S_ISVTX:
        return f"{parent} belongs to uid {info.st_uid}: dsenv creates folders only in yours"
    return None


def create_dirs(paths: list[Path], env: Mapping[str, str]) -> FixAction:
    """Create the missing cache folders ``paths`` (with their missing parents)."""
    mode = folder_mode(paths[0], env)
    why_not = next(filter(None, (may_create_in(nearest_existing(p)) for p in paths)), None)
    shown = ", ".join(map(str, paths))
    return FixAction(CREATE_DIR, f"create {shown} (mode {mode:04o})", str(paths[0]),
                     why_not is None, f"mkdir -p -m {mode:04o} "
                     + " ".join(shlex.quote(str(p)) for p in paths),
                     mode=mode, why_not=why_not, paths=tuple(map(str, paths)))

"""The fixers of `dsenv doctor --fix`: one small function per kind of FixAction
(doctor/fix/actions.py builds them), each safe, local and reversible.

- activate-*: a marked block in the environment's activate script, replaced (never appended
  twice) on the next fix; the script as it was is kept as ``activate.dsenv-fix.bak``, and
  deleting the block undoes the change. Written atomically, with the script's mode.
- remove-stale-lock: the lock is removed only if, looked at again right before, it is still a
  plain file that no process on this node holds (/proc/<pid>/fd and cwd).
- create-cache-dir: the folder and its missing parents, each with the action's mode.

:func:`recheck_env` gives the environment a re-check sees: for an activate script, what a
shell has after sourcing it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from dsenv import proc
from dsenv.doctor.context import Context
from dsenv.doctor.fix import actions as fa
from dsenv.facts.host import mounts
from dsenv.facts.toolchain import extensions
from dsenv.provision.record.activation import sh_value
from dsenv.redact import is_secret_name
from dsenv.staging import write_file_atomically
from dsenv.verdicts.findings import FixAction

BACKUP_SUFFIX = ".dsenv-fix.bak"
BEGIN, END = "# >>> dsenv doctor --fix {kind} >>>", "# <<< dsenv doctor --fix {kind} <<<"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SOURCE_TIMEOUT = 30.0
# Inside the re-check a guarded block needs a Slurm job: the job the script will run in.
STAND_IN_JOB = "dsenv-doctor-fix-recheck"


class FixError(Exception):
    """Why a fix was not applied (one line)."""


def block_pattern(kind: str) -> re.Pattern:
    begin, end = re.escape(BEGIN.format(kind=kind)), re.escape(END.format(kind=kind))
    return re.compile(rf"\n*^{begin}$.*?^{end}$\n?", re.MULTILINE | re.DOTALL)


def render_block(action: FixAction, check_id: str) -> str:
    for name in [name for name, _value in action.variables] + list(action.unset):
        if not NAME.fullmatch(name):
            raise FixError(f"{name!r} is not a variable name")
        if is_secret_name(name):
            raise FixError(f"refusing to write {name}: activate scripts never carry secrets")
    exports = [f"export {name}={sh_value(value)}" for name, value in action.variables]
    exports += [f"unset {name}" for name in action.unset]
    lines = [BEGIN.format(kind=action.kind),
             f"# Written by `dsenv doctor --fix` for check {check_id} ({action.kind}).",
             "# Delete this block (down to its closing marker) to undo it."]
    if action.guard == "slurm":
        lines += ['if [ -n "${SLURM_JOB_ID:-}" ]; then', *("    " + e for e in exports), "fi"]
    else:
        lines += exports
    return "\n".join([*lines, END.format(kind=action.kind)]) + "\n"


def with_block(text: str, action: FixAction, check_id: str) -> str:
    """``text`` with this kind's block replaced, or added at the end."""
    kept = block_pattern(action.kind).sub("\n", text).rstrip("\n")
    return kept + "\n\n" + render_block(action, check_id)


def write_activate(action: FixAction, ctx: Context, check_id: str) -> str:
    script = Path(action.target or "")
    why_not = fa.writable_script(script)
    if why_not:
        raise FixError(why_not)
    before = script.read_text(encoding="utf-8")
    after = with_block(before, action, check_id)
    if after == before:
        return f"{script} already has this block"
    mode = stat.S_IMODE(script.stat().st_mode)
    backup = script.with_name(script.name + BACKUP_SUFFIX)
    write_file_atomically(backup, before, mode=mode)
    write_file_atomically(script, after, mode=mode)
    return f"wrote the {action.kind} block into {script} (the script before: {backup})"


def _remove_if_stale(lock: Path, ctx: Context) -> str:
    """Remove ``lock`` if, looked at now, no process holds it; else FixError."""
    try:
        info = lock.lstat()
    except FileNotFoundError:
        return f"{lock} is gone already (its build ended)"
    if not stat.S_ISREG(info.st_mode) or lock.name != "lock":
        raise FixError(f"{lock} is not a build lock file")
    holders, seen, unreadable = extensions.scan_holders(ctx, [lock])
    if holders[lock]:
        live = "; ".join(h.describe() for h in holders[lock])
        raise FixError(f"{lock} is held now: {live}; left in place")
    if not seen:
        raise FixError(f"no process could be inspected under {ctx.path('/proc')}: {lock} "
                       "left in place")
    if unreadable and info.st_uid != os.geteuid():
        raise FixError(f"{lock} belongs to uid {info.st_uid}, whose processes cannot be "
                       "inspected: left in place")
    lock.unlink()
    return f"removed {lock}"


def remove_stale_lock(action: FixAction, ctx: Context, check_id: str) -> str:
    locks = [Path(p) for p in action.paths or (action.target or "",)]
    return "; ".join(_remove_if_stale(lock, ctx) for lock in locks)


def _make_folder(path: Path, mode: int) -> bool:
    """Create ``path`` and its missing parents, each with ``mode``; False if it existed."""
    if path.is_dir():
        return False
    missing = [p for p in (path, *path.parents) if not p.exists()]
    why_not = fa.may_create_in(mounts.nearest_existing(path))
    if why_not:
        raise FixError(why_not)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            if not folder.is_dir():
                raise FixError(f"{folder} exists and is not a folder") from None
            continue
        except OSError as exc:
            raise FixError(f"cannot create {folder}: {exc.strerror}") from None
        os.chmod(folder, mode)  # mkdir's mode passes through the umask
    return True


def create_cache_dir(action: FixAction, ctx: Context, check_id: str) -> str:
    mode = action.mode if action.mode is not None else fa.SHARED
    paths = [Path(p) for p in action.paths or (action.target or "",)]
    made = [p for p in paths if _make_folder(p, mode)]
    if not made:
        return "the folders exist already"
    return f"created {', '.join(map(str, made))} (mode {mode:04o})"


FIXERS: dict[str, Callable[[FixAction, Context, str], str]] = {
    fa.OFFLINE: write_activate, fa.EXTENSIONS: write_activate, fa.NCCL: write_activate,
    fa.CACHE: write_activate,
    fa.REMOVE_LOCK: remove_stale_lock, fa.CREATE_DIR: create_cache_dir,
}


def apply(action: FixAction, ctx: Context, check_id: str) -> str:
    """Apply ``action``; what was done, in one line. Raises FixError when it may not."""
    if not action.applicable:
        raise FixError(action.why_not or "not a change `dsenv doctor --fix` makes")
    fixer = FIXERS.get(action.kind)
    if fixer is None:
        raise FixError(f"no fixer for {action.kind!r}")
    try:
        return fixer(action, ctx, check_id)
    except OSError as exc:
        raise FixError(f"{exc.filename or action.target}: {exc.strerror or exc}") from None


def sourced_env(script: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a POSIX shell has after ``. script`` (started with ``env``)."""
    done = proc.run(["sh", "-c", '. "$1" >/dev/null 2>&1 </dev/null; exec env -0', "sh",
                     str(script)], SOURCE_TIMEOUT, env=env)
    if not done.ok:
        raise FixError(f"sourcing {script} failed: {done.describe()}")
    pairs = (item.partition("=") for item in done.stdout.split("\0") if "=" in item)
    return {name: value for name, _, value in pairs}


def recheck_env(action: FixAction, ctx: Context) -> tuple[dict[str, str], str | None]:
    """(the environment to judge the fixed node in, a note on how it was made)."""
    if action.kind not in fa.ACTIVATE_KINDS:
        return dict(ctx.env), None
    env, note = dict(ctx.env), f"judged after `. {action.target}`"
    if action.guard == "slurm" and not env.get("SLURM_JOB_ID"):
        env["SLURM_JOB_ID"] = STAND_IN_JOB
        note += " as inside a Slurm job (SLURM_JOB_ID set while sourcing)"
    sourced = sourced_env(Path(action.target or ""), env)
    if env.get("SLURM_JOB_ID") == STAND_IN_JOB:
        sourced.pop("SLURM_JOB_ID", None)
    return sourced, note

"""Commands as ``dsenv provision --dry-run`` prints them and as the real run logs them.

Each builder (venv.py, container.py, locks.py, ops/command.py, ops/cuda.py) has a function
that returns the :class:`Command` it will run; the plan (plan.py) calls it to show the step,
the builder calls it to run the step, and :func:`run_logged` (uvcmd.py) appends the command
to the build log before it runs it: ``$ uv venv /envs/cpu --relocatable ...``.

One rendering for both (:meth:`Command.render`): the variables set for the command first,
then its words, quoted as a shell would need them; ``cd DIR &&`` first when it runs in a
folder of its own. Folders that differ between a dry run and the real run only by a process
id or a random name are shown by what they stand for (``names``): the staging folder as the
final prefix, a temporary folder as ``/tmp/dsenv-ops-XXXXXXXX`` (:func:`temporary`).
Secrets never reach the text: values of secret-named variables (dsenv.redact) and the
password of an index URL (``https://user:***@host/simple``) are masked.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dsenv.redact import MASK, Redactor, is_secret_name

LOG_MARK = "$ "  # a logged command's line starts with it
PLAN_MARK = "    $ "  # a command's line in a printed plan, under its step
Names = tuple[tuple[str, str], ...]  # (real folder, the text shown for it)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")


@dataclass(frozen=True)
class Command:
    """A command of a build step: ``argv`` with the program by its name (``uv``), the
    variables set for it that the rendering names (the rest of the environment is the
    caller's), and the folder it runs in (None: the caller's)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    @classmethod
    def of(cls, argv: Iterable[str | os.PathLike], env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike | None = None) -> Command:
        return cls(tuple(os.fspath(a) for a in argv),
                   tuple(sorted((k, str(v)) for k, v in (env or {}).items())),
                   os.fspath(cwd) if cwd is not None else None)

    @property
    def args(self) -> list[str]:
        """The words after the program (what ``run_uv`` takes)."""
        return list(self.argv[1:])

    def variables(self) -> dict[str, str]:
        return dict(self.env)

    def render(self, names: Names = ()) -> str:
        """``[cd DIR && ]NAME=value ... prog args`` with ``names`` applied, secrets masked."""
        words = [f"{k}={shlex.quote(MASK if is_secret_name(k) else show(v, names))}"
                 for k, v in self.env]
        words += [shlex.quote(show(arg, names)) for arg in self.argv]
        line = " ".join(words)
        if self.cwd is not None:
            line = f"cd {shlex.quote(show(self.cwd, names))} && {line}"
        return redact(line)


def show(text: str, names: Names) -> str:
    """``text`` with each real folder of ``names`` replaced by what it is shown as (longest
    first, so a folder inside another is named by its own entry)."""
    for real, shown in sorted(names, key=lambda pair: len(pair[0]), reverse=True):
        if real and real in text:
            text = text.replace(real, shown)
    return text


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` without the values of secret-named variables (``env``, default os.environ)
    and without the passwords of URLs."""
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)
    return Redactor(os.environ if env is None else env).scrub(text)


def temporary(prefix: str) -> Path:
    """How a temporary folder made with ``tempfile`` and ``prefix`` is shown (its random
    part as ``XXXXXXXX``): ``/tmp/dsenv-ops-XXXXXXXX``."""
    return Path(tempfile.gettempdir()) / f"{prefix}XXXXXXXX"


def temporary_names(folder: str | os.PathLike, prefix: str) -> Names:
    """``names`` that show the temporary ``folder`` (made with ``prefix``) as :func:`temporary`
    does."""
    return ((os.fspath(folder), str(temporary(prefix))),)


class BuildLog(os.PathLike):
    """The build log of a run (a path: ``open(log)`` works as before) with the ``names`` its
    commands are shown with (the staging folder as the final prefix ...)."""

    def __init__(self, path: str | os.PathLike, names: Names = ()):
        self.path = Path(path)
        self.names = tuple(names)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"BuildLog({str(self.path)!r})"


def as_log(log: str | os.PathLike | None) -> BuildLog | None:
    """``log`` resolved to an absolute path, its names kept."""
    if log is None:
        return None
    names = log.names if isinstance(log, BuildLog) else ()
    return BuildLog(Path(os.fspath(log)).resolve(), names)


def log_command(log: str | os.PathLike | None, command: Command, names: Names = ()) -> None:
    """Append ``$ COMMAND`` to the build log ``log`` (nothing without one), shown with the
    log's names and ``names`` (a builder's temporary folder)."""
    if log is None:
        return
    known = (log.names if isinstance(log, BuildLog) else ()) + tuple(names)
    Path(os.fspath(log)).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"{LOG_MARK}{command.render(known)}\n")


def planned_commands(plan_text: str) -> list[str]:
    """The commands a printed plan shows, in its order."""
    return [line[len(PLAN_MARK):] for line in plan_text.splitlines()
            if line.startswith(PLAN_MARK)]


def logged_commands(log_text: str) -> list[str]:
    """The commands a build log shows, in the order they ran."""
    return [line[len(LOG_MARK):] for line in log_text.splitlines()
            if line.startswith(LOG_MARK)]


def not_carried_out(planned: list[str], logged: list[str]) -> list[str]:
    """The planned commands that the log does not show verbatim and in the plan's order
    ([]: the run carried out every one as the plan showed it; it may run more, e.g. an
    offline retry)."""
    missing, at = [], 0
    for command in planned:
        if command in logged[at:]:
            at = logged.index(command, at) + 1
        else:
            missing.append(command)
    return missing

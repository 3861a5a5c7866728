"""What a check returns. Checks never print; renderers decide how a result looks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    INFO = "info"  # a fact worth showing that needs no action
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"  # the check itself raised: it could not vouch for anything

    @property
    def failing(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True)
class FixAction:
    """A fix as data: the change `dsenv doctor --fix` would make (doctor/fix/fixers.py applies
    it), or, when it may not, the command to run by hand and why.

    ``kind`` names the fixer: one of doctor/fix/actions.py's KINDS, their one home (the
    fixers, the report schema's action.kind and doctor/modes/*.toml's ``fixable`` are
    checked against it by tests/test_tables_agree.py).
    """

    kind: str
    change: str  # one line: what it changes
    target: str | None = None  # the file or folder it changes
    applicable: bool = False  # `dsenv doctor --fix` may apply it
    command: str | None = None  # the same by hand, as a shell command
    variables: tuple[tuple[str, str], ...] = ()  # activate-*: (name, value) to export
    unset: tuple[str, ...] = ()  # activate-*: variables to unset (back to the default)
    guard: str | None = None  # activate-*: "slurm": exported only inside a Slurm job
    mode: int | None = None  # create-cache-dir: the new folders' permission bits
    paths: tuple[str, ...] = ()  # every folder to create, lock to remove (target: the first)
    why_not: str | None = None  # when not applicable: why --fix leaves it to you

    def to_json(self) -> dict:
        return {"kind": self.kind, "change": self.change, "target": self.target,
                "applicable": self.applicable, "command": self.command,
                "variables": dict(self.variables) or None, "unset": list(self.unset) or None,
                "guard": self.guard,
                "mode": None if self.mode is None else f"{self.mode:04o}",
                "paths": list(self.paths) or None,
                "why_not": self.why_not}


@dataclass(frozen=True)
class Finding:
    """A check's verdict: status, one-line summary, evidence lines and one concrete fix
    (``fix`` for people; ``action`` the same as data, for `dsenv doctor --fix`).

    ``mode``: the failure-catalogue mode (doctor/modes/*.toml) this finding reports, "" when
    none; a finding that names a mode carries that mode's fix (doctor/catalogue.py
    mode_finding), what this node adds to it as "here: ..." evidence lines."""

    status: Status
    summary: str
    evidence: tuple[str, ...] = ()
    fix: str | None = None
    action: FixAction | None = None
    mode: str = ""


def ok(summary: str, *evidence: str) -> Finding:
    return Finding(Status.OK, summary, tuple(evidence))


def info(summary: str, *evidence: str, action: FixAction | None = None) -> Finding:
    return Finding(Status.INFO, summary, tuple(evidence), action.command if action else None,
                   action)


def warn(summary: str, fix: str, *evidence: str, action: FixAction | None = None) -> Finding:
    return Finding(Status.WARN, summary, tuple(evidence), fix, action)


def fail(summary: str, fix: str, *evidence: str, action: FixAction | None = None) -> Finding:
    return Finding(Status.FAIL, summary, tuple(evidence), fix, action)


def skip(reason: str, *evidence: str) -> Finding:
    return Finding(Status.SKIP, reason, tuple(evidence))


@dataclass
class Result:
    """A finding placed in the report: which check, in which area, how long it took."""

    id: str
    area: str
    title: str
    status: Status
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None
    seconds: float = 0.0
    traceback: str | None = None
    action: FixAction | None = None
    mode: str = ""  # the catalogue mode the finding reports (Finding.mode)

    def to_json(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data["seconds"] = round(self.seconds, 4)
        data["action"] = self.action.to_json() if self.action else None
        return data

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
class Finding:
    """A check's verdict: status, one-line summary, evidence lines and one concrete fix."""

    status: Status
    summary: str
    evidence: tuple[str, ...] = ()
    fix: str | None = None


def ok(summary: str, *evidence: str) -> Finding:
    return Finding(Status.OK, summary, tuple(evidence))


def info(summary: str, *evidence: str) -> Finding:
    return Finding(Status.INFO, summary, tuple(evidence))


def warn(summary: str, fix: str, *evidence: str) -> Finding:
    return Finding(Status.WARN, summary, tuple(evidence), fix)


def fail(summary: str, fix: str, *evidence: str) -> Finding:
    return Finding(Status.FAIL, summary, tuple(evidence), fix)


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

    def to_json(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data["seconds"] = round(self.seconds, 4)
        return data

"""The failure catalogue (doctor/modes/*.toml, one file per family): the modes users report,
each with its symptom, cause, the check that detects it before the job (or why none can), the
fix and the public sources. Read by `dsenv explain` and `dsenv doctor --list`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from dsenv.data import load_table
from dsenv.verdicts.findings import Finding, FixAction, Status, warn

# The areas a mode belongs to (the first part of its id); explain's ranking knows which
# component's lines belong to which areas (doctor/explain/rank.py COMPONENTS).
AREAS = ("jit", "toolkit", "torch", "deepspeed", "gpu", "comm", "system", "launch", "mpi",
         "slurm", "cache", "hf", "job", "container", "rocm", "loader", "env", "cloud")


@dataclass(frozen=True)
class Mode:
    id: str
    area: str
    title: str
    symptom: str
    match: tuple[str, ...]
    cause: str
    detect: str
    check: str  # the doctor check id; "" when it cannot be detected before launch
    fix: str
    fixable: str  # the --fix action that can repair it, "" when none is safe
    sources: tuple[str, ...]
    also: tuple[str, ...] = ()  # more message evidence (doctor/explain/rank.py)
    against: tuple[str, ...] = ()  # evidence that the symptom came from elsewhere
    goes_on: bool = False  # the process goes on after this symptom (a fallback, a notice)
    merged: tuple[str, ...] = ()  # ids of earlier or proposed modes of the same cause it took in
    benign: bool = False  # a normal notice, never a job's cause (explain shows it as a notice)
    # names what failed, never why (a collective that timed out): explain lists it, with its fix
    # (how to find the cause), under "no known cause" and goes on looking for the cause
    symptom_only: bool = False

    def matches(self, text: str) -> list[str]:
        """The patterns of this mode that ``text`` matches."""
        return [p for p in self.match if re.search(p, text, re.IGNORECASE | re.MULTILINE)]


def files() -> list[str]:
    """The catalogue's table files, in name order."""
    return sorted(f.name for f in resources.files("dsenv.doctor.modes").iterdir()
                  if f.name.endswith(".toml"))


@cache
def modes() -> tuple[Mode, ...]:
    rows = [r for name in files() for r in load_table("dsenv.doctor.modes", name)["mode"]]
    return tuple(Mode(r["id"], r["area"], r["title"], r["symptom"], tuple(r.get("match", ())),
                      r["cause"], r["detect"], r.get("check", ""), r["fix"],
                      r.get("fixable", ""), tuple(r["sources"]), tuple(r.get("also", ())),
                      tuple(r.get("against", ())), bool(r.get("goes_on", False)),
                      tuple(r.get("merged", ())), bool(r.get("benign", False)),
                      bool(r.get("symptom_only", False)))
                 for r in rows)


def mode(mode_id: str) -> Mode | None:
    """The mode with this id, or the one that took in a mode of that id (``merged``)."""
    return next((m for m in modes() if m.id == mode_id), None) or next(
        (m for m in modes() if mode_id in m.merged), None)


def same_cause(named: str, label: str) -> bool:
    """A cause explain named is the one a label gives: the same id, or the mode that took in a
    mode of that id (``merged``: a proposed or earlier id the catalogue covers under another)."""
    found = mode(named) if named else None
    return bool(named) and (named == label or (found is not None and label in found.merged))


def by_check() -> dict[str, list[Mode]]:
    """{check id: the catalogue modes it detects}."""
    found: dict[str, list[Mode]] = {}
    for mode in modes():
        if mode.check:
            found.setdefault(mode.check, []).append(mode)
    return found


def explain(text: str) -> list[tuple[Mode, list[str]]]:
    """The modes that ``text`` names: a mode id or check id exactly, else every mode one of
    whose patterns the text matches, most matching patterns first."""
    wanted = text.strip()
    exact = [m for m in modes() if wanted in (m.id, m.check, *m.merged)]
    if exact:
        return [(m, []) for m in exact]
    hits = [(m, m.matches(text)) for m in modes()]
    hits = [(m, found) for m, found in hits if found]
    return sorted(hits, key=lambda hit: -len(hit[1]))


# -- one fix per mode -----------------------------------------------------------------------------
# A doctor finding that reports a catalogue mode takes the mode's fix from here, never its own
# copy: the doctor, `dsenv explain` and `dsenv explain --here` print the same text. What the
# check knows about this node (a path, the exact command) goes after it as "here: ..." lines.
# tests/test_tables_agree.py finds every call by AST and checks the ids against the catalogue.


def fix_for(mode_id: str) -> str:
    """The catalogue's fix for ``mode_id`` (KeyError for an id the catalogue lacks)."""
    found = mode(mode_id)
    if found is None:
        raise KeyError(f"no catalogue mode {mode_id!r} in doctor/modes/")
    return found.fix


def mode_id(name: str) -> str:
    """``name``, a catalogue mode id, checked: how a check marks an id it picks before it
    calls mode_finding (the cross-check reads the literal; KeyError for an unknown id)."""
    fix_for(name)
    return name


def here_lines(here) -> tuple[str, ...]:
    """``here`` (a line, lines, or nothing) as "here: ..." evidence lines."""
    if not here:
        return ()
    lines = (here,) if isinstance(here, str) else tuple(here)
    return tuple(f"here: {line}" for line in lines if line)


def mode_finding(verdict: Callable[..., Finding], mode_id: str, summary: str, *evidence: str,
                 here=(), action: FixAction | None = None) -> Finding:
    """``verdict`` (findings.fail or findings.warn) for the catalogue mode ``mode_id``: its fix
    the mode's, ``here`` (this node's specifics) added as "here: ..." evidence lines."""
    found = verdict(summary, fix_for(mode_id), *evidence, *here_lines(here), action=action)
    return replace(found, mode=mode_id)


def mode_fact(mode_id: str, summary: str, *evidence: str, here=()) -> Finding:
    """An info finding that this node has the catalogue mode ``mode_id``'s cause while nothing
    the check was given needs what is missing (no NVMe offload asked for, a default limit):
    a fact with the mode's fix, which `dsenv explain --here` reads as the cause present."""
    return replace(mode_finding(warn, mode_id, summary, *evidence, here=here), status=Status.INFO)


"""What a finding advises: its fix and the "here: ..." lines (a finding that reports a catalogue
mode carries the mode's fix, what this node adds to it as evidence; doctor/catalogue.py).
Each takes a Finding, a Result or a result of `dsenv doctor --json`."""

from __future__ import annotations


def _get(result, key: str):
    return result[key] if isinstance(result, dict) else getattr(result, key)


def here(result) -> str:
    """The "here: ..." evidence lines, one string (a line each)."""
    return "\n".join(line.removeprefix("here: ") for line in _get(result, "evidence")
                     if line.startswith("here: "))


def advice(result) -> str:
    """The fix and the "here:" lines, one string: what a test of a fix looks in."""
    return "\n".join(filter(None, (_get(result, "fix") or "", here(result))))

"""What a finding advises: its fix and the "here: ..." lines (a finding that reports a catalogue
mode carries the mode's fix, what this node adds to it as evidence; doctor/catalogue.py)."""

from __future__ import annotations


def here(result) -> str:
    """The "here: ..." evidence lines of a Finding or Result, one string."""
    return "\n".join(line.removeprefix("here: ") for line in result.evidence
                     if line.startswith("here: "))


def advice(result) -> str:
    """The fix and the "here:" lines, one string: what a test of a fix looks in."""
    return "\n".join(filter(None, (result.fix or "", here(result))))

"""Recorded real outputs under tests/fixtures, each file opening with its '# source:' lines."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture_text(name: str) -> str:
    """A recorded output from tests/fixtures, without its leading '# source:' lines."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# source:"))

"""What `dsenv explain` answers for a text, in the form the explain tests compare."""

from __future__ import annotations

from dsenv.doctor.explain.command import explain_text


def answer(text: str) -> tuple[str, list[str]]:
    """(the group id or "", the causes explain gives, first first)."""
    _, _, sure, _ = explain_text(text)
    return (sure[0].shared if sure else ""), [m.id for m in sure]

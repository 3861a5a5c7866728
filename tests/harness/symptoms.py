"""The verbatim symptoms of the catalogue (tests/fixtures/explain_symptoms/<table>.jsonl) as
the family parser tests read them: the rows of a table, one text by its thread, and the
parts a parser read for a mode."""

from __future__ import annotations

import json
from pathlib import Path

SYMPTOMS = Path(__file__).resolve().parents[1] / "fixtures" / "explain_symptoms"


def rows(stem: str) -> list[dict]:
    return [json.loads(line) for line in (SYMPTOMS / f"{stem}.jsonl").read_text().splitlines()
            if line.strip()]


def text(table: list[dict], url_end: str) -> str:
    """The symptom whose thread's URL ends with ``url_end``."""
    return next(r["text"] for r in table if r["url"].endswith(url_end))


def parts(parser, message: str, mode: str) -> dict[str, str]:
    """What ``parser`` (a family module) read for ``mode`` in ``message``."""
    found = [r for r in parser.read(message) if r.mode == mode]
    assert found, [r.mode for r in parser.read(message)]
    return dict(found[0].parts)

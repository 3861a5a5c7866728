"""explain compiles a catalogue pattern only when the text holds its needle (rank.needle):
the needle must be in every text the pattern matches, or a cause would be lost silently.
Checked against every real text the project has (symptoms and corpus), and on patterns
whose needle is easy to get wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.explain.rank import FLAGS, needle

FIXTURES = Path(__file__).parent / "fixtures"


def _texts() -> list[str]:
    files = [*sorted((FIXTURES / "explain_symptoms").glob("*.jsonl")),
             FIXTURES / "explain_corpus" / "messages.jsonl"]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    return [row.get("text") or row["message"] for row in rows]


def test_every_needle_is_in_every_real_text_its_pattern_matches():
    texts = _texts()
    lowered = [t.lower() for t in texts]
    patterns = {p for m in catalogue.modes() for p in (*m.match, *m.also, *m.against)}
    lost = []
    for p in sorted(patterns):
        compiled, found = re.compile(p, FLAGS), needle(p)
        lost += [(p, found) for t, low in zip(texts, lowered, strict=True)
                 if found and found not in low and compiled.search(t)]
    assert not lost, lost[:5]
    assert sum(bool(needle(p)) for p in patterns) > 0.8 * len(patterns)  # it does prefilter


@pytest.mark.parametrize("pattern, expected", [
    ("Ninja is required to load C\\+\\+ extensions", "ninja is required to load c++ extensions"),
    ("ninja: (command )?not found", "not found"),  # the optional group is not required
    ("colou?r depth", "r depth"),  # 'u?' makes the u optional: 'colo' and 'r depth' remain
    ("a|bcdef", ""),  # a top-level alternation: no literal every match has
    ("(libfoo|libbar)\\.so", ".so"),
    ("x{0,3}yz", ""),  # x may be absent; 'yz' is too short to be worth it
    ("[Cc]annot open shared object", "annot open shared object"),
    ("\\bnccl[A-Z]\\w*", "nccl"),
])
def test_needles(pattern, expected):
    assert needle(pattern) == expected
    if expected:
        assert expected in re.search(pattern, _sample(pattern), FLAGS).group(0).lower()


def _sample(pattern: str) -> str:
    return {"Ninja is required to load C\\+\\+ extensions": "Ninja is required to load C++ extensions",
            "ninja: (command )?not found": "ninja: command not found",
            "colou?r depth": "color depth", "(libfoo|libbar)\\.so": "libbar.so",
            "[Cc]annot open shared object": "cannot open shared object",
            "\\bnccl[A-Z]\\w*": "ncclSystemError"}[pattern]

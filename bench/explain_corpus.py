"""`dsenv explain` on the corpus of real messages (tests/fixtures/explain_corpus/messages.jsonl):
recall and wrong-cause rate per family.

A message is *named* when the first cause explain gives (the best confident match of the
first failure line that has one) is the mode the corpus gives for it (``mode``, or
``proposed_mode`` for a cause the catalogue did not have when the corpus was collected).
(A mode's ``merged`` ids count as it: a proposed id the catalogue took in under another, said
in the mode's row.) It is *wrong* when explain gives another cause, *quiet* when it gives none. Environment
messages should be named; NOT-ENVIRONMENT ones should stay quiet (a cause there is wrong).
Two tables: every environment message, and those whose text can name the cause (no
``evidence`` field: see the corpus README). An answer that lists the causes several threads
settled for the same words (doctor/explain/alternatives.toml) counts as named when its first
cause is the corpus's (the column "in group" says how many named answers came so, flagged as
words several causes share), *narrowed* when a later one is (neither named nor wrong), *wrong*
when none is.

    python bench/explain_corpus.py [--misses] [--corpus FILE]

``--corpus tests/fixtures/explain_holdout/messages.jsonl``: the held-out messages (same
fields), collected by someone who did not read the rules (its README). ``--gpu-logs``: the
whole logs recorded on a real GPU node (tests/fixtures/explain_gpu), each with the cause it
was provoked with (the table in tests/test_explain_gpu_logs.py), family "gpu-node log".
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this checkout's explain, not whichever dsenv is installed (the script's folder, not the
# checkout, comes first on sys.path)
sys.path.insert(0, str(ROOT))

from dsenv.doctor import catalogue  # noqa: E402
from dsenv.doctor.explain.command import explain_text  # noqa: E402

CORPUS = ROOT / "tests/fixtures/explain_corpus/messages.jsonl"


def first_cause(text: str) -> str:
    return answer(text)[0]


def answer(text: str) -> tuple[str, tuple[str, ...]]:
    """(the first cause explain gives or "", the causes of a shared-words answer or ())."""
    _, _, sure, _ = explain_text(text)
    return (sure[0].id if sure else "",
            tuple(m.id for m in sure if m.shared) if sure and sure[0].shared else ())


def gpu_log_rows() -> list[dict]:
    """The recorded GPU-node logs as corpus rows; their expected causes live in the test."""
    from tests.test_explain_gpu_logs import CASES, NO_MODE_YET, recorded
    return [{"id": name.removesuffix(".log"), "url": "tests/fixtures/explain_gpu/" + name,
             "family": "gpu-node log" if want or name in NO_MODE_YET else "NOT-ENVIRONMENT",
             "mode": want or "", "proposed_mode": "", "message": recorded(name)}
            for name, want in CASES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--misses", action="store_true", help="list the messages not named")
    ap.add_argument("--family", help="only this family")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="messages.jsonl to read")
    ap.add_argument("--gpu-logs", action="store_true", help="the logs recorded on a GPU node")
    args = ap.parse_args()
    rows = gpu_log_rows() if args.gpu_logs else [
        json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    if args.family:
        rows = [r for r in rows if r["family"] == args.family]
    tables = {"every message": collections.defaultdict(collections.Counter),
              "messages whose text can name the cause": collections.defaultdict(
                  collections.Counter)}
    misses = []
    start = time.perf_counter()
    for row in rows:
        want = row["mode"] or row["proposed_mode"]
        got, shared = answer(row["message"])
        env = row["family"] != "NOT-ENVIRONMENT"
        named = catalogue.same_cause(got, want)
        listed = any(catalogue.same_cause(s, want) for s in shared)
        verdict = ("named" if named else "narrowed" if listed else "wrong" if got
                   else "quiet") if env else ("wrong" if got else "quiet")
        for name, tally in tables.items():
            if name != "every message" and row.get("evidence"):
                continue
            for fam in (row["family"], "all environment" if env else None):
                if fam:
                    tally[fam][verdict] += 1
                    tally[fam]["in group"] += bool(verdict == "named" and shared)
        if (env and verdict != "named") or (not env and got):
            misses.append((row["id"], row["family"], want,
                           "|".join(shared) if shared else got or "-",
                           (row.get("evidence") or "")[:12], row["url"]))
    took = time.perf_counter() - start
    for name, tally in tables.items():
        print(f"{name}:")
        print(f"{'family':<22} {'n':>4} {'named':>6} {'recall':>7} {'in group':>9} {'narrowed':>9} "
              f"{'wrong':>6} {'wrong%':>7}")
        order = sorted(tally, key=lambda f: (f == "all environment", f == "NOT-ENVIRONMENT", f))
        for fam in order:
            c = tally[fam]
            n = sum(c.values()) - c["in group"]
            if fam == "NOT-ENVIRONMENT":
                print(f"{fam:<22} {n:>4} {'quiet':>6} {c['quiet'] / n:>7.1%} {'':>9} {'':>9} "
                      f"{c['wrong']:>6} {c['wrong'] / n:>7.1%}")
                continue
            print(f"{fam:<22} {n:>4} {c['named']:>6} {c['named'] / n:>7.1%} {c['in group']:>9} "
                  f"{c['narrowed']:>9} {c['wrong']:>6} {c['wrong'] / n:>7.1%}")
        print()
    print(f"{len(rows)} messages in {took:.2f} s")
    if args.misses:
        for m in misses:
            print("  ".join(m))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

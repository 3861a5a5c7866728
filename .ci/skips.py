"""Fail a test run that skipped more tests than README states for a fresh clone.

README says, in one sentence, "A fresh clone skips N tests"; the summary lines of the run's
output (one per phase of README's test command, ``176 passed, 5 skipped in 1440.12s``),
added up by .ci/record.py's reader, say how many did. More
skips than stated means this machine lacks something the suite needs (or a test skips by
mistake), and the tests it hides did not prove anything. Fewer is fine (an opt-in such as
DSENV_CUDA_BUILD=1 was given).

Usage: ``python .ci/skips.py LOG [README]`` with LOG the output of README's test command;
exit 0 when at most N skipped, 1 when more (the run's SKIPPED lines printed), 2 when README
states no number or LOG holds no summary line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import summary  # noqa: E402  (one reader of pytest's summary lines)

README = Path(__file__).resolve().parents[1] / "README.md"
STATED = re.compile(r"A fresh clone skips (\d+) tests?\b")


def stated_skips(readme: str) -> int | None:
    """N of README's "A fresh clone skips N tests"; None when it says no such thing."""
    found = STATED.findall(readme)
    return int(found[0]) if len(found) == 1 else None


def run_skips(log: str) -> int | None:
    """The skipped tests of the run's summary lines, added up; None when there is none."""
    got = summary(log)
    return None if got is None else got[0].get("skipped", 0)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python .ci/skips.py LOG [README]", file=sys.stderr)
        return 2
    log = Path(argv[0]).read_text(errors="replace")
    readme = Path(argv[1]) if len(argv) == 2 else README
    stated = stated_skips(readme.read_text())
    if stated is None:
        print(f"skips: {readme} does not state, once, 'A fresh clone skips N tests'",
              file=sys.stderr)
        return 2
    skipped = run_skips(log)
    if skipped is None:
        print("skips: no pytest summary line in the log (did the run finish?)", file=sys.stderr)
        return 2
    if skipped > stated:
        print(f"skips: {skipped} tests skipped, README states {stated} for a fresh clone:",
              file=sys.stderr)
        for line in log.splitlines():
            if line.startswith("SKIPPED"):
                print(f"  {line}", file=sys.stderr)
        return 1
    print(f"skips: {skipped} skipped (README: a fresh clone skips {stated})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

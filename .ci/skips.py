"""Fail a test run that skipped more tests than README states for a fresh clone.

README says, in one sentence, "A fresh clone skips N tests"; the last summary line of the
run's output (``1273 passed, 5 skipped in 1440.12s (0:24:00)``) says how many did. More
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

README = Path(__file__).resolve().parents[1] / "README.md"
STATED = re.compile(r"A fresh clone skips (\d+) tests?\b")
# pytest's last line: counts, then the time ("=" around it unless -q)
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+|no tests ran) in \d+(?:\.\d+)?s\b")


def stated_skips(readme: str) -> int | None:
    """N of README's "A fresh clone skips N tests"; None when it says no such thing."""
    found = STATED.findall(readme)
    return int(found[0]) if len(found) == 1 else None


def run_skips(log: str) -> int | None:
    """The skipped tests of the run's last summary line; None when there is none."""
    counts = [m.group(1) for line in log.splitlines() if (m := SUMMARY.match(line.strip()))]
    if not counts:
        return None
    skipped = re.search(r"(\d+) skipped", counts[-1])
    return int(skipped.group(1)) if skipped else 0


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

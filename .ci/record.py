"""Record the test command's run: counts and duration, for README's stated suite time.

``python .ci/record.py LOG SECONDS STATUS`` reads the pytest summary lines of LOG (the output
of README's test command, one line per phase: ``3792 passed in 459.71s (0:07:39)`` for the
tests on both cores, ``176 passed, 5 skipped in 1459.12s (0:24:19)`` for the serial ones),
adds them up and, when the run passed, writes ``.ci/last-run.json``: the command, each count,
pytest's seconds, the wall seconds the command took (SECONDS) and when it finished. It prints
one line either way.
tests/test_readme_screens.py holds README's "~N min" and "N passed" to this record;
``python tests/harness/readme_screens.py --write`` puts the record's figures into README.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

RECORD = Path(__file__).resolve().parent / "last-run.json"
# README's test command: the tests that may share the machine on both cores, then the ones
# that need it to themselves (tests/conftest.py SERIAL_MODULES).
PHASES = ('python -m pytest -q -n 2 --dist loadgroup -m "not serial"',
          "python -m pytest -q -m serial")
COMMAND = " && ".join(PHASES)
# pytest's last line: counts, then the time ("=" around it unless -q)
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+|no tests ran) in (\d+(?:\.\d+)?)s\b")


def summary(log: str) -> tuple[dict[str, int], float] | None:
    """The counts and seconds of the log's pytest summary lines (one per phase), added up;
    None when there is none."""
    found = [m for line in log.splitlines() if (m := SUMMARY.match(line.strip()))]
    if not found:
        return None
    counts: dict[str, int] = {}
    for match in found:
        for n, word in re.findall(r"(\d+) ([a-z]+)", match.group(1)):
            counts[word] = counts.get(word, 0) + int(n)
    return counts, sum(float(match.group(2)) for match in found)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python .ci/record.py LOG SECONDS STATUS", file=sys.stderr)
        return 2
    log, wall, status = Path(argv[0]).read_text(errors="replace"), float(argv[1]), int(argv[2])
    got = summary(log)
    if got is None:
        print("record: no pytest summary line in the log; nothing recorded", file=sys.stderr)
        return 0
    counts, seconds = got
    line = (f"{counts.get('passed', 0)} passed, {counts.get('skipped', 0)} skipped, "
            f"{seconds:.0f} s of tests (~{round(seconds / 60)} min), {wall:.0f} s in all")
    if status:
        print(f"record: {line}; the run failed (exit {status}), so {RECORD.name} is kept")
        return 0
    RECORD.write_text(json.dumps({
        "command": COMMAND,
        "passed": counts.get("passed", 0),
        "skipped": counts.get("skipped", 0),
        "failed": counts.get("failed", 0),
        "errors": counts.get("error", 0) + counts.get("errors", 0),
        "seconds": round(seconds, 1),
        "wall_seconds": round(wall),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }, indent=2) + "\n")
    print(f"record: {line} -> .ci/{RECORD.name} (README states it: "
          f"python tests/harness/readme_screens.py --write)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

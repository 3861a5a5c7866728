"""A real 2-rank launch (``dsenv doctor --probe``): start the rank printer
(:mod:`.mpi_rank_printer`) the way the job will start its ranks, and classify what came back
(ok, silent singletons, crash, hung, wrong size)."""

from __future__ import annotations

import json
import re
from pathlib import Path

RANK_MARK = "DSENV-MPI-RANK "
PROBE_RANKS = 2
# The first line that explains a failed launch, in the order a user should read them.
LAUNCH_ERRORS = (
    "OMPI was not built with SLURM's PMI support",
    "can not load PMIx library",
    "unsupported PMI version",
    "No module named 'mpi4py'",
    "has detected an attempt to run as root",
    "There are not enough slots available",
    "Unable to create step",
    "error while loading shared libraries",
)


def rank_printer_code() -> str:
    return (Path(__file__).with_name("rank_printer.py")).read_text()


def probe_command(launcher: str, launcher_path: str, python: str, plugin: str | None) -> list[str]:
    """Start PROBE_RANKS ranks of the rank printer the way the job will start its ranks."""
    code = rank_printer_code()
    if launcher == "srun":
        # --overlap: the doctor itself may already run as a step of this allocation
        return [launcher_path, f"--ntasks={PROBE_RANKS}", "--overlap", f"--mpi={plugin}",
                python, "-c", code]
    return [launcher_path, "-np", str(PROBE_RANKS), python, "-c", code]


def classify_launch(returncode: int | None, stdout: str, stderr: str, timed_out: bool,
                    expected: int = PROBE_RANKS) -> tuple[str, tuple[dict, ...], str]:
    """(outcome, ranks, detail) from what a real launch of the rank printer left behind."""
    ranks = rank_lines(stdout)
    if timed_out:
        return "hung", ranks, f"{len(ranks)} of {expected} ranks answered before the timeout"
    if returncode != 0 or not ranks:
        return "crash", ranks, _first_error(stderr + "\n" + stdout, returncode)
    sizes = sorted({r.get("size") for r in ranks})
    if sizes == [1] and len(ranks) > 1:
        return "singletons", ranks, f"{len(ranks)} processes each saw rank 0 of 1"
    if sizes != [expected] or sorted(r.get("rank") for r in ranks) != list(range(expected)):
        return "wrong-size", ranks, "ranks/sizes seen: " + ", ".join(
            f"{r.get('rank')}/{r.get('size')}" for r in ranks)
    return "ok", ranks, f"ranks 0..{expected - 1} of {expected} answered"


_RANK_LINE = re.compile(re.escape(RANK_MARK) + r"(\{[^{}\n]*\})")


def rank_lines(stdout: str) -> tuple[dict, ...]:
    """Every rank's JSON, also when two ranks' lines were written into one (MPICH does)."""
    found = []
    for match in _RANK_LINE.finditer(stdout):
        try:
            found.append(json.loads(match.group(1)))
        except json.JSONDecodeError:
            continue
    return tuple(found)


def _first_error(text: str, returncode: int | None) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for known in LAUNCH_ERRORS:
        for line in lines:
            if known in line:
                return f"rc {returncode}: {line}"
    telling = [line for line in lines if not set(line) <= set("-*=")]
    return f"rc {returncode}: " + (telling[-1] if telling else "no output")

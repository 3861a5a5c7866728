"""What a report concludes: the exit code, the counts, the verdict line, and which skipped
checks fold into one line per area.

Renderers (doctor/render.py) and the command read these; nothing here prints.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from dsenv.verdicts.findings import Result, Status

COUNT_WORDS = {Status.OK: "ok", Status.INFO: "info", Status.WARN: "warning",
               Status.FAIL: "failure", Status.SKIP: "skipped", Status.ERROR: "error"}
_COUNTABLE = ("warning", "failure", "error")


def exit_code(results: list[Result], strict: bool = False) -> int:
    """0: nothing failed; 1: a check failed or raised (with ``strict``: or warned)."""
    failing = any(r.status.failing for r in results)
    if strict:
        failing = failing or any(r.status is Status.WARN for r in results)
    return 1 if failing else 0


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 and word in _COUNTABLE else ''}"


def summary_line(results: list[Result]) -> str:
    """``15 ok, 10 info, 2 warnings, 20 skipped``: every status that occurred, in order."""
    counts = Counter(r.status for r in results)
    parts = [_count(counts[s], COUNT_WORDS[s]) for s in Status if counts.get(s)]
    return ", ".join(parts) or "no checks ran"


def skipped_note(results: list[Result], folded: int, lines: int) -> str:
    """What the screen did with the skipped checks, for the counts line: `` (4 shown, 33
    folded into 9 lines; --verbose lists each)``, the two adding up to the skipped count;
    "" when none was folded."""
    if not folded:
        return ""
    shown = sum(r.status is Status.SKIP for r in results) - folded
    into = f"folded into {lines} line{'s' if lines != 1 else ''}"
    parts = ([f"{shown} shown"] if shown else []) + [f"{folded} {into}" if shown else into]
    return f" ({', '.join(parts)}; --verbose lists each)"


def verdict_line(results: list[Result], target: str, strict: bool = False) -> str:
    """``ready to submit: 0 failures, 2 warnings`` / ``not ready: 2 failures, 1 warning``.

    A login target is judged before submitting; a compute target is the job itself, so it
    is "ready to run". With ``strict`` the verdict says so: warnings count as failures.
    """
    counts = Counter(r.status for r in results)
    parts = [_count(counts[Status.FAIL], "failure")]
    if counts[Status.ERROR]:
        parts.append(_count(counts[Status.ERROR], "error"))
    parts.append(_count(counts[Status.WARN], "warning"))
    if exit_code(results, strict):
        head = "not ready"
    else:
        head = "ready to run" if target == "compute" else "ready to submit"
    if strict:
        head += " (--strict: warnings count as failures)"
    return f"{head}: {', '.join(parts)}"


# -- skipped checks, folded --------------------------------------------------------------
# A skip whose reason is an option nobody gave ("no --for WORKLOAD given", "not asked
# (`dsenv doctor --probe` ...)") was not asked for; every other skip cannot apply on this
# node (no GPU driver, a CPU torch, no RDMA device, a variable that is not set).
_NOT_ASKED = re.compile(r"^(no --|not asked\b)|\bgive --")
_TRAILING_ASIDE = re.compile(r"^(?P<head>.*\S)\s+\((?P<aside>[^()]*)\)$")
_WHERE = re.compile(r" under /\S*$")  # "no RDMA devices under /sys/class/infiniband"
_UNSET = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) is not set( \(.*\))?$")
LONG_ASIDE = 20  # a trailing "(...)" longer than this is detail, not the reason
SHORT_HEAD = 12  # ... unless what is left would say too little ("not asked")


def short_reason(summary: str) -> str:
    """The reason of a skip, without its detail: the text before ``": "``, less a long aside
    and a trailing ``under /path``.

    ``torch 2.13.0+cpu (CPU-only build): see torch.build`` -> ``torch 2.13.0+cpu (CPU-only
    build)``; ``NCCL_IB_HCA is not set (NCCL uses every active HCA)`` -> ``NCCL_IB_HCA is not
    set``; ``no RDMA devices under /sys/class/infiniband`` -> ``no RDMA devices``; ``not asked
    (`dsenv doctor --probe` launches ...)`` -> what is inside the aside.
    """
    text = _WHERE.sub("", summary.split(": ", 1)[0].strip())
    match = _TRAILING_ASIDE.match(text)
    if match:
        head, aside = match["head"], match["aside"]
        if head == "not asked":
            return aside
        if len(aside) > LONG_ASIDE and len(head) >= SHORT_HEAD:
            return head
    return text


def _join_reasons(summaries: list[str]) -> str:
    reasons: list[str] = []
    unset: list[str] = []
    for summary in summaries:
        reason = short_reason(summary)
        match = _UNSET.match(reason)
        if match:
            if match["name"] not in unset:
                unset.append(match["name"])
            if "\0unset" in reasons:
                continue
            reason = "\0unset"  # where the merged "A, B not set" goes
        if reason not in reasons:
            reasons.append(reason)
    merged = ", ".join(unset) + (" is not set" if len(unset) == 1 else " not set")
    return "; ".join(merged if r == "\0unset" else r for r in reasons)


@dataclass(frozen=True)
class Folded:
    """Skipped checks of one area shown as one line: how many, why, and whether asked for."""

    area: str
    asked: bool  # False: an option was not given; True: the checks cannot apply here
    results: tuple[Result, ...]

    @property
    def title(self) -> str:
        n = len(self.results)
        if not self.asked:
            return f"{n} check{'s' if n != 1 else ''} not asked for"
        return f"{n} checks do not apply here" if n != 1 else "1 check does not apply here"

    @property
    def reasons(self) -> str:
        return _join_reasons([r.summary for r in self.results])

    def line(self) -> str:
        """``gpu: 3 checks do not apply here: no NVIDIA driver; no ROCm; no GPU``."""
        return f"{self.area}: {self.title}: {self.reasons}"


def fold_skipped(results: list[Result]) -> tuple[list[Result | Folded], int]:
    """One area's rows for the screen, and how many skipped checks were folded away.

    Skipped checks go to the end of their area: those that cannot apply here on one line,
    those not asked for on another. A lone skipped check keeps its own row (already one
    line, and its title says more than a count).
    """
    rows: list[Result | Folded] = [r for r in results if r.status is not Status.SKIP]
    skipped = [r for r in results if r.status is Status.SKIP]
    if len(skipped) < 2:
        return rows + skipped, 0
    area = skipped[0].area
    folded = 0
    for asked in (True, False):
        group = tuple(r for r in skipped if (not _NOT_ASKED.search(r.summary)) is asked)
        if len(group) > 1:
            rows.append(Folded(area, asked, group))
            folded += len(group)
        else:
            rows.extend(group)
    return rows, folded

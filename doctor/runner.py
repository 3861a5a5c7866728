"""Run the selected checks in parallel; a check that raises or stalls becomes a result."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterable

from dsenv.doctor.context import Context
from dsenv.doctor.registry import Check
from dsenv.facts.host.mounts import NoAnswer
from dsenv.verdicts.findings import Finding, Result, Status

# A check waits on probes that each have their own timeout; this bounds the rest.
CHECK_DEADLINE_FACTOR = 3.0


NOT_READ_FIX = ("ask the site's admins which file server or storage target is down (on "
                "Lustre `lfs check servers`; `lfs getstripe FILE` names the targets a file "
                "is on: Lustre's operations manual), rerun when it answers, or run the job "
                "from an environment on another file system")


NOT_JUDGED = "not judged: "  # how the summary of a check whose facts were not read begins


def not_read(exc: NoAnswer, ctx: Context) -> str:
    """The summary of a check whose facts sit on files that gave no answer (mounts.NoAnswer)."""
    return (f"{NOT_JUDGED}{exc.what} {exc.path} gave no answer to a stat within "
            f"{ctx.options.probe_timeout:g} s: its file system, or one of its storage targets, "
            "stopped answering, and the job will hang reading it too")


def run_check(check: Check, ctx: Context) -> Result:
    start = time.monotonic()
    try:
        finding = check.func(ctx)
        if not isinstance(finding, Finding):
            raise TypeError(f"check returned {type(finding).__name__}, not a Finding")
        return Result(check.id, check.area, check.title, finding.status, finding.summary,
                      list(finding.evidence), finding.fix, time.monotonic() - start,
                      action=finding.action, mode=finding.mode)
    except NoAnswer as exc:  # the facts it needs were not read: said, never judged on nothing
        return Result(check.id, check.area, check.title, Status.WARN, not_read(exc, ctx),
                      fix=NOT_READ_FIX, seconds=time.monotonic() - start)
    except Exception as exc:  # the doctor never crashes because one check did
        return Result(check.id, check.area, check.title, Status.ERROR,
                      f"the check raised {type(exc).__name__}: {exc}",
                      fix="report this as a dsenv bug with `dsenv doctor --verbose` output",
                      seconds=time.monotonic() - start, traceback=traceback.format_exc())


def run_checks(checks: Iterable[Check], ctx: Context) -> list[Result]:
    checks = list(checks)
    results: list[Result | None] = [None] * len(checks)

    def work(i: int, check: Check) -> None:
        results[i] = run_check(check, ctx)

    # Daemon threads: a check stuck in Python code cannot keep the process alive.
    threads = [threading.Thread(target=work, args=(i, c), daemon=True, name=c.id)
               for i, c in enumerate(checks)]
    for t in threads:
        t.start()
    limit = ctx.options.probe_timeout * CHECK_DEADLINE_FACTOR
    deadline = time.monotonic() + limit
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for i, check in enumerate(checks):
        if results[i] is None:
            results[i] = Result(
                check.id, check.area, check.title, Status.ERROR,
                f"the check did not finish within {limit:.0f} s",
                fix="rerun with --verbose and a larger --probe-timeout; report it as a dsenv bug",
            )
    return results  # type: ignore[return-value]

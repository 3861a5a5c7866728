"""`dsenv doctor --fix`: after the report, show each change the findings carry as data
(doctor/fix/actions.py), apply it (asking y/N on a terminal unless ``--yes``; with no
terminal and no ``--yes`` nothing is applied; ``--dry-run`` only shows), re-run the check,
and call it fixed only when the check now passes. Changes `--fix` may not make (system
files, packages, another user's files) are printed as the command to run by hand.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from dsenv.doctor.context import Context
from dsenv.doctor.fix.fixers import FixError, apply, recheck_env
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.doctor.verdict import verdict_line
from dsenv.redact import Redactor
from dsenv.verdicts.findings import Result, Status

NEEDS_FIX = (Status.INFO, Status.WARN, Status.FAIL, Status.ERROR)
PASSING = (Status.OK, Status.INFO, Status.SKIP)


@dataclass
class FixRecord:
    """What `--fix` did with one finding, for the screen and the JSON report."""

    check: str
    kind: str
    change: str
    applied: bool = False
    fixed: bool = False
    message: str = ""  # what was done, or why not
    status_after: str | None = None  # the check's status when re-run
    summary_after: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def pending(results: list[Result]) -> list[Result]:
    """Results whose fix `--fix` may apply."""
    return [r for r in results
            if r.action is not None and r.action.applicable and r.status in NEEDS_FIX]


def by_hand(results: list[Result]) -> list[tuple[Result, str]]:
    """Warnings and failures `--fix` leaves to the user, with the command to run."""
    out = []
    for r in results:
        if r.status not in (Status.WARN, Status.FAIL) or (r.action and r.action.applicable):
            continue
        command = (r.action.command if r.action and r.action.command else r.fix)
        if command:
            why = f" ({r.action.why_not})" if r.action and r.action.why_not else ""
            out.append((r, command + why))
    return out


def passes(before: Result, after: Result) -> bool:
    """The check now passes: no warning or failure, and the same fix no longer offered."""
    if after.status not in PASSING:
        return False
    return not (after.action is not None and after.action.applicable
                and after.action.kind == (before.action.kind if before.action else None))


def _confirm(question: str, stdin: TextIO, out: TextIO) -> bool:
    out.write(f"{question} [y/N] ")
    out.flush()
    answer = stdin.readline()
    if not answer:
        out.write("\n")
    return answer.strip().lower() in ("y", "yes")


def recheck(result: Result, ctx: Context) -> tuple[Result, str | None]:
    """Run ``result``'s check again, in a fresh context that sees the fix."""
    all_checks()
    env, note = recheck_env(result.action, ctx)
    fresh = Context(options=ctx.options, env=env, root=ctx.root,
                    python_prefix=ctx.python_prefix, target=ctx.target,
                    target_reason=ctx.target_reason)
    return run_check(CHECKS[result.id], fresh), note


def run_fixes(results: list[Result], ctx: Context, *, yes: bool, dry_run: bool,
              strict: bool = False, out: TextIO | None = None, stdin: TextIO | None = None
              ) -> tuple[list[Result], list[FixRecord]]:
    """Show, confirm, apply, re-check. Returns the results with every re-checked one
    replaced, and what happened to each fix."""
    out = out or sys.stdout
    stdin = stdin or sys.stdin
    scrub = Redactor(ctx.env).scrub
    todo, manual = pending(results), by_hand(results)
    records = [FixRecord(r.id, r.action.kind, r.action.change) for r in todo]
    width = max([len(r.id) for r in todo] + [len(r.id) for r, _ in manual] + [10])
    out.write("\nFixes (dsenv doctor --fix)\n")
    if not todo:
        out.write("  nothing `--fix` can change here\n")
    for r in todo:
        out.write(scrub(f"  {r.id:{width}}  {r.action.change}\n"))
    if manual:
        out.write("By hand (--fix never edits system files or installs packages):\n")
        for r, command in manual:
            out.write(scrub(f"  {r.id:{width}}  {command}\n"))
    if not todo:
        return results, records
    if dry_run:
        out.write(f"dry run: nothing changed ({len(todo)} change(s) shown)\n")
        for record in records:
            record.message = "dry run: not applied"
        return results, records
    interactive = not yes and stdin.isatty()
    if not yes and not interactive:
        out.write("no terminal to ask and no --yes: nothing changed (rerun with "
                  "`dsenv doctor --fix --yes` to apply the changes above)\n")
        for record in records:
            record.message = "not applied: no terminal to ask and no --yes"
        return results, records
    replaced = {}
    for r, record in zip(todo, records, strict=True):
        if interactive and not _confirm(scrub(f"{r.id}: {r.action.change}?"), stdin, out):
            record.message = "declined"
            out.write(f"- {r.id}: left as it is\n")
            continue
        try:
            record.message = apply(r.action, ctx, r.id)
            record.applied = True
            after, note = recheck(r, ctx)
        except FixError as exc:
            record.message = str(exc) if not record.applied else f"{record.message}; {exc}"
            out.write(scrub(f"✗ {r.id}: not fixed: {record.message}\n"))
            continue
        replaced[r.id] = after
        record.status_after, record.summary_after = after.status.value, after.summary
        record.fixed = passes(r, after)
        how = f" ({note})" if note else ""
        if record.fixed:
            out.write(scrub(f"✓ {r.id}: fixed, {record.message}; the check now says "
                            f"{after.status.value}{how}: {after.summary}\n"))
        else:
            out.write(scrub(f"✗ {r.id}: applied ({record.message}) but the check still "
                            f"says {after.status.value}{how}: {after.summary}\n"))
    sourced = sorted({r.action.target for r, rec in zip(todo, records, strict=True)
                      if rec.applied and r.action.kind.startswith("activate-")})
    for script in sourced:
        out.write(f"jobs that source {script} get the change; in this shell: . {script}\n")
    fixed = sum(rec.fixed for rec in records)
    out.write(f"{fixed} of {len(records)} fix(es) confirmed by re-running the check\n")
    after = [replaced.get(r.id, r) for r in results]
    if replaced:
        out.write(f"after --fix: {verdict_line(after, ctx.target, strict)}\n")
    return after, records

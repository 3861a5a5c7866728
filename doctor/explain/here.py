"""`dsenv explain --here`: from the post-mortem to a live check.

For a named cause that a doctor check detects, run that check on this node and this
environment now (the job's environment, as `dsenv doctor` judges it: --env, the activated
environment, python3 on PATH) and say whether the cause is present here. A loader finding
also says where this node and environment have the library (loader.look_here).
"""

from __future__ import annotations

import os
import threading

from dsenv.doctor import registry, runner
from dsenv.doctor.context import Context, Options
from dsenv.doctor.explain import loader, rank
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT
from dsenv.facts.python import target_env
from dsenv.verdicts.findings import Result, Status

# What a check's status says about the cause a log names.
VERDICT = {
    Status.FAIL: "the cause is present here",
    Status.ERROR: "the check could not finish here, so nothing is ruled out",
    Status.WARN: "the check warns here: the cause may be present",
    Status.OK: "not found here: this node and environment look healthy for it (the job's "
               "node or environment may differ)",
    Status.INFO: "not found here (the check reports facts only)",
    Status.SKIP: "the check does not apply here, so it cannot confirm or rule it out",
}


def context(environment: str | None = None,
            probe_timeout: float = DEFAULT_PROBE_TIMEOUT) -> Context:
    """This node as the doctor sees it; the job's environment starts being probed at once
    (every check needs it) while explain reads the text."""
    ctx = Context(options=Options(environment=environment, probe_timeout=probe_timeout),
                  env=dict(os.environ))
    threading.Thread(target=_probe_quietly, args=(ctx,), daemon=True).start()
    return ctx


def _probe_quietly(ctx: Context) -> None:
    try:
        target_env.environment(ctx)
    except Exception:  # noqa: BLE001 - the check that needs it reports what went wrong
        pass


def run(check_id: str, ctx: Context) -> Result | None:
    check = registry.named(check_id)
    return None if check is None else runner.run_checks([check], ctx)[0]


def look(match: rank.Match, ctx: Context, results: dict[str, Result]) -> list[str]:
    """Lines: what this node shows for the cause ``match`` names. ``results`` caches checks
    already run for an earlier match (two modes of one check run it once)."""
    if match.finding is not None:
        return loader.look_here(match.finding, ctx)
    mode = match.mode
    if not mode.check:
        return [f"no doctor check can see this before the job ({mode.detect.removeprefix('cannot: ')})"]
    if mode.check not in results:
        found = run(mode.check, ctx)
        if found is None:
            return [f"the doctor has no check {mode.check} in this dsenv"]
        results[mode.check] = found
    result = results[mode.check]
    verdict = VERDICT[result.status]
    if result.summary.startswith(runner.NOT_JUDGED):  # what it needs gave no answer here
        verdict = ("the check could not read what it needs here (its file system gave no "
                   "answer), so nothing is ruled out")
    elif result.mode == mode.id and result.status in (Status.WARN, Status.INFO):
        # the check named this very cause; it only warns or reports it (a login node, nothing
        # it was given needs what is missing), and the log says the job met it
        verdict = ("the cause is present here (the doctor "
                   + ("warns of it)" if result.status is Status.WARN else
                      "reports it as a fact only)"))
    elif result.mode and result.mode != mode.id and result.status in (Status.FAIL, Status.WARN):
        # a check with several causes stops at the first it finds
        verdict = (f"the check finds another cause here first ({result.mode}), so this one is "
                   "neither confirmed nor ruled out")
    lines = [f"your log says: {mode.title}",
             f"on this node {result.id} finds: {result.status.value.upper()} {result.summary}",
             verdict]
    if (result.status in (Status.FAIL, Status.WARN) or result.mode == mode.id) and result.fix:
        if result.mode and result.mode != mode.id:  # the check names a related cause
            lines.append(f"the check reports it as {result.mode} (`dsenv explain {result.mode}`)")
        # the catalogue's fix when the check names the mode (the one `dsenv explain` printed),
        # then what this node adds to it
        lines.append(f"fix here: {result.fix}")
        lines += [line for line in result.evidence if line.startswith("here: ")]
    return lines


def which_here(members: list[rank.Match], found: dict[int, list[str]]) -> str:
    """One sentence: which of several causes that share a text this node shows, from what
    ``look`` found for each (``found``: id(match) -> its lines)."""
    def said(m: rank.Match, *statuses: Status) -> bool:
        return any(line.startswith(VERDICT[s]) for line in found.get(id(m), ())
                   for s in statuses)

    # a reading that compares the text with this node decides too ("this node shows <id>":
    # loader.look_here on an undefined torch symbol against this torch's ABI)
    shown = {line.rsplit("this node shows ", 1)[1] for lines in found.values() for line in lines
             if "this node shows " in line}
    present = [m.id for m in members if said(m, Status.FAIL) or m.id in shown]
    healthy = [m.id for m in members if said(m, Status.OK)]  # an info decides nothing
    unseen = [m.id for m in members if m.id not in present and m.id not in healthy]
    if len(present) == 1:
        return f"of these causes, this node shows {present[0]}"
    if present:
        return f"this node shows several of them: {', '.join(present)}"
    parts = [f"not found here: {', '.join(healthy)}"] if healthy else []
    if unseen:
        parts.append(f"not decided here: {', '.join(unseen)}")
    # "none is present" only for causes a check here ruled out: an undecided one may be
    lead = ("none of them is present on this node" if not unseen else
            "none that a check here decides is present" if healthy else
            "no check on this node decides between them")
    return (lead + " (" + "; ".join(parts) + "): run `dsenv explain --here` on the node and "
            "in the environment that failed")

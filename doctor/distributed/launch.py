"""The ``dsenv doctor --distributed`` command: each rank's preflight, ``--launch``, or the
rank's run (:mod:`.rank`); the report is :mod:`.report`'s.

Before anything heavy is imported, each rank looks for the silent failures: a world of one
while the launcher started more (an MPI started without PMI, a job script without srun, N
copies of the command started side by side), or a world size other than the one asked for.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time

import psutil

from dsenv import proc
from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.command import Plan, make_plan
from dsenv.doctor.distributed.outcome import Failure, Launched, Outcome
from dsenv.doctor.distributed.rank import RankRun, message_of
from dsenv.doctor.distributed.report import RESULT_MARK, report
from dsenv.doctor.explain import logread
from dsenv.errors import UsageError
from dsenv.net import free_port
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.launch.env import discover

# --launch: the ranks' own deadline is the command's; this is for the launcher's start and
# for a rank's hard stop (.rank: PEER_LAG_S + HARD_STOP_AFTER_S).
LAUNCH_GRACE_S = 8.0
# A lone rank looks for copies of itself when it starts and again this much later, and lives
# at least that long, so that two copies started up to this far apart both see each other.
SIBLING_SETTLE_S = 1.0


def run_distributed(args, checks, ctx) -> int:
    """``dsenv doctor --distributed``: exit 0 (nothing failed), 1, or 2 (usage)."""
    plan = make_plan(args, ctx.env)
    if plan.launch:
        return launch(plan, args, checks, ctx)
    try:
        info = discover(ctx.env)
    except WorkloadError as exc:
        return report(preflight_outcome(None, plan, [f"rank discovery: {exc}"], "launch-env"),
                      plan, args, checks, ctx)
    problems = ranks.world_size_problems(info.launcher, info.world_size, ctx.env,
                                         plan.expect_world_size, plan.expect_world_from)
    siblings = sibling_copies() if info.world_size == 1 else []
    if info.world_size == 1:  # stay alive a moment: a copy started later must see this one
        time.sleep(SIBLING_SETTLE_S)
        siblings = siblings or sibling_copies()
    evidence = ranks.singleton_evidence(info.world_size, ctx.env, siblings)
    if evidence:
        return report(preflight_outcome(info, plan, evidence, "singletons"),
                      plan, args, checks, ctx)
    if problems:
        return report(preflight_outcome(info, plan, problems, "world-size"),
                      plan, args, checks, ctx)
    if info.world_size == 1:
        return report(preflight_outcome(info, plan, [], "alone"), plan, args, checks, ctx)
    if info.master_addr is None:
        return report(preflight_outcome(info, plan, [
            f"{info.launcher}: ranks span several nodes and MASTER_ADDR is not set"],
            "launch-env"), plan, args, checks, ctx)
    if info.rank == 0 and not plan.marked:
        # rich: loaded before the run, so that a failure report need not wait on imports
        import rich.console  # noqa: F401  (rich, as above)
        import rich.table  # noqa: F401  (rich, as above)

    RankRun(plan, info, ctx.env, lambda outcome: report(outcome, plan, args, checks, ctx)).run()
    return 1  # not reached: RankRun.run exits the process


def sibling_copies() -> list[str]:
    """Other processes running this same command line, started by the same parent (or, for
    a per-rank wrapper such as `singularity exec`, the same grandparent), running now."""
    try:
        me = psutil.Process()
        mine = me.cmdline()
        parent = me.parent()
        ancestors = [parent]
        if parent is not None and len(parent.children()) == 1:
            ancestors.append(parent.parent())
        for ancestor in ancestors:
            if ancestor is None or ancestor.pid <= 1:
                break
            copies = []
            for process in ancestor.children(recursive=True):
                try:
                    if process.pid != me.pid and process.cmdline() == mine:
                        copies.append(process.pid)
                except psutil.Error:
                    continue
            if copies:
                pids = ", ".join(str(p) for p in sorted([me.pid, *copies]))
                return [f"{len(copies) + 1} copies of this command run side by side under "
                        f"{ancestor.name()} (pid {ancestor.pid}; pids {pids}), each sees "
                        "rank 0 of 1"]
    except Exception:  # a process vanished or cannot be read: no evidence either way
        return []
    return []


def preflight_outcome(info, plan: Plan, problems: list[str], kind: str) -> Outcome:
    """The outcome of a run stopped before any rank talked to another."""
    outcome = Outcome(rank=info.rank if info else 0, launcher=info.launcher if info else None,
                      world_size=info.world_size if info else None, timeout_s=plan.timeout_s,
                      preflight=kind)
    if info:
        outcome.ranks = [{"rank": info.rank, "local_rank": info.local_rank,
                          "world_size": info.world_size, "local_size": info.local_size,
                          "launcher": info.launcher, "host": socket.gethostname(),
                          "pid": os.getpid()}]
    if kind == "singletons":
        outcome.failure = Failure(kind, "silent singletons: this process sees itself as rank 0 "
                                  "of 1 while the launcher started more", "start",
                                  evidence=problems)
    elif kind != "alone":
        outcome.failure = Failure(kind, problems[0], "start", evidence=problems[1:])
    return outcome


# -- --launch ---------------------------------------------------------------------------------
def launch(plan: Plan, args, checks, ctx) -> int:
    """``--launch mpirun|torchrun -n N``: start N ranks on this node and report for them."""
    env = dict(ctx.env)
    env.setdefault("MASTER_ADDR", "127.0.0.1")  # one node
    env["MASTER_PORT"] = str(free_port())
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The ranks run `python -m dsenv` and must run the dsenv that launched them: without this
    # (Python >= 3.11) the working directory comes first on their path, and a `dsenv` folder
    # there (the source checkout, a project of that name) was imported instead: on a GPU node,
    # run from the clone, every rank died at import and no rank reported.
    env["PYTHONSAFEPATH"] = "1"
    deadline = time.time() + plan.timeout_s
    rank_command = ["-m", "dsenv", "doctor", "--distributed", *plan.passed,
                    "--expect-world-size", str(plan.nprocs), "--rank-output", "marked",
                    "--deadline-epoch", f"{deadline:.3f}"]
    n = str(plan.nprocs)
    if plan.launch == "torchrun":
        if importlib.util.find_spec("torch") is None:
            raise UsageError("--launch torchrun: torch is not installed in this Python "
                             f"({sys.executable})")
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", n,
                "--master_addr", env["MASTER_ADDR"], "--master_port", env["MASTER_PORT"],
                *rank_command]
    else:
        mpirun = ctx.which("mpirun")  # PATH as env has it, less folders that gave no answer
        if mpirun is None:
            raise UsageError("--launch mpirun: mpirun is not on PATH; load an MPI module or "
                             "use --launch torchrun")
        argv = [mpirun, *mpirun_options(mpirun, plan.nprocs, env), "-np", n,
                sys.executable, *rank_command]
    ran = proc.run(argv, timeout=plan.timeout_s + LAUNCH_GRACE_S, env=env)
    outcome = collected_outcome(ran, plan)
    outcome.launched = Launched(plan.launch, plan.nprocs, " ".join(argv), ran.returncode,
                                ran.timed_out, round(ran.seconds, 3))
    return report(outcome, plan, args, checks, ctx, marked_ok=False)


def mpirun_options(mpirun: str, nprocs: int, env) -> list[str]:
    """Open MPI needs to be told it may run as root and oversubscribe; Hydra takes neither."""
    version = proc.run([mpirun, "--version"], timeout=10, env=env)
    if "open mpi" not in (version.stdout + version.stderr).lower() and \
            "open rte" not in (version.stdout + version.stderr).lower():
        return []
    options = ["-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    if os.geteuid() == 0:
        options.append("--allow-run-as-root")
    if nprocs > (os.cpu_count() or 1):
        options.append("--oversubscribe")
    return options


def marked_outcomes(text: str) -> list[Outcome]:
    found = []
    for line in text.splitlines():
        at = line.find(RESULT_MARK)
        if at < 0:
            continue
        try:
            found.append(Outcome.from_json(json.loads(line[at + len(RESULT_MARK):])))
        except (json.JSONDecodeError, KeyError, TypeError):  # a line cut short or garbled
            continue
    return found


def collected_outcome(ran: proc.CommandResult, plan: Plan) -> Outcome:
    """Rank 0's outcome when it reported; else the lowest rank's that did; else what the
    launcher itself said."""
    reported = marked_outcomes(ran.stdout) + marked_outcomes(ran.stderr)
    reported.sort(key=lambda o: o.rank)
    if reported:
        outcome = reported[0]
        others = [f"rank {o.rank}: {o.failure.message}" for o in reported[1:]
                  if o.failure and o.failure.kind != "aborted"]
        if others and outcome.failure:  # what ranks saw beyond rank 0's word
            outcome.failure.evidence = [*(outcome.failure.evidence or []), *others]
        return outcome
    output = "\n".join(text for text in (ran.stderr, ran.stdout) if text and text.strip())
    tail = [line for line in output.strip().splitlines() if line.strip()]
    how = (f"did not finish within {plan.timeout_s + LAUNCH_GRACE_S:g} s (killed)"
           if ran.timed_out else f"exited {ran.returncode}")
    return Outcome(launcher=plan.launch, world_size=plan.nprocs, timeout_s=plan.timeout_s,
                   seconds=ran.seconds,
                   failure=Failure("launch", f"{plan.launch} {how} and no rank reported",
                                   "start", evidence=[*first_error(output), *tail[-8:]]))


def first_error(output: str) -> list[str]:
    """The ranks' own first error in the launcher's output, which a launcher's closing summary
    (torchrun's "ChildFailedError" block, mpirun's help text) pushes out of the tail."""
    reading = logread.find_root(output)
    if reading.root is None or reading.single:
        return []
    return [f"first error (line {reading.root.number} of the launcher's output): "
            f"{message_of(reading.root.text.strip())}"]

"""``dsenv doctor --distributed``: prove every rank can talk to every other, fast, and never hang.

Under a launcher (srun, mpirun, torchrun, the deepspeed launcher) every rank runs this same
command; rank discovery is the workloads' (dsenv.workloads.launch_env). With ``--launch
mpirun|torchrun -n N`` the command starts N ranks on this node itself and collects them.

Before anything is imported, each rank looks for the silent failures: a world of one while
the launcher started more (an MPI started without PMI, a job script without srun, N copies
of the command started side by side), or a world size other than the one asked for. Then
(doctor/distributed_rank.py) the ranks rendezvous, rank 0 checks that no two ranks share a
GPU, and all-reduces random data at several sizes, checked against the exact sum, then
timed as nccl-tests times them. Rank 0 prints one table of the ranks, one of the bandwidths,
and the normal doctor report with the ``distributed`` results in it (``--json``: the same
report, plus a ``distributed`` section).

Test-only fault injection: DSENV_DISTRIBUTED_TEST_FAULT (doctor/distributed_rank.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc
from dsenv.argtypes import csv_list, non_negative_int, positive_float, positive_int
from dsenv.data import load_table
from dsenv.net import free_port

from . import ranks
from .probes.result import Result, Status

AREA = "distributed"
LAUNCH_WITH = ("mpirun", "torchrun")
RESULT_MARK = "DSENV-DISTRIBUTED-RESULT "
# --launch: the ranks' own deadline is the command's; this is for the launcher's start and
# for a rank's hard stop (distributed_rank: PEER_LAG_S + HARD_STOP_AFTER_S).
LAUNCH_GRACE_S = 8.0
# A lone rank looks for copies of itself when it starts and again this much later, and lives
# at least that long, so that two copies started up to this far apart both see each other.
SIBLING_SETTLE_S = 1.0
# Ranks other than 0 that stop before the rendezvous exit this much later than rank 0 would:
# torchrun and mpirun stop every rank as soon as one exits non-zero.
PREFLIGHT_LAG_S = 2.0


def defaults() -> dict:
    return load_table("dsenv.doctor", "distributed.toml")


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "distributed test",
        "--distributed: every rank reports itself, all-reduces checked data at several sizes "
        "and times them (nccl-tests' algbw/busbw). Run it under srun/mpirun/torchrun/"
        "deepspeed, or let it start the ranks with --launch. Always returns within "
        "--timeout (+ a few seconds), naming a rank that is missing or stuck.")
    group.add_argument("--distributed", action="store_true",
                       help="run the distributed test (rank 0 reports)")
    group.add_argument("--launch", choices=LAUNCH_WITH,
                       help="start the ranks on this node with this launcher (needs -n)")
    group.add_argument("-n", "--nprocs", type=positive_int, metavar="N",
                       help="ranks to start with --launch")
    group.add_argument("--timeout", type=positive_float, metavar="S",
                       help=f"seconds the whole test may take (default {defaults()['timeout_s']})")
    group.add_argument("--sizes", type=csv_list, metavar="SIZE[,SIZE]",
                       help="all-reduce sizes in bytes, K/M/G allowed (default GPU: "
                            f"{','.join(defaults()['backends']['nccl']['sizes'])}; CPU: "
                            f"{','.join(defaults()['backends']['gloo']['sizes'])})")
    group.add_argument("--iters", type=positive_int, metavar="N",
                       help="timed all-reduces per size (default GPU 20, CPU 10)")
    group.add_argument("--warmup", type=non_negative_int, metavar="N",
                       help="untimed all-reduces per size first (default GPU 5, CPU 3)")
    group.add_argument("--expect-world-size", type=positive_int, metavar="N",
                       help="fail unless the world has N ranks (default: --nodes x "
                            "--gpus-per-node when both are given)")
    group.add_argument("--expect-busbw", type=positive_float, metavar="GBPS",
                       help="expected bus bandwidth in GB/s at the largest size (default: the "
                            "site profile's expect_busbw_gbps)")
    group.add_argument("--site", metavar="NAME",
                       help="site profile for the expected bandwidth (default: the one this "
                            "environment was provisioned for)")
    group.add_argument("--rank-output", choices=("marked",), help=argparse.SUPPRESS)
    group.add_argument("--deadline-epoch", type=float, help=argparse.SUPPRESS)


@dataclass
class Plan:
    timeout_s: float
    sizes: list[int] | None = None
    warmup: int | None = None
    iters: int | None = None
    expect_world_size: int | None = None
    expect_world_from: str = "--expect-world-size"
    expect_busbw: float | None = None
    site: str | None = None
    launch: str | None = None
    nprocs: int | None = None
    marked: bool = False
    deadline_epoch: float | None = None
    fault: object = None  # distributed_rank.Fault
    passed: list[str] = field(default_factory=list)  # options handed to --launch's ranks

    def _backend(self, backend: str) -> dict:
        return defaults()["backends"][backend]

    def sizes_for(self, backend: str) -> list[int]:
        return self.sizes or [ranks.parse_size(s) for s in self._backend(backend)["sizes"]]

    def warmup_for(self, backend: str) -> int:
        return self._backend(backend)["warmup"] if self.warmup is None else self.warmup

    def iters_for(self, backend: str) -> int:
        return self.iters or self._backend(backend)["iters"]


def validate_usage(args) -> None:
    """Options that only mean something with --distributed (UsageError otherwise)."""
    from dsenv.errors import UsageError

    if args.distributed:
        return
    given = [name for name, value in (("--launch", args.launch), ("-n", args.nprocs),
                                      ("--timeout", args.timeout), ("--sizes", args.sizes),
                                      ("--expect-busbw", args.expect_busbw),
                                      ("--expect-world-size", args.expect_world_size),
                                      ("--iters", args.iters), ("--warmup", args.warmup))
             if value is not None]
    if AREA in (args.only or []):
        given.append("--only distributed")
    if given:
        raise UsageError(f"{given[0]} needs --distributed (`dsenv doctor --distributed "
                         f"{given[0].split()[0]} ...`)")


def make_plan(args, env) -> Plan:
    from dsenv.errors import UsageError

    from .distributed_rank import FAULT_VARIABLE, parse_fault

    if args.launch and not args.nprocs:
        raise UsageError(f"--launch {args.launch} needs -n N (the number of ranks to start)")
    if args.nprocs and not args.launch:
        raise UsageError("-n needs --launch mpirun|torchrun (under a launcher, the launcher "
                         "decides the number of ranks)")
    if args.launch and args.nprocs < 2:
        raise UsageError("--launch -n 1: one rank has nobody to talk to; use -n 2 or more")
    try:
        sizes = sorted({ranks.parse_size(s) for s in args.sizes}) if args.sizes else None
    except ValueError as exc:
        raise UsageError(f"--sizes: {exc}") from None
    if args.sizes is not None and not sizes:
        raise UsageError("--sizes: give at least one size (e.g. --sizes 1M,64M)")
    try:
        fault = parse_fault(env.get(FAULT_VARIABLE))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.site:
        from dsenv.envs.sites import site_names

        if args.site not in site_names():
            raise UsageError(f"--site {args.site}: unknown site; known sites: "
                             f"{', '.join(site_names())}")
    expected, expected_from = args.expect_world_size, "--expect-world-size"
    if expected is None and args.nodes and args.gpus_per_node:
        expected = args.nodes * args.gpus_per_node
        expected_from = f"--nodes {args.nodes} x --gpus-per-node {args.gpus_per_node}"
    if args.launch:
        expected, expected_from = args.nprocs, f"--launch {args.launch} -n {args.nprocs}"
    passed = []
    for option, value in (("--timeout", args.timeout), ("--iters", args.iters),
                          ("--warmup", args.warmup)):
        if value is not None:
            passed += [option, str(value)]
    if sizes:
        passed += ["--sizes", ",".join(str(s) for s in sizes)]
    return Plan(timeout_s=args.timeout or float(defaults()["timeout_s"]), sizes=sizes,
                warmup=args.warmup, iters=args.iters, expect_world_size=expected,
                expect_world_from=expected_from, expect_busbw=args.expect_busbw,
                site=args.site, launch=args.launch, nprocs=args.nprocs,
                marked=args.rank_output == "marked", deadline_epoch=args.deadline_epoch,
                fault=fault, passed=passed)


# -- the command --------------------------------------------------------------------------------
def run_distributed(args, checks, ctx) -> int:
    """``dsenv doctor --distributed``: exit 0 (nothing failed), 1, or 2 (usage)."""
    plan = make_plan(args, ctx.env)
    if plan.launch:
        return launch(plan, args, checks, ctx)
    from dsenv.workloads.launch_env import WorkloadError, discover

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
    from .distributed_rank import RankRun

    if info.rank == 0 and not plan.marked:
        import rich.console  # noqa: F401  (a failure report must not wait on imports)
        import rich.table  # noqa: F401

    RankRun(plan, info, ctx.env, lambda outcome: report(outcome, plan, args, checks, ctx)).run()
    return 1  # not reached: RankRun.run exits the process


def sibling_copies() -> list[str]:
    """Other processes running this same command line, started by the same parent (or, for
    a per-rank wrapper such as `singularity exec`, the same grandparent), running now."""
    try:
        import psutil

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
    except Exception:  # psutil missing or a process vanished: no evidence either way
        return []
    return []


def preflight_outcome(info, plan: Plan, problems: list[str], kind: str) -> dict:
    """The outcome of a run stopped before any rank talked to another."""
    import socket

    outcome = {"rank": info.rank if info else 0, "launcher": info.launcher if info else None,
               "backend": None, "world_size": info.world_size if info else None,
               "master": None, "timeout_s": plan.timeout_s, "seconds": 0.0,
               "ranks": [{"rank": info.rank, "local_rank": info.local_rank,
                          "world_size": info.world_size, "local_size": info.local_size,
                          "launcher": info.launcher, "host": socket.gethostname(),
                          "pid": os.getpid()}] if info else [],
               "allreduce": [], "timing": {}, "failure": None, "preflight": kind,
               "fault_injected": None}
    if kind == "singletons":
        outcome["failure"] = {"kind": kind, "step": "start", "culprits": [],
                              "message": "silent singletons: this process sees itself as rank 0 "
                                         "of 1 while the launcher started more",
                              "evidence": problems}
    elif kind != "alone":
        outcome["failure"] = {"kind": kind, "message": problems[0], "step": "start",
                              "culprits": [], "evidence": problems[1:]}
    return outcome


# -- --launch ---------------------------------------------------------------------------------
def launch(plan: Plan, args, checks, ctx) -> int:

    from dsenv.errors import UsageError

    env = dict(ctx.env)
    env.setdefault("MASTER_ADDR", "127.0.0.1")  # one node
    env["MASTER_PORT"] = str(free_port())
    env.setdefault("PYTHONUNBUFFERED", "1")
    deadline = time.time() + plan.timeout_s
    rank_command = ["-m", "dsenv", "doctor", "--distributed", *plan.passed,
                    "--expect-world-size", str(plan.nprocs), "--rank-output", "marked",
                    "--deadline-epoch", f"{deadline:.3f}"]
    n = str(plan.nprocs)
    if plan.launch == "torchrun":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise UsageError("--launch torchrun: torch is not installed in this Python "
                             f"({sys.executable})")
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", n,
                "--master_addr", env["MASTER_ADDR"], "--master_port", env["MASTER_PORT"],
                *rank_command]
    else:
        mpirun = proc.which("mpirun", env)
        if mpirun is None:
            raise UsageError("--launch mpirun: mpirun is not on PATH; load an MPI module or "
                             "use --launch torchrun")
        argv = [mpirun, *mpirun_options(mpirun, plan.nprocs, env), "-np", n,
                sys.executable, *rank_command]
    ran = proc.run(argv, timeout=plan.timeout_s + LAUNCH_GRACE_S, env=env)
    outcome = collected_outcome(ran, plan)
    outcome["launched"] = {"launcher": plan.launch, "nprocs": plan.nprocs,
                           "command": " ".join(argv), "returncode": ran.returncode,
                           "timed_out": ran.timed_out, "seconds": round(ran.seconds, 3)}
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


def marked_outcomes(text: str) -> list[dict]:
    found = []
    for line in text.splitlines():
        at = line.find(RESULT_MARK)
        if at < 0:
            continue
        try:
            found.append(json.loads(line[at + len(RESULT_MARK):]))
        except json.JSONDecodeError:
            continue
    return found


def collected_outcome(ran: proc.CommandResult, plan: Plan) -> dict:
    """Rank 0's outcome when it reported; else the lowest rank's that did; else what the
    launcher itself said."""
    reported = marked_outcomes(ran.stdout) + marked_outcomes(ran.stderr)
    reported.sort(key=lambda o: o.get("rank", 0))
    if reported:
        outcome = reported[0]
        others = [f"rank {o['rank']}: {o['failure']['message']}" for o in reported[1:]
                  if o.get("failure") and o["failure"]["kind"] != "aborted"]
        if others and outcome.get("failure"):  # what ranks saw beyond rank 0's word
            outcome["failure"].setdefault("evidence", []).extend(others)
        return outcome
    tail = [line for line in (ran.stderr or ran.stdout).strip().splitlines() if line.strip()]
    how = (f"did not finish within {plan.timeout_s + LAUNCH_GRACE_S:g} s (killed)"
           if ran.timed_out else f"exited {ran.returncode}")
    return {"rank": 0, "launcher": plan.launch, "backend": None, "world_size": plan.nprocs,
            "master": None, "timeout_s": plan.timeout_s, "seconds": ran.seconds, "ranks": [],
            "allreduce": [], "timing": {}, "fault_injected": None,
            "failure": {"kind": "launch", "step": "start", "culprits": [],
                        "message": f"{plan.launch} {how} and no rank reported",
                        "evidence": tail[-8:]}}


# -- verdicts -----------------------------------------------------------------------------------
STAGES = ("launch", "rendezvous", "devices", "allreduce", "busbw")
TITLES = {"launch": "Ranks and launcher", "rendezvous": "Every rank arrives",
          "devices": "One GPU per rank", "allreduce": "All-reduce is exact",
          "busbw": "All-reduce bus bandwidth"}


def stage_of(failure: dict | None) -> str | None:
    if failure is None:
        return None
    if failure["kind"] in ("singletons", "world-size", "launch-env", "launch"):
        return "launch"
    step = failure.get("step") or "start"
    if failure["kind"] == "aborted" and step == "rendezvous":
        return "devices" if "GPU" in failure["message"] else "launch"
    if step.startswith("all-reduce check"):
        return "allreduce"
    if step.startswith(("bandwidth", "gather", "done")):
        return "busbw"
    return "rendezvous"


def expectation(plan: Plan, hosts: int, prefix: Path | None = None
                ) -> tuple[float | None, str]:
    """(expected busbw GB/s, where it comes from) or (None, how to give one)."""
    if plan.expect_busbw:
        return plan.expect_busbw, "--expect-busbw"
    name = plan.site
    if name is None:
        from dsenv.provision import ProvisionError
        from dsenv.provision.manifest import read_manifest

        try:
            recorded = read_manifest(prefix or Path(sys.prefix))
        except ProvisionError:
            recorded = None
        name = recorded.site if recorded is not None else None
    if not name:
        return None, ("no expectation: pass --expect-busbw GBPS or set expect_busbw_gbps in "
                      "the site profile")
    from dsenv.envs.sites import load_site

    key = "intra_node" if hosts <= 1 else "inter_node"
    value = load_site(name).expect_busbw_gbps.get(key)
    if value is None:
        return None, f"site {name} has no expect_busbw_gbps.{key}; pass --expect-busbw GBPS"
    return float(value), f"site {name}: expect_busbw_gbps.{key}"


def _result(stage: str, status: Status, summary: str, evidence=(), fix=None) -> Result:
    return Result(f"{AREA}.{stage}", AREA, TITLES[stage], status, summary, list(evidence), fix)


FIXES = {
    "singletons": "the launcher did not give the ranks their identity: start MPI programs "
                  "with `srun --mpi=pmix` (or the plugin `dsenv doctor --only mpi` names), "
                  "run one srun step per rank set (`srun -n N dsenv doctor --distributed`), "
                  "or use torchrun / the deepspeed launcher",
    "world-size": "make the launcher start the ranks you plan for (srun -n, mpirun -np, "
                  "torchrun --nnodes x --nproc_per_node) and do not export WORLD_SIZE by hand",
    "launch-env": "export MASTER_ADDR=<first node> (and LOCAL_RANK where the launcher does "
                  "not), or use a launcher that sets them",
    "launch": "run the printed launcher command by hand to see why it failed",
    "absent": "see the launcher's log for that rank: it did not start, or cannot reach "
              "MASTER_ADDR:MASTER_PORT (firewall, wrong interface); a slow start on a "
              "shared file system needs a larger --timeout",
    "exited": "read the named rank's own output (stderr): it ended before the test did",
    "stuck": "inspect the named rank while it hangs: `py-spy dump --pid PID` on its host",
    "stall": "every rank is waiting in the same collective: rerun with NCCL_DEBUG=INFO (GPU) "
             "and check the interface column (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)",
}


def _failure_fix(failure: dict, records: list[dict]) -> str:
    kind = failure["kind"]
    if kind in FIXES:
        return FIXES[kind]
    culprits = failure.get("culprits", [])
    for state in ("exited", "absent", "stuck"):
        culprit = next((c for c in culprits if c["state"] == state), None)
        if culprit is None:
            continue
        pid = next((r.get("pid") for r in records if r.get("rank") == culprit["rank"]), None)
        return FIXES[state].replace("PID", str(pid)) if pid else FIXES[state]
    if kind == "aborted" and "GPU" in failure["message"]:
        return ("give each rank its own GPU: `srun --gpus-per-task=1`, or one "
                "CUDA_VISIBLE_DEVICES entry per local rank (dsenv uses cuda:LOCAL_RANK)")
    if kind == "aborted":
        return FIXES["world-size"]
    if kind == "store":
        return FIXES["absent"]
    return FIXES["stall"]


def results_from(outcome: dict, plan: Plan, prefix: Path | None = None) -> list[Result]:
    """The distributed results for the doctor report, from rank 0's (or the parent's) view."""
    failure = outcome.get("failure")
    failed_at = stage_of(failure)
    records = outcome.get("ranks") or []
    hosts = sorted({r.get("host") for r in records if r.get("host")})
    world = outcome.get("world_size")
    launcher = outcome.get("launcher") or "?"
    results: list[Result] = []

    def reached(stage: str) -> bool:
        return failed_at is None or STAGES.index(stage) < STAGES.index(failed_at)

    def failed(stage: str) -> Result:
        evidence = [c["detail"] for c in failure.get("culprits", [])
                    if c["detail"] not in failure["message"]]
        evidence += failure.get("evidence", [])
        if outcome.get("fault_injected"):
            evidence.append("fault injected: " + outcome["fault_injected"])
        if outcome.get("launched"):
            evidence.append(f"started with: {outcome['launched']['command']}")
        return _result(stage, Status.FAIL, failure["message"], evidence,
                       _failure_fix(failure, records))

    for stage in STAGES:
        if failed_at == stage:
            results.append(failed(stage))
        elif not reached(stage):
            results.append(_result(stage, Status.SKIP, f"not reached: "
                                   f"{TITLES[failed_at].lower()} failed"))
        elif outcome.get("preflight") == "alone" and stage != "launch":
            results.append(_result(stage, Status.SKIP, "one rank: nothing to talk to"))
        else:
            results.append(_passed(stage, outcome, plan, hosts, world, launcher, prefix))
    return results


def _passed(stage, outcome, plan, hosts, world, launcher, prefix) -> Result:
    records = outcome.get("ranks") or []
    if stage == "launch":
        if outcome.get("preflight") == "alone":
            return _result(stage, Status.WARN, f"one rank ({launcher}): nothing to test",
                           [], "run it under the job's launcher (srun -n N, mpirun -np N, "
                           "torchrun --nproc_per_node N, deepspeed) or add --launch torchrun "
                           "-n 2")
        return _result(stage, Status.OK, f"{world} ranks under {launcher} on "
                       f"{len(hosts)} host(s), backend {outcome.get('backend')}",
                       [f"rank {r['rank']}: {r.get('host')}, local rank {r.get('local_rank')}"
                        for r in records[:16]])
    if stage == "rendezvous":
        timing = outcome.get("timing", {})
        return _result(stage, Status.OK, f"{world}/{world} ranks in "
                       f"{timing.get('rendezvous_s', 0):.2f} s, {outcome.get('backend')} "
                       f"init {timing.get('init_s', 0):.2f} s", [f"master {outcome['master']}"])
    if stage == "devices":
        gpus = [r for r in records if str(r.get("device", "")).startswith("cuda")]
        if not gpus:
            return _result(stage, Status.SKIP, "ranks run on CPU (gloo): no GPUs to share")
        return _result(stage, Status.OK, f"{len(gpus)} ranks on {len(gpus)} distinct GPUs",
                       [f"rank {r['rank']}: {r.get('device_name')} {r.get('device_uuid')}"
                        for r in gpus[:16]])
    rows = outcome.get("allreduce") or []
    if stage == "allreduce":
        wrong = [r for r in rows if r.get("wrong")]
        sizes = f"{ranks.format_size(rows[0]['bytes'])} to {ranks.format_size(rows[-1]['bytes'])}"
        if wrong:
            first = wrong[0]
            at = first.get("first_wrong", {})
            return _result(stage, Status.FAIL, f"wrong sum at {ranks.format_size(first['bytes'])}"
                           f": {first['wrong']} of {first['count']} elements differ",
                           [f"first at index {at.get('index')}: got {at.get('got')}, expected "
                            f"{at.get('expected')}"],
                           "the collective corrupts data: rerun with NCCL_ALGO=Ring "
                           "NCCL_PROTO=Simple to isolate it, and report this output to the admins")
        return _result(stage, Status.OK, f"exact at {len(rows)} sizes ({sizes}): the sum of "
                       f"{world} ranks' random data, element by element")
    largest = rows[-1]
    busbw = largest["busbw_gbps"]
    shown = f"{busbw:.2f} GB/s at {ranks.format_size(largest['bytes'])}"
    expected, source = expectation(plan, len(hosts), prefix)
    evidence = [f"{ranks.format_size(r['bytes'])}: {r['time_us']:.1f} us, algbw "
                f"{r['algbw_gbps']:.2f}, busbw {r['busbw_gbps']:.2f} GB/s" for r in rows]
    if expected is None:
        return _result(stage, Status.INFO, f"busbw {shown}; {source}", evidence)
    verdict = defaults()["verdict"]
    ratio = busbw / expected
    summary = f"busbw {shown}: {ratio:.0%} of the expected {expected:g} GB/s ({source})"
    if ratio >= verdict["ok_from"]:
        return _result(stage, Status.OK, summary, evidence)
    fix = ("compare the interface column with the fabric you expect (NCCL_SOCKET_IFNAME, "
           "NCCL_IB_HCA), run `dsenv doctor --only comm`, and rerun with NCCL_DEBUG=INFO to "
           "see the transport NCCL chose")
    status = Status.WARN if ratio >= verdict["warn_from"] else Status.FAIL
    return _result(stage, status, summary, evidence, fix)


# -- output -------------------------------------------------------------------------------------
def report(outcome: dict, plan: Plan, args, checks, ctx, marked_ok: bool = True) -> int:
    """Print what this process should print; the exit code."""
    failed = outcome.get("failure") is not None
    if plan.marked and marked_ok:
        stream = sys.stdout if outcome.get("rank", 0) == 0 else sys.stderr
        stream.write(RESULT_MARK + json.dumps(outcome) + "\n")
        return 1 if failed else 0
    if outcome.get("rank", 0) != 0:  # rank 0 prints the report; the others one line
        if failed:
            print(f"dsenv doctor --distributed: rank {outcome['rank']}: "
                  f"{outcome['failure']['message']}", file=sys.stderr, flush=True)
            if outcome.get("preflight"):  # every rank stops at once: let rank 0 report
                time.sleep(PREFLIGHT_LAG_S)  # before a launcher stops it for our exit
        return 1 if failed else 0
    from .render import exit_code, render_json, render_text
    from .runner import run_checks

    results = results_from(outcome, plan)
    if not failed and checks:
        if ctx.options.launcher is None and outcome.get("launcher") in ("srun", "mpirun",
                                                                         "deepspeed", "torchrun"):
            ctx.options.launcher = outcome["launcher"]
        results = run_checks(checks, ctx) + results
    outcome["expect_busbw_gbps"], outcome["expect_source"] = expectation(
        plan, len({r.get("host") for r in outcome.get("ranks") or []}))
    if args.json:
        sys.stdout.write(render_json(results, ctx, extra={"distributed": outcome}) + "\n")
    else:
        color = None if sys.stdout.isatty() else False
        sys.stdout.write(render_tables(outcome, color=color))
        sys.stdout.write(render_text(results, ctx, color=color))
    return exit_code(results, strict=args.strict)


def render_tables(outcome: dict, *, color: bool | None = None, width: int = 100) -> str:
    """The ranks table and nccl-tests' bandwidth table, as text."""
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=color is False, width=width,
                      highlight=False, soft_wrap=False)
    hosts = {r.get("host") for r in outcome.get("ranks") or []}
    world = outcome.get("world_size")
    console.print(f"[bold]dsenv doctor --distributed[/] — {world} rank{'' if world == 1 else 's'}"
                  f" under {outcome.get('launcher')}, backend {outcome.get('backend') or '-'}, "
                  f"{len(hosts)} host(s), {outcome.get('seconds', 0):.1f} s")
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for column in ("rank", "host", "local", "device", "visible", "NUMA", "interface"):
        table.add_column(column, justify="right" if column in ("rank", "local") else "left")
    for r in outcome.get("ranks") or []:
        device = r.get("device") or "-"
        if r.get("device_uuid"):
            device += f" {str(r['device_uuid'])[:13]}"
        numa = ",".join(str(n) for n in r.get("numa") or []) or "-"
        if r.get("device_numa") is not None:
            numa += f" (GPU {r['device_numa']})"
        interface = r.get("interface") or "-"
        if r.get("address"):
            interface += f" {r['address']}"
        table.add_row(str(r.get("rank")), escape(str(r.get("host"))), str(r.get("local_rank")),
                      escape(device), escape(r.get("visible") or "-"), numa, escape(interface))
    console.print(table)
    rows = outcome.get("allreduce") or []
    if rows and all("time_us" in r for r in rows):
        console.print(f"\n[bold]all-reduce[/] (in place, {outcome.get('warmup')} warm-up + "
                      f"{outcome.get('iters')} timed iterations, time averaged over ranks, "
                      "busbw = algbw x 2(n-1)/n)")
        bw = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
        for column in ("size (B)", "count", "type", "redop", "time (us)", "algbw (GB/s)",
                       "busbw (GB/s)", "#wrong"):
            bw.add_column(column, justify="left" if column in ("type", "redop") else "right")
        for r in rows:
            bw.add_row(str(r["bytes"]), str(r["count"]), r["type"], r["redop"],
                       f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.2f}", f"{r['busbw_gbps']:.2f}",
                       str(r["wrong"]))
        console.print(bw)
    console.print()
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"

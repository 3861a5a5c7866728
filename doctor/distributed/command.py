"""``dsenv doctor --distributed``: prove every rank can talk to every other, fast, and never hang.

Under a launcher (srun, mpirun, torchrun, the deepspeed launcher) every rank runs this same
command; rank discovery is the workloads' (dsenv.workloads.launch.env). With ``--launch
mpirun|torchrun -n N`` the command starts N ranks on this node itself and collects them.

Before anything is imported, each rank looks for the silent failures: a world of one while
the launcher started more (an MPI started without PMI, a job script without srun, N copies
of the command started side by side), or a world size other than the one asked for. Then
the ranks rendezvous, rank 0 checks that no two ranks share a GPU, and all-reduces random
data at several sizes, checked against the exact sum, then timed as nccl-tests times them.
Rank 0 prints one table of the ranks, one of the bandwidths, and the normal doctor report
with the ``distributed`` results in it (``--json``: the same report, plus a ``distributed``
section).

The modules, in the order a run goes through them:

- this one: the options and the :class:`Plan` made from them (``dsenv --help`` reads the
  options, so it imports nothing else of the test);
- :mod:`.launch`: the command: preflight, ``--launch``, or this rank's run;
- :mod:`.rank`: one rank's run under a deadline no peer can break, with :mod:`.record`
  (what a rank reports about itself), :mod:`.liveness` (who left), :mod:`.fingerprint`
  (every rank's environment, compared by rank 0), :mod:`.allreduce` (the exact checks and
  the timings) and :mod:`.pairs` (the bandwidth of each host pair, so one slow link is
  named);
- :mod:`.report`: the results for the doctor report, the tables, the exit code;
- :mod:`.outcome`: what they hand each other, typed (the :class:`~.outcome.Outcome` a run
  ends with, and its parts), and the JSON the report writes of it;
- :mod:`.ranks`: the pure arithmetic and diagnosis underneath.

Test-only fault injection: DSENV_DISTRIBUTED_TEST_FAULT (:func:`parse_fault`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from dsenv.argtypes import csv_list, non_negative_int, positive_float, positive_int
from dsenv.data import load_table
from dsenv.doctor.distributed import ranks
from dsenv.envs.sites import site_names
from dsenv.errors import UsageError

AREA = "distributed"
LAUNCH_WITH = ("mpirun", "torchrun")
FAULT_VARIABLE = "DSENV_DISTRIBUTED_TEST_FAULT"
FAULT_STAGES = ("start", "init", "check", "bandwidth")


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
                            "--gpus-per-node when both are given and G > 0; a CPU job "
                            "(--gpus-per-node 0) names its rank count here)")
    group.add_argument("--expect-busbw", type=positive_float, metavar="GBPS",
                       help="expected bus bandwidth in GB/s at the largest size (default: the "
                            "site profile's expect_busbw_gbps)")
    group.add_argument("--site", metavar="NAME",
                       help="site profile for the expected bandwidth (default: the one this "
                            "environment was provisioned for)")
    group.add_argument("--rank-output", choices=("marked",), help=argparse.SUPPRESS)
    group.add_argument("--deadline-epoch", type=float, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class Fault:
    """A fault the test suite injects into one rank: ``action`` before ``stage``."""

    action: str  # "exit" (os._exit(code)) or "hang" (the main thread sleeps forever)
    rank: int
    stage: str  # start (before the rendezvous), init, check (first all-reduce), bandwidth
    code: int = 1

    def describe(self) -> str:
        what = f"exits with code {self.code}" if self.action == "exit" else "sleeps forever"
        return f"{FAULT_VARIABLE}: rank {self.rank} {what} before '{self.stage}'"


_FAULT = re.compile(r"(exit|hang)(?:=(\d+))?:(\d+)(?:@([a-z]+))?")


def parse_fault(value: str | None) -> Fault | None:
    """``DSENV_DISTRIBUTED_TEST_FAULT=ACTION[=CODE]:RANK[@STAGE]``, a test-only hook.

    ``exit=3:1@check``: rank 1 exits with code 3 before its first all-reduce;
    ``hang:1@init``: rank 1's main thread sleeps forever before init_process_group.
    ACTION is exit or hang, CODE defaults to 1, STAGE to check. Anything else is a
    ValueError: a mistyped value never passes silently, and no other variable triggers it.
    """
    if value is None or not value.strip():
        return None
    match = _FAULT.fullmatch(value.strip())
    if not match or (match.group(4) or "check") not in FAULT_STAGES:
        raise ValueError(f"{FAULT_VARIABLE}={value!r}: write ACTION[=CODE]:RANK[@STAGE] with "
                         f"ACTION exit|hang and STAGE {'|'.join(FAULT_STAGES)} (a test hook)")
    action, code, rank, stage = match.groups()
    return Fault(action, int(rank), stage or "check", int(code or 1))


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
    fault: Fault | None = None
    passed: list[str] = field(default_factory=list)  # options handed to --launch's ranks

    def _backend(self, backend: str) -> dict:
        return defaults()["backends"][backend]

    def sizes_for(self, backend: str) -> list[int]:
        return self.sizes or [ranks.parse_size(s) for s in self._backend(backend)["sizes"]]

    def warmup_for(self, backend: str) -> int:
        return self._backend(backend)["warmup"] if self.warmup is None else self.warmup

    def iters_for(self, backend: str) -> int:
        return self.iters or self._backend(backend)["iters"]

    def budget_for(self, backend: str) -> float | None:
        """Seconds one size's timing may take; None when --iters or --warmup fix the counts."""
        if self.iters or self.warmup is not None:
            return None
        return self._backend(backend).get("size_budget_s")



def validate_usage(args) -> None:
    """Options that only mean something with --distributed (UsageError otherwise)."""
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
        if args.site not in site_names():
            raise UsageError(f"--site {args.site}: unknown site; known sites: "
                             f"{', '.join(site_names())}")
    expected, expected_from = args.expect_world_size, "--expect-world-size"
    # --gpus-per-node 0 is a CPU job: its ranks per node are the launcher's choice, not a
    # GPU count, so no world size is inferred from it (--expect-world-size names one).
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

"""Every command's arguments and its dispatch: the whole ``dsenv`` parser.

``dsenv explain`` builds only its own parser (dsenv/cli.py) and never imports this module:
the other commands' argument modules are ~50 ms it does not need for a 10,000-line log.
Imports stay light: ``dsenv --help`` never loads torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from dsenv.argtypes import csv_list, non_negative_int, positive_float, positive_int
from dsenv.doctor.distributed.command import add_distributed_arguments
from dsenv.doctor.registry import AREAS
from dsenv.envs.launchers import LAUNCHERS
from dsenv.errors import UsageError
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT
from dsenv.provision.parsers import add_parsers as add_provision_parsers
from dsenv.workloads.cli import add_launcher_arguments, add_workload_parsers, run_workload_command
from dsenv.workloads.fetch.command import add_fetch_parser, run_fetch
from dsenv.workloads.launch.command import add_launch_parser, run_launch, split_workload_args
from dsenv.workloads.reframe_checks import add_reframe_parser, run_reframe


def add_command_parsers(parser: argparse.ArgumentParser, sub, add_explain) -> None:
    """Every command's parser but explain's, which ``add_explain`` adds in its place in the
    list (dsenv/cli.py owns it: `dsenv explain` builds it alone)."""

    doctor = sub.add_parser(
        "doctor", help="check this node before submitting a job, or inside the job",
        description="Check the node: system, python, GPUs, torch, toolkit, DeepSpeed ops, "
                    "communication fabric, MPI and its launcher, offline caches, job config. "
                    "Exit 0: nothing failed; 1: a check failed; 2: usage error.")
    doctor.add_argument("--env", dest="environment", metavar="PREFIX|PYTHON",
                        help="the Python environment the job runs in: a venv, conda or "
                             "`dsenv provision` prefix, or a Python executable (default: the "
                             "activated environment, else python3 on PATH)")
    doctor.add_argument("--json", action="store_true", help="write the versioned JSON report")
    doctor.add_argument("--html", type=Path, metavar="FILE",
                        help="also write the report as one self-contained HTML page (with "
                             "--distributed: busbw, host-pair and per-rank plots)")
    doctor.add_argument("--only", type=csv_list, metavar="AREA[,AREA]",
                        help="run only these areas: " + ", ".join(AREAS))
    doctor.add_argument("--skip", type=csv_list, metavar="ID[,ID]", default=[],
                        help="skip these check ids (see --list)")
    doctor.add_argument("--strict", action="store_true", help="warnings fail too")
    doctor.add_argument("--target", choices=("login", "compute", "auto"), default="auto",
                        help="login node or compute node (auto: compute inside a Slurm "
                             "allocation or with visible GPUs)")
    doctor.add_argument("--launcher", choices=LAUNCHERS,
                        help="the launcher the job will use")
    doctor.add_argument("--nodes", type=positive_int, metavar="N", help="planned node count")
    doctor.add_argument("--gpus-per-node", type=non_negative_int, metavar="G",
                        help="planned GPUs (ranks) per node; 0: a CPU job, no GPU needed")
    doctor.add_argument("--deepspeed-config", type=Path, metavar="FILE",
                        help="check this ds_config against the planned world")
    doctor.add_argument("--for", dest="workload", metavar="WORKLOAD",
                        help="also check what this bundled workload needs")
    doctor.add_argument("--probe-timeout", type=positive_float, default=DEFAULT_PROBE_TIMEOUT,
                        metavar="S",
                        help="seconds each external probe may take (default 10)")
    doctor.add_argument("--probe", action="store_true",
                        help="inside an allocation, launch 2 real MPI ranks with the job's "
                             "launcher to confirm the launch verdict (crash, singletons, ok)")
    doctor.add_argument("--list", action="store_true",
                        help="list the checks, with the catalogue entries each detects, and exit")
    doctor.add_argument("--fix", action="store_true",
                        help="apply the safe, local fixes the findings offer (activate-script "
                             "variables, a stale JIT lock, a missing cache folder), asking "
                             "first, then re-run each check; other fixes are printed as "
                             "commands")
    doctor.add_argument("--yes", "-y", action="store_true",
                        help="with --fix: apply without asking (needed without a terminal)")
    doctor.add_argument("--dry-run", action="store_true",
                        help="with --fix: only show the changes")
    doctor.add_argument("--verbose", "-v", action="store_true",
                        help="show every non-ok result and tracebacks, and ask DeepSpeed's op "
                             "builders which ops are compatible (imports torch once: seconds; "
                             "the answer is cached)")
    doctor.add_argument("--node-health", action="store_true",
                        help="a node health check for Slurm's HealthCheckProgram, a prolog or "
                             "NHC: only the checks about this node, within --budget; one "
                             "'ERROR: dsenv: CHECK: REASON' line per failure, nothing when "
                             "healthy; exit 1 on a failure (warnings: with --strict)")
    doctor.add_argument("--drain", action="store_true",
                        help="with --node-health: on a failure, `scontrol update` this node "
                             "to DRAIN with the reason (never resumes; a node drained by "
                             "someone else keeps its reason)")
    doctor.add_argument("--budget", type=positive_float, metavar="S",
                        help="with --node-health: seconds the run may take from its start "
                             "(default 5); a check still running then fails")
    doctor.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    add_distributed_arguments(doctor)

    add_launcher_arguments(parser)  # the deepspeed launcher puts --local_rank before COMMAND
    add_workload_parsers(sub)
    add_fetch_parser(sub)
    add_provision_parsers(sub)
    add_launch_parser(sub)
    add_explain(sub)
    add_reframe_parser(sub)


def parse(parser: argparse.ArgumentParser, argv: list[str]):
    """The arguments of any command but a leading `explain`; None when no command is given
    (the usage is printed)."""
    own, workload_args = split_workload_args(argv)  # `dsenv launch ... -- ARGS`
    args = parser.parse_args(own)
    if workload_args and args.command != "launch":
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return None
    if args.command == "launch":
        args.workload_args = workload_args
    return args


def command_label(args) -> str:
    """How errors name the command: `dsenv provision openmpi: ...`, `dsenv smoke t5-xsum: ...`."""
    if args.command == "provision" and getattr(args, "provision_what", None):
        return f"provision {args.provision_what}"
    if args.command in ("smoke", "run") and getattr(args, "workload", None):
        return f"{getattr(args, 'workload_mode', args.command)} {args.workload}"
    return args.command


def dispatch(args, argv: list[str]) -> int:
    """Every command but explain, which dsenv/cli.py runs whichever parser read it."""
    if args.command == "doctor":
        from dsenv.doctor.command import run_doctor  # dsenv.doctor.checks: off --help

        return run_doctor(args)
    if args.command in ("smoke", "run"):
        return run_workload_command(args, argv)
    if args.command == "fetch":
        return run_fetch(args)
    if args.command in ("provision", "lock"):
        # rich, yaml and the node-facts probes the builders read: off --help
        from dsenv.provision.command import run_lock, run_provision

        if args.command == "lock":
            return run_lock(args)
        return run_provision(args, ["dsenv", *argv])
    if args.command == "launch":
        return run_launch(args, argv)
    if args.command == "reframe":
        return run_reframe(args)
    raise UsageError(f"unknown command {args.command}")

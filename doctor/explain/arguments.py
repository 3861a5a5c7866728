"""`dsenv explain`'s arguments, apart from the command: cli.py builds every parser on each
run (`dsenv --help`, `dsenv doctor`), and the command's modules (the catalogue's rules, the
family parsers) take ~0.1 s to import."""

from __future__ import annotations

from dsenv.argtypes import positive_float
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT


def add_explain_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="explain an error message or a job log (or a check id)",
        description="Read an error message or a whole job log (ranks interleaved, NCCL and "
                    "DeepSpeed INFO lines, Slurm's and the launchers' own lines), find the "
                    "root error, and match it against dsenv's catalogue of failures users "
                    "report (DeepSpeed, PyTorch, NCCL, Hugging Face, Open MPI, Slurm, "
                    "Apptainer, ROCm) and its parsers of loader and linker errors; print the "
                    "line read, each cause, fix, the doctor check that catches it before the "
                    "next job, and the public sources. Exit 0: a cause was named; 1: none "
                    "cleared the confidence bar; 2: usage.")
    p.add_argument("text", nargs="?", metavar="TEXT|FILE|-",
                   help="the error message (quote it), a log file, a catalogue id or a check "
                        "id; '-' reads it from standard input")
    p.add_argument("--json", action="store_true", help="the matches as JSON")
    p.add_argument("--here", action="store_true",
                   help="also run the doctor check of each cause on this node and say whether "
                        "the cause is present here (a missing library: where LD_LIBRARY_PATH, "
                        "ldconfig and the env's wheels have it)")
    p.add_argument("--probe-timeout", type=positive_float, default=DEFAULT_PROBE_TIMEOUT,
                   metavar="S", help="with --here: seconds each external probe may take, as "
                                     "`dsenv doctor --probe-timeout` (default 10)")
    p.add_argument("--env", metavar="PREFIX|PYTHON", dest="environment",
                   help="with --here: the environment the job runs in (default: as `dsenv "
                        "doctor` picks it: the activated environment, else python3 on PATH)")

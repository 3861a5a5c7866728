"""Command-line wiring of the workloads: ``dsenv smoke WORKLOAD`` and ``dsenv run WORKLOAD``.

Light on purpose: nothing here imports torch, deepspeed or transformers.

    add_workload_parsers(subparsers)   # adds "smoke" and "run" to dsenv's sub-commands
    run_workload_command(args) -> int  # exit code: 0 PASS, 1 a verdict failed, 2 bad input

Under a launcher, run it as a module: ``torchrun --nproc_per_node 2 -m dsenv.workloads.cli
smoke bert-squad`` (or through the ``dsenv`` script). ``smoke all`` runs every smoke in turn
(workloads/smoke_all.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dsenv.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from dsenv.errors import run_command
from dsenv.facts.host import mounts
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT, Node
from dsenv.suggest import Parser
from dsenv.workloads import registry
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.launch import target
from dsenv.workloads.smoke_all import run_all
from dsenv.workloads.training import runtime
from dsenv.workloads.training.dsconfig import LR_SCALINGS

# The workloads' names, modules and help lines: workloads/workloads.toml (registry.py).
SMOKE_WORKLOADS = {name: registry.entry(name).smoke for name in registry.smoke_names()}
SMOKE_ALL = registry.SMOKE_ALL
FULL_WORKLOADS = {name: registry.entry(name).full for name in registry.full_names()}
# each module satisfies workloads/contract.py's Workload: run(args, mode) and FULL
WORKLOAD_MODULES = {name: e.module for name, e in registry.entries().items()}
DEFAULT_PRESET = "fp32"
DATA_DIR_HELP = ("read the data from DIR: bert-squad: train-v1.1.json and dev-v1.1.json; the "
                 "others: a data set saved with datasets' save_to_disk in the real one's "
                 "layout")
PRESETS_HELP = "fp32, fp16, bf16, zero1, zero2, zero3, zero3-offload (workloads/presets.toml)"


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", dest="environment", metavar="PREFIX|PYTHON",
                        help="the Python environment to exercise: a venv, conda or `dsenv "
                             "provision` prefix, or a Python executable (default: as `dsenv "
                             "doctor` picks it: the activated environment, else python3 on "
                             "PATH, else dsenv's own)")
    parser.add_argument("--preset", default=DEFAULT_PRESET, metavar="NAME",
                        help=f"DeepSpeed preset: {PRESETS_HELP} (default fp32)")
    parser.add_argument("--deepspeed-config", "--deepspeed_config", metavar="FILE",
                        help="a ds_config JSON merged over the preset; train_batch_size is "
                             "derived (micro-batch x grad-accum x world size), never trusted")
    parser.add_argument("--micro-batch", type=positive_int, metavar="N",
                        help="train_micro_batch_size_per_gpu (default: the workload's)")
    parser.add_argument("--grad-accum", type=positive_int, metavar="N",
                        help="gradient_accumulation_steps (default 1)")
    parser.add_argument("--lr", type=non_negative_float, metavar="LR",
                        help="learning rate at world size 1 (default: the workload's)")
    parser.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none",
                        help="scale the learning rate with the world size (default none)")
    parser.add_argument("--seed", type=int, default=1234, help="random seed (default 1234)")
    parser.add_argument("--output-dir", default="dsenv-output/{workload}-{mode}", metavar="DIR",
                        help="model, generated assets and report (default "
                             "./dsenv-output/WORKLOAD-MODE)")
    parser.add_argument("--report", metavar="FILE",
                        help="write the JSON run report here (default OUTPUT_DIR/report.json)")
    parser.add_argument("--html", metavar="FILE",
                        help="write the HTML report here: plots of the loss and samples/s "
                             "per step, verdicts, examples; one file that opens offline "
                             "(default OUTPUT_DIR/report.html beside report.json)")
    parser.add_argument("--no-html", action="store_true",
                        help="write no HTML report")
    parser.add_argument("--references", metavar="FILE",
                        help="performance reference table (TOML) instead of the shipped one")
    parser.add_argument("--examples", type=int, default=3, metavar="N",
                        help="examples to print: QA answers highlighted in their paragraph, "
                             "generated summaries beside the reference, classified pairs "
                             "(default 3)")
    parser.add_argument("--no-sync-gradients", action="store_true",
                        help="bert-mrpc: every rank trains its own model without gradient "
                             "all-reduce, the best one is kept (needs a preset "
                             "without ZeRO)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="keep DeepSpeed's own logging")
    parser.add_argument("--probe-timeout", type=positive_float, default=DEFAULT_PROBE_TIMEOUT,
                        metavar="S", help="seconds a stat of the output folder may take before "
                        "its file server is taken as not answering (default 10)")


def add_workload_parsers(subparsers) -> None:
    """Add ``smoke`` and ``run`` to an argparse sub-parsers object (dsenv's top level)."""
    smoke = subparsers.add_parser(
        "smoke", help="prove the stack trains: a bundled workload's tiny run (seconds)",
        description="A tiny training run of a bundled workload through the real DeepSpeed "
                    "engine, under any launcher (none, deepspeed, torchrun, mpirun, srun). "
                    "Ends with a sanity verdict (did it learn?) and a performance verdict "
                    "(samples/s against references). Exit 0: PASS; 1: a verdict failed; "
                    "2: bad input.")
    smoke.add_argument("workload", choices=[*SMOKE_WORKLOADS, SMOKE_ALL],
                       help="; ".join(f"{k}: {v}" for k, v in SMOKE_WORKLOADS.items())
                       + f"; {SMOKE_ALL}: each of them in turn, then one table")
    _add_common(smoke)
    smoke.add_argument("--data-dir", metavar="DIR", help=DATA_DIR_HELP + " instead of "
                       "generating synthetic data")
    smoke.add_argument("--steps", type=positive_int, help=argparse.SUPPRESS)
    smoke.add_argument("--shuffle-labels", action="store_true", help=argparse.SUPPRESS)
    smoke.set_defaults(workload_mode="smoke")

    run = subparsers.add_parser(
        "run", help="a bundled workload's full run: real model and data from the offline "
                    "cache, throughput and quality",
        description="The full training run of a bundled workload through the DeepSpeed "
                    "engine, offline: the model and data come from the cache `dsenv fetch` "
                    "filled (a missing asset is an error naming it, never a download). With "
                    "--model-dir, evaluate a saved model on chosen dev samples instead. "
                    "Exit 0: PASS; 1: a verdict failed; 2: bad input.")
    run.add_argument("workload", choices=list(FULL_WORKLOADS),
                     help="; ".join(f"{k}: {v}" for k, v in FULL_WORKLOADS.items()))
    _add_common(run)
    run.add_argument("--data-dir", metavar="DIR",
                     help=DATA_DIR_HELP + " instead of the fetched data set")
    run.add_argument("--epochs", type=positive_int, metavar="N",
                     help="epochs (default: bert-squad 2, t5-xsum 1, gpt2-wikitext 1, "
                          "bert-mrpc 3)")
    run.add_argument("--max-steps", type=positive_int, metavar="N",
                     help="stop after N optimizer steps (a shorter check of a full setup)")
    run.add_argument("--max-length", type=positive_int, metavar="TOKENS",
                     help="bert-squad: window length (384); t5-xsum: document length "
                          "(128); gpt2-wikitext: block size (128); bert-mrpc: sentence-pair "
                          "length (128)")
    run.add_argument("--doc-stride", type=positive_int, metavar="TOKENS",
                     help="bert-squad: overlap of a long paragraph's windows (default 128)")
    run.add_argument("--max-train-samples", type=positive_int, metavar="N",
                     help="train on the first N samples (questions, documents, lines, "
                          "pairs) only")
    run.add_argument("--max-eval-samples", type=positive_int, metavar="N",
                     help="evaluate on the first N validation samples only")
    evaluate = run.add_argument_group(
        "bert-squad: evaluate a saved model",
        "no training: the model a run saved answers dev questions K..K+N-1, each printed "
        "with its answer highlighted, then exact match and F1 over them")
    evaluate.add_argument("--model-dir", metavar="DIR",
                          help="a model folder a run saved (OUTPUT_DIR/model)")
    evaluate.add_argument("--start-sample", type=non_negative_int, default=0, metavar="K",
                          help="first dev question (default 0)")
    evaluate.add_argument("--num-test-samples", type=positive_int, default=10, metavar="N",
                          help="how many dev questions (default 10)")
    run.set_defaults(workload_mode="run")


def full_run_settings(workload: str):
    """The ``Settings`` of ``dsenv run WORKLOAD`` (micro-batch, lr, ...), None if it has no
    full run yet. Light: a workload module imports no torch at module import."""
    module = WORKLOAD_MODULES.get(workload) if workload in FULL_WORKLOADS else None
    return importlib.import_module(module).FULL if module else None


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    """Hidden ``--local_rank``/``--local-rank`` on the TOP-LEVEL parser: the deepspeed
    launcher (and torch.distributed.launch) put it before the sub-command. Rank discovery
    reads LOCAL_RANK from the environment, so the value itself is not used."""
    parser.add_argument("--local_rank", "--local-rank", dest="launcher_local_rank", type=int,
                        help=argparse.SUPPRESS)


def answering_output_dir(path: str, timeout: float = DEFAULT_PROBE_TIMEOUT) -> str:
    """``path``, once a stat of it (of its nearest existing folder) answered in a child within
    the probe deadline. On a file server that stopped answering, the run's first touch of its
    output folder (resolving it, making it, locking it) blocks in the kernel, where no
    deadline reaches: the run would hang before its first line."""
    problem = mounts.unanswered(Node(wanted_target="login", probe_timeout=timeout), path,
                                "the output folder (--output-dir)")
    if problem:
        raise WorkloadError(f"{problem}; pass an --output-dir on a file system that answers "
                            "(a local disk, $TMPDIR) and ask the site about the mount")
    return path


def run_workload_command(args, argv: list[str] | None = None) -> int:
    """Run what ``args`` asks for, in the job's environment (launch/target.py: this process, or
    the environment's interpreter in its place); WorkloadError (one line, exit 2) for bad
    input or an environment that cannot run it."""
    target.prepare(args, sys.argv[1:] if argv is None else argv)
    mode = getattr(args, "workload_mode", args.command)
    args.output_dir = answering_output_dir(args.output_dir.format(workload=args.workload,
                                                                   mode=mode),
                                           args.probe_timeout)
    if mode == "smoke" and args.workload == SMOKE_ALL:
        return run_all(args, list(SMOKE_WORKLOADS))
    if args.workload not in WORKLOAD_MODULES:
        raise WorkloadError(f"unknown workload {args.workload!r}")
    return importlib.import_module(WORKLOAD_MODULES[args.workload]).run(args, mode=mode)


def main(argv: list[str] | None = None) -> int:
    """``python -m dsenv.workloads.cli smoke bert-squad ...`` (for launchers and tests)."""
    parser = Parser(prog="dsenv")
    add_launcher_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_workload_parsers(sub)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    label = f"{getattr(args, 'workload_mode', args.command)} {args.workload}"
    return run_command(label, lambda: run_workload_command(args, argv))


if __name__ == "__main__":
    code = main()
    if runtime.left_a_process_group:
        runtime.end_rank_process(code)
    sys.exit(code)

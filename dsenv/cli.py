"""The ``dsenv`` command. Imports stay light: ``dsenv --help`` never loads torch, and
``dsenv explain`` builds its own parser alone (dsenv/commands.py has every other command)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from dsenv import __version__
from dsenv.doctor.explain.arguments import add_explain_parser
from dsenv.errors import run_command
from dsenv.suggest import Parser


def top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = Parser(
        prog="dsenv",
        description="Reproducible DeepSpeed environments, health checks and smoke workloads "
                    "for HPC clusters.",
    )
    parser.add_argument("--version", action="version", version=f"dsenv {__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def explain_parser() -> argparse.ArgumentParser:
    """`dsenv explain` alone: it reads a job's log, often 10,000 lines, in under 0.5 s
    (issue 23), without importing every other command's arguments first."""
    parser, sub = top_parser()
    add_explain_parser(sub)
    return parser


def build_parser() -> argparse.ArgumentParser:
    # dsenv.commands: the other commands' argument modules (~50 ms), off `dsenv explain`'s path
    from dsenv.commands import add_command_parsers

    parser, sub = top_parser()
    add_command_parsers(parser, sub, add_explain_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`dsenv explain LOG | head`): stop quietly as other Unix tools
        # do on SIGPIPE; stdout goes to /dev/null so the interpreter's last flush cannot raise.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["explain"]:
        args = explain_parser().parse_args(argv)
        return run_command("explain", lambda: _explain(args))
    # dsenv.commands: every other command's arguments and dispatch, off `dsenv explain`'s path
    from dsenv.commands import command_label, dispatch, parse

    args = parse(build_parser(), argv)
    if args is None:
        return 2
    if args.command == "explain":  # after an option of the deepspeed launcher's (--local_rank)
        return run_command("explain", lambda: _explain(args))
    return run_command(command_label(args), lambda: dispatch(args, argv))


def _explain(args) -> int:
    # dsenv.doctor.explain.command: the rules and family parsers (~0.1 s), off --help
    from dsenv.doctor.explain.command import run_explain

    return run_explain(args)

"""`dsenv explain "TEXT"`: the catalogue entries an error message (or a check id) names,
each with its cause, fix, the check to run before the next job and its public sources."""

from __future__ import annotations

import json
import sys
import textwrap

from dsenv.doctor import catalogue
from dsenv.errors import UsageError


def add_explain_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="explain an error message a job printed (or a check id)",
        description="Match an error message against dsenv's catalogue of failures users "
                    "report (DeepSpeed, PyTorch, NCCL, Hugging Face, Open MPI, Slurm, "
                    "Apptainer, ROCm), and print each match's cause, fix, the doctor check "
                    "that catches it before the next job, and the public sources. Exit 0: "
                    "something matched; 1: nothing did; 2: usage.")
    p.add_argument("text", nargs="?", metavar="TEXT",
                   help="the error message (quote it), a catalogue id or a check id; "
                        "'-' reads it from standard input")
    p.add_argument("--json", action="store_true", help="the matches as JSON")


def run_explain(args) -> int:
    text = sys.stdin.read() if args.text == "-" else (args.text or "")
    if not text.strip():
        raise UsageError("give the error message to explain, e.g. `dsenv explain \"Ninja is "
                         "required to load C++ extensions\"`, or `-` to read it from stdin")
    found = catalogue.explain(text)
    if args.json:
        print(json.dumps({"schema": "dsenv.explain/1", "matches": [
            {"id": m.id, "title": m.title, "cause": m.cause, "fix": m.fix, "check": m.check,
             "detect": m.detect, "fixable": m.fixable, "sources": list(m.sources),
             "matched": patterns} for m, patterns in found]}, indent=2))
        return 0 if found else 1
    if not found:
        print("no catalogue entry matches this text; `dsenv doctor` checks the node and the "
              "environment, and `dsenv doctor --list` shows what the catalogue covers")
        return 1
    for index, (mode, _) in enumerate(found):
        if index:
            print()
        print(render(mode))
    return 0


def render(mode: catalogue.Mode) -> str:
    def para(label: str, text: str) -> str:
        return textwrap.fill(text, width=96, initial_indent=f"  {label:<8}",
                             subsequent_indent=" " * 10)

    check = (f"`dsenv doctor` runs {mode.check} before the job" if mode.check
             else f"cannot be detected before the job: {mode.detect.removeprefix('cannot: ')}")
    lines = [f"{mode.id}: {mode.title}", para("cause", mode.cause), para("fix", mode.fix),
             para("check", check)]
    if mode.fixable:
        lines.append(para("--fix", "`dsenv doctor --fix` can apply this fix"))
    lines += [para("source" if i == 0 else "", src) for i, src in enumerate(mode.sources)]
    return "\n".join(lines)

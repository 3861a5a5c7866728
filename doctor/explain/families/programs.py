"""A program the job runs by name that is not on its PATH, read by structure: every shell's
and tool's way of saying so, and which program it was (../programs.toml maps the programs dsenv
knows to the catalogue mode their absence is: ninja, nvcc, the compilers, pdsh, orted, the
environment's own launcher scripts ...).

- bash: ``bash: nvcc: command not found``, ``run.sh: line 17: deepspeed: command not found``;
  zsh: ``zsh: command not found: ninja``; dash and busybox: ``/bin/sh: 1: nvcc: not found``;
- Python's subprocess: ``FileNotFoundError: [Errno 2] No such file or directory: 'ninja'``
  (a bare name: a path there is a file that does not exist, which other families read);
- ``which: no nvcc in (/usr/bin:/bin)``; setuptools: ``error: command 'g++' failed: No such
  file or directory``, ``unable to execute 'gcc': No such file or directory``;
- Slurm: ``slurmstepd: error: execve(): torchrun: No such file or directory``.

A program not in the table is not named: that a tool is missing is the text's own news, and
which package should have brought it is what a cause would add.
"""

from __future__ import annotations

import re
from functools import cache

from dsenv.data import load_table
from dsenv.doctor.explain.families import Reading, reading

FAMILY = "programs"

_NAME = r"[\w.+-]+"
SHAPES = (
    # bash, ksh: "bash: X: command not found", "script.sh: line 3: X: command not found"
    re.compile(rf"(?:^|[\s:])(?P<prog>{_NAME}): command not found", re.M),
    # zsh
    re.compile(rf"command not found: (?P<prog>{_NAME})"),
    # dash (/bin/sh on Debian and Ubuntu), busybox: "/bin/sh: 1: X: not found", "sh: X: not found"
    re.compile(rf"\bsh: (?:\d+: )?(?:{_NAME}: \d+: )?(?P<path>[\w./+-]*/)?(?P<prog>{_NAME}): "
               r"not found"),
    # a script run by dash: "build.sh: 11: build.sh: nvcc: not found"
    re.compile(rf"{_NAME}: \d+: {_NAME}: (?P<prog>{_NAME}): not found"),
    # Python's subprocess: the bare name it was asked to run (twice from Python 3.7 on)
    re.compile(rf"\[Errno 2\] No such file or directory: '(?P<prog>{_NAME})'"),
    # which
    re.compile(rf"\bwhich: no (?P<prog>{_NAME}) in \("),
    # setuptools / distutils
    re.compile(rf"(?:error: command|unable to execute) '(?P<path>[\w./+-]*/)?(?P<prog>{_NAME})'"
               r"(?: failed)?: No such file or directory"),
    # Slurm's step daemon
    re.compile(rf"execve\(\): (?P<path>[\w./+-]*/)?(?P<prog>{_NAME}): No such file or directory"),
    # a script's "#!/usr/bin/env X" line (coreutils quotes the name; a name that ends in "\r" is
    # a script saved with Windows line ends, another cause, and does not match)
    re.compile(rf"/usr/bin/env: [‘'](?P<prog>{_NAME})[’']\s*: No such file or directory"),
    # a shell's exec builtin (an image's entrypoint script): "line 67: exec: X: not found"
    re.compile(rf"\bexec: (?P<prog>{_NAME}): not found"),
)


# A script saved with Windows line ends: the kernel looks for an interpreter whose name ends in
# a carriage return (bash prints it as ^M, env as \r), and sbatch refuses such a script.
CRLF = re.compile(r"(?P<interp>/[\w/]*?\w*sh)(?:\^M|\\r|\r): bad interpreter"
                  r"|/usr/bin/env: [‘'](?P<prog>\w+)(?:\\r|\r)[’']: No such file or directory"
                  r"|Batch script contains DOS line breaks")


@cache
def programs() -> dict[str, dict]:
    """{executable name: its row of programs.toml}."""
    rows = load_table("dsenv.doctor.explain", "programs.toml")["program"]
    return {name: row for row in rows for name in row["names"]}


def read(message: str) -> list[Reading]:
    if not message:
        return []
    known = programs()
    found: list[Reading] = []
    for shape in SHAPES:
        for m in shape.finditer(message):
            row = known.get(m["prog"])
            if row is None:
                continue
            where = (m.groupdict().get("path") or "").rstrip("/")
            found.append(reading(FAMILY, row["mode"], m.group(0), program=m["prog"],
                                 looked_in=where or "PATH", it_is=row["why"]))
    if crlf := CRLF.search(message):
        found.append(reading(FAMILY, "launch.job-script-crlf", crlf.group(0),
                             interpreter=crlf["interp"] or crlf["prog"] or "(sbatch's check)",
                             line_ends="CRLF (Windows)"))
    return found

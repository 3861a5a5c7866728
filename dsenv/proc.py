"""Subprocesses that always come back: every call has a timeout and kills its whole group.

A hung ``nvidia-smi`` or a silent MPI rank must never hang dsenv, and a wrapper script's
children (``sleep`` under a shell) must die with it, or ``communicate`` would wait on their
pipes forever.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when the command was not found or timed out
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    not_found: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    def describe(self) -> str:
        """One line saying how the command ended, for evidence."""
        if self.not_found:
            return f"{self.argv[0]}: not found on PATH"
        if self.timed_out:
            return f"`{self.command}` did not answer within {self.seconds:.1f} s (killed)"
        tail = (self.stderr or self.stdout).strip().splitlines()
        last = f": {tail[-1]}" if tail else ""
        return f"`{self.command}` exited {self.returncode}{last}"


def which(name: str, env: Mapping[str, str] | None = None, path: str | None = None) -> str | None:
    """``name`` looked up on ``path`` (default: ``env``'s PATH)."""
    if path is None:
        path = (env if env is not None else os.environ).get("PATH", os.defpath)
    return shutil.which(name, path=path)


def run(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    input_text: str | None = None,
    output: str | os.PathLike | None = None,
    path: str | None = None,
) -> CommandResult:
    """Run ``argv`` with a hard ``timeout``; never raises for a missing or hung command.

    ``output``: a file that stdout and stderr are appended to while the command runs (a
    build log that can be followed, and that survives a kill); the result's ``stdout`` and
    ``stderr`` are then empty. ``path``: where a bare command name is looked up (default: the
    PATH of ``env``); the child still gets ``env``'s PATH.
    """
    argv = tuple(str(a) for a in argv)
    env = dict(env if env is not None else os.environ)
    exe = argv[0] if os.sep in argv[0] else which(argv[0], env, path)
    if exe is None or not os.path.exists(exe):
        return CommandResult(argv, None, not_found=True)
    start = time.monotonic()
    log = open(output, "ab") if output is not None else None  # closed once the child has it
    try:
        proc = subprocess.Popen(
            (exe, *argv[1:]),
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=log if log is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(argv, None, stderr=str(exc), not_found=True)
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return CommandResult(argv, None, out or "", err or "", timed_out=True,
                             seconds=time.monotonic() - start)
    return CommandResult(argv, proc.returncode, out or "", err or "",
                         seconds=time.monotonic() - start)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def marked_json(stdout: str, mark: str):
    """The JSON a child printed on its last line starting with ``mark`` (so library noise
    before it does not matter); None when there is no such line or it does not parse."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(mark):
            try:
                return json.loads(line[len(mark):])
            except json.JSONDecodeError:
                return None
    return None

"""`python -m dsenv ARGS` as a user runs it, and the one-line error every bad input must give."""

from __future__ import annotations

import os
import subprocess
import sys


def dsenv(*args, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run the CLI with ``env`` over this process's environment; a traceback fails the test."""
    done = subprocess.run([sys.executable, "-m", "dsenv", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_line(done: subprocess.CompletedProcess, prefix: str) -> str:
    """Exit 2 and exactly one stderr line starting with ``prefix``; the rest of that line."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0].removeprefix(prefix)

"""The one error path: every command raises a :class:`DsenvError` (or a subclass) with a
one-line message saying what is wrong and how to fix it; ``dsenv/cli.py`` catches it once and
prints ``dsenv <command>: <message>`` and exits with the error's code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from dsenv.redact import Redactor


class DsenvError(Exception):
    """One line for the user and the exit code that goes with it (2 unless said otherwise:
    bad input, or a step that cannot go on and says how to fix it)."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(DsenvError):
    """Bad input on the command line or in a file the user named."""


def run_command(label: str, action: Callable[[], int]) -> int:
    """Run one command's ``action``; a :class:`DsenvError` becomes one line on stderr,
    ``dsenv <label>: <message>`` (secrets masked, newlines folded), and its exit code."""
    try:
        return action()
    except DsenvError as exc:
        message = " ".join(Redactor(os.environ).scrub(str(exc)).split())
        print(f"dsenv {label}: {message}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dsenv {label}: interrupted", file=sys.stderr, flush=True)
        return 130

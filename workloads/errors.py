"""The workloads' errors: one line for the user, exit code 2 (dsenv.errors.DsenvError), printed
once by the command line as ``dsenv <command>: <message>``."""

from __future__ import annotations

from dsenv.errors import DsenvError


class WorkloadError(DsenvError):
    """Bad input or an impossible set-up for a smoke or a full run."""


class FetchError(DsenvError):
    """``dsenv fetch``: bad input, an unreachable or refusing Hub, a damaged bundle or
    manifest."""


class LaunchError(DsenvError):
    """Bad input for ``dsenv launch``: what is wrong and how to fix it."""

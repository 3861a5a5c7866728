"""Fixtures of the provision tests. The tiny wheels and their lock (tests/harness/tinywheels.py)
are the root conftest's, shared with tests/test_provision_locking.py.

Nothing in the fast tests reaches a package index: locks and venvs are made from two tiny
projects built with ``pip wheel`` into a temporary folder and given to uv as --find-links
with --no-index. The real tests (marked slow) use envs/locks/cpu.txt and PyPI.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def no_retries(monkeypatch):
    """uv gives up on an unreachable index at once instead of after 3 retries."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")

"""Fixtures of the provision tests. The tiny wheels and their lock (tests/harness/tinywheels.py)
are the root conftest's, shared with tests/test_provision_locking.py.

Nothing in the fast tests reaches a package index: locks and venvs are made from two tiny
projects built with ``pip wheel`` into a temporary folder and given to uv as --find-links
with --no-index. The real tests (marked slow) use envs/locks/cpu.txt and PyPI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.harness.cli import dsenv

# torch 2.13.0+cpu: this project's machines keep it here; elsewhere the real tests take it
# from https://download.pytorch.org/whl/cpu
LOCAL_TORCH = Path("/opt/wheels")


@pytest.fixture
def no_retries(monkeypatch):
    """uv gives up on an unreachable index at once instead of after 3 retries."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")


# ----------------------------------------------------------------------------- a real env
# One real environment for the package's slow tests (test_real_env.py, test_smokes_in_env.py):
# building it compiles cpu_adam (~2 min on 2 cores), so it is built once.
@pytest.fixture(scope="package")
def cpu_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real")


def cpu_command(root: Path) -> list:
    """`dsenv provision --arch cpu --ops cpu_adam` into ROOT/envs/dsenv-cpu, with an ops
    cache of its own: empty, so the build compiles (the journey's second provision reuses
    it)."""
    links = ["--find-links", str(LOCAL_TORCH)] if LOCAL_TORCH.is_dir() else []
    return ["provision", "--arch", "cpu", "--ops", "cpu_adam", "--no-bytecode", "--prefix",
            root / "envs" / "dsenv-cpu", "--ops-cache", root / "ops-cache", *links]


@pytest.fixture(scope="package")
def cpu_plan(cpu_root) -> str:
    """The --dry-run of cpu_env's command, printed before the real run."""
    done = dsenv(*cpu_command(cpu_root), "--dry-run", env={"COLUMNS": "400"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="package")
def cpu_env(cpu_root, cpu_plan):
    """`dsenv provision --arch cpu --ops cpu_adam`: envs/locks/cpu.txt in a venv built in
    staging with cpu_adam precompiled, then renamed: (final prefix, manifest, its output)."""
    final = cpu_root / "envs" / "dsenv-cpu"
    start = time.monotonic()
    done = dsenv(*cpu_command(cpu_root), env={"COLUMNS": "200"}, timeout=1800)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\n{done.stdout}\ndsenv provision --arch cpu --ops cpu_adam: {seconds:.0f} s")
    manifest = json.loads((final / "dsenv-env.json").read_text())
    return final, manifest, done.stdout

"""README's first command installs the light package (no torch). Every command a new user
types next ends in a verdict or one line with the fix, never a traceback (issue 24): a real
venv with `pip install .` (PyPI or uv's cache for the light dependencies)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv (the test extra)")


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run(["uv", "venv", "--python", sys.executable, str(venv)], check=True,
                   capture_output=True, timeout=120)
    done = subprocess.run(["uv", "pip", "install", "--python", str(venv / "bin" / "python"),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


# (arguments, exit status, what the one line or the verdict says)
COMMANDS = [
    (["doctor"], 1, "not ready: "),
    (["doctor", "--for", "bert-squad"], 1, "not ready: "),
    (["smoke", "bert-squad"], 2, 'pip install "dsenv[train]"'),
    (["smoke", "all"], 2, "rouge-score not installed in "),
    (["run", "t5-xsum"], 2, "torch, deepspeed, transformers"),
    (["fetch", "bert-squad"], 2, "huggingface_hub and datasets not installed in dsenv's own"),
    (["launch", "bert-squad"], 2, "--launcher is required"),
    (["lock", "--kind", "conda", "--stack", "cpu"], 2, "pip install 'dsenv[provision]'"),
    (["explain", "Ninja is required to load C++ extensions"], 0, "jit.ninja-missing: "),
    (["provision", "--arch", "7", "--dry-run"], 2, "did you mean '7.0'"),
    (["reframe", "--path"], 0, "/dsenv/workloads/reframe_checks/dsenv_checks.py"),
]


@pytest.mark.parametrize("args, code, said", COMMANDS, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_no_traceback_after_the_light_install(light, tmp_path, args, code, said):
    done = subprocess.run([str(light / "bin" / "dsenv"), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": f"{light / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
                               "VIRTUAL_ENV": str(light)})
    both = done.stdout + done.stderr
    assert "Traceback" not in both, both[-3000:]
    assert done.returncode == code, both[-3000:]
    if code == 2:
        lines = done.stderr.strip().splitlines()
        assert len(lines) <= 2 and said in lines[0], done.stderr
    else:
        assert said in both

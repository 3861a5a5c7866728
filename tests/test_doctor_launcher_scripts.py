"""python.launcher-scripts: what `deepspeed ...` or `torchrun ...` in a job script starts, judged
with the PATH the doctor runs with, for the environment under test (--env): this machine's
real interpreter and its real pip-installed scripts, a PATH without their folder (the user
install of DeepSpeed#3308, a batch script that does not activate the environment), another
copy first on PATH, and a fresh venv without any launcher (nothing to judge: skipped). Then
`dsenv explain --here` on "deepspeed: command not found" with that PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import dsenv

PREFIX = Path(sys.prefix)
SCRIPT = PREFIX / "bin" / "deepspeed"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

pytestmark = pytest.mark.skipif(not os.access(SCRIPT, os.X_OK),
                                reason=f"no deepspeed script in {PREFIX}/bin to judge")


def result(path: str, env_arg: Path = PREFIX) -> dict:
    done = dsenv("doctor", "--only", "python", "--json", "--env", str(env_arg),
                 env={"PATH": path}, drop=("VIRTUAL_ENV", "CONDA_PREFIX"))
    return next(r for r in json.loads(done.stdout)["results"]
                if r["id"] == "python.launcher-scripts")


def test_the_environments_scripts_off_path_fail_with_the_mode():
    got = result(BASE_PATH)
    assert got["status"] == "fail", got
    assert got["mode"] == "env.scripts-not-on-path"
    assert f"installed in {PREFIX}/bin but {PREFIX}/bin is not on PATH" in got["summary"]
    assert "deepspeed: PATH finds nothing" in " ".join(got["evidence"])


def test_the_environments_own_scripts_first_on_path_pass():
    got = result(f"{PREFIX}/bin:{BASE_PATH}")
    assert got["status"] == "ok" and "this environment's own" in got["summary"], got


def test_another_copy_first_on_path_is_a_warning(tmp_path):
    other = tmp_path / "other" / "bin"
    other.mkdir(parents=True)
    shutil.copy2(SCRIPT, other / "deepspeed")
    got = result(f"{other}:{PREFIX}/bin:{BASE_PATH}")
    assert got["status"] == "warn", got
    assert got["summary"].startswith(f"`deepspeed` on PATH is {other}/deepspeed")
    assert f"not this environment's {SCRIPT}" in got["summary"]


def test_an_environment_without_launchers_is_skipped_with_the_reason(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    got = result(f"{venv}/bin:{BASE_PATH}", env_arg=venv)
    assert got["status"] == "skip", got
    assert got["summary"] == f"{venv} has no launcher script (deepspeed, torchrun, " \
                             "accelerate): nothing of it to find on PATH"


def test_explain_here_finds_the_cause_present(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("run.sh: line 12: deepspeed: command not found\n")
    done = dsenv("explain", "--here", "--json", "--env", str(PREFIX), str(log),
                 env={"PATH": BASE_PATH}, drop=("VIRTUAL_ENV", "CONDA_PREFIX"))
    match = json.loads(done.stdout)["matches"][0]
    assert match["id"] == "env.scripts-not-on-path", match
    here = " ".join(match["here"])
    assert "python.launcher-scripts finds: FAIL" in here and "present here" in here, here

"""`dsenv doctor --fix` on an environment `dsenv provision` really made (--arch cpu --ops
none, the tiny lock of conftest.py): its activate script loses the Hugging Face offline
block, the doctor inside a Slurm job (SLURM_JOB_ID set, hub unreachable) fails, --fix --yes
writes the variables back, and the environment, sourced again, passes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.harness.cli import dsenv, sourced
from tests.harness.tinywheels import provision_tiny as tiny

CLOSED = "http://127.0.0.1:9"
OFFLINE_BLOCK = re.compile(r'^if \[ -n "\$\{SLURM_JOB_ID:-\}" \]; then\n    export HF_HUB_OFFLINE'
                           r"=1 .*?\nfi\n", re.MULTILINE | re.DOTALL)


def doctor_sourced(script: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """The doctor as a job runs it: a shell sources the activate script, then runs it."""
    return dsenv("doctor", "--only", "cache", *args, base=env, wrapper=sourced(script),
                 timeout=300)


def offline_status(done: subprocess.CompletedProcess) -> tuple[str, dict | None]:
    result = next(r for r in json.loads(done.stdout)["results"] if r["id"] == "cache.offline")
    return result["status"], result["action"]


def test_fix_writes_offline_vars_into_a_provisioned_env(tmp_path, tiny_lock, tiny_wheels):
    prefix = tmp_path / "envs" / "cpu"
    made = tiny(prefix, tiny_lock, tiny_wheels)
    assert made.returncode == 0, made.stdout + made.stderr
    script = prefix / "activate"
    text = script.read_text()
    assert OFFLINE_BLOCK.search(text), text  # what provision writes
    script.write_text(OFFLINE_BLOCK.sub("", text))  # broken: an env without the block
    home = tmp_path / "home"
    (home / ".cache" / "huggingface" / "hub").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "datasets").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "SLURM_JOB_ID": "77",
           "HF_ENDPOINT": CLOSED, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}

    status, action = offline_status(doctor_sourced(script, env, "--json"))
    assert status == "fail" and action["applicable"] and action["target"] == str(script)

    fixed = doctor_sourced(script, env, "--fix", "--yes")
    assert "✓ cache.offline: fixed" in fixed.stdout, fixed.stdout
    assert fixed.returncode == 0

    again = doctor_sourced(script, env, "--json")
    assert offline_status(again)[0] == "ok", again.stdout
    assert again.returncode == 0
    # the environment the job runs is the provisioned venv, judged through its activate script
    assert json.loads(again.stdout)["environment"]["prefix"] == str(prefix)

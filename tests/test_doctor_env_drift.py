"""python.env-drift follows the environment under test: an environment built by
`dsenv provision` (which holds no dsenv) judged by the dsenv installed elsewhere, through
--env and through its activate script; one package replaced afterwards is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.provision.locks import compile_lock
from dsenv.provision.uvcmd import Sources
from tests.harness import pyenvs
from tests.harness.cli import dsenv, sourced


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
    """(prefix, wheels): `dsenv provision --arch cpu --ops none` of a two-package lock."""
    root = tmp_path_factory.mktemp("drift")
    wheels = root / "wheels"
    pyenvs.torch_wheel(wheels, "2.5.1+cpu")
    pyenvs.simple_wheel(wheels, "dsenv-drift-a", "1.0")
    pyenvs.simple_wheel(wheels, "dsenv-drift-a", "1.1")
    lock = compile_lock(["torch==2.5.1+cpu", "dsenv-drift-a==1.0"], root / "drift.txt",
                        sources=Sources.of([wheels], no_index=True),
                        regenerate="dsenv lock --stack drift")
    prefix = root / "envs" / "drift"
    done = dsenv("provision", "--arch", "cpu", "--ops", "none", "--lock", lock, "--no-index",
                 "--find-links", wheels, "--prefix", prefix, timeout=600,
                 base=pyenvs.doctor_env(HOME=str(root)))
    assert done.returncode == 0, done.stdout + done.stderr
    return prefix, wheels


def judged(prefix: Path, tmp_path: Path, through: str) -> dict:
    """The doctor's python area as JSON: with --env, or after sourcing the env's activate."""
    env = pyenvs.doctor_env(HOME=str(tmp_path), DSENV_CACHE_DIR=str(tmp_path / "cache"),
                            **{pyenvs.MARK_VARIABLE: str(tmp_path / "torch-imported")})
    args = ["doctor", "--json", "--only", "python,torch"]
    if through == "--env":
        done = dsenv(*args, "--env", prefix, base=env, cwd=tmp_path)
    else:
        done = dsenv(*args, base=env, cwd=tmp_path, wrapper=sourced(prefix / "activate"))
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert not (tmp_path / "torch-imported").exists()
    return json.loads(done.stdout)


def result(data: dict, check_id: str) -> dict:
    return next(r for r in data["results"] if r["id"] == check_id)


def test_the_provisioned_env_holds_no_dsenv(provisioned, tmp_path):
    prefix, _ = provisioned
    done = subprocess.run([prefix / "bin" / "python", "-c", "import dsenv"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=pyenvs.doctor_env())
    assert done.returncode == 1 and "No module named 'dsenv'" in done.stderr


@pytest.mark.parametrize("through, source", [("--env", "option"), ("activate", "DSENV_ENV")])
def test_provisioned_env_judged_then_drift_caught(provisioned, tmp_path, through, source):
    prefix, wheels = provisioned
    python = prefix / "bin" / "python"
    pyenvs.uv_install(wheels, "dsenv-drift-a==1.0", python=python)  # as provisioned
    data = judged(prefix, tmp_path, through)
    assert data["environment"]["prefix"] == str(prefix)
    assert data["environment"]["source"] == source
    drift = result(data, "python.env-drift")
    assert drift["status"] == "ok", drift
    assert drift["summary"].startswith("2 locked packages as provisioned")
    assert "torch 2.5.1+cpu" in result(data, "torch.build")["summary"]

    pyenvs.uv_install(wheels, "dsenv-drift-a==1.1", python=python)  # one package replaced
    try:
        drift = result(judged(prefix, tmp_path, through), "python.env-drift")
    finally:
        pyenvs.uv_install(wheels, "dsenv-drift-a==1.0", python=python)
    assert drift["status"] == "warn"
    assert "1 difference(s)" in drift["summary"] and "dsenv-drift-a" in drift["summary"]
    assert "dsenv-drift-a: 1.1 installed, lock has 1.0" in drift["evidence"]
    assert f"uv pip sync --require-hashes --python {python}" in drift["fix"]


def test_drift_is_not_judged_on_dsenvs_own_env_when_the_job_runs_another(
        provisioned, tmp_path):
    # before: the doctor judged its own interpreter and skipped ("no dsenv-env.json") while
    # the activated environment had drifted
    prefix, _ = provisioned
    data = judged(prefix, tmp_path, "activate")
    assert data["environment"]["prefix"] != sys.prefix
    assert result(data, "python.env-drift")["status"] != "skip"
    assert os.path.samefile(data["environment"]["prefix"], prefix)

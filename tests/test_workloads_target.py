"""`dsenv smoke` exercises the job's environment, chosen as the doctor chooses it (issue 24):
--env, the activated environment, else python3 on PATH, else dsenv's own. The environment
here is a real venv that sees this interpreter's packages (--system-site-packages) but is
another interpreter and prefix; dsenv replaces itself with the venv's python, which runs
dsenv's code from an overlay. Also: a first CPU smoke with an empty extensions folder
compiles nothing, and an environment that cannot import the workload is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.cli import explain, run
from tests.harness.workload_runs import MODULE


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("target") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(prefix)], check=True, timeout=120)
    return prefix


def smoke(tmp_path, env, *args, launcher=()):
    """The smoke, started from a folder holding a decoy `dsenv` package (as a checkout's root
    does): the environment's interpreter must still import the overlay's dsenv."""
    out = tmp_path / "out"
    decoy = tmp_path / "cwd" / "dsenv"
    decoy.mkdir(parents=True, exist_ok=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy dsenv in the cwd')\n")
    # a launcher starts `-m MODULE` itself; dsenv's own start is its console script's (-P:
    # the decoy is for the environment's interpreter, not for dsenv's)
    python = [] if launcher else [sys.executable, "-P"]
    done = run([*launcher, *python, "-m", MODULE if launcher else "dsenv", "smoke",
                "bert-squad", "--output-dir", str(out), *args], env=env,
               timeout=600, cwd=decoy.parent if not launcher else None)
    report = out / "report.json"
    return done, json.loads(report.read_text()) if report.is_file() else None


def test_env_option_runs_the_smoke_in_that_interpreter_and_compiles_nothing(
        venv, tmp_path, run_env):
    extensions = tmp_path / "extensions"  # empty: a first smoke on this node
    run_env.update(TORCH_EXTENSIONS_DIR=str(extensions))
    run_env["DSENV_OVERLAY_DIR"] = str(tmp_path / "overlay")
    start = time.monotonic()
    done, report = smoke(tmp_path, run_env, "--env", str(venv))
    seconds = time.monotonic() - start
    assert done.returncode == 0, explain(done)
    assert done.stdout.splitlines()[0] == (f"environment {venv} (Python "
                                           f"{sys.version.split()[0]}) — --env {venv}")
    assert report["environment"]["prefix"] == str(venv)
    assert Path(report["environment"]["running"]).parent == venv / "bin"
    assert report["versions"]["dsenv"]  # dsenv's code came from the overlay
    assert not extensions.exists() or not any(extensions.iterdir())  # no shm_comm for 1 rank
    assert "compiling DeepSpeed op" not in done.stdout
    assert seconds <= 60, seconds
    overlay, = (tmp_path / "overlay").iterdir()
    assert (overlay / "dsenv" / "workloads").is_symlink()
    assert not (overlay / "torch").exists()  # the overlay never shadows the env's packages


def test_the_activated_environment_is_chosen_and_said(venv, tmp_path, run_env):
    run_env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{run_env['PATH']}")
    run_env["DSENV_OVERLAY_DIR"] = str(tmp_path / "overlay")
    done, report = smoke(tmp_path, run_env)
    assert done.returncode == 0, explain(done)
    assert done.stdout.splitlines()[0].endswith(f"activated venv (VIRTUAL_ENV={venv})")
    assert Path(report["environment"]["running"]).parent == venv / "bin"


def test_under_torchrun_every_rank_runs_in_the_environment(venv, tmp_path, run_env):
    run_env["DSENV_OVERLAY_DIR"] = str(tmp_path / "overlay")
    torchrun = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", run_env["MASTER_PORT"]]
    done, report = smoke(tmp_path, run_env, "--env", str(venv),
                         launcher=[sys.executable, *torchrun])
    assert done.returncode == 0, explain(done)
    assert report["run"]["world_size"] == 2 and report["run"]["launcher"] == "torchrun"
    assert report["environment"]["prefix"] == str(venv)
    assert done.stdout.count(f"environment {venv} ") == 1  # said once, by rank 0


def test_an_environment_that_cannot_run_it_is_one_line(tmp_path, run_env):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    done, report = smoke(tmp_path, run_env, "--env", str(bare))
    assert done.returncode == 2 and report is None
    assert done.stderr.strip() == (
        f"dsenv smoke bert-squad: torch, deepspeed, transformers, tokenizers, datasets not "
        f"installed in {bare}, the environment chosen (--env {bare}): build one with `dsenv "
        "provision` and activate it, or pass --env PREFIX of an environment that has them")

"""`dsenv launch` scripts run by the real one-node Slurm (tests/slurmcluster.py).

The four launchers' smokes run across two hosts in tests/test_multihost_launch.py; here: a
job whose preflight doctor fails stops before any rank starts, and sbatch's refusal. The
submitting environment reaches the jobs (sbatch --export=ALL): TORCH_EXTENSIONS_DIR (DeepSpeed's ops,
compiled once per session), DS_ACCELERATOR, GLOO_SOCKET_IFNAME, MASTER_ADDR.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.envs.sites import load_site
from dsenv.provision.record.activation import write_activation
from dsenv.provision.targets import resolve_arch
from tests.harness.cli import dsenv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")

ANSI = re.compile(r"\x1b\[[0-9;]*m")
JOB_TIMEOUT = 600


@pytest.fixture
def job_env(slurm, run_env) -> dict:
    """The submitting environment: loopback rendezvous, CPU DeepSpeed, the session's ops."""
    return {**run_env, "SLURM_CONF": str(slurm.conf_path), "OMP_NUM_THREADS": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launch(tmp_path: Path, env: dict, *args) -> subprocess.CompletedProcess:
    done = dsenv("launch", "bert-squad", *args, base=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 or "--submit" in args, done.stderr
    return done


def test_failed_preflight_stops_the_job_before_any_rank(slurm, job_env, tmp_path):
    """Submitted with --submit from a folder whose name has a space and a '#' (the #SBATCH
    --output line), with a real venv at a path with spaces as --env."""
    folder = tmp_path / "jobs #1 here"
    env_dir = tmp_path / "my env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(env_dir)], check=True, timeout=120)
    write_activation(env_dir, load_site("generic"), resolve_arch("cpu"), None)
    broken = tmp_path / "ds config.json"
    broken.write_text('{"train_micro_batch_size_per_gpu": 4,}\n')
    done = launch(tmp_path, job_env, "--gpus-per-node", "2", "--cpu", "--launcher", "mpirun",
                  "--env", str(env_dir), "--deepspeed-config", str(broken), "--out",
                  str(folder / "job.sbatch"), "--submit")
    assert done.returncode == 0, done.stderr
    path_line, submitted = done.stdout.strip().splitlines()
    job_id = submitted.removeprefix("submitted job ")
    assert path_line == str(folder / "job.sbatch") and job_id.isdigit()
    fields = slurm.wait(int(job_id), timeout=JOB_TIMEOUT)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "1:0"
    output = ANSI.sub("", (folder / f"dsenv-bert-squad-mpirun-{job_id}.out").read_text())
    assert f"dsenv launch: python is {env_dir}/bin/python" in output
    # the doctor's finding (its text wraps long paths: match the finding's own line)
    assert re.search(r"✗ job\.ds-config +DeepSpeed config parses", output), output[-3000:]
    assert "1 failure" in output
    assert "preflight failed (dsenv doctor exit 1)" in output
    assert "dsenv launch: launcher exited" not in output and "dsenv smoke" not in output


def test_sbatch_refusal_is_one_line(slurm, job_env, tmp_path):
    done = launch(tmp_path, job_env, "--launcher", "srun", "--cpu", "--partition", "nosuch",
                  "--submit")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dsenv launch: sbatch refused") and "partition" in lines[0]

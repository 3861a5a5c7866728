"""`dsenv launch` scripts run by the real one-node Slurm (tests/slurmcluster.py).

`bert-squad` smokes with 2 CPU ranks on the node (gloo over loopback) under each launcher:
the job's exit code, the PASS verdict and world size 2 in the job output and in the smoke's
report.json. A job whose preflight doctor fails stops before any rank starts. The submitting
environment reaches the jobs (sbatch --export=ALL): TORCH_EXTENSIONS_DIR (DeepSpeed's ops,
compiled once per session), DS_ACCELERATOR, GLOO_SOCKET_IFNAME, MASTER_ADDR.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dsenv.envs.sites import load_site
from dsenv.provision.activation import write_activation
from dsenv.provision.targets import resolve_arch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")

ANSI = re.compile(r"\x1b\[[0-9;]*m")
JOB_TIMEOUT = 600


@pytest.fixture
def job_env(slurm, run_env) -> dict:
    """The submitting environment: loopback rendezvous, CPU DeepSpeed, the session's ops."""
    return {**run_env, "SLURM_CONF": str(slurm.conf_path), "OMP_NUM_THREADS": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launch(tmp_path: Path, env: dict, *args) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "dsenv", "launch", "bert-squad", *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0 or "--submit" in args, done.stderr
    return done


@pytest.mark.slow
# The deepspeed launcher's job line (hostfile from the allocation) ran to PASS once by hand
# (bench/RESULTS.md); in CI its script is checked by test_launch.py, which saves ~80 s.
@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_smoke_job_passes_with_world_size_two(slurm, job_env, no_references, tmp_path,
                                              launcher):
    if launcher == "srun":  # rendezvous from the allocation: its node is `localhost`
        del job_env["MASTER_ADDR"]
    launch(tmp_path, job_env, "--nodes", "1", "--gpus-per-node", "2", "--cpu", "--launcher",
           launcher, "--out", "job.sbatch", "--", "--steps", "300", "--references",
           no_references, "--examples", "1")
    script = tmp_path / "job.sbatch"
    submitted = slurm.run(["sbatch", "--parsable", f"--output={tmp_path}/job.out", script],
                          timeout=60, env=job_env, cwd=tmp_path)
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted.stderr
    fields = slurm.wait(int(job_id), timeout=JOB_TIMEOUT)
    output = ANSI.sub("", (tmp_path / "job.out").read_text(errors="replace"))
    assert (fields["ExitCode"], fields["JobState"]) == ("0:0", "COMPLETED"), output[-6000:]
    assert "dsenv launch: preflight:" in output and "dsenv launch: launcher exited 0" in output
    assert "dsenv smoke bert-squad: PASS" in output
    assert f"{launcher}, world size 2" in output
    report = json.loads((tmp_path / "dsenv-output" /
                         f"bert-squad-smoke-{launcher}-{job_id}" / "report.json").read_text())
    assert report["status"] == "PASS"
    assert (report["run"]["launcher"], report["run"]["world_size"]) == (launcher, 2)
    port = 20000 + int(job_id) % 20000
    if launcher == "torchrun":  # its agents meet there, then pick the workers' own port
        assert f"'--rdzv-endpoint=127.0.0.1:{port}'" in output
    else:
        host = "localhost" if launcher == "srun" else "127.0.0.1"
        assert report["run"]["master"] == f"{host}:{port}"
    print(f"{launcher}: job {job_id} exit {fields['ExitCode']}, world size "
          f"{report['run']['world_size']}, run time {fields['RunTime']}")


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

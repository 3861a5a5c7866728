"""`dsenv launch --nodes 2` across two namespaced hosts (tests/netns.py, tests/slurmcluster.py).

Each launcher's script is submitted to the multi-host test Slurm (h1, h2; slurmctld on h1)
and runs a bert-squad smoke with one CPU rank per host, gloo over the fabric interface hsn0:
the job completes, the smoke passes, world size 2 and global batch 2 x micro-batch, and the
run report lists both hosts. MASTER_ADDR is the allocation's first node (h1, resolved by each
host's /etc/hosts to its fabric address). mpirun starts its daemons through Slurm (Open MPI's
plm/slurm); the deepspeed launcher reaches h2 with pdsh over ssh, and the variables its
ranks need travel in the .deepspeed_env file the script writes (DS_ENV_FILE).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="namespaced hosts need root"),
              pytest.mark.slow]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
JOB_TIMEOUT = 420


@pytest.fixture
def cluster(slurm_cluster):
    return slurm_cluster(hosts=2)


@pytest.fixture
def job_env(cluster, run_env) -> dict:
    env = cluster.env({**run_env, "GLOO_SOCKET_IFNAME": "hsn0", "OMP_NUM_THREADS": "1",
                       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       # Open MPI's daemons and ranks talk over the fabric, as a site sets
                       "OMPI_MCA_btl_tcp_if_include": "hsn0",
                       "OMPI_MCA_oob_tcp_if_include": "hsn0"})
    # the rendezvous is the allocation's first node (the single-host tests use loopback)
    return {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}


# Every launcher once and every preset once, across hosts (these replaced the single-host
# two-rank bert-squad runs: the same launcher x preset pairs, now over the fabric).
@pytest.mark.parametrize("launcher, preset", [
    ("srun", "fp32"), ("mpirun", "zero2"), ("torchrun", "zero3-offload"),
    ("deepspeed", "zero3")])
def test_smoke_across_two_hosts(cluster, job_env, no_references, tmp_path, launcher, preset):
    made = subprocess.run([sys.executable, "-m", "dsenv", "launch", "bert-squad", "--nodes",
                           "2", "--gpus-per-node", "1", "--cpu", "--launcher", launcher,
                           "--out", "job.sbatch", "--", "--steps", "300", "--references",
                           no_references, "--examples", "1", "--preset", preset],
                          capture_output=True, text=True, timeout=120, env=job_env,
                          cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    job = cluster.sbatch(tmp_path / "job.sbatch", timeout=JOB_TIMEOUT, cwd=tmp_path,
                         env=job_env)
    output = ANSI.sub("", job.output)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), output[-6000:]
    assert "dsenv launch: launcher exited 0" in output
    assert "dsenv smoke bert-squad: PASS" in output
    run_dir = tmp_path / "dsenv-output" / f"bert-squad-smoke-{launcher}-{job.job_id}"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "PASS" and report["metrics"]["exact_match"] >= 60
    assert output.count("dsenv smoke bert-squad: PASS") == 1  # rank 0 only
    assert (report["run"]["launcher"], report["run"]["world_size"]) == (launcher, 2)
    assert report["batch"]["preset"] == preset
    assert report["ds_config"]["zero_optimization"]["stage"] == {"fp32": 0, "zero2": 2}.get(
        preset, 3)
    assert report["run"]["hosts"] == ["h1", "h2"]
    assert report["run"]["ranks_per_host"] == {"h1": 1, "h2": 1}
    assert report["batch"]["train_batch_size"] == 2 * report["batch"]["micro_batch"]
    assert re.search(r"hosts +h1 \(1 rank\), h2 \(1 rank\)", output)
    if launcher == "torchrun":  # the agents meet at a c10d rendezvous on the first host
        assert re.search(r"'--rdzv-endpoint=h1:\d+'", output)
    else:
        assert report["run"]["master"].startswith("h1:")
    if launcher == "deepspeed":
        carried = dict(line.split("=", 1) for line in
                       (run_dir / ".deepspeed_env").read_text().splitlines())
        assert carried["GLOO_SOCKET_IFNAME"] == "hsn0"
        assert carried["DS_ACCELERATOR"] == "cpu"
        assert carried["TORCH_EXTENSIONS_DIR"] == job_env["TORCH_EXTENSIONS_DIR"]
        assert "h2: " in output  # pdsh prefixes the remote host's lines
    print(f"{launcher}: job {job.job_id} {job.state}, hosts {report['run']['hosts']}, "
          f"wall {report['wall_s']:.1f} s")

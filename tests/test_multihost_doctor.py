"""The launch prerequisites judged on every host, on two namespaced hosts (tests/netns.py).

`dsenv doctor --target compute --launcher L --nodes 2 --only launch` runs inside a real
two-node allocation, as a `dsenv launch` preflight does, and asks every host the way the
launcher will (ssh for the deepspeed launcher, one srun step otherwise). Each check has a
broken host and a healthy twin: a host that drops ssh (nftables, inside that host only),
a launch folder that exists on one host only (a tmpfs over it on h2), MASTER_ADDR known to
one host's /etc/hosts only or reached through the management network, an interface that
one host lacks, an allocated host missing from the hostfile, variables that would not reach
the other hosts' ranks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaced hosts need root")


@pytest.fixture
def cluster(slurm_cluster):
    return slurm_cluster(hosts=2)


@pytest.fixture
def base_env(cluster, run_env) -> dict:
    env = cluster.env({**run_env, "GLOO_SOCKET_IFNAME": "hsn0"})
    return {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}


def doctor_in_job(cluster, folder: Path, env: dict, launcher: str, exports: str = "",
                  hosts: str = "h1 h2") -> tuple[dict, float]:
    """The launch checks' results by id, from a doctor run inside a two-node job."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "doctor.json"
    script = folder / "job.sh"
    script.write_text(f"""#!/bin/bash
export MASTER_ADDR=h1 MASTER_PORT=29555
{exports}
printf '%s slots=1\\n' {hosts} > {folder}/hostfile
export DSENV_HOSTFILE={folder}/hostfile
{sys.executable} -m dsenv doctor --target compute --launcher {launcher} --nodes 2 \\
    --gpus-per-node 0 --only launch --json > {out}
""")
    started = time.monotonic()
    job = cluster.sbatch(script, timeout=180, cwd=folder, env=env,
                         args=["--nodes=2", "--ntasks-per-node=1"])
    seconds = time.monotonic() - started
    assert out.exists() and out.stat().st_size, job.output[-3000:]
    report = json.loads(out.read_text())
    return {r["id"]: r for r in report["results"]}, seconds


def status(results: dict, check_id: str) -> str:
    return results[check_id]["status"]


@pytest.mark.parametrize("launcher", ["deepspeed", "srun"])
def test_every_host_answers_and_a_healthy_job_passes(cluster, base_env, tmp_path, launcher):
    results, seconds = doctor_in_job(cluster, tmp_path / "job", base_env, launcher)
    for check_id in ("launch.hosts-answer", "launch.hosts-paths", "launch.hosts-master",
                     "launch.hosts-ifname"):
        assert status(results, check_id) == "ok", results[check_id]
    transport = "ssh" if launcher == "deepspeed" else "srun"
    assert f"answered over {transport}" in results["launch.hosts-answer"]["summary"]
    if launcher == "deepspeed":
        assert status(results, "launch.pdsh") == "ok", results["launch.pdsh"]
        assert status(results, "launch.ds-hostfile") == "ok", results["launch.ds-hostfile"]
    assert "resolves to 192.0.2.11 on all 2 hosts" in results["launch.hosts-master"]["summary"]
    assert seconds < 60


def test_a_host_that_drops_ssh_is_named_within_the_timeout(cluster, base_env, tmp_path):
    h2 = cluster.hosts["h2"]
    h2.drop_tcp_port(22)
    try:
        results, seconds = doctor_in_job(cluster, tmp_path / "job", base_env, "deepspeed")
    finally:
        h2.allow_all()
    found = results["launch.hosts-answer"]
    assert found["status"] == "fail", found
    assert "no passwordless ssh to h2" in found["summary"]
    assert not any("h1:" in e for e in found["evidence"])  # h1 answered
    assert seconds < 60  # ssh's ConnectTimeout (5 s), not a hang


def test_a_launch_folder_only_one_host_has(cluster, base_env, tmp_path):
    shared = tmp_path / "node-local"
    shared.mkdir()
    h2 = cluster.hosts["h2"]
    h2.mount_tmpfs(shared, 16)  # h2 sees an empty folder in its place: no job/ inside
    try:
        results, _ = doctor_in_job(cluster, shared / "job", base_env, "srun")
    finally:
        h2.undo_mounts()
    found = results["launch.hosts-paths"]
    assert found["status"] == "fail", found
    assert f"launch folder {shared / 'job'} does not exist on h2" in found["summary"]


def test_master_addr_known_to_one_host_only(cluster, base_env, tmp_path):
    hosts_file = Path("/etc/netns") / cluster.hosts["h1"].netns / "hosts"
    original = hosts_file.read_text()
    with open(hosts_file, "a") as fh:  # in place: the bind mount keeps the same inode
        fh.write("192.0.2.11 head\n")
    try:
        results, _ = doctor_in_job(cluster, tmp_path / "job", base_env, "deepspeed",
                                   exports="export MASTER_ADDR=head")
    finally:
        with open(hosts_file, "r+") as fh:
            fh.write(original)
            fh.truncate()
    found = results["launch.hosts-master"]
    assert found["status"] == "fail", found
    assert "MASTER_ADDR=head does not resolve on h2" in found["summary"]


def test_master_addr_on_another_network_than_the_ranks(cluster, base_env, tmp_path):
    results, _ = doctor_in_job(cluster, tmp_path / "job", base_env, "deepspeed",
                               exports="export MASTER_ADDR=h1-nmn")
    found = results["launch.hosts-master"]
    assert found["status"] == "warn", found
    assert "GLOO_SOCKET_IFNAME=hsn0 does not select" in found["summary"]
    assert any("via nmn0" in e for e in found["evidence"])


def test_an_interface_one_host_lacks(cluster, base_env, tmp_path):
    h1 = cluster.hosts["h1"]  # a second fabric port on h1 only
    h1.run(["ip", "link", "add", "hsn1", "type", "veth", "peer", "name", "hsn1p"], timeout=15,
           check=True)
    for end in ("hsn1", "hsn1p"):
        h1.link(end, "up")
    try:
        results, _ = doctor_in_job(cluster, tmp_path / "bad", base_env, "srun",
                                   exports="export NCCL_SOCKET_IFNAME==hsn1")
        healthy, _ = doctor_in_job(cluster, tmp_path / "good", base_env, "srun",
                                   exports="export NCCL_SOCKET_IFNAME=hsn")
    finally:
        h1.run(["ip", "link", "del", "hsn1"], timeout=15)
    found = results["launch.hosts-ifname"]
    assert found["status"] == "fail", found
    assert "NCCL_SOCKET_IFNAME==hsn1" in found["summary"] and "on h2" in found["summary"]
    assert status(healthy, "launch.hosts-ifname") == "ok", healthy["launch.hosts-ifname"]


def test_a_hostfile_that_leaves_out_an_allocated_host(cluster, base_env, tmp_path):
    results, _ = doctor_in_job(cluster, tmp_path / "job", base_env, "deepspeed", hosts="h1")
    found = results["launch.ds-hostfile"]
    assert found["status"] == "fail", found
    assert "1 host(s) for 2 nodes" in found["summary"] or "leaves out" in found["summary"]


def test_variables_that_would_not_reach_the_other_hosts(cluster, base_env, tmp_path):
    """Without the file DS_ENV_FILE names, GLOO_SOCKET_IFNAME stays behind on h1; with it
    (as `dsenv launch` writes it), every variable travels."""
    lost, _ = doctor_in_job(cluster, tmp_path / "lost", base_env, "deepspeed")
    found = lost["launch.ds-env"]
    assert found["status"] == "warn", found
    assert "GLOO_SOCKET_IFNAME" in found["summary"]
    carried, _ = doctor_in_job(
        cluster, tmp_path / "carried", base_env, "deepspeed",
        exports=f"export DS_ENV_FILE={tmp_path}/carried/.deepspeed_env\n"
                "env | grep -E '^(GLOO_|HF_|TORCH_|DS_ACCELERATOR|OMP_)' > \"$DS_ENV_FILE\"")
    assert status(carried, "launch.ds-env") == "ok", carried["launch.ds-env"]

"""`dsenv doctor --node-health`: the doctor as Slurm's HealthCheckProgram, a prolog or an NHC
check, run for real as the command a site would run.

On this machine: the healthy node says nothing and exits 0 well inside the budget; a 64 MB
/dev/shm (a tmpfs in a private mount namespace), a locked-memory limit of 64 KiB beside an RDMA
device, and an NCCL_SOCKET_IFNAME naming an interface the node lacks each print their one
`ERROR: dsenv: <check>: <reason>` line and exit 1; GPU tools that hang (fake nvidia-smi and ROCm
tools on PATH that sleep) cannot push the run past its budget, and leave no process behind.
On the namespaced two-host Slurm (tests/harness/slurmcluster.py): h1 with a 64 MB /dev/shm in
its mount namespace is drained by `--drain` with the dsenv reason, h2 stays idle, the next job
lands on h2, and a node an admin drained keeps the admin's reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.harness import mountns

COMMAND = [sys.executable, "-m", "dsenv", "doctor", "--node-health"]
EXIT_SLACK = 0.5  # the interpreter's exit after the budget (threads, flushing)


def node_health(*extra: str, env: dict | None = None, timeout: float = 60):
    start = time.monotonic()
    done = subprocess.run([*COMMAND, *extra], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return done, time.monotonic() - start


def test_healthy_node_says_nothing_and_exits_0_within_2_s():
    """The best of three runs (two shared cores: another test may be busy beside it)."""
    runs = [node_health() for _ in range(3)]
    for done, _ in runs:
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == ""
        assert "Traceback" not in done.stderr
    assert min(seconds for _, seconds in runs) < 2.0, [s for _, s in runs]


def test_small_dev_shm_is_one_error_line_and_exit_1():
    mountns.needs_namespace()
    done = mountns.in_namespace(
        "mount -t tmpfs -o size=64m tmpfs /dev/shm\n"
        '"$PY" -m dsenv doctor --node-health --budget 2 && echo rc=0 || echo rc=$?\n',
        timeout=60)
    lines = done.stdout.splitlines()
    assert lines[-1] == "rc=1", done.stdout + done.stderr
    assert lines[:-1] == ["ERROR: dsenv: system.shm: /dev/shm is 64 MiB: NCCL and DataLoader "
                          "workers fail with 'No space left on device' or bus errors"]


def test_low_memlock_beside_an_rdma_device_fails():
    """A real `ulimit -l 64`; the RDMA device is a folder under a tmpfs over /sys/class (in
    the namespace only): a device without ports, so only the limit is judged."""
    mountns.needs_namespace()
    done = mountns.in_namespace(
        "mount -t tmpfs tmpfs /sys/class && mkdir -p /sys/class/infiniband/mlx5_0\n"
        "ulimit -l 64\n"
        '"$PY" -m dsenv doctor --node-health --budget 2 && echo rc=0 || echo rc=$?\n',
        timeout=60)
    lines = done.stdout.splitlines()
    assert lines[-1] == "rc=1", done.stdout + done.stderr
    assert lines[:-1] == ["ERROR: dsenv: system.memlock: ulimit -l is 64 KiB with RDMA devices "
                          "present: NCCL cannot register memory for InfiniBand/RoCE and falls "
                          "back to sockets or fails"]


def test_missing_fabric_interface_fails_and_a_stray_one_warns_unless_strict():
    absent, _ = node_health("--budget", "2", env={"NCCL_SOCKET_IFNAME": "hsn0"})
    assert absent.returncode == 1
    assert absent.stdout.startswith("ERROR: dsenv: comm.socket-ifname: NCCL_SOCKET_IFNAME=hsn0 "
                                    "selects no network interface on this node")
    assert len(absent.stdout.splitlines()) == 1
    stray, _ = node_health("--budget", "2", env={"NCCL_SOCKET_IFNAME": "lo,hsn0"})
    assert stray.returncode == 0 and stray.stdout == ""
    assert stray.stderr.startswith("WARNING: dsenv: comm.socket-ifname:")
    strict, _ = node_health("--budget", "2", "--strict", env={"NCCL_SOCKET_IFNAME": "lo,hsn0"})
    assert strict.returncode == 1
    assert strict.stdout.startswith("ERROR: dsenv: comm.socket-ifname:")


def _no_process_of(folder) -> list[str]:
    found = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True, text=True,
                           timeout=15)
    return found.stdout.splitlines()


def test_a_hung_nvidia_smi_is_its_own_failure(fake_bin):
    folder = fake_bin("nvidia-smi", "sleep 60\n")
    done, seconds = node_health("--budget", "2",
                                env={"PATH": f"{folder}:{os.environ['PATH']}"})
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "ERROR: dsenv: gpu.nvidia-smi: nvidia-smi did not answer within 0.8 s (driver hung? "
        "GPU fallen off the bus?)"]
    assert seconds < 2.0 + EXIT_SLACK
    assert not _no_process_of(folder)


def test_probes_that_hang_in_turn_cannot_pass_the_budget(fake_bin):
    """nvidia-smi, then each ROCm tool, asked one after the other: each is killed at 0.8 s,
    so together they would take 3.2 s; the budget ends the run at 2 s."""
    for tool in ("nvidia-smi", "amd-smi", "rocminfo", "rocm-smi"):
        folder = fake_bin(tool, "sleep 60\n")
    done, seconds = node_health("--budget", "2", env={"PATH": f"{folder}:{os.environ['PATH']}"})
    assert done.returncode == 1
    assert seconds < 2.0 + EXIT_SLACK, seconds
    lines = done.stdout.splitlines()
    assert "ERROR: dsenv: gpu.nvidia-smi: did not finish within the 2 s budget (waiting on " \
           "inventory" in lines[0]
    assert all(line.startswith("ERROR: dsenv: gpu.") or line.startswith("ERROR: dsenv: torch.")
               for line in lines), lines
    time.sleep(0.2)
    assert not _no_process_of(folder)


@pytest.mark.parametrize("argv", [["--drain"], ["--budget", "3"], ["--node-health", "--json"],
                                  ["--node-health", "--only", "system"],
                                  ["--node-health", "--skip", "mpi.launch"]])
def test_usage_errors(argv):
    done = subprocess.run([sys.executable, "-m", "dsenv", "doctor", *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--node-health" in done.stderr or "node-health" in done.stderr


# -- on the namespaced Slurm cluster ----------------------------------------------------------


def _node(cluster, name: str) -> dict[str, str]:
    shown = cluster.run(["scontrol", "show", "node", "-o", name], timeout=30).stdout
    fields = dict(t.split("=", 1) for t in shown.split() if "=" in t)
    reason = shown.split("Reason=", 1)[1].rsplit(" [", 1)[0] if "Reason=" in shown else ""
    return {**fields, "Reason": reason}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="namespaced hosts need root")
def test_cluster_drains_the_broken_host_and_keeps_jobs_off_it(slurm_cluster, tmp_path):
    cluster = slurm_cluster(hosts=2)
    h1, h2 = cluster.hosts["h1"], cluster.hosts["h2"]
    env = cluster.env()
    argv = [*COMMAND, "--drain", "--budget", "2"]
    h1.mount_tmpfs("/dev/shm", 64)  # h1: the scheduler's first choice for a one-node job
    try:
        runs = {}
        for host in (h1, h2):
            start = time.monotonic()
            runs[host.name] = (host.run(argv, timeout=60, env=env), time.monotonic() - start)
        broken, broken_s = runs["h1"]
        healthy, healthy_s = runs["h2"]
        assert broken.returncode == 1, broken.stdout + broken.stderr
        assert broken.stdout.startswith("ERROR: dsenv: system.shm: /dev/shm is 64 MiB")
        assert "dsenv: drained h1" in broken.stderr
        assert healthy.returncode == 0 and healthy.stdout == "", healthy.stdout + healthy.stderr
        # the checks' 2 s, then two scontrol calls
        assert broken_s < 2.0 + EXIT_SLACK + 2 and healthy_s < 2.0 + EXIT_SLACK, runs

        drained, idle = _node(cluster, "h1"), _node(cluster, "h2")
        assert "DRAIN" in drained["State"], drained
        assert drained["Reason"].startswith("dsenv: system.shm: /dev/shm is 64 MiB"), drained
        assert idle["State"] == "IDLE", idle

        script = tmp_path / "where.sbatch"
        script.write_text("#!/bin/sh\n#SBATCH -N1 -n1\nhostname\n")
        job = cluster.sbatch(script, timeout=60, cwd=tmp_path)
        assert job.state == "COMPLETED" and job.output.strip() == "h2", job

        # An admin's drain is theirs: dsenv reports the failure but keeps their reason.
        cluster.run(["scontrol", "update", "NodeName=h1", "State=RESUME"], timeout=30)
        cluster.run(["scontrol", "update", "NodeName=h1", "State=DRAIN",
                     "Reason=admin: fan replaced, burn-in"], timeout=30)
        again = h1.run(argv, timeout=60, env=env)
        assert again.returncode == 1 and again.stdout.startswith("ERROR: dsenv: system.shm:")
        assert "left as it is" in again.stderr, again.stderr
        assert _node(cluster, "h1")["Reason"] == "admin: fan replaced, burn-in"
    finally:
        h1.undo_mounts()
        cluster.run(["scontrol", "update", "NodeName=h1", "State=RESUME"], timeout=30)

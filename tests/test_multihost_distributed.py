"""`dsenv doctor --distributed` across namespaced hosts (tests/netns.py, tests/slurmcluster.py).

Ranks start with srun in a real multi-node allocation, one CPU rank per host, gloo over the
fabric interface hsn0 (Slurm itself talks over the management network nmn0, as on real
clusters). Proven here: the rank table names each rank's host and interface; the exact
all-reduce runs across hosts; bandwidth is timed per host pair and a slow link (a token
bucket on one host's hsn0: this kernel has no netem) is named; a host whose fabric is down,
whose ports are dropped (nftables inside that host) or whose rank hangs is named, host and
rank, within the timeout plus a few seconds; hosts whose environments differ (another
transformers version, no offline cache, a 64 MiB /dev/shm, an NCCL_SOCKET_IFNAME interface
it lacks) are named with the differing values, and identical hosts give no finding.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from tests.harness.browser import look_at, offline_browser

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="namespaced hosts need root"),
              pytest.mark.slow]

TIMEOUT = 40  # the doctor's --timeout
# ... where a rank is meant not to arrive: the test waits it out, and the healthy rank's start
# (an import of torch, ~3-5 s on this machine's hosts) fits it three times over
FAULT_TIMEOUT = 15


def job_env(cluster, run_env) -> dict:
    env = cluster.env({**run_env, "GLOO_SOCKET_IFNAME": "hsn0", "OMP_NUM_THREADS": "1",
                       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1"})
    return {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}


def distributed_doctor(cluster, folder: Path, env: dict, nodes: int, exports: str = "",
                       timeout: float = TIMEOUT, args: str = "") -> tuple[dict, float, str]:
    """(the --json report, seconds from submission to the job's end, the job output)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "doctor.json"
    script = folder / "job.sh"
    script.write_text(f"""#!/bin/bash
export MASTER_ADDR=h1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
{exports}
srun --mpi=none --kill-on-bad-exit=0 {sys.executable} -m dsenv doctor --distributed \\
    --timeout {timeout} --only distributed --json {args} > {out}
""")
    started = time.monotonic()
    job = cluster.sbatch(script, timeout=timeout + 120, cwd=folder, env=env,
                         args=[f"--nodes={nodes}", "--ntasks-per-node=1"])
    seconds = time.monotonic() - started
    text = out.read_text() if out.exists() else ""
    assert text.strip(), job.output[-4000:]
    return json.loads(text[text.index("{"):]), seconds, job.output


def results(report: dict) -> dict:
    return {r["id"]: r for r in report["results"]}


def failure_text(report: dict) -> str:
    found = [r for r in report["results"] if r["status"] in ("fail", "warn")]
    return "\n".join(f"{r['id']}: {r['summary']} | {' | '.join(r['evidence'])}" for r in found)


@pytest.fixture
def two_hosts(slurm_cluster):
    return slurm_cluster(hosts=2)


def test_healthy_hosts_rank_table_exact_allreduce_and_pair(two_hosts, run_env, tmp_path):
    report, seconds, _ = distributed_doctor(two_hosts, tmp_path, job_env(two_hosts, run_env),
                                            2)
    assert report["exit_code"] == 0, failure_text(report)
    dist = report["distributed"]
    assert [(r["host"], r["interface"].split()[0], r["address"]) for r in dist["ranks"]] == [
        ("h1", "hsn0", "192.0.2.11"), ("h2", "hsn0", "192.0.2.12")]
    assert all(row["wrong"] == 0 for row in dist["allreduce"])
    assert dist["environment"]["distinct"] == 1 and not dist["environment"]["findings"]
    assert [p[:2] for p in dist["pairs"]["pairs"]] == [[0, 1]]
    assert seconds < TIMEOUT


def test_a_slow_link_is_named_by_host_pair(slurm_cluster, run_env, tmp_path):
    cluster = slurm_cluster(hosts=4)
    h4 = cluster.hosts["h4"]
    h4.limit_rate("hsn0", "100mbit")  # 12.5 MB/s; the others run at hundreds of MB/s
    page = tmp_path / "distributed.html"
    try:
        report, _, _ = distributed_doctor(cluster, tmp_path, job_env(cluster, run_env), 4,
                                          args=f"--sizes 1M,4M --iters 3 --warmup 1 "
                                               f"--html {page}")
    finally:
        h4.unlimit("hsn0")
    pairs = results(report)["distributed.links"]
    assert pairs["status"] == "warn", pairs
    assert "h4 is in every slow pair" in pairs["summary"], pairs
    assert "3 slow pairs" in pairs["summary"]  # h1-h4, h2-h4, h3-h4; the other 3 are fine

    # the page, in a browser with no network: the heat map outlines the three pairs with h4
    with offline_browser(tmp_path / "browser") as browser:
        seen = look_at(browser, page, screenshot="doctor-distributed-4-hosts")
    assert seen.requests == [page.as_uri()] and seen.scripts == 0
    width, height = seen.plots["pairs"]
    assert width >= 200 and height >= 200, seen.plots
    assert len(seen.cells) == 12  # 6 pairs, each drawn on both sides of the diagonal
    assert sorted(set(seen.slow_cells)) == ["h1-h4", "h2-h4", "h3-h4"]
    assert "busbw" in seen.plots and "ranks" in seen.plots
    assert seen.headline == report["verdict"]["line"]
    arrived = [r["arrived_epoch"] for r in report["distributed"]["ranks"]]
    assert len(arrived) == 4 and max(arrived) - min(arrived) < 60
    assert "every host has the same environment" in seen.body


def test_a_host_whose_fabric_is_down_is_named(two_hosts, run_env, tmp_path):
    h2 = two_hosts.hosts["h2"]
    h2.link("hsn0", "down")
    try:
        report, seconds, _ = distributed_doctor(two_hosts, tmp_path,
                                                job_env(two_hosts, run_env), 2,
                                                timeout=FAULT_TIMEOUT)
    finally:
        h2.link("hsn0", "up")
    assert report["exit_code"] != 0
    text = failure_text(report)
    assert "h2" in text and "rank 1" in text, text
    assert seconds < FAULT_TIMEOUT + 30


def test_a_host_whose_rendezvous_port_is_blocked_is_named(two_hosts, run_env, tmp_path):
    """nftables inside h2 drops its connections to the rendezvous port on h1."""
    h2 = two_hosts.hosts["h2"]
    script = ("table inet dsenvtest {\n chain output {\n  type filter hook output priority 0;"
              "\n  tcp dport 29611 drop\n }\n}\n")
    h2.run(["nft", "-f", "-"], timeout=15, check=True, input=script)
    try:
        report, seconds, _ = distributed_doctor(two_hosts, tmp_path,
                                                job_env(two_hosts, run_env), 2,
                                                timeout=FAULT_TIMEOUT,
                                                exports="export MASTER_PORT=29611")
    finally:
        h2.allow_all()
    assert report["exit_code"] != 0
    text = failure_text(report)
    assert "rank 1 (h2) did not arrive" in text, text
    assert seconds < FAULT_TIMEOUT + 30


def test_a_hung_rank_is_named_with_its_host(two_hosts, run_env, tmp_path):
    env = {**job_env(two_hosts, run_env), "DSENV_DISTRIBUTED_TEST_FAULT": "hang:1@check"}
    report, seconds, _ = distributed_doctor(two_hosts, tmp_path, env, 2,
                                            timeout=FAULT_TIMEOUT)
    assert report["exit_code"] != 0
    text = failure_text(report)
    assert "rank 1" in text and "h2" in text, text
    assert seconds < FAULT_TIMEOUT + 30


def test_hosts_whose_environments_differ_are_named(two_hosts, run_env, tmp_path):
    h1, h2 = two_hosts.hosts["h1"], two_hosts.hosts["h2"]
    # another transformers on h2: its METADATA says another version
    dist = metadata.distribution("transformers")
    meta = Path(dist._path) / "METADATA"  # the installed dist-info folder
    changed = tmp_path / "METADATA"
    changed.write_text(meta.read_text().replace(f"Version: {dist.version}",
                                                "Version: 4.0.0", 1))
    # an offline cache that h2 does not see
    hf_home = tmp_path / "hf"
    (hf_home / "hub" / "models--tiny--bert").mkdir(parents=True)
    # an interface only h1 has
    h1.run(["ip", "link", "add", "hsn1", "type", "veth", "peer", "name", "hsn1p"],
           timeout=15, check=True)
    for end in ("hsn1", "hsn1p"):
        h1.link(end, "up")
    h2.bind(changed, meta)
    h2.mount_tmpfs(hf_home, 8)
    h2.mount_tmpfs("/dev/shm", 64)
    try:
        env = {**job_env(two_hosts, run_env), "HF_HOME": str(hf_home)}
        report, _, _ = distributed_doctor(two_hosts, tmp_path / "job", env, 2,
                                          exports="export NCCL_SOCKET_IFNAME==hsn1",
                                          args=f"--html {tmp_path / 'hosts.html'}")
    finally:
        h2.undo_mounts()
        h1.run(["ip", "link", "del", "hsn1"], timeout=15)
    environment = report["distributed"]["environment"]
    assert environment["distinct"] == 2
    found = results(report)["distributed.environment"]
    assert found["status"] in ("fail", "warn"), found
    text = found["summary"] + " | " + " | ".join(found["evidence"])
    assert "h2" in text
    assert "4.0.0" in text and dist.version in text  # transformers, both values
    assert "64 MiB" in text  # /dev/shm
    assert "hsn1" in text  # the interface h2 lacks
    assert "hf assets" in text or "hub cache" in text  # the offline cache

    # the page: h2's row highlighted, each difference with both values, h2's side marked
    with offline_browser(tmp_path / "browser") as browser:
        seen = look_at(browser, tmp_path / "hosts.html", screenshot="doctor-hosts-differ")
    assert seen.scripts == 0 and len(seen.requests) == 1
    assert seen.odd_hosts == ["h2"]
    differing = {row[0][0]: (row[1][0], row[2][0], row[2][1]) for row in seen.differing}
    assert differing["transformers"] == (dist.version, "4.0.0", True), differing
    assert differing["/dev/shm"][1] == "64 MiB"


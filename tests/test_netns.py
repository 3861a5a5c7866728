"""The namespaced hosts of the multi-host test cluster (tests/netns.py): isolated, and gone
after teardown, also after the test run that made them was killed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root")


def ours(tag: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=15).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(tag)]


def test_hosts_are_isolated_and_teardown_removes_everything():
    before = netns.machine_interfaces()
    hosts = netns.Hosts(2).start()
    try:
        h1, h2 = hosts.hosts
        assert h1.run(["hostname"], timeout=10).stdout.strip() == "h1"
        assert h1.run(["getent", "hosts", "h2"], timeout=10).stdout.split()[0] == "192.0.2.12"
        for host in hosts.hosts:  # no default route: nothing leaves the test's networks
            routes = host.run(["ip", "-4", "route"], timeout=10).stdout
            assert "default" not in routes and "192.0.2.0/24 dev hsn0" in routes
        reach = h1.run([sys.executable, "-c", "import socket; socket.create_connection("
                        "('198.51.100.12', 9), timeout=3)"], timeout=15)
        assert "Connection refused" in reach.stderr  # h2 answered (nothing listens on 9)
        # the machine's own namespace has no interface on these networks
        assert netns.machine_interfaces() == before
        own = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True,
                             timeout=10).stdout
        for host in hosts.hosts:  # (this machine may use a TEST-NET range itself)
            assert f"inet {host.fabric_ip}/" not in own
            assert f"inet {host.management_ip}/" not in own
        assert len(ours(hosts.tag)) == 3  # two hosts and the bridge
    finally:
        hosts.stop()
    assert ours(hosts.tag) == []
    assert not any(Path("/etc/netns").glob(f"{hosts.tag}*"))
    assert hosts.hosts[0].holder.poll() is not None
    assert netns.machine_interfaces() == before


def test_namespaces_of_a_killed_run_are_removed_by_the_next(tmp_path):
    root = str(Path(__file__).resolve().parent.parent)
    code = (f"import sys, time; sys.path.insert(0, {root!r}); from tests.harness import netns; "
            "h = netns.Hosts(2).start(); print(h.tag, flush=True); time.sleep(600)")
    killed = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        tag = killed.stdout.readline().strip()
        assert tag and len(ours(tag)) == 3
    finally:
        os.killpg(killed.pid, 9)  # as an interrupted test run ends: no teardown
        killed.wait(timeout=15)
    assert len(ours(tag)) == 3  # left behind
    removed = netns.remove_stale()
    assert sorted(removed) == sorted(f"{tag}-{n}" for n in ("br", "h1", "h2"))
    assert ours(tag) == [] and not any(Path("/etc/netns").glob(f"{tag}*"))
    holders = subprocess.run(["pgrep", "-f", f"ip netns exec {tag}"], capture_output=True,
                             text=True, timeout=10).stdout.split()
    assert holders == []

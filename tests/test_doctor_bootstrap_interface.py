"""comm.bootstrap-interface: the interface NCCL's bootstrap picks by itself (issue 23: the check
of comm.no-bootstrap-interface, one of the causes of NCCL's bare "unhandled system error").

Built for real: each case runs the doctor in a network namespace of its own (`unshare -n`),
with only the loopback, a veth named like Docker's bridge, or a fabric-like veth on a TEST-NET
address (192.0.2.0/24, no route anywhere; the namespace and its interfaces go when the command
ends). NCCL without NCCL_SOCKET_IFNAME picks ib*, then any interface but docker*/lo*, then
docker*, then lo (NVIDIA/nccl src/misc/socket.cc): on a job of two nodes a pick of lo or of the
bridge alone is an address the other node cannot reach."""

from __future__ import annotations

import json
import os

import pytest

from dsenv.verdicts.findings import Status
from tests.harness.mountns import doctor_json, in_namespace, needs_namespace, result

LO_UP = "ip link set lo up\n"
# a veth pair: $1 takes the address; its peer stays down, so it gets no address at all (an up
# peer's IPv6 link-local address would make it a candidate too: NCCL counts those)
VETH = ('veth() { ip link add "$1" type veth peer name "$1p"; ip addr add "$2" dev "$1"; '
        'ip link set "$1" up; }\n')
DOCTOR = '"$PY" -m dsenv doctor --only comm --json $ARGS || true\n'


def in_netns(script: str, env: dict | None = None, timeout: float = 120):
    """``script`` with sh in a new network namespace (it goes when the script ends)."""
    needs_namespace()
    return in_namespace(VETH + script, env=env, timeout=timeout, unshare=("-n",))


def _check(setup: str, args: str = "--nodes 2", **env) -> dict:
    done = in_netns(LO_UP + setup + DOCTOR, env={"ARGS": args, **env})
    return result(doctor_json(done), "comm.bootstrap-interface")


CLEAN = {"NCCL_SOCKET_IFNAME": "", "NCCL_CONF_FILE": "/nonexistent/nccl.conf"}


@pytest.fixture
def no_nccl_conf(tmp_path, monkeypatch):
    """No NCCL_SOCKET_IFNAME anywhere: the environment's removed, HOME without ~/.nccl.conf."""
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if os.path.exists("/etc/nccl.conf"):
        pytest.skip("/etc/nccl.conf exists here: it may set NCCL_SOCKET_IFNAME")


def test_only_the_loopback_on_two_nodes_fails(no_nccl_conf):
    found = _check("", "--nodes 2 --target compute")
    assert found["status"] == "fail" and found["mode"] == "comm.no-bootstrap-interface", found
    assert found["summary"].startswith("NCCL_SOCKET_IFNAME unset: NCCL picks lo (the loopback")
    assert "which ranks on other nodes cannot reach" in found["summary"]
    assert any(x.startswith("here: export NCCL_SOCKET_IFNAME=") for x in found["evidence"])


def test_only_a_docker_bridge_on_two_nodes_fails(no_nccl_conf):
    found = _check('veth docker0 192.0.2.1/24\n', "--nodes 2 --target compute")
    assert found["status"] == "fail" and found["mode"] == "comm.no-bootstrap-interface", found
    # the peer without an address is not a candidate; NCCL takes docker* before lo
    assert "picks docker0 (Docker's bridge" in found["summary"], found
    assert "docker0p (no address; down)" in found["evidence"][0], found


def test_a_fabric_interface_is_picked_before_the_bridge_and_passes(no_nccl_conf):
    """The healthy twin: hsn0 on 192.0.2.11 beside docker0 and lo."""
    found = _check('veth docker0 198.51.100.1/24\nveth hsn0 192.0.2.11/24\n',
                   "--nodes 2 --target compute")
    assert found["status"] == "ok", found
    assert found["summary"].startswith("NCCL_SOCKET_IFNAME unset: NCCL picks hsn0")
    assert "hsn0 (192.0.2.11" in found["evidence"][0]


def test_on_one_node_the_loopback_is_enough(no_nccl_conf):
    found = _check("", "--nodes 1")
    assert found["status"] == "ok" and found["summary"].endswith("enough for one node's ranks")


def test_a_login_node_warns_instead_of_failing(no_nccl_conf):
    found = _check("", "--nodes 2 --target login")
    assert found["status"] == "warn" and found["mode"] == "comm.no-bootstrap-interface"


def test_a_set_interface_is_left_to_comm_socket_ifname(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".nccl.conf").write_text("NCCL_SOCKET_IFNAME=hsn0\n")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    found = _check("")
    assert found["status"] == "skip" and "comm.socket-ifname judges it" in found["summary"]


def test_without_ip_the_check_skips_with_the_reason(make_ctx, run_one, tmp_path):
    # the probe finds nothing: no iproute2 on PATH
    (tmp_path / "bin").mkdir()
    ctx = make_ctx(env={"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path)}, nodes=2)
    found = run_one("comm.bootstrap-interface", ctx)
    assert found.status == Status.SKIP and "`ip` (iproute2) is not on PATH" in found.summary


def test_explain_here_finds_the_loopback_only_node_among_the_causes(no_nccl_conf):
    """NCCL's bare system error explained inside a two-node job whose node has only lo: of the
    group's causes, this node shows comm.no-bootstrap-interface."""
    text = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1331, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1")
    done = in_netns(LO_UP + '"$PY" -m dsenv explain --here --json "$TEXT" || true\n',
                    env={"TEXT": text, "SLURM_JOB_ID": "7", "SLURM_NNODES": "2"})
    report = json.loads(done.stdout)
    assert report["shared"]["id"] == "nccl-system-error-unlocated", report
    by_id = {m["id"]: m for m in report["matches"]}
    assert "the cause is present here" in by_id["comm.no-bootstrap-interface"]["here"], by_id

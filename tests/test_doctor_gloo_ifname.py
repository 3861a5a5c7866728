"""comm.gloo-ifname: GLOO_SOCKET_IFNAME against this node's interfaces, before the job, and
`dsenv explain --here` on the real log of a gloo group that aborted (an H200 node, record3.sh:
`GLOO_SOCKET_IFNAME=ib9`, "ifa != nullptr. Unable to find address for: ib9"). The interfaces
are this machine's own (/sys/class/net); the empty case is a node root with no /sys."""

from __future__ import annotations

import json
from pathlib import Path

from dsenv.doctor import registry, runner
from dsenv.doctor.context import Context
from dsenv.verdicts.findings import Status
from tests.harness.cli import dsenv

LOG = Path(__file__).parent / "fixtures" / "explain_gpu" / "gloo_ifname_invalid.log"


def gloo(value: str, *args: str) -> dict:
    done = dsenv("doctor", "--only", "comm", "--json", *args, env={"GLOO_SOCKET_IFNAME": value})
    return next(r for r in json.loads(done.stdout)["results"] if r["id"] == "comm.gloo-ifname")


def test_a_name_the_node_lacks_fails_on_a_compute_node():
    result = gloo("ib9", "--target", "compute")
    assert result["status"] == "fail", result
    assert result["summary"].startswith("GLOO_SOCKET_IFNAME=ib9: ib9 is not an interface"), result
    assert result["mode"] == "comm.gloo-ifname-invalid"
    assert any(line.startswith("interfaces here: ") and "lo" in line for line in result["evidence"])
    assert gloo("ib9", "--target", "login")["status"] == "warn"


def test_nccls_list_syntax_is_named():
    result = gloo("^lo,docker0")
    assert "NCCL's ^/= syntax" in result["summary"] and "^lo" in result["summary"], result


def test_an_interface_of_this_node_passes():
    result = gloo("lo")
    assert result["status"] == "ok", result


def test_without_network_interfaces_it_skips_with_the_reason(tmp_path):
    ctx = Context(env={"GLOO_SOCKET_IFNAME": "eth0"}, root=tmp_path)
    result = runner.run_checks([registry.named("comm.gloo-ifname")], ctx)[0]
    assert result.status is Status.SKIP and "/sys/class/net" in result.summary, result


def test_explain_here_finds_the_name_the_log_could_not_use(tmp_path):
    log = tmp_path / "gloo.log"
    log.write_text(LOG.read_text().partition("\n")[2])
    done = dsenv("explain", "--here", "--json", str(log), env={"GLOO_SOCKET_IFNAME": "ib9"})
    match = json.loads(done.stdout)["matches"][0]
    assert match["id"] == "comm.gloo-ifname-invalid", match
    here = " ".join(match["here"])
    assert "comm.gloo-ifname finds: WARN GLOO_SOCKET_IFNAME=ib9" in here, here
    assert "the cause is present here" in here, here
    # the twin: an interface this node has
    done = dsenv("explain", "--here", "--json", str(log), env={"GLOO_SOCKET_IFNAME": "lo"})
    here = " ".join(json.loads(done.stdout)["matches"][0]["here"])
    assert "finds: OK GLOO_SOCKET_IFNAME=lo" in here and "not found here" in here, here

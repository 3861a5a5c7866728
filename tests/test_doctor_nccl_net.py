"""comm.nccl-net: the network NCCL_NET forces opens on this node (issue 23).

A forced network that cannot open is fatal: the H100 node's NCCL 2.28.9 stopped with
"Failed to initialize any NET plugin" for NCCL_NET=IB without an HCA and for NCCL_NET="AWS
Libfabric" without the plugin (tests/fixtures/explain_gpu). This machine has no RDMA device,
so NCCL_NET=IB fails here for real; its twin reads a /sys tree written from a recorded ibstat.
The plugin case looks on LD_LIBRARY_PATH for the file NCCL would dlopen.
"""

from __future__ import annotations

import os

import pytest

from dsenv.facts.comm import fabric
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.recorded import fixture_text
from tests.harness.sysfs import ibstat_to_sysfs


def env_with(tmp_path, **variables):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    env.update(variables)
    return env


def test_unset_skips_with_where_it_looked(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-net", make_ctx(env=env_with(tmp_path)))
    assert result.status is Status.SKIP
    assert "NCCL_NET is not set" in result.summary and ".nccl.conf" in result.summary


def test_ib_forced_on_a_node_without_an_hca_fails(make_ctx, run_one, tmp_path):
    if fabric.ib_ports(make_ctx(root="/")):
        pytest.skip("this machine has an RDMA device: the sysfs twin below covers it")
    ctx = make_ctx(env=env_with(tmp_path, NCCL_NET="IB"), root="/", target="compute")
    result = run_one("comm.nccl-net", ctx)
    assert result.status is Status.FAIL, result
    assert result.mode == "comm.net-forced-unavailable"
    assert "no InfiniBand/RoCE device" in result.summary
    assert here(result).startswith("unset NCCL_NET on nodes without InfiniBand")
    # on a login node the compute nodes may have the fabric: a warning, not a failure
    login = run_one("comm.nccl-net", make_ctx(env=env_with(tmp_path, NCCL_NET="IB"), root="/"))
    assert login.status is Status.WARN


def test_ib_forced_with_an_active_port_passes(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-active.txt"), tmp_path / "root")
    result = run_one("comm.nccl-net", make_ctx(env=env_with(tmp_path, NCCL_NET="ib"),
                                                target="compute"))
    assert result.status is Status.OK and "ACTIVE InfiniBand/RoCE port" in result.summary


def test_ib_forced_from_etc_nccl_conf_names_the_file(make_ctx, run_one, tmp_path):
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    (etc / "nccl.conf").write_text("NCCL_NET=IB\n")
    result = run_one("comm.nccl-net", make_ctx(env=env_with(tmp_path), target="compute"))
    assert result.status is Status.FAIL
    assert f"NCCL_NET=IB (from {etc / 'nccl.conf'})" in result.summary
    assert here(result).startswith(f"delete the NCCL_NET line from {etc / 'nccl.conf'}")


def test_a_plugins_network_needs_its_plugin_on_the_library_path(make_ctx, run_one, tmp_path):
    plugins = tmp_path / "aws-ofi-nccl" / "lib"
    plugins.mkdir(parents=True)
    env = env_with(tmp_path, NCCL_NET="AWS Libfabric", LD_LIBRARY_PATH=str(plugins))
    result = run_one("comm.nccl-net", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and "libnccl-net.so" in result.summary, result
    (plugins / "libnccl-net.so").write_bytes(b"\x7fELF")  # the module's plugin, now present
    twin = run_one("comm.nccl-net", make_ctx(env=env, target="compute"))
    assert twin.status is Status.OK and str(plugins / "libnccl-net.so") in twin.summary


def test_quotes_inside_the_value_name_no_network(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-net", make_ctx(env=env_with(
        tmp_path, NCCL_NET="'AWS Libfabric'"), target="compute"))
    assert result.status is Status.FAIL and "quotes are part of the value" in result.summary
    assert here(result) == "set it without quotes inside the value: NCCL_NET=AWS Libfabric"


def test_sockets_always_open(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-net", make_ctx(env=env_with(tmp_path, NCCL_NET="Socket"),
                                                root="/", target="compute"))
    assert result.status is Status.OK

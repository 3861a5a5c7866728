"""comm.nccl-env: NCCL debugging variables left set, from the environment and NCCL's files.

NVLink and its absence come from recorded `nvidia-smi topo -m` outputs printed by a fake
nvidia-smi on PATH; InfiniBand from a /sys tree written from a recorded `ibstat`.
"""

import os

import pytest

from dsenv.facts.comm.ncclconf import nccl_settings, parse_conf
from dsenv.facts.gpu.modes import parse_topology_nvlinks
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import clean_env, doctor, fake_nvidia_smi
from tests.harness.findings import here
from tests.harness.recorded import fixture_text
from tests.harness.sysfs import ibstat_to_sysfs

NVLINK = "gpu/nvidia_smi_topo_dgx_a100.txt"
PCIE = "gpu/nvidia_smi_topo_2x5090_pcie.txt"


def env_with(tmp_path, topo=None, **variables):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    if topo:
        env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'smi', topo=topo)}:{env['PATH']}"
    env.update(variables)
    return env


def test_topology_parser_reads_nvlink_and_pcie_outputs():
    assert set(parse_topology_nvlinks(fixture_text(NVLINK))) == {"NV12"}
    assert parse_topology_nvlinks(fixture_text(PCIE)) == []  # the legend's "NV#" is no link


def test_conf_files_rank_below_the_environment(make_ctx, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("# user\nNCCL_P2P_LEVEL=LOC\nNCCL_ALGO=Ring\n")
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    (etc / "nccl.conf").write_text("NCCL_ALGO=Tree\nNCCL_PROTO=Simple\n")
    settings = nccl_settings(make_ctx(env={"HOME": str(home), "NCCL_P2P_LEVEL": "NVL"}))
    assert settings["NCCL_P2P_LEVEL"].value == "NVL" and settings["NCCL_P2P_LEVEL"].source == "environment"
    assert settings["NCCL_ALGO"].value == "Ring" and settings["NCCL_ALGO"].source.endswith(".nccl.conf")
    assert settings["NCCL_PROTO"].source.endswith("etc/nccl.conf")
    # as NCCL's setEnvFile: "NCCL_A = 1" sets "NCCL_A ", a variable NCCL never reads
    assert parse_conf("NCCL_A = 1\nbroken line\n#NCCL_B=2\n") == {"NCCL_A ": " 1"}


def test_p2p_disabled_on_an_nvlink_node_warns(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-env", make_ctx(env=env_with(tmp_path, NVLINK, NCCL_P2P_DISABLE="1")))
    assert result.status is Status.WARN, result
    assert "NVLink" in result.summary and "NV12" in result.summary
    assert here(result).startswith("`unset NCCL_P2P_DISABLE`")


def test_p2p_disabled_on_a_pcie_node_is_only_a_note(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-env", make_ctx(env=env_with(tmp_path, PCIE, NCCL_P2P_DISABLE="1")))
    assert result.status is Status.INFO and "NCCL_P2P_DISABLE" in result.summary
    assert result.fix  # still says how to remove it


def test_no_debugging_variable_is_ok(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-env", make_ctx(env=env_with(
        tmp_path, NVLINK, NCCL_P2P_DISABLE="0", NCCL_SOCKET_IFNAME="ib0", NCCL_DEBUG="WARN")))
    assert result.status is Status.OK, result


def test_p2p_level_loc_from_the_users_nccl_conf_warns_and_names_the_file(make_ctx, run_one,
                                                                         tmp_path):
    env = env_with(tmp_path, NVLINK)
    conf = tmp_path / "home" / ".nccl.conf"
    conf.parent.mkdir()
    conf.write_text("NCCL_P2P_LEVEL=LOC\n")
    result = run_one("comm.nccl-env", make_ctx(env=env))
    assert result.status is Status.WARN and "NCCL_P2P_LEVEL=LOC" in result.summary
    assert str(conf) in here(result)
    # the environment wins over the file: NVL is a pinned cutoff, not P2P off
    result = run_one("comm.nccl-env", make_ctx(env={**env, "NCCL_P2P_LEVEL": "NVL"}))
    assert result.status is Status.INFO, result


def test_socket_network_with_active_infiniband_warns(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-active.txt"), tmp_path / "root")
    result = run_one("comm.nccl-env", make_ctx(env=env_with(tmp_path, NCCL_NET="Socket")))
    assert result.status is Status.WARN and "ACTIVE" in result.summary
    result = run_one("comm.nccl-env", make_ctx(env=env_with(tmp_path, NCCL_NET="IB")))
    assert result.status is Status.OK


def test_socket_network_without_infiniband_is_a_note(make_ctx, run_one, tmp_path):
    result = run_one("comm.nccl-env", make_ctx(env=env_with(tmp_path, NCCL_NET="Socket")))
    assert result.status is Status.INFO


@pytest.mark.parametrize("variables, expected", [
    ({"NCCL_P2P_DISABLE": "1"}, "warn"),
    ({}, "ok"),
])
def test_through_the_cli(tmp_path, variables, expected):
    smi = fake_nvidia_smi(tmp_path / "smi", topo=NVLINK)
    env = clean_env(HOME=str(tmp_path / "home"), PATH=f"{smi}:{os.environ['PATH']}", **variables)
    result = doctor("--only", "comm", env=env)["comm.nccl-env"]
    assert result["status"] == expected, result

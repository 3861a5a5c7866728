"""comm area: NCCL/RCCL version and the fabric, on /sys trees built from recorded real outputs.

The trees are written from `ibstat`, `ibstatus`, `ibv_devinfo -v`, `show_gids`, `lstopo` and
`ibdev2netdev` outputs posted in public issues (tests/fixtures/comm, each with its source).
"""

import os
import re

import pytest

from dsenv.facts.comm import fabric
from dsenv.facts.python import torch_info
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.recorded import fixture_text
from tests.harness.sysfs import (
    IB,
    gids_to_sysfs,
    ibdev2netdev_to_sysfs,
    ibstat_to_sysfs,
    ibv_devinfo_gids,
    put,
)


def ibstatus_to_sysfs(text, root):
    """`ibstatus` prints the sysfs values verbatim ("4: ACTIVE", "100 Gb/sec (4X EDR)")."""
    port = None
    for line in text.splitlines():
        if m := re.match(r"Infiniband device '(\S+)' port (\d+) status:", line):
            port = f"{IB}/{m.group(1)}/ports/{m.group(2)}"
        elif port and ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            name = {"state": "state", "phys state": "phys_state", "rate": "rate",
                    "link_layer": "link_layer"}.get(key)
            if name:
                put(root, f"{port}/{name}", value)


def show_gids_rows(text):
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[2].isdigit():
            kind = "RoCE v2" if parts[-2] == "v2" else "IB/RoCE v1"
            rows.append((int(parts[2]), parts[3], kind, parts[-1]))
    return rows


@pytest.fixture
def roce_root(tmp_path):
    root = tmp_path / "root"
    ibstat_to_sysfs(fixture_text("comm/ibstat-connectx7-roce.txt"), root)
    return root


# -- parsers ----------------------------------------------------------------------------------


def test_nccl_list_syntax():
    spec = fabric.parse_nccl_list("^=mlx5_0:1,mlx5_1")
    assert spec.exclude and spec.exact and spec.items == (("mlx5_0", 1), ("mlx5_1", None))
    prefixes = fabric.parse_nccl_list("ib,enp27")
    names = ["ibp26s0", "enp27s0f0np0", "lo"]
    assert prefixes.selected(names) == ["ibp26s0", "enp27s0f0np0"]
    assert fabric.parse_nccl_list("^lo,docker").selected(names) == ["ibp26s0", "enp27s0f0np0"]
    assert fabric.parse_nccl_list("=ib").unmatched(names) == ["ib"]


def test_ipv4_mapped_gid_forms():
    assert fabric.ipv4_mapped("0000:0000:0000:0000:0000:ffff:0a98:000c") == "10.152.0.12"
    assert fabric.ipv4_mapped("::ffff:200.0.209.6") == "200.0.209.6"
    assert fabric.ipv4_mapped("fe80:0000:0000:0000:a4ed:ccff:fe8b:1994") is None


def test_library_version_from_file_name():
    assert fabric.library_version_from_name("libnccl.so.2.21.5") == "2.21.5"
    assert fabric.library_version_from_name("librccl.so.1.0.60200") == "1.0.60200"
    assert fabric.library_version_from_name("libnccl.so.2") is None


# -- comm.nccl --------------------------------------------------------------------------------------


def test_nccl_skips_for_the_real_cpu_torch(make_ctx, run_one):
    build = torch_info.torch_build(make_ctx())
    result = run_one("comm.nccl", make_ctx())
    if build.kind == "cpu":  # torch 2.13+cpu on this machine
        assert result.status is Status.SKIP and "gloo" in result.summary
    else:
        assert result.status is not Status.ERROR


def test_nccl_version_from_the_wheel_metadata(make_ctx, run_one, tmp_path, monkeypatch):
    dist = tmp_path / "site" / "nvidia_nccl_cu12-2.21.5.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: 2.21.5\n")
    monkeypatch.setattr(torch_info, "torch_build",
                        lambda ctx: TorchBuild("2.5.1+cu124", cuda="12.4", location=str(tmp_path)))
    # the wheel is on the job's path (its PYTHONPATH), not dsenv's own
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path / "site")}
    result = run_one("comm.nccl", make_ctx(env=env))
    assert result.status is Status.OK and "NCCL 2.21.5" in result.summary


def test_rccl_version_from_torch_lib_file_name(make_ctx, run_one, tmp_path, monkeypatch):
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib / "librccl.so.1.0.60200").write_bytes(b"")
    (lib / "librccl.so.1").symlink_to("librccl.so.1.0.60200")
    monkeypatch.setattr(torch_info, "torch_build", lambda ctx: TorchBuild(
        "2.5.1+rocm6.2", hip="6.2.41133", location=str(tmp_path / "torch")))
    result = run_one("comm.nccl", make_ctx(target="compute"))
    assert result.status is Status.OK and result.summary.startswith("RCCL 1.0.60200")


def test_cuda_torch_without_nccl_warns_on_compute(make_ctx, run_one, tmp_path, monkeypatch):
    monkeypatch.setattr(fabric, "NCCL_WHEELS", ("dsenv-no-such-nccl-wheel",))
    monkeypatch.setattr(torch_info, "torch_build", lambda ctx: TorchBuild(
        "2.5.1+cu124", cuda="12.4", location=str(tmp_path / "torch")))
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""}
    result = run_one("comm.nccl", make_ctx(env=env, target="compute"))
    if fabric.comm_library(make_ctx(env=env)) is None:  # no system libnccl on this machine
        assert result.status is Status.WARN and "nvidia-nccl-cu12" in result.fix


# -- comm.infiniband ----------------------------------------------------------------------------------


def test_active_roce_ports_pass(make_ctx, run_one, roce_root):
    result = run_one("comm.infiniband", make_ctx(root=roce_root))
    assert result.status is Status.OK and "2 of 2" in result.summary and "RoCE" in result.summary
    assert any("mlx5_0:1: ACTIVE (LinkUp), RoCE, 200 Gb/sec" in e for e in result.evidence)


def test_ibstatus_values_are_read_verbatim(make_ctx, tmp_path):
    ibstatus_to_sysfs(fixture_text("comm/ibstatus-roce.txt"), tmp_path / "root")
    ports = fabric.ib_ports(make_ctx())
    assert [p.name for p in ports] == ["mlx5_0:1", "mlx5_1:1"]
    assert ports[0].active and ports[0].roce and ports[0].rate == "100 Gb/sec (4X EDR)"


def test_infiniband_port_down_warns_on_compute(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-down.txt"), tmp_path / "root")
    result = run_one("comm.infiniband", make_ctx(target="compute"))
    assert result.status is Status.WARN and "none ACTIVE" in result.summary
    assert run_one("comm.infiniband", make_ctx()).status is Status.INFO


def test_no_rdma_devices_skip(make_ctx, run_one):
    assert run_one("comm.infiniband", make_ctx()).status is Status.SKIP


# -- comm.roce-gid ---------------------------------------------------------------------------------------


def test_roce_without_gid_index_warns_with_the_computed_index(make_ctx, run_one, roce_root):
    gids_to_sysfs(ibv_devinfo_gids(fixture_text("comm/ibv_devinfo-gids-roce.txt")), roce_root, "mlx5_0")
    result = run_one("comm.roce-gid", make_ctx(root=roce_root))
    assert result.status is Status.WARN
    assert here(result) == "export NCCL_IB_GID_INDEX=3"  # what fixed NVIDIA/nccl#769
    assert any("200.0.209.6" in e for e in result.evidence)


def test_roce_gid_index_from_show_gids_in_a_pod(make_ctx, run_one, roce_root):
    gids_to_sysfs(show_gids_rows(fixture_text("comm/show_gids-k8s.txt")), roce_root, "mlx5_0")
    result = run_one("comm.roce-gid", make_ctx(root=roce_root))
    assert here(result) == "export NCCL_IB_GID_INDEX=7"


def test_roce_with_the_right_gid_index_passes(make_ctx, run_one, roce_root):
    gids_to_sysfs(ibv_devinfo_gids(fixture_text("comm/ibv_devinfo-gids-roce.txt")), roce_root, "mlx5_0")
    ctx = make_ctx(env={"PATH": "/usr/bin", "NCCL_IB_GID_INDEX": "3"}, root=roce_root)
    result = run_one("comm.roce-gid", ctx)
    assert result.status is Status.OK and "RoCE v2" in result.summary


def test_roce_gid_index_pointing_at_roce_v1_warns(make_ctx, run_one, roce_root):
    gids_to_sysfs(ibv_devinfo_gids(fixture_text("comm/ibv_devinfo-gids-roce.txt")), roce_root, "mlx5_0")
    ctx = make_ctx(env={"PATH": "/usr/bin", "NCCL_IB_GID_INDEX": "0"}, root=roce_root)
    result = run_one("comm.roce-gid", ctx)
    assert result.status is Status.WARN and here(result) == "export NCCL_IB_GID_INDEX=3"


def test_infiniband_only_skips_gid_check(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-active.txt"), tmp_path / "root")
    assert run_one("comm.roce-gid", make_ctx()).status is Status.SKIP


# -- comm.slingshot ------------------------------------------------------------------------------------------


@pytest.fixture
def slingshot_root(tmp_path):
    root = tmp_path / "root"
    for name in re.findall(r'"(cxi\d+)"', fixture_text("comm/lstopo-slingshot.txt")):
        (root / "sys/class/cxi" / name).mkdir(parents=True)
    return root


def test_slingshot_without_ofi_plugin_fails_on_compute(make_ctx, run_one, slingshot_root):
    env = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": ""}
    result = run_one("comm.slingshot", make_ctx(env=env, root=slingshot_root, target="compute"))
    assert result.status is Status.FAIL and "4 cxi" in result.summary
    assert "aws-ofi-" in here(result) and "FI_PROVIDER=cxi" in here(result)


def test_slingshot_with_the_plugin_on_ld_library_path_passes(make_ctx, run_one, slingshot_root,
                                                             tmp_path):
    plugin_dir = tmp_path / "aws-ofi-nccl" / "lib"
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "libnccl-net.so").write_bytes(b"")
    (plugin_dir / "librccl-net.so").write_bytes(b"")
    env = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": str(plugin_dir), "FI_PROVIDER": "cxi"}
    result = run_one("comm.slingshot", make_ctx(env=env, root=slingshot_root, target="compute"))
    assert result.status is Status.OK and "-net.so" in result.summary


@pytest.mark.parametrize("launcher, status", [
    ("torchrun", Status.WARN),  # ranks started outside srun: no VNI (uiuc-hpc/lci#110)
    ("deepspeed", Status.WARN),
    ("srun", Status.OK),  # the healthy twin: every step gets its VNI from Slurm
])
def test_slingshot_ranks_get_a_vni_only_from_srun(make_ctx, run_one, slingshot_root, launcher,
                                                  status):
    ctx = make_ctx(env={"PATH": "/usr/bin"}, root=slingshot_root, launcher=launcher)
    result = run_one("comm.slingshot-vni", ctx)
    assert result.status is status, result
    assert "cxi0" in result.evidence[0] and f"--launcher {launcher}" in result.evidence[1]
    if status is Status.WARN:
        assert result.mode == "comm.slingshot-no-vni" and launcher in result.summary
        assert "--launcher srun" in here(result) and "single_node_vni" in result.fix


def test_slingshot_vni_skips_without_cxi_or_a_launcher(make_ctx, run_one, slingshot_root,
                                                       tmp_path):
    none = run_one("comm.slingshot-vni", make_ctx(env={}, root=tmp_path / "bare",
                                                  launcher="torchrun"))
    assert none.status is Status.SKIP and "no Slingshot" in none.summary
    unknown = run_one("comm.slingshot-vni", make_ctx(env={}, root=slingshot_root))
    assert unknown.status is Status.SKIP and "--launcher" in unknown.summary


def test_nccl_net_plugin_names_the_file(make_ctx):
    ctx = make_ctx(env={"NCCL_NET_PLUGIN": "ofi"})
    assert fabric.net_plugin_names(ctx, rocm=False)[0] == "libnccl-net-ofi.so"


# -- comm.socket-ifname / comm.ib-hca / comm.ib-disable ---------------------------------------------------------


@pytest.fixture
def h100_root(tmp_path):
    """An H100 node: HCAs and their netdevs from a recorded `ibdev2netdev`."""
    return ibdev2netdev_to_sysfs(fixture_text("comm/ibdev2netdev-h100.txt"), tmp_path / "root")


def env_with(**values):
    return {"PATH": "/usr/bin", **values}


def test_socket_ifname_prefix_matching_passes(make_ctx, run_one, h100_root):
    result = run_one("comm.socket-ifname", make_ctx(env=env_with(NCCL_SOCKET_IFNAME="enp27"),
                                                    root=h100_root))
    assert result.status is Status.OK and "enp27s0f0np0" in result.summary


def test_socket_ifname_naming_a_missing_interface_fails_on_compute(make_ctx, run_one, h100_root):
    ctx = make_ctx(env=env_with(NCCL_SOCKET_IFNAME="=eth0"), root=h100_root, target="compute")
    result = run_one("comm.socket-ifname", ctx)
    assert result.status is Status.FAIL and "ibp26s0" in here(result)
    ctx = make_ctx(env=env_with(NCCL_SOCKET_IFNAME="=eth0"), root=h100_root, target="login")
    assert run_one("comm.socket-ifname", ctx).status is Status.WARN


def test_socket_ifname_with_one_typo_warns(make_ctx, run_one, h100_root):
    ctx = make_ctx(env=env_with(NCCL_SOCKET_IFNAME="ibp,hsn"), root=h100_root, target="compute")
    result = run_one("comm.socket-ifname", ctx)
    assert result.status is Status.WARN and "hsn" in result.summary


def test_socket_ifname_unset_skips(make_ctx, run_one):
    assert run_one("comm.socket-ifname", make_ctx(env=env_with())).status is Status.SKIP


def test_ib_hca_with_existing_hcas_passes(make_ctx, run_one, h100_root):
    ctx = make_ctx(env=env_with(NCCL_IB_HCA="mlx5_0:1,mlx5_3:1"), root=h100_root)
    assert run_one("comm.ib-hca", ctx).status is Status.OK


def test_ib_hca_naming_a_missing_hca_fails(make_ctx, run_one, h100_root):
    ctx = make_ctx(env=env_with(NCCL_IB_HCA="=mlx5_12"), root=h100_root, target="compute")
    result = run_one("comm.ib-hca", ctx)
    assert result.status is Status.FAIL and "selects no HCA" in result.summary


def test_ib_hca_naming_a_missing_port_fails(make_ctx, run_one, h100_root):
    ctx = make_ctx(env=env_with(NCCL_IB_HCA="=mlx5_0:2"), root=h100_root, target="compute")
    result = run_one("comm.ib-hca", ctx)
    assert result.status is Status.FAIL and "mlx5_0:2" in result.summary


def test_ib_disable_while_infiniband_is_up_warns(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-active.txt"), tmp_path / "root")
    result = run_one("comm.ib-disable", make_ctx(env=env_with(NCCL_IB_DISABLE="1")))
    assert result.status is Status.WARN and here(result) == "unset NCCL_IB_DISABLE"


def test_ib_disable_without_active_ports_is_fine(make_ctx, run_one, tmp_path):
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-down.txt"), tmp_path / "root")
    assert run_one("comm.ib-disable", make_ctx(env=env_with(NCCL_IB_DISABLE="1"))).status is Status.OK
    assert run_one("comm.ib-disable", make_ctx(env=env_with())).status is Status.SKIP

"""The NCCL/RCCL family parser (doctor/explain/families/nccl.py) on real texts: the symptom
fixtures of the comm table (tests/fixtures/explain_symptoms/comm.jsonl) read into their parts
and mode; texts of other families and empty text give no reading."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import nccl
from tests.harness import symptoms

ROWS = symptoms.rows("comm")
# Modes whose symptoms the parser reads by structure (the others are left to the catalogue's
# patterns: an ImportError's undefined NCCL symbol is the loader family's, a watchdog timeout
# torch.distributed's).
PARSED = {"comm.no-bootstrap-interface", "comm.ibverbs-unloadable",
          "comm.ibverbs-provider-warning-benign", "comm.net-plugin-absent-benign",
          "comm.nvls-fabric-manager", "comm.p2p-peer-access-unsupported", "comm.gdr-disabled",
          "comm.roce-gid-index", "comm.socket-ifname-missing", "comm.memlock-low",
          "comm.nccl-newer-than-driver", "comm.ib-link-errors", "comm.efa-unavailable",
          "comm.slingshot-no-ofi-plugin", "comm.socket-virtual-interfaces",
          "comm.gloo-ifname-invalid", "comm.algo-proto-forced",
          "comm.gpu-memory-registration-failed", "comm.cumem-host-numa-divergent",
          "comm.rdma-no-active-device"}


def _modes(text: str) -> list[str]:
    return [r.mode for r in nccl.read(text)]


# Other libraries' words for NCCL's causes, read by the catalogue's patterns, not NCCL's parser:
# NVSHMEM's for the GPUDirect path (DeepEP)
NOT_NCCL = ("neither nv_peer_mem, or nvidia_peermem detected",
            # Intel MPI's DAPL fabric: the same locked-memory limit, read by the catalogue's pattern
            "DAPL startup: RLIMIT_MEMLOCK too small")


@pytest.mark.parametrize("row", [r for r in ROWS if r["mode"] in PARSED
                                 and not any(w in r["text"] for w in NOT_NCCL)],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_symptom_reads_into_its_mode(row):
    assert row["mode"] in _modes(row["text"])


def test_parts_of_an_ibverbs_call():
    text = next(r["text"] for r in ROWS if r["url"].endswith("horovod/horovod/issues/98"))
    found = [r for r in nccl.read(text) if r.mode == "comm.memlock-low"]
    assert found and dict(found[0].parts)["call"] == "ibv_create_qp"
    assert dict(found[0].parts)["file"] == "misc/ibvwrap.cu"


def test_parts_of_a_provider_warning():
    text = next(r["text"] for r in ROWS if r["url"].endswith("linux-rdma/perftest/issues/262"))
    found = nccl.read(text)
    assert {r.mode for r in found} == {"comm.ibverbs-provider-warning-benign"}
    assert dict(found[0].parts)["provider"] == "libmana-rdmav34.so"


def test_abi_mismatch_is_not_the_benign_warning():
    text = next(r["text"] for r in ROWS if r["mode"] == "comm.ibverbs-unloadable"
                and "IBVERBS_PRIVATE" in r["text"])
    assert set(_modes(text)) == {"comm.ibverbs-unloadable"}


def test_the_shared_memory_segment_is_named():
    text = ("host:12:34 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
            "/dev/shm/nccl-AbCdEf to 9637892 bytes, error: No space left on device (28)")
    found = nccl.read(text)
    assert [r.mode for r in found] == ["system.shm-too-small"]
    assert dict(found[0].parts)["file"] == "misc/shmutils.cc"
    # the "Error while ... segment" form without an errno (before 2.12) says none, not "None"
    old = nccl.read("include/shm.h:48 NCCL WARN Error while creating shared memory segment "
                    "nccl-shm-recv-1 (size 4460544)")
    assert [r.mode for r in old] == ["system.shm-too-small"]
    assert dict(old[0].parts)["errno"] == ""


def test_the_plugin_notice_yields_to_a_real_error():
    text = ("NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal "
            "implementation\nh:1:2 [0] transport/nvls.cc:254 NCCL WARN Cuda failure 401 'the "
            "operation cannot be performed in the present state'")
    assert _modes(text) == ["comm.nvls-fabric-manager"]


@pytest.mark.parametrize("text", [
    "", "   ",
    "ImportError: libcudnn_cnn_infer.so.8: cannot open shared object file: No such file or "
    "directory",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "OSError: We couldn't connect to 'https://huggingface.co' to load this file",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, invalid usage"
    "\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
    "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000",
])
def test_other_texts_give_no_reading(text):
    assert nccl.read(text) == []


@pytest.mark.parametrize("text", [
    "h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo\n"
    "h:1:1 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>",
    "h:1:2 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>\nh:1:2 [0] NCCL INFO Using network "
    "Socket",
])
def test_a_single_node_on_loopback_is_not_a_failure(text):
    # one node's ranks bootstrap over lo legitimately: only a failed connect to a loopback
    # peer on a multi-node job would be a cause, and an INFO line alone is none
    assert nccl.read(text) == []


def test_a_port_error_explains_the_completion_errors_after_it():
    text = ("h1:1:2 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error\n"
            "h2:3:4 [4] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer h1<1> "
            "with error 12, opcode 2, len 1, vendor err 129")
    assert _modes(text) == ["comm.ib-link-errors"]


def test_the_chosen_interfaces_are_parts():
    text = next(r["text"] for r in ROWS if r["url"].endswith("pytorch/pytorch/issues/68893"))
    found = [r for r in nccl.read(text) if r.mode == "comm.socket-virtual-interfaces"]
    assert found and dict(found[0].parts) == {"result": "", "interface": "ens5",
                                              "virtual": "vethe2e6725"}


def _gloo(text: str) -> dict[str, str]:
    return symptoms.parts(nccl, text, "comm.gloo-ifname-invalid")


def test_gloo_reads_the_interface_value_it_could_not_find():
    # torch's short form and gloo's enforce form (Horovod's copy of gloo) read alike
    sparkrun = symptoms.text(ROWS, "spark-arena/sparkrun/issues/275")
    assert _gloo(sparkrun) == {"result": "", "variable": "GLOO_SOCKET_IFNAME", "value": "eth0",
                               "syntax": "an interface name this node does not have"}
    horovod = symptoms.text(ROWS, "horovod/horovod/issues/1341")
    assert _gloo(horovod)["value"] == "eth0"
    # the same line with NCCL's list syntax or an address where a name belongs
    assert _gloo(sparkrun.replace("eth0", "^lo"))["syntax"] == "NCCL's ^ exclusion list"
    assert _gloo(horovod.replace("eth0", "=ib0"))["syntax"] == "NCCL's = exact-match prefix"
    assert _gloo(sparkrun.replace("eth0", "10.0.0.7"))["syntax"] == (
        "an address, not an interface name")
    assert _gloo(sparkrun.replace("eth0", "bond0.100"))["value"] == "bond0.100"  # a VLAN


def test_gloo_failing_on_the_hosts_own_name_is_not_the_interface_variable():
    # device.cc's `rp` lookup is the hostname (it does not resolve), not GLOO_SOCKET_IFNAME
    horovod = symptoms.text(ROWS, "horovod/horovod/issues/1341")
    assert "comm.gloo-ifname-invalid" not in _modes(
        horovod.replace("ifa != nullptr", "rp != nullptr").replace("eth0", "dgx-1.ai"))
    assert _modes("RuntimeError: Unable to find address for: dgx-1.ai") == []
    # an address looked up for MASTER_ADDR (device.cc: "Unable to find interface for")
    assert _modes("RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/"
                  "device.cc:208] ifa != nullptr. Unable to find interface for: "
                  "[10.16.32.68]") == []


def test_a_container_without_a_socket_is_left_to_the_container_family():
    # The same WARN: on a host it is this mode; from a container (Docker names the host after
    # the container id) the container family names it (container.network-isolation).
    bare = ("include/socket.h:344 WARN Socket creation failed : Address family not supported by "
            "protocol")
    assert _modes(bare) == ["comm.no-bootstrap-interface"]
    assert _modes("3f2a9c41b7d0:3171:3171 [0] " + bare) == []
    assert _modes("gpu7:3171:3171 [0] " + bare) == ["comm.no-bootstrap-interface"]



def test_a_forced_algorithm_is_read_only_when_nccl_says_it_was_forced():
    # newer NCCL names the function, and the NCCL_ALGO/NCCL_PROTO values only when set
    forced = ("No algorithm/protocol nor symKernelId available for function Broadcast with "
              "datatype ncclInt8.\nNCCL_ALGO was set to allreduce:tree. NCCL_PROTO was set to "
              "Simple.")
    found = [r for r in nccl.read(forced) if r.mode == "comm.algo-proto-forced"]
    assert found and dict(found[0].parts)["function"] == "Broadcast"
    assert dict(found[0].parts)["variable"] == "NCCL_ALGO=allreduce:tree"
    unforced = ("ncclInternalError: Internal check failed.\nLast error:\nError : no "
                "algorithm/protocol available for function AllGather with datatype ncclInt8.")
    assert "comm.algo-proto-forced" not in _modes(unforced)


def test_gpu_memory_the_nic_refuses_is_not_the_memlock_limit():
    text = "misc/ibvwrap.cc:182 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Bad address"
    assert _modes(text) == ["comm.gpu-memory-registration-failed"]
    low = ("misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot "
           "allocate memory")
    assert _modes(low) == ["comm.memlock-low"]


def test_the_ofi_plugin_needing_a_newer_libfabric():
    for row in (r for r in ROWS if r["mode"] == "comm.efa-libfabric-too-old"
                and "NCCL" in r["text"]):
        assert "comm.efa-libfabric-too-old" in _modes(row["text"])
    text = next(r["text"] for r in ROWS if "FABRIC_1.7" in r["text"])
    found = [r for r in nccl.read(text) if r.mode == "comm.efa-libfabric-too-old"]
    assert dict(found[0].parts).items() >= {"plugin": "libnccl-net.so", "version": "FABRIC_1.7"}.items()


def test_a_refused_shared_memory_segment_is_the_folder_mode_not_its_size():
    row = next(r for r in symptoms.rows("system") if r["mode"] == "system.shm-not-writable"
               and "NCCL WARN" in r["text"])
    _, _, sure, _ = explain_text(row["text"])
    assert sure[0].id == "system.shm-not-writable"
    assert "system.shm-too-small" not in [m.id for m in sure]
    full = ("misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-Abc123 to "
            "9637892 bytes")
    assert _modes(full) == ["system.shm-too-small"]


# NCCL >= 2.12's misc/shmutils.cc ends the line in the errno of the call that failed
# ("error: %s (%d)", strerror and errno): the errno, not the words before it, is the cause.
_SEGMENT = ("h:1:2 [0] misc/shmutils.cc:67 NCCL WARN Error while {op} shared memory segment "
            "{path} (size {size}), error: {why} ({errno})")


@pytest.mark.parametrize("op,path,size,why,errno,want", [
    ("creating", "/dev/shm/nccl-sZcxQF", 9637888, "No space left on device", 28,
     ["system.shm-too-small"]),
    ("creating", "/dev/shm/nccl-sZcxQF", 9637888, "Permission denied", 13,
     ["system.shm-not-writable"]),
    ("creating", "/dev/shm/nccl-sZcxQF", 9637888, "Read-only file system", 30,
     ["system.shm-not-writable"]),
    # the peer's cuMem handle read as a file name: a zero-sized segment named by garbage
    ("attaching to", "/dev/shm/nccl-\u040c", 0, "No such file or directory", 2,
     ["comm.cumem-host-numa-divergent"]),
    # a real segment gone missing (NVIDIA/nccl#1589: no settled cause): no cause named
    ("attaching to", "/dev/shm/nccl-glnlGK", 14156128, "No such file or directory", 2, []),
])
def test_a_failed_segment_is_read_by_its_errno(op, path, size, why, errno, want):
    assert _modes(_SEGMENT.format(op=op, path=path, size=size, why=why, errno=errno)) == want


def test_the_cumem_fallback_reads_its_parts():
    row = next(r for r in ROWS if r["mode"] == "comm.cumem-host-numa-divergent")
    found = [r for r in nccl.read(row["text"]) if r.mode == "comm.cumem-host-numa-divergent"]
    assert dict(found[0].parts)["errno"] == "No such file or directory (2)"


@pytest.mark.parametrize("text,want", [
    # IB wanted (the HCA filter set) and NCCL's scan empty: no active RDMA port
    ("h:1:2 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0:1,mlx5_1:1\nh:1:2 [0] NCCL INFO NET/IB : No "
     "device found.", ["comm.rdma-no-active-device"]),
    # the same line on a node without RDMA NICs, nothing asking for IB: normal (NVIDIA/nccl#226)
    ("h:1:2 [0] NCCL INFO NET/IB : No device found.\nh:1:2 [0] NCCL INFO NET/Socket : Using "
     "[0]eth0:10.1.1.1<0>", []),
    # a device listed that will not open is the container's, not the node's ports
    ("h:1:2 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0\nh:1:2 [0] misc/ibvwrap.cc:212 NCCL WARN Call "
     "to ibv_open_device failed\nh:1:2 [0] NCCL INFO NET/IB : No device found.", []),
])
def test_an_empty_ib_scan_is_a_cause_only_where_ib_was_wanted(text, want):
    assert [m for m in _modes(text) if m == "comm.rdma-no-active-device"] == want


@pytest.mark.parametrize("text", [
    # EFAULT from memory registration in UCX's and mscclpp's words: a buffer the NIC cannot
    # pin, never the locked-memory limit (that is ENOMEM): microsoft/mscclpp#496, openucx/ucx#8049
    "UCX  ERROR ibv_reg_mr(address=0x7f724fa00000, length=4096, access=0xf) failed: Bad address",
    "mscclpp._mscclpp.IbError: (14, 'ibv_reg_mr failed (errno 14) (Ib failure: Bad address)')",
])
def test_a_bad_address_registration_is_not_the_memlock_limit(text):
    _, _, sure, _ = explain_text(text)
    assert "comm.memlock-low" not in [m.id for m in sure]
    # the healthy twin: ENOMEM is the limit
    _, _, sure, _ = explain_text("UCX  ERROR ibv_reg_mr(address=0x7f72, length=4096) failed: "
                                 "Cannot allocate memory")
    assert sure and sure[0].id == "comm.memlock-low"


def _lookalike(url_end: str) -> str:
    import json
    from pathlib import Path
    path = Path(__file__).parent / "fixtures" / "explain_lookalikes" / "comm.jsonl"
    return next(r["text"] for r in map(json.loads, path.read_text().splitlines())
                if r["url"].endswith(url_end))


def test_a_qp_that_times_out_names_the_gids_nccl_printed():
    # NCCL >= 2.2x names the GID index and both GIDs; a link-local fe80:: GID is the wrong
    # entry of nccl#769 (index 1), an IPv4-mapped one the usual RoCE v2 entry: shown as parts
    link_local = ("h1:1:2 [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 "
                  "Connection timed out, on dev mlx5_0:1, curr state INIT, next state RTR, local "
                  "GID index 1, local GID fe80::ac0:ebff:feda:1cfb, remote GID "
                  "fe80::ac0:ebff:feda:2c0e")
    got = symptoms.parts(nccl, link_local, "comm.roce-gid-index")
    assert (got["gid index"], got["local gid"], got["remote gid"]) == (
        "1", "fe80::ac0:ebff:feda:1cfb", "fe80::ac0:ebff:feda:2c0e")
    assert got["gid kind"].startswith("link-local")
    completion = ("h1:1:2 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
                  "10.0.0.2<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
                  "::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2")
    got = symptoms.parts(nccl, completion, "comm.roce-gid-index")
    assert (got["local gid"], got["remote gid"]) == ("::ffff:10.0.0.1", "::ffff:10.0.0.2")
    assert got["gid kind"].startswith("IPv4-mapped")
    # an older NCCL names no GID: the reading has none to show
    old = "ibvwrap.cc: NCCL WARN Call to ibv_modify_qp failed with error Connection timed out"
    assert "gid index" not in symptoms.parts(nccl, old, "comm.roce-gid-index")


def test_a_device_the_qp_cannot_use_is_no_gid_index():
    # ENODEV from ibv_modify_qp (nccl#799: fixed by leaving the HCA out with NCCL_IB_HCA)
    text = _lookalike("NVIDIA/nccl/issues/799")
    assert "comm.roce-gid-index" not in _modes(text)
    _, _, sure, _ = explain_text(text)
    assert "comm.roce-gid-index" not in [m.id for m in sure]


def test_gloo_refused_at_a_loopback_address_reads_the_address():
    got = symptoms.parts(nccl, symptoms.text(ROWS, "pytorch/gloo/issues/223"),
                         "comm.gloo-hostname-loopback")
    assert (got["address"], got["port"]) == ("127.0.1.1", "60817")
    got = symptoms.parts(nccl, symptoms.text(ROWS, "ray-project/ray/issues/24305"),
                         "comm.gloo-hostname-loopback")
    assert (got["address"], got["port"]) == ("127.0.0.1", "14221")
    # a routable peer that refuses (it died, a firewall) is not this cause
    routable = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect "
                "[10.1.2.3]:14221: Connection refused")
    assert "comm.gloo-hostname-loopback" not in _modes(routable)
    _, _, sure, _ = explain_text(routable)
    assert "comm.gloo-hostname-loopback" not in [m.id for m in sure]


def test_c10ds_ipv6_notice_is_no_bootstrap_failure():
    """c10d's warning that a client socket could not be made for IPv6 (errno 97) is a notice:
    torch goes on over IPv4 and the runs of vidur#49 and codellama#215 finished; NCCL's own
    bootstrap WARN with the same words (the corpus's nccl#210) stays the failure."""
    notice = ("[W socket.cpp:601] [c10d] The client socket cannot be initialized to connect to "
              "[localhost]:29500 (errno: 97 - Address family not supported by protocol).")
    assert "comm.no-bootstrap-interface" not in [r.mode for r in nccl.read(notice)]
    warn = ("node1:1234:1234 [0] misc/socket.cc:386 NCCL WARN socketCreate: Address family not "
            "supported by protocol")
    assert "comm.no-bootstrap-interface" in [r.mode for r in nccl.read(warn)]


def test_peer_access_asked_by_an_engines_own_all_reduce_names_the_caller():
    """The same CUDA error 217 from vLLM/sglang's custom_all_reduce.cuh or TensorRT-LLM's own
    all-reduce: the GPUs' missing P2P, with the engine named as the caller (NCCL's P2P settings
    cannot help there, the mode's fix says); from NCCL's p2p transport no caller is named."""
    (got,) = nccl.read("Failed: Cuda error /w/vllm/csrc/custom_all_reduce.cuh:307 'peer access "
                       "is not supported between these two devices'")
    assert (got.mode, dict(got.parts)["caller"]) == ("comm.p2p-peer-access-unsupported",
                                                     "custom_all_reduce")
    (got,) = nccl.read("h:1:2 [0] transport/p2p.cc:202 NCCL WARN failed to open CUDA IPC handle "
                       ": 217 peer access is not supported between these two devices")
    assert got.mode == "comm.p2p-peer-access-unsupported" and not dict(got.parts)["caller"]

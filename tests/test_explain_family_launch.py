"""The launcher and rendezvous family parser (doctor/explain/families/launch.py) on real texts:
the symptom fixtures of the launch table (tests/fixtures/explain_symptoms/launch.jsonl) read
into their parts and mode; texts of other families and empty text give no reading."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import launch, mpi, programs
from tests.harness import symptoms

ROWS = symptoms.rows("launch")


def _text(url_end: str) -> str:
    return symptoms.text(ROWS, url_end)


def _parts(text: str, mode: str) -> dict[str, str]:
    return symptoms.parts(launch, text, mode)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_symptom_reads_into_its_mode(row):
    """By the launch family, or for a program missing from PATH (numactl) by the programs one."""
    readings = launch.read(row["text"]) or programs.read(row["text"])
    assert row["mode"] in [r.mode for r in readings]


def test_the_missing_variable_is_named():
    assert _parts(_text("meta-llama/llama/issues/391"),
                  "launch.env-vars-no-launcher")["variable"] == "RANK"
    assert _parts('raise _env_error("MASTER_ADDR")',
                  "launch.env-vars-no-launcher")["variable"] == "MASTER_ADDR"


def test_slurms_task_variables_are_read_and_the_programs_own_are_not():
    """SLURM_PROCID / LOCALID / NODEID exist only in a Slurm task; SLURM_CONF and a variable
    the program invented are no launcher's, so no reading (explain stays quiet)."""
    assert _parts(_text("dcharatan/pixelsplat/issues/99"),
                  "launch.slurm-vars-outside-step")["variable"] == "SLURM_NODEID"
    assert _parts("  File \"train.py\", line 9\n    rank = int(os.environ['SLURM_PROCID'])\n"
                  "KeyError: 'SLURM_PROCID'", "launch.slurm-vars-outside-step")["variable"] \
        == "SLURM_PROCID"
    for own in ("KeyError: 'SLURM_CONF'", "KeyError: 'MY_CONFIG'"):
        assert launch.read(own) == []
        assert explain_text(own)[2] == []  # no confident cause


def test_the_store_barrier_counts_tell_a_missing_node_from_a_shared_store():
    missing = _parts(_text("NVIDIA/Megatron-LM/issues/782"), "launch.rdzv-timeout")
    assert (missing["world size"], missing["worker count"]) == ("2", "1")
    shared = _parts(_text("tczhangzhi/pytorch-distributed/issues/18"), "launch.store-shared")
    assert (shared["world size"], shared["worker count"]) == ("2", "4")
    assert "launch.rdzv-timeout" not in [r.mode for r in launch.read(
        _text("tczhangzhi/pytorch-distributed/issues/18"))]


def test_the_client_endpoint_and_errno_are_read():
    parts = _parts(_text("hpcaitech/Open-Sora/issues/667"), "launch.store-unreachable")
    assert parts["endpoint"] == "::ffff:0.104.99.143:47389"
    assert parts["errno"] == "110 Connection timed out"
    conn = _parts(_text("pytorch/pytorch/issues/107021"), "launch.rdzv-wrong-interface")
    assert conn["endpoint"] == "192.0.0.1:1234"
    # the same client line under torchrun's agent is the rendezvous, not env://
    assert "launch.store-unreachable" not in [r.mode for r in launch.read(
        _text("pytorch/pytorch/issues/107021"))]


def test_the_errno_decides_between_a_busy_port_and_a_name():
    assert _parts(_text("open-mmlab/mmpretrain/issues/960"), "launch.port-in-use")["port"] == "22"
    parts = _parts(_text("nyu-systems/Grendel-GS/issues/9"), "launch.master-addr-other-hosts")
    assert (parts["host"], parts["port"]) == ("user", "53821")


def test_accelerates_own_port_check_names_the_port():
    parts = _parts(_text("NovaSearch-Team/RAG-Retrieval/issues/50"), "launch.port-in-use")
    assert parts["port"] == "29500"
    # its other port messages are not a busy port
    assert launch.read("ValueError: main_process_port must be set for multi-node training") == []


def test_ssh_failures_are_told_apart():
    assert _parts(_text("DeepSpeed/issues/438"), "launch.sshd-refused")["port"] == "2222"
    assert _parts(_text("TsinghuaAI/CPM-2-Finetune/issues/42"),
                  "launch.host-unreachable")["host"] == "node0"
    # pdsh's exit code 255 only says that ssh failed; the publickey line says why
    modes = [r.mode for r in launch.read(_text("deepspeedai/DeepSpeed/issues/5709"))]
    assert modes == ["launch.ssh-publickey"]
    # sshd reset the connection before the key exchange: past MaxStartups, not an unreachable host
    dropped = ("pdsh@node0: node7: kex_exchange_identification: read: Connection reset by peer\n"
               "pdsh@node0: node7: ssh exited with exit code 255")
    assert [r.mode for r in launch.read(dropped)] == ["launch.sshd-maxstartups"]
    assert not launch.read("ConnectionResetError: [Errno 104] Connection reset by peer")


def test_a_missing_launcher_other_than_pdsh_is_not_pdsh_missing():
    """DeepSpeed's runner says "launcher 'X' not installed" for every backend it looks for;
    openmpi's is mpirun missing, not pdsh: no pdsh reading."""
    assert [r.mode for r in launch.read("RuntimeError: launcher 'pdsh' not installed.")] == [
        "launch.ds-pdsh-missing"]
    assert not [r for r in launch.read("RuntimeError: launcher 'openmpi' not installed.")
                if r.mode == "launch.ds-pdsh-missing"]


def test_the_deepspeed_runner_lines():
    parts = _parts(_text("deepspeedai/DeepSpeed/issues/1481"), "launch.ds-env-not-forwarded")
    assert parts["exported"] == "PYTHONUNBUFFERED,NCCL_VERSION,PYTHONPATH"
    assert _parts(_text("Megatron-DeepSpeed/issues/125"),
                  "launch.remote-paths-missing")["path"] == "/data/asc23/src_zero3"
    assert _parts(_text("xtuner/issues/592"),
                  "launch.ds-mpi-discovery-fallback")["fallback"] == "mpi_discovery"


@pytest.mark.parametrize("text", [
    "include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol",
    "ImportError: libcudart.so.10.1: cannot open shared object file: No such file or directory",
    "RuntimeError: [enforce fail at .../gloo/transport/tcp/device.cc:84]\n"
    "  ifa != nullptr. Unable to find address for: ^lo",
    "RuntimeError: Expected all tensors to be on the same device, but found at least two "
    "devices, cuda:0 and cpu!",
])
def test_other_families_give_no_reading(text):
    assert launch.read(text) == []


def test_empty_text_gives_no_reading():
    assert launch.read("") == []


def test_a_hangup_of_the_session_is_read_in_each_wording_and_no_other_signal_is():
    # older torch, newer torch (Signals.SIGHUP), the forwarded signal, the SignalException
    assert _parts(_text("open-mmlab/mmrotate/issues/210"),
                  "launch.sighup-session-closed")["signal"] == "SIGHUP (1)"
    newer = ("W0828 22:53:47.001000 139822188226368 torch/distributed/elastic/agent/server/"
             "api.py:688] Received Signals.SIGHUP death signal, shutting down workers")
    assert "launch.sighup-session-closed" in [r.mode for r in launch.read(newer)]
    forwarded = _parts("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process "
                       "30482 closing signal SIGHUP", "launch.sighup-session-closed")
    assert forwarded["forwarded to"] == "30482"
    raised = _parts(_text("zai-org/ChatGLM2-6B/issues/238"), "launch.sighup-session-closed")
    assert raised["agent pid"] == "8665"
    # SIGTERM (a scheduler's cancel, preemption, another rank's crash) is not a hangup
    sigterm = ("WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, "
               "shutting down workers\nWARNING:torch.distributed.elastic.multiprocessing.api:"
               "Sending process 1 closing signal SIGTERM\ntorch.distributed.elastic."
               "multiprocessing.api.SignalException: Process 2 got signal: 15")
    assert "launch.sighup-session-closed" not in [r.mode for r in launch.read(sigterm)]
    _, _, sure, _ = explain_text(sigterm)
    assert "launch.sighup-session-closed" not in [m.id for m in sure]


def test_the_agents_last_lines_after_a_long_run_name_the_hangup():
    log = "\n".join([
        " 12%|#         | 2905/25120 [2:12:37<17:37:09,  2.86s/it]WARNING:torch.distributed."
        "elastic.agent.server.api:Received 1 death signal, shutting down workers",
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2919043 closing "
        "signal SIGHUP",
        "Traceback (most recent call last):",
        '  File "/usr/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2918977 got "
        "signal: 1"])
    _, _, sure, _ = explain_text(log)
    assert sure and sure[0].id == "launch.sighup-session-closed"


def test_a_refused_bind_below_1024_is_a_privileged_port_not_a_busy_one():
    parts = _parts(_text("KimMeen/Time-LLM/issues/158"), "launch.privileged-port")
    assert (parts["port"], parts["errno"]) == ("98", "13 EACCES")
    assert _parts(_text("zlin0/wedefense/issues/47"), "launch.privileged-port")["port"] == "374"
    newer = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
             "local network address. port: 520, useIpv6: false, code: -13, name: EACCES, "
             "message: permission denied")
    assert _parts(newer, "launch.privileged-port")["port"] == "520"
    for row in ("KimMeen/Time-LLM/issues/158", "liucongg/ChatGLM-Finetuning/issues/140"):
        _, _, sure, _ = explain_text(_text(row))
        assert sure and sure[0].id == "launch.privileged-port"


def test_a_refused_bind_on_a_high_port_names_neither_privilege_nor_a_busy_port():
    high = ("RuntimeError: The server socket has failed to listen on any local network address. "
            "The server socket has failed to bind to [::]:29500 (errno: 13 - Permission denied).")
    assert "launch.privileged-port" not in [r.mode for r in launch.read(high)]
    _, _, sure, _ = explain_text(high)
    assert "launch.port-in-use" not in [m.id for m in sure]
    busy = ("The server socket has failed to bind to [::]:980 (errno: 98 - Address already in "
            "use).")
    assert [r.mode for r in launch.read(busy)] == ["launch.port-in-use"]


def test_ssh_openssl_mismatch_names_both_releases():
    # OPENSSL_VERSION_NUMBER as ssh prints it: 3.x MNN00PP0, 1.x MNNFFPPS (patch as a letter)
    got = _parts(_text("modin-project/unidist/issues/314"), "launch.ssh-openssl-mismatch")
    assert got == {"built against": "3.0.2", "loaded": "3.1.1"}
    got = _parts(_text("openssl/openssl/issues/1631"), "launch.ssh-openssl-mismatch")
    assert got == {"built against": "1.0.2g", "loaded": "1.0.1k"}
    # ssh could not run: the daemon box that follows is not read as a lost daemon
    assert "mpi.orted-lost" not in [r.mode for r in mpi.read(_text("unidist/issues/314"))]


def test_ray_says_which_version_differs_from_the_heads():
    """Ray's two blocks (the head's Ray and Python, this process's) are read and compared: Ray
    alone differs at gpustack/gpustack#1640, Ray and the Python minor at Unakar/Logic-RL#30;
    Ray Client's line names the Python minor; versions printed without Ray's refusal are
    no reading."""
    one = _parts(_text("gpustack/gpustack/issues/1640"), "launch.ray-version-mismatch")
    assert (one["cluster"], one["this process"], one["differs"]) == (
        "Ray 2.43.0, Python 3.11.10", "Ray 2.44.1, Python 3.11.10", "Ray")
    both = _parts(_text("Unakar/Logic-RL/issues/30"), "launch.ray-version-mismatch")
    assert both["differs"] == "Ray and Python"
    client = _parts(_text("ray-project/kuberay/issues/1553"), "launch.ray-version-mismatch")
    assert (client["cluster"], client["this process"]) == ("Python 3.8.13", "Python 3.11.4")
    assert launch.read("ray.init() connected to the cluster: Ray 2.44.1, Python 3.11.10") == []


def test_a_closed_elastic_rendezvous_is_read_and_explain_lists_it_as_a_symptom():
    """RendezvousClosedError (pytorch/pytorch#147064: the backend from torchrun's own line) is
    what failed on this node after another agent left: the family reads it, explain names no
    cause for it alone and lists it with where to look; "Rendezvous'ing worker group" alone, a
    healthy start, is nothing."""
    from dsenv.doctor.explain.command import explain_text

    text = _text("pytorch/pytorch/issues/147064")
    assert _parts(text, "launch.rdzv-closed")["backend"] == "c10d"
    _, _, sure, weak = explain_text(text)
    assert not sure and weak[0].id == "launch.rdzv-closed"
    assert launch.read("[default] Rendezvous'ing worker group") == []

"""NCCL's bare "unhandled system error": the words of a group no single cause ranks above the
others (doctor/explain/alternatives.toml, nccl-system-error-unlocated, ``unranked``).

torch prints ncclSystemError's summary for any system call NCCL saw fail; NCCL's own WARN line
(with NCCL_DEBUG=WARN or INFO) names the call. Threads settled the bare summary as a small
/dev/shm in a container, containers on Docker's bridge network and the wrong socket interface
(tests/fixtures/explain_shared/rows.jsonl, checked by tests/test_explain_shared.py). Here: the
WARN line, when the log has it, names its cause and the group stays out (the healthy twin); a
bridge address in NCCL's INFO lines tells the container's network; the answer says how to get
the WARN line."""

from __future__ import annotations

from dsenv.doctor.explain import alternatives
from tests.harness.cli import dsenv, explain
from tests.harness.explaining import answer

# LianjiaTech/BELLE#136's text (the settled cause: Docker's /dev/shm, fixed by --ipc=host)
BARE = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1169, unhandled "
        "system error, NCCL version 21.0.3 ncclSystemError: System call (socket, malloc, munmap, "
        "etc) failed.")


def test_the_bare_summary_is_the_group():
    group, causes = answer(BARE)
    g = alternatives.group("nccl-system-error-unlocated")
    assert g.unranked and group == g.id and causes == list(g.modes), causes


def test_ncclS_own_warning_names_the_cause_instead():
    """pytorch/pytorch#40622's CI log: NCCL's WARN lines name /dev/shm's posix_fallocate, the
    same summary follows; the parser's cause is the answer, alone."""
    log = ("5135fc87695d:126319:126336 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate "
           "failed : No space left on device\n"
           "5135fc87695d:126319:126336 [1] include/shm.h:48 NCCL WARN Error while creating shared "
           "memory segment nccl-shm-recv-54c7cb5318ccdf40-1-0-1 (size 9637888)\n"
           "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:514, "
           "unhandled system error, NCCL version 2.7.3")
    group, causes = answer(log)
    assert not group and causes[:1] == ["system.shm-too-small"], causes


def test_a_bridge_address_in_the_info_lines_tells_the_containers_network():
    log = ("e57377aacbb6:1203:1203 [0] NCCL INFO Bootstrap : Using eth0:172.17.0.3<0>\n"
           f"{BARE}")
    group, causes = answer(log)
    assert not group and causes == ["container.network-isolation"], causes
    # the bridge's gateway (172.17.0.1) is the host's side, not a container's address
    log = "h:1:1 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>\n" + BARE
    assert answer(log)[0] == "nccl-system-error-unlocated"


def test_other_nccl_errors_are_not_the_group():
    # another ncclResult has its own words: the group's words are the system error's only
    text = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, "
            "invalid usage\nncclInvalidUsage: This usually reflects invalid usage of NCCL "
            "library.")
    assert answer(text)[0] != "nccl-system-error-unlocated"


def test_the_answer_says_how_to_get_ncclS_warning():
    done = dsenv("explain", BARE)
    assert done.returncode == 0, explain(done)
    head = " ".join(done.stdout.split("\n\n", 1)[0].split())
    assert head.startswith("3 known causes share these words (nccl-system-error-unlocated)")
    assert "NCCL_DEBUG=WARN" in head and "--network=host" in head and "df -h /dev/shm" in head

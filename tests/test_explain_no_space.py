"""A bare "No space left on device": the words of a group no single cause ranks above the others
(doctor/explain/alternatives.toml, no-space-unlocated, ``unranked``).

Threads settled the same bare ENOSPC as a small tmpfs at TMPDIR, a full output disk, a cache on a
small disk and a full /dev/shm (tests/fixtures/explain_shared/rows.jsonl, checked by
tests/test_explain_shared.py). These tests hold the rest of the mechanism: the group is the
answer only when no line names a cause; a line a cause ranks on keeps it; a path printed with
the error tells the member; and with --here, each member's check runs where the job failed: a
real 64 MiB tmpfs as TMPDIR is found, a roomy one (the healthy twin) is not."""

from __future__ import annotations

import json

from dsenv.doctor.explain import alternatives
from tests.harness.explaining import answer
from tests.harness.mountns import in_namespace, needs_namespace

BARE = "OSError: [Errno 28] No space left on device"  # pelican-eggs/eggs#1836, AlphaPose#1027


def test_bare_words_are_the_group_with_every_member():
    group, causes = answer(BARE)
    g = alternatives.group("no-space-unlocated")
    assert g.unranked and group == g.id and causes == list(g.modes), causes


def test_a_line_a_cause_ranks_on_keeps_that_cause_alone():
    """The words never outweigh a ranked cause: torch's shared-memory file (idiap/ESLAM#20's
    line) is /dev/shm, pip's install is TMPDIR (pterodactyl/panel#3541), a quota is errno 122."""
    for text, cause in (
            ("RuntimeError: unable to write to file </torch_31911_952036340_6686>: No space left "
             "on device (28)", "system.shm-too-small"),
            ("Could not install packages due to an OSError: [Errno 28] No space left on device",
             "system.tmp-full"),
            ("OSError: [Errno 122] Disk quota exceeded", "cache.home-quota")):
        group, causes = answer(text)
        assert not group and causes[:1] == [cause], (text, causes)


def test_a_later_line_that_names_a_cause_is_the_answer():
    """The group is the answer of last resort: a log whose other failure names its cause is
    explained by that line (the order of reading is unchanged by the group)."""
    log = (f"{BARE}\n"
           "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
           "local network address. The server socket has failed to bind to [::]:29500 (errno: "
           "98 - Address already in use).")
    group, causes = answer(log)
    assert not group and causes[:1] == ["launch.port-in-use"], causes
    # its twin: the same log without that line is the group's
    assert answer(BARE)[0] == "no-space-unlocated"


def test_a_path_printed_with_the_words_tells_the_member():
    # tempfile's default name in TMPDIR (YeoLab/sailor#2's folder), the Hub client's cache
    # (huggingface_hub#2742's target), shared memory
    for around, member in (
            ("  File \"/usr/lib/python3.10/tempfile.py\", in mkdtemp: '/tmp/tmpCvhVDX'",
             "system.tmp-full"),
            ("  File \"/venv/lib/python3.12/site-packages/huggingface_hub/file_download.py\", "
             "line 651, in http_get", "cache.home-quota"),
            ("writing /dev/shm/arrow-7f3a", "system.shm-too-small")):
        group, causes = answer(f"Traceback (most recent call last):\n{around}\n{BARE}")
        assert not group and causes == [member], (around, causes)


def test_other_words_are_not_the_group():
    assert answer("OSError: [Errno 13] Permission denied: '/scratch/run'")[0] == ""
    assert answer("ValueError: too many values to unpack (expected 2)") == ("", [])


_HERE = ('mkdir -p "$D/tmp"; mount -t tmpfs -o size=$SIZE none "$D/tmp"\n'
         'TMPDIR="$D/tmp" HF_HOME="$D/hf" "$PY" -m dsenv explain --here --json "$TEXT" || true\n')


def _here(tmp_path, size: str) -> dict:
    needs_namespace()
    done = in_namespace(_HERE, env={"D": str(tmp_path), "SIZE": size, "TEXT": BARE},
                        timeout=120)
    return json.loads(done.stdout)


def test_here_finds_the_small_tmpdir_among_the_causes(tmp_path):
    report = _here(tmp_path, "64m")
    assert report["shared"]["id"] == "no-space-unlocated"
    by_id = {m["id"]: m for m in report["matches"]}
    assert "the cause is present here" in by_id["system.tmp-full"]["here"]
    assert any(x.startswith("on this node system.tmpdir finds: FAIL")
               for x in by_id["system.tmp-full"]["here"])
    assert "the cause is present here" not in by_id["system.shm-too-small"]["here"]


def test_here_with_a_roomy_tmpdir_finds_none_of_them(tmp_path):
    report = _here(tmp_path, "8g")
    assert report["shared"]["id"] == "no-space-unlocated"
    assert not any("the cause is present here" in m["here"] for m in report["matches"]), \
        [(m["id"], m["here"]) for m in report["matches"]]
    tmp = next(m for m in report["matches"] if m["id"] == "system.tmp-full")
    assert any(x.startswith("on this node system.tmpdir finds: OK") for x in tmp["here"])

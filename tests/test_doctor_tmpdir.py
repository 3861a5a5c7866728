"""system.tmpdir: the temporary folder a job's programs write to has room (issue 23: the
check of system.tmp-full, pip's "[Errno 28] No space left on device" while the disk has room).

Built for real: a tmpfs of 64 MiB, 2 GiB and 8 GiB mounted in a private mount namespace as
the job's TMPDIR; the probe that finds no temporary folder at all skips with the reason."""

from __future__ import annotations

import json
import os
import time

from dsenv.verdicts.findings import Status
from tests.harness.mountns import (
    FUSE_MOUNT,
    doctor_json,
    in_namespace,
    needs_fuse,
    needs_namespace,
    result,
)

SCRIPT = """
mkdir -p "$D/tmp"
mount -t tmpfs -o size=$SIZE none "$D/tmp"
TMPDIR="$D/tmp" "$PY" -m dsenv doctor --only system --json || true
"""


def _tmpdir(tmp_path, size: str) -> dict:
    needs_namespace()
    done = in_namespace(SCRIPT, env={"D": str(tmp_path), "SIZE": size}, timeout=120)
    return result(doctor_json(done), "system.tmpdir")


def test_a_small_tmpfs_as_tmpdir_fails_with_the_mode_and_a_folder_with_room(tmp_path):
    found = _tmpdir(tmp_path, "64m")
    assert found["status"] == "fail" and found["mode"] == "system.tmp-full", found
    assert "0.06 GiB free" in found["summary"] and "a tmpfs: RAM-backed" in found["summary"]
    assert found["evidence"][0].startswith(f"{tmp_path}/tmp (TMPDIR) on {tmp_path}/tmp (tmpfs)")
    # the catalogue's fix, then a folder on this machine's disk, which has room
    assert found["fix"].startswith("Point the temporary folder at a disk with room")
    assert any(x.startswith("here: export TMPDIR=/var/tmp/") for x in found["evidence"]), found


def test_a_tmpfs_under_four_gib_warns(tmp_path):
    found = _tmpdir(tmp_path, "2g")
    assert found["status"] == "warn" and found["mode"] == "system.tmp-full", found


def test_a_tmpdir_with_room_is_ok(tmp_path):
    found = _tmpdir(tmp_path, "8g")
    assert found["status"] == "ok" and found["summary"].endswith("8.0 GiB free of 8.0 GiB")


def test_a_tmpdir_on_a_file_server_that_stopped_answering_costs_the_deadline(tmp_path):
    """statfs on a FUSE mount that never answers it blocks in the kernel (as on a hard-mounted
    file server that stopped answering): the check's child waits its deadline and is left
    behind, the check says it could not read the room, and the doctor exits
    (tests/harness/fusefs.py)."""
    needs_fuse()
    script = FUSE_MOUNT + ('fuse_mount "$D/hung" statfs-hangs\n'
                           'TMPDIR="$D/hung" timeout 60 "$PY" -m dsenv doctor --only system '
                           '--json || true\n')
    start = time.monotonic()
    done = in_namespace(script, env={"D": str(tmp_path)}, timeout=120)
    found = result(doctor_json(done), "system.tmpdir")
    assert found["status"] == "skip" and "`stat -f` gave no answer in 5 s" in found["summary"]
    assert time.monotonic() - start < 45


def test_no_temporary_folder_skips_with_the_reason(make_ctx, run_one, tmp_path):
    # a node root with no /tmp, no /var/tmp, and TMPDIR set to a folder that is not there
    ctx = make_ctx(env={"TMPDIR": "/scratch/gone"}, root=tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    found = run_one("system.tmpdir", ctx)
    assert found.status == Status.SKIP and "no temporary folder exists" in found.summary


def test_explain_here_finds_the_cause_present_in_the_job(tmp_path):
    """pip's ENOSPC (pterodactyl/panel#3541's line) explained inside the job whose TMPDIR is
    the small tmpfs: the check runs there and finds the cause."""
    needs_namespace()
    text = ("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on "
            "device")
    script = ('mkdir -p "$D/tmp"; mount -t tmpfs -o size=64m none "$D/tmp"\n'
              'TMPDIR="$D/tmp" "$PY" -m dsenv explain --here --json "$TEXT" || true\n')
    done = in_namespace(script, env={"D": str(tmp_path), "TEXT": text}, timeout=120)
    first = json.loads(done.stdout)["matches"][0]
    assert first["id"] == "system.tmp-full" and first["check"] == "system.tmpdir"
    assert any(x.startswith("on this node system.tmpdir finds: FAIL") for x in first["here"])
    assert "the cause is present here" in first["here"]


def test_a_temporary_folder_too_long_for_socket_paths(make_ctx, run_one, tmp_path):
    """system.tmpdir-sockets: sockets under TMPDIR must fit Unix's 107-byte sun_path. A real
    folder of 90 bytes fails (multiprocessing's listener sockets, DataLoader workers), one of
    60 warns (Ray's session sockets), one of 30 is ok, and no temporary folder skips."""
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="s", dir="/tmp")  # /tmp/sXXXXXXXX: short enough to grow
    try:
        def folder(length: int) -> str:
            path = base + "/" + "d" * (length - len(base) - 1)
            os.makedirs(path, exist_ok=True)
            return path

        for length, status in ((90, Status.FAIL), (60, Status.WARN), (30, Status.OK)):
            found = run_one("system.tmpdir-sockets",
                            make_ctx(env={"TMPDIR": folder(length)}, root="/"))
            assert found.status == status, found
            if status != Status.OK:
                assert "AF_UNIX path too long" in found.summary
                assert found.mode == "system.tmpdir-socket-path-too-long"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    (tmp_path / "empty").mkdir()
    found = run_one("system.tmpdir-sockets", make_ctx(env={"TMPDIR": "/scratch/gone"},
                                                      root=tmp_path / "empty"))
    assert found.status == Status.SKIP and "no temporary folder exists" in found.summary

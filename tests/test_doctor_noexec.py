"""system.noexec: the folders where Triton, Inductor and torch's JIT write the shared objects
they then load (the temporary folder, the Inductor and Triton caches, torch's extensions
folder), each as the job's variables place it, must not be on a noexec mount (issue 23: a
class the held-out messages showed, 'failed to map segment from shared object'). Real tmpfs
mounts in a private mount namespace: noexec, its healthy twin, and a node whose mount table
cannot be read."""

from __future__ import annotations

from dsenv.doctor import catalogue
from tests.harness.mountns import doctor_json, in_namespace, needs_namespace, result

RUN = """
D=$(mktemp -d); mount -t tmpfs -o "$OPTIONS" none "$D"
# the job's other placements at their defaults: Inductor's cache then lives under TMPDIR
env -u TORCHINDUCTOR_CACHE_DIR -u TRITON_CACHE_DIR -u TORCH_EXTENSIONS_DIR TMPDIR="$D" \
    "$PY" -m dsenv doctor --only system --target compute --json || true
umount "$D"; rmdir "$D"
"""


def _noexec_result(options: str) -> dict:
    done = in_namespace(RUN, env={"OPTIONS": options}, timeout=120)
    return result(doctor_json(done), "system.noexec")


def test_a_noexec_temporary_folder_fails_and_says_where_to_move_it():
    needs_namespace()
    found = _noexec_result("size=8m,noexec")
    assert found["status"] == "fail", found
    assert found["mode"] == "system.tmp-noexec"
    assert found["fix"] == catalogue.fix_for("system.tmp-noexec")
    assert "temporary files" in found["summary"] and "mounted noexec" in found["summary"]
    # Inductor's default cache sits under TMPDIR: it is on the same noexec mount
    assert "Inductor cache" in found["summary"]
    assert any(line.startswith("here: export TMPDIR=") for line in found["evidence"])


def test_the_same_folder_mounted_with_exec_is_ok():
    needs_namespace()
    found = _noexec_result("size=8m")
    assert found["status"] == "ok", found
    assert "no noexec mount" in found["summary"]
    assert any("temporary files" in line and "noexec" not in line for line in found["evidence"])


def test_no_mount_table_skips_with_the_reason(tmp_path, make_ctx, run_one):
    """A node root without /proc (the doctor reads the mount table through it): skip, never
    a vacuous ok."""
    found = run_one("system.noexec", make_ctx(root=tmp_path))
    assert found.status.value == "skip" and "mount table" in found.summary

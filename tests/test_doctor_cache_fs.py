"""Cache folders on file systems, made for real: cache.flock on a FUSE mount whose locks fail
as Lustre without ``-o flock`` (ENOSYS) or NFS without a lock manager (ENOLCK) do,
cache.triton-dir and cache.miopen-db on read-only binds, another user's folders and network
mounts (a faked mount table under --root); the mount table parser; each with a healthy twin."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

from dsenv.doctor.checks.software.builds import FILELOCK_SOFT_FALLBACK, lock_consequence
from dsenv.doctor.context import Context, Options
from dsenv.facts.host import cachefs, mounts
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.mountns import (
    FUSE_MOUNT,
    READ_ONLY,
    doctor_json,
    folder_of_another_user,
    in_namespace,
    needs_fuse,
    needs_namespace,
    result,
    third_user_cannot_write,
)

CACHE_OTHERS = "cache.offline,cache.assets,cache.hf-dirs"


def make(tmp_path, env=None, root=None, prefix=None) -> Context:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    return Context(options=Options(target="login"), env={**base, **(env or {})},
                   root=Path(root) if root else tmp_path / "root", python_prefix=prefix)


def fake_root(tmp_path, *lines: str, kfd: bool = False) -> Path:
    """A --root tree: /proc/self/mountinfo with ``/`` (ext4) and ``lines``; /dev/kfd if asked."""
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    table = ["27 1 254:0 / / rw,relatime - ext4 /dev/vda rw", *lines]
    (root / "proc" / "self" / "mountinfo").write_text("\n".join(table) + "\n")
    if kfd:
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev" / "kfd").write_text("")
    return root


def triton_prefix(tmp_path) -> Path:
    """An environment with triton installed, read from its files."""
    site = tmp_path / "env" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("__version__ = '3.1.0'\n")
    return tmp_path / "env"


# -- the mount table --------------------------------------------------------------------------


def test_mountinfo_parsing_and_longest_prefix(tmp_path):
    root = fake_root(
        tmp_path,
        "40 27 0:40 / /lus rw - lustre 10.0.0.1@o2ib:/fs rw,localflock",
        r"41 27 0:41 / /home/with\040space rw shared:5 - nfs4 srv:/home rw,vers=4.2,nolock",
        "42 27 0:42 / /lus/scratch rw - lustre 10.0.0.1@o2ib:/sc rw,flock",
        "43 27 0:43 / /lus/scratch rw - tmpfs none rw",  # mounted over: the later one counts
        "44 27 0:44 / /opt/img rw - fuse.squashfuse img rw",
        "45 27 0:45 / /gw rw - fuse.sshfs me@gw: rw")
    table = mounts.parse_mountinfo((root / "proc/self/mountinfo").read_text())
    assert table[2].point == "/home/with space" and table[2].fstype == "nfs4"
    ctx = make(tmp_path, root=root)
    assert mounts.mount_for(ctx, "/lus/a/b").lock_scope() == "node-local"
    assert mounts.mount_for(ctx, "/lus/scratch/x").fstype == "tmpfs"
    assert mounts.mount_for(ctx, "/lustre-not/x").fstype == "ext4"
    assert mounts.mount_for(ctx, "/home/with space/u").lock_scope() == "node-local"
    assert mounts.mount_for(ctx, "/opt/img/x").kind == "local"
    assert mounts.mount_for(ctx, "/gw/x").kind == "network"
    assert mounts.Mount("/l", "lustre", "s", frozenset({"rw"})).lock_scope() == "none"
    assert mounts.parse_mounts("srv:/h /h nfs rw,vers=3 0 0\n")[0].kind == "network"


def test_a_path_is_touched_in_process_only_once_its_mount_answered(tmp_path, monkeypatch):
    """mounts.answers: a local mount is touched without asking; a network, FUSE or autofs
    mount is statted in a child first (once per mount and run); a mount whose probe gave no
    answer is not touched again, and mount_for then goes by the path's text."""
    root = fake_root(tmp_path, "45 27 0:45 / /gw rw - fuse.sshfs me@gw: rw",
                     "46 27 0:46 / /net rw - autofs auto.net rw",
                     "47 27 0:47 / /lus rw - lustre 10.0.0.1@o2ib:/fs rw")
    ctx = make(tmp_path, root=root)
    children = []
    real_run = type(ctx).run
    monkeypatch.setattr(type(ctx), "run", lambda self, argv, timeout=None:
                        children.append(argv[-1]) or real_run(self, argv, timeout))
    assert mounts.answers(ctx, "/opt/x") and children == []  # ext4: no child
    assert mounts.answers(ctx, "/gw/a/b") and mounts.answers(ctx, "/gw/c")
    assert mounts.answers(ctx, "/net/srv/x")
    assert children == ["/gw/a/b", "/net/srv/x"]  # one stat per mount, in a child
    mounts.hung_points(ctx).add("/lus")  # as a write test that gave no answer marks it
    assert not mounts.answers(ctx, "/lus/scratch/x") and children[2:] == []
    assert mounts.mount_for(ctx, "/lus/scratch/x").fstype == "lustre"  # by text, no realpath


def test_files_under_a_folder_are_statted_in_a_child_before_they_are_read(tmp_path, monkeypatch):
    """mounts.files_answer: on a mount that can hang, the entries down to ``depth`` are statted
    in a child (once per folder, depth and run) after the mount's own stat; a walk that gave no
    answer keeps the folder and everything below it from this process (answers says so too),
    while the rest of the mount stays readable; a local folder asks nothing."""
    share = tmp_path / "share"
    (share / "ext" / "op").mkdir(parents=True)
    (share / "ext" / "op" / "op.so").write_text("x")
    (tmp_path / "local").mkdir()
    ctx = make(tmp_path, root=fake_root(tmp_path,
                                        f"49 27 0:49 / {share} rw - lustre mds@o2ib:/fs rw"))
    children = []
    real_run = type(ctx).run
    monkeypatch.setattr(type(ctx), "run", lambda self, argv, timeout=None:
                        children.append(argv[4:]) or real_run(self, argv, timeout))
    assert mounts.files_answer(ctx, tmp_path / "local", 3) and children == []
    assert mounts.files_answer(ctx, share / "ext", 2)
    assert mounts.files_answer(ctx, share / "ext", 2)  # once per folder and run
    assert children == [["--stat", str(share / "ext")], ["--walk", str(share / "ext"), "2",
                                                         str(mounts.MAX_WALKED)]]
    walked = __import__("json").loads(real_run(ctx, [sys.executable, "-I", "-S",
                                                     mounts.lockprobe.__file__, "--walk",
                                                     str(share / "ext"), "2", "1"]).stdout)
    assert walked == {"statted": 1, "complete": False}  # the limit: the rest is not statted
    mounts.hung_folders(ctx).add(str(share / "hf"))  # as a walk that gave no answer marks it
    assert not mounts.answers(ctx, share / "hf" / "hub" / "x.lock")
    assert not mounts.files_answer(ctx, share / "hf" / "hub", 1)
    assert mounts.answers(ctx, share / "ext" / "op") and len(children) == 2


def test_a_write_test_that_answered_spares_the_mounts_stat(tmp_path, monkeypatch):
    """cachefs' write test runs in a child: its answer is the mount's, so the folder's later
    in-process reads (mount_for's realpath) start no second child there."""
    share = tmp_path / "share"
    share.mkdir()
    ctx = make(tmp_path, root=fake_root(tmp_path, f"48 27 0:48 / {share} rw - nfs4 srv:/s rw"))
    children = []
    real_run = type(ctx).run
    monkeypatch.setattr(type(ctx), "run", lambda self, argv, timeout=None:
                        children.append(argv) or real_run(self, argv, timeout))
    assert cachefs.try_folder(ctx, share / "hf").created and len(children) == 1
    assert mounts.mount_for(ctx, share / "hf").fstype == "nfs4" and len(children) == 1


def test_real_tmpfs_mount_is_seen():
    needs_namespace()
    done = in_namespace(
        'D=$(mktemp -d); mount -t tmpfs -o size=1m none "$D"\n'
        '"$PY" -c "import sys; from dsenv.facts.host import mounts; '
        "from dsenv.facts.node import Node; "
        "m = mounts.mount_for(Node(), sys.argv[1] + '/sub/dir'); "
        'print(m.fstype, m.point == sys.argv[1])" "$D"; umount "$D"; rmdir "$D"')
    assert done.stdout.split() == ["tmpfs", "True"], done.stderr


# -- cache.flock: a FUSE mount whose locks fail ------------------------------------------------

FLOCK_RUN = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
"$PY" -m dsenv doctor --only cache --skip $SKIP --json > "$OUT" || true
"$PY" - "$MNT" > "$LIB" 2>/dev/null <<'PY' || true
import sys
from filelock import FileLock, Timeout
try:
    FileLock(sys.argv[1] + "/probe.lock").acquire(timeout=1)
    print("acquired")
except Timeout:
    print("Timeout: filelock still waiting")
except NotImplementedError as exc:
    print("NotImplementedError:", exc)
except OSError as exc:
    print("OSError:", exc)
PY
"""


def _new_filelock() -> bool:
    """filelock >= 3.24 (the one these tests and the doctor see): ENOSYS -> SoftFileLock."""
    return Version(metadata.version("filelock")) >= FILELOCK_SOFT_FALLBACK


def _flock_run(tmp_path, mode: str, env: dict) -> tuple[dict, str]:
    needs_fuse()
    pytest.importorskip("filelock")
    out, lib = tmp_path / "report.json", tmp_path / "filelock.txt"
    done = in_namespace(FLOCK_RUN, env={"MNT": str(tmp_path / "mnt"), "MODE": mode,
                                        "OUT": str(out), "LIB": str(lib),
                                        "SKIP": CACHE_OTHERS + ",cache.triton-dir,cache.miopen-db",
                                        "HOME": str(tmp_path / "home"), **env})
    assert done.returncode == 0, done.stderr
    report = doctor_json(subprocess.CompletedProcess((), 0, out.read_text(), ""))
    return result(report, "cache.flock"), lib.read_text().strip()


def test_hub_cache_where_flock_is_not_implemented(tmp_path):
    found, library = _flock_run(tmp_path, "enosys", {"HF_HOME": str(tmp_path / "mnt" / "hf")})
    assert "[Errno 38] Function not implemented" in found["summary"], found
    assert "fuse.dsenvtest" in found["summary"]
    assert here(found) == "export HF_HOME=/tmp/$USER/huggingface"
    # what the library the hub uses does there, and what the doctor says it does
    if _new_filelock():
        assert library == "acquired"
        assert found["status"] == "warn" and "falls back to SoftFileLock" in found["summary"]
    else:  # the error users report
        assert library.startswith("NotImplementedError: FileSystem does not appear to support")
        assert found["status"] == "fail" and "does not appear to support flock" in \
            found["summary"]


def test_datasets_cache_without_lock_manager_fails(tmp_path):
    found, library = _flock_run(tmp_path, "enolck",
                                {"HF_DATASETS_CACHE": str(tmp_path / "mnt" / "datasets")})
    assert found["status"] == "fail" and "[Errno 37] No locks available" in found["summary"]
    assert here(found) == "export HF_DATASETS_CACHE=/tmp/$USER/huggingface/datasets"
    if _new_filelock():
        assert library == "OSError: [Errno 37] No locks available"
        assert "raises OSError" in found["summary"], found
    else:  # load_dataset's endless wait
        assert library == "Timeout: filelock still waiting"
        assert "retries forever" in found["summary"], found


def test_fuse_with_working_locks_is_ok(tmp_path):
    found, library = _flock_run(tmp_path, "local", {"HF_HOME": str(tmp_path / "mnt" / "hf")})
    assert library == "acquired"
    assert found["status"] == "ok", found


@pytest.mark.parametrize("version, code, fatal, words", [
    ("3.13.1", errno.ENOSYS, True, "does not appear to support flock"),
    ("3.13.1", errno.ENOLCK, True, "retries forever"),
    ("3.24.0", errno.ENOSYS, False, "falls back to SoftFileLock"),
    ("3.24.0", errno.ENOLCK, True, "raises OSError [Errno 37]"),
    (None, errno.EIO, True, "retries forever"),
])
def test_lock_consequence_follows_the_filelock_version(version, code, fatal, words):
    # both behaviours were checked on the FUSE mount with filelock 3.13.1 and 3.24.0 wheels
    got = lock_consequence(code, Version(version) if version else None)
    assert got[0] is fatal and words in got[1]


def test_lustre_localflock_is_noted(tmp_path, run_one):
    hf = tmp_path / "hf"
    hf.mkdir()
    root = fake_root(tmp_path, f"40 27 0:40 / {hf} rw - lustre 10.0.0.1@o2ib:/fs rw,localflock")
    found = run_one("cache.flock", make(tmp_path, {"HF_HOME": str(hf)}, root))
    assert found.status == Status.INFO and "only on this node" in found.summary, found
    twin = run_one("cache.flock", make(tmp_path, {"HF_HOME": str(hf)}, fake_root(tmp_path)))
    assert twin.status == Status.OK, twin


def test_untestable_folder_falls_back_to_mount_options(tmp_path, run_one):
    # /proc refuses new files even for root; the table says it is a Lustre without flock
    env = {"HF_HOME": "/proc/dsenv-test/hf"}
    root = fake_root(tmp_path, "40 27 0:40 / /proc rw - lustre 10.0.0.1@o2ib:/fs rw")
    found = run_one("cache.flock", make(tmp_path, env, root))
    assert "mounted without flock" in found.summary, found
    assert found.status == (Status.WARN if _new_filelock() else Status.FAIL)
    plain = run_one("cache.flock", make(tmp_path, env, fake_root(tmp_path)))
    assert plain.status == Status.SKIP and "cache.hf-dirs" in plain.summary, plain


# -- cache.triton-dir -------------------------------------------------------------------------


def test_triton_cache_on_nfs_warns_local_is_ok(tmp_path, run_one):
    cache = tmp_path / "triton"
    cache.mkdir()
    prefix = triton_prefix(tmp_path)
    env = {"TRITON_CACHE_DIR": str(cache)}
    root = fake_root(tmp_path, f"40 27 0:40 / {cache} rw - nfs4 srv:/home rw,vers=4.2")
    found = run_one("cache.triton-dir", make(tmp_path, env, root, prefix))
    assert found.status == Status.WARN and "nfs4" in found.summary, found
    assert here(found) == "export TRITON_CACHE_DIR=/tmp/$USER/triton"
    twin = run_one("cache.triton-dir", make(tmp_path, env, fake_root(tmp_path), prefix))
    assert twin.status == Status.OK, twin


def test_triton_home_decides_the_default(tmp_path, run_one):
    env = {"TRITON_HOME": str(tmp_path / "th")}
    found = run_one("cache.triton-dir", make(tmp_path, env, fake_root(tmp_path),
                                             triton_prefix(tmp_path)))
    assert found.status == Status.OK
    assert f"Triton cache: {tmp_path / 'th' / '.triton' / 'cache'} (TRITON_HOME)" in \
        found.evidence[0]


def test_triton_cache_made_by_another_user_warns(tmp_path, run_one):
    # a TRITON_CACHE_DIR=/tmp/triton set by a shared module
    with folder_of_another_user("triton") as cache:
        found = run_one("cache.triton-dir", make(tmp_path, {"TRITON_CACHE_DIR": str(cache)},
                                                 fake_root(tmp_path), triton_prefix(tmp_path)))
        assert found.status == Status.WARN and "belongs to uid 65534" in found.summary, found
        assert third_user_cannot_write(["touch", str(cache / "k.lock")])


def test_read_only_triton_cache_fails_then_fix_passes(tmp_path):
    needs_namespace()
    cache, fixed = tmp_path / "triton", tmp_path / "node-local"
    cache.mkdir()
    fixed.mkdir()
    prefix = triton_prefix(tmp_path)
    script = READ_ONLY + 'read_only "$CACHE"\n' \
        '"$PY" -m dsenv doctor --only cache --skip $SKIP --env "$PREFIX" --json || true\n' \
        'echo ---\n' \
        'TRITON_CACHE_DIR=$FIXED "$PY" -m dsenv doctor --only cache --skip $SKIP ' \
        '--env "$PREFIX" --json'
    done = in_namespace(script, env={"CACHE": str(cache), "FIXED": str(fixed),
                                     "TRITON_CACHE_DIR": str(cache), "PREFIX": str(prefix),
                                     "SKIP": CACHE_OTHERS + ",cache.flock,cache.miopen-db"})
    broken_out, fixed_out = done.stdout.split("---\n")
    broken = result(doctor_json(subprocess.CompletedProcess((), 0, broken_out, "")),
                    "cache.triton-dir")
    assert broken["status"] == "fail" and "cannot be written" in broken["summary"], broken
    again = result(doctor_json(subprocess.CompletedProcess((), 0, fixed_out, "")),
                   "cache.triton-dir")
    assert again["status"] == "ok", again


def test_triton_not_installed_skips(tmp_path, run_one):
    bare = tmp_path / "bare" / "lib" / "python3.11" / "site-packages"
    bare.mkdir(parents=True)
    found = run_one("cache.triton-dir", make(tmp_path, prefix=tmp_path / "bare"))
    assert found.status == Status.SKIP


# -- cache.miopen-db --------------------------------------------------------------------------


def test_miopen_skips_without_rocm(tmp_path, run_one):
    found = run_one("cache.miopen-db", make(tmp_path, root=fake_root(tmp_path)))
    assert found.status == Status.SKIP and "/dev/kfd" in found.summary


def test_miopen_in_an_nfs_home_warns_local_is_ok(tmp_path, run_one):
    home = tmp_path / "home"
    home.mkdir()
    root = fake_root(tmp_path, f"40 27 0:40 / {home} rw - nfs4 srv:/home rw", kfd=True)
    found = run_one("cache.miopen-db", make(tmp_path, root=root))
    assert found.status == Status.WARN and "MIOpen user database" in found.summary, found
    assert f"{home}/.config/miopen (default, MIOPEN_USER_DB_PATH unset)" in found.evidence[0]
    assert here(found).startswith("export MIOPEN_USER_DB_PATH=/tmp/$USER/miopen ")
    twin = run_one("cache.miopen-db", make(tmp_path, root=fake_root(tmp_path, kfd=True)))
    assert twin.status == Status.OK, twin


def test_miopen_db_where_posix_locks_fail(tmp_path):
    needs_fuse()
    root = fake_root(tmp_path, kfd=True)
    db = tmp_path / "mnt" / "db"
    script = FUSE_MOUNT + """
fuse_mount "$MNT" enosys
mkdir "$DB"
cat /proc/self/mountinfo > "$ROOT/proc/self/mountinfo"
"$PY" -m dsenv doctor --only cache --skip $SKIP --root "$ROOT" --json || true
echo ---
"$PY" -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('create table t (x)')" \
    "$DB/kernels.db" 2>&1 || true
"""
    done = in_namespace(script, env={"MNT": str(tmp_path / "mnt"), "DB": str(db),
                                     "ROOT": str(root), "MIOPEN_USER_DB_PATH": str(db),
                                     "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / "kernels"),
                                     "SKIP": CACHE_OTHERS + ",cache.flock,cache.triton-dir"})
    report, sqlite = done.stdout.split("---\n")
    found = result(doctor_json(subprocess.CompletedProcess((), 0, report, "")),
                   "cache.miopen-db")
    assert "sqlite3.OperationalError" in sqlite, sqlite  # SQLite itself cannot work there
    assert found["status"] == "fail" and "POSIX locks fail" in found["summary"], found
    assert "[Errno 38]" in found["summary"]


# -- a file server that stopped answering ------------------------------------------------------

# The probe deadline the hung-mount runs give the doctor (its default is 10 s): each run waits
# about one deadline for the mount that gave no answer, and the verdicts do not depend on its
# length (the slowest probe of a healthy run here takes under 2 s).
DEADLINE = "4"
HUNG_RUN = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
unset $UNSET
timeout -s KILL 60 "$PY" -m dsenv doctor --probe-timeout "$DEADLINE" $ONLY --skip $SKIP --json > "$OUT" || true
"""


def _hung_run(tmp_path, mode: str, only: str = "--only cache", **env) -> tuple[dict, float]:
    """The cache checks (``only``) with HF_HOME (and ``env``'s folders) on a FUSE mount that
    never answers ``mode``'s requests (tests/harness/fusefs.py): (the report's results by id,
    seconds the doctor took)."""
    needs_fuse()
    out = tmp_path / "report.json"
    start = time.monotonic()
    done = in_namespace(HUNG_RUN, timeout=120, env={
        "MNT": str(tmp_path / "mnt"), "MODE": mode, "OUT": str(out), "SKIP": "cache.assets",
        "DEADLINE": DEADLINE,
        "HF_HOME": str(tmp_path / "mnt" / "hf"), "HOME": str(tmp_path / "home"), "ONLY": only,
        "UNSET": " ".join(name for name in ("TORCH_EXTENSIONS_DIR",) if name not in env),
        **{name: str(tmp_path / "mnt" / value) for name, value in env.items()}})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    report = doctor_json(subprocess.CompletedProcess((), 0, out.read_text(), ""))
    return {r["id"]: r for r in report["results"]}, seconds


def test_a_lock_manager_that_stopped_answering_warns_and_the_doctor_exits(tmp_path):
    """flock() on the mount never returns (LOCK_NB or not: the kernel waits for the server).
    The write-and-lock test runs in a child with the probe deadline (10 s): the doctor says the
    file system stopped answering, in each check that writes there, once per mount, and exits
    (a thread blocked there kept the first version from exiting at all: `timeout -s KILL`
    ended it), and no check calls it a permission problem."""
    found, seconds = _hung_run(tmp_path, "locks-hang")
    for check in ("cache.flock", "cache.hf-dirs", "cache.hf-repos"):
        assert found[check]["status"] == "warn", found[check]
        assert "gave no answer" in found[check]["summary"], found[check]
        assert "PermissionError" not in found[check]["summary"]
    assert found["cache.hf-repos"]["fix"].startswith("use a hub cache on a node-local disk")
    assert any("not tried: a test under" in e for e in found["cache.flock"]["evidence"])
    assert seconds < 20, seconds  # one deadline for the mount, not one per folder


def test_statfs_that_never_answers_leaves_writes_judged_and_room_unread(tmp_path):
    found, seconds = _hung_run(tmp_path, "statfs-hangs")
    dirs = found["cache.hf-dirs"]
    assert dirs["status"] == "ok" and dirs["summary"].endswith(
        "(free space not read: `stat -f` gave no answer)"), dirs
    assert found["cache.flock"]["status"] == "ok" and seconds < 40, (found["cache.flock"], seconds)


# Every folder of the job on one mount: HOME stays local (Python itself stats the user's
# site-packages there before any of dsenv runs, so a dead HOME hangs every Python program).
# XDG_CACHE_HOME holds dsenv's own cache and torch's default extensions folder.
JOB_FOLDERS = {"TMPDIR": "tmp", "XDG_CACHE_HOME": "cache", "NCCL_CONF_FILE": "nccl.conf"}


def test_a_file_server_that_answers_nothing_is_named_and_the_doctor_exits(tmp_path):
    """Nothing but the mount's INIT is answered: even a stat of the mount point blocks. Every
    touch of a folder there is first tried in a child (mounts.answers, lockprobe): the whole
    doctor exits after one deadline (the first version stayed blocked in the hub cache's
    scandir and a realpath, killed at 60 s), and each check that needs the folder says the
    file system gave no answer (the job hangs there too) or skips with that reason; none
    passes on what it could not read."""
    found, seconds = _hung_run(tmp_path, "all-hang", only="", **JOB_FOLDERS)
    assert seconds < 40, seconds
    for check in ("cache.flock", "cache.hf-dirs", "cache.hf-repos", "system.tmpdir",
                  "deepspeed.extensions-dir", "comm.nccl-env"):
        assert found[check]["status"] == "warn", found[check]
        assert "gave no answer" in found[check]["summary"], found[check]
    assert found["system.tmpdir"]["fix"].startswith("export TMPDIR=")
    assert "(no answer: not read)" in " ".join(found["comm.nccl-env"]["evidence"])
    for check in ("deepspeed.extension-locks", "deepspeed.async-io"):
        assert found[check]["status"] == "skip" and "no answer" in found[check]["summary"], \
            found[check]
    assert "not read: its file system gave no answer" in " ".join(
        found["deepspeed.ops"]["evidence"])
    assert not [r for r in found.values() if r["status"] == "error"], \
        [r for r in found.values() if r["status"] == "error"]


def test_the_same_folders_on_a_mount_that_answers_are_read(tmp_path):
    found, seconds = _hung_run(tmp_path, "local", only="", **JOB_FOLDERS)
    assert not any("no answer" in r["summary"] for r in found.values()), \
        [r for r in found.values() if "no answer" in r["summary"]]
    assert found["comm.nccl-env"]["status"] == "ok", found["comm.nccl-env"]
    assert found["deepspeed.extensions-dir"]["status"] in ("ok", "warn")
    # read there: it does not exist on the fresh mount, so tempfile passes it over, as here
    assert f"TMPDIR={tmp_path / 'mnt' / 'tmp'}: not a folder, so tempfile skips it" in \
        found["system.tmpdir"]["evidence"], found["system.tmpdir"]
    assert seconds < 40, seconds


# A Lustre whose one storage target (OST) is down: folders and listings answer, files that
# existed when it went down do not (tests/harness/fusefs.py files-hang: creating .ost-down
# takes them down). The JIT folder holds an op's .so and a build lock, the hub cache a lock,
# NCCL's file a line.
OST_RUN = FUSE_MOUNT + """
fuse_mount "$MNT" files-hang
mkdir -p "$MNT/ext/cpu_adam" "$MNT/ext/fused_adam" "$MNT/hf/hub/.locks/models--org--m" \\
         "$MNT/hf/hub/models--org--m/blobs"
echo so > "$MNT/ext/fused_adam/fused_adam.so"; echo l > "$MNT/ext/cpu_adam/lock"
echo l > "$MNT/hf/hub/.locks/models--org--m/abc.lock"
echo b > "$MNT/hf/hub/models--org--m/blobs/abc"
echo NCCL_SOCKET_IFNAME=lo > "$MNT/nccl.conf"
[ "$DOWN" = 0 ] || touch "$MNT/.ost-down"
timeout -s KILL 60 "$PY" -m dsenv doctor --probe-timeout "$DEADLINE" --skip cache.assets --json > "$OUT" || true
"""
OST_CHECKS = ("deepspeed.extensions-dir", "deepspeed.extension-locks", "deepspeed.ops",
              "torch.extension-symbols", "comm.socket-ifname", "comm.nccl-env", "cache.hf-repos")


def _ost_run(tmp_path, down: bool) -> tuple[dict, float]:
    needs_fuse()
    mnt, out = tmp_path / "mnt", tmp_path / "report.json"
    start = time.monotonic()
    done = in_namespace(OST_RUN, timeout=120, env={
        "MNT": str(mnt), "OUT": str(out), "DOWN": "1" if down else "0", "DEADLINE": DEADLINE,
        "HOME": str(tmp_path / "home"), "HF_HOME": str(mnt / "hf"),
        "TORCH_EXTENSIONS_DIR": str(mnt / "ext"), "NCCL_CONF_FILE": str(mnt / "nccl.conf"),
        "XDG_CACHE_HOME": str(mnt / "cache")})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    report = doctor_json(subprocess.CompletedProcess((), 0, out.read_text(), ""))
    return {r["id"]: r for r in report["results"]}, seconds


def test_files_that_stopped_answering_on_a_mount_that_answers_are_named(tmp_path):
    """The mount and its folders answer, the files in them do not: each folder's files are
    statted in a child before this process reads them (mounts.files_answer), so the doctor
    exits after one deadline (the first version blocked in the JIT lock scan, the hub's lock
    files and NCCL's file, and never exited: killed at 80 s with 9 checks unfinished), and
    each check that needed them says so: none passes on what it could not read."""
    found, seconds = _ost_run(tmp_path, down=True)
    assert seconds < 40, seconds
    assert not [r for r in found.values() if r["status"] == "error"], \
        [r for r in found.values() if r["status"] == "error"]
    for check in ("deepspeed.extensions-dir", "cache.hf-repos"):
        assert found[check]["status"] == "warn", found[check]
        assert "gave no answer to a stat while the folder did" in found[check]["summary"]
    assert found["comm.nccl-env"]["status"] == "warn"
    assert "gave no answer" in found["comm.nccl-env"]["summary"]
    assert found["comm.socket-ifname"]["status"] != "ok", found["comm.socket-ifname"]
    assert found["deepspeed.extension-locks"]["status"] == "skip"
    assert "not read" in " ".join(found["deepspeed.ops"]["evidence"])
    assert "not read: the JIT builds" in " ".join(found["torch.extension-symbols"]["evidence"])


def test_the_same_files_on_a_mount_whose_files_answer_are_read(tmp_path):
    found, seconds = _ost_run(tmp_path, down=False)
    unread = [r["id"] for r in found.values()
              if "no answer" in r["summary"] + " ".join(r["evidence"])]
    assert not unread, unread
    assert "held by no process" in found["deepspeed.extension-locks"]["summary"]
    assert found["cache.hf-repos"]["status"] == "ok", found["cache.hf-repos"]
    assert "JIT-compiled earlier" in found["deepspeed.ops"]["summary"] or \
        "fused_adam" not in found["deepspeed.ops"]["summary"], found["deepspeed.ops"]
    socket = found["comm.socket-ifname"]
    assert "nccl.conf" in socket["summary"] + " ".join(socket["evidence"]), socket
    assert seconds < 40, seconds

"""PATH and LD_LIBRARY_PATH folders, a toolkit root, a ds_config and a hostfile on a file
server that stopped answering (system.path, Node.searchable_path, toolkit.home_binary,
mounts.require_files).

A command is looked up by a stat of each PATH folder's entry. With a module's bin folder on a
mount whose files stopped answering (tests/harness/fusefs.py files-hang: a Lustre storage
target down; the same for a hard-mounted NFS server that went away), that stat blocks in the
kernel, where no deadline reaches: the first version of the doctor stayed blocked looking up
nvcc until `timeout -s KILL` ended it at 60 s, with no report (on a mount that answers nothing
at all, not even SIGKILL ended it: the test's own limit did, by unmounting).
"""

from __future__ import annotations

import json
import time

from dsenv.facts.node import Node
from tests.harness.mountns import FUSE_MOUNT, in_namespace, needs_fuse

DEAD_BIN = FUSE_MOUNT + """
fuse_mount "$MNT" files-hang
mkdir -p "$MNT/apps/cuda/bin" "$MNT/apps/cuda/lib64"
echo ELF > "$MNT/apps/cuda/lib64/libcudart.so.12"
printf '#!/bin/sh\\necho "Cuda compilation tools, release 12.4, V12.4.131"\\n' > "$MNT/apps/cuda/bin/nvcc"
chmod +x "$MNT/apps/cuda/bin/nvcc"
[ "$DOWN" = 0 ] || touch "$MNT/.ost-down"
export PATH="$MNT/apps/cuda/bin:$PATH" CUDA_HOME="$MNT/apps/cuda" LD_LIBRARY_PATH="$MNT/apps/cuda/lib64"
timeout -s KILL 60 "$PY" -m dsenv doctor --only system,toolkit --probe-timeout 2 --json > "$OUT" || true
echo "$LOG" | timeout -s KILL 60 "$PY" -m dsenv explain --here --probe-timeout 2 - > "$OUT.explain" || true
"""
# The kernel's line when an NFS server stops answering (TIGRLab/admin#525, in syslog there).
LOG = ("May  3 09:30:47 backup kernel: [74505.779405] nfs: server rprshnas01.camh.ca not "
       "responding, still trying")


def _run(tmp_path, down: bool) -> tuple[dict, float]:
    needs_fuse()
    out = tmp_path / "report.json"
    start = time.monotonic()
    done = in_namespace(DEAD_BIN, timeout=100, env={
        "MNT": str(tmp_path / "mnt"), "OUT": str(out), "DOWN": "1" if down else "0", "LOG": LOG,
        "HOME": str(tmp_path / "home")})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}, seconds


def test_a_path_folder_that_stopped_answering_is_named_and_the_doctor_exits(tmp_path):
    found, seconds = _run(tmp_path, down=True)
    assert seconds < 40, seconds
    bindir = tmp_path / "mnt" / "apps" / "cuda" / "bin"
    path = found["system.path"]
    assert path["status"] == "warn", path  # a login node; on a compute node it fails
    assert path["summary"].startswith(
        f"PATH folder {bindir} and LD_LIBRARY_PATH folder {bindir.parent / 'lib64'} gave no "
        "answer"), path["summary"]
    assert "the job's dynamic loader hangs" in path["summary"]
    assert "which server the kernel names" in path["fix"]  # the catalogue mode's fix
    assert path["mode"] == "system.file-server-not-answering"
    assert any(e.startswith("here: meanwhile take the folder off the path (`module unload`")
               for e in path["evidence"]), path["evidence"]
    assert path["evidence"][0].startswith(f"PATH {bindir}: on fuse.dsenvtest (FUSE file system")
    assert path["evidence"][0].endswith("gave no answer")
    # CUDA_HOME there: the toolkit's bin folder is statted in a child first (toolkit.home_binary)
    nvcc = found["toolkit.nvcc"]
    assert nvcc["status"] == "warn", nvcc
    assert nvcc["summary"].startswith(f"not judged: the toolkit (CUDA_HOME) {bindir} gave no "
                                      "answer to a stat"), nvcc["summary"]
    assert not [r["id"] for r in found.values() if r["status"] == "error"]
    # explain --here on the kernel's NFS line runs system.path here: the cause is present
    explained = " ".join((tmp_path / "report.json.explain").read_text().split())
    assert explained.startswith("system.file-server-not-answering:"), explained
    assert "on this node system.path finds: WARN PATH folder" in explained, explained
    assert "the cause is present here (the doctor warns of it)" in explained, explained


def test_the_same_folder_that_answers_is_searched(tmp_path):
    found, seconds = _run(tmp_path, down=False)
    path = found["system.path"]
    assert path["status"] == "ok", path
    assert path["summary"].startswith("2 of "), path["summary"]
    nvcc = found["toolkit.nvcc"]
    assert "12.4" in nvcc["summary"] + " ".join(nvcc["evidence"]), nvcc
    explained = " ".join((tmp_path / "report.json.explain").read_text().split())
    assert "on this node system.path finds: OK 2 of " in explained, explained
    assert "not found here" in explained, explained
    assert seconds < 40, seconds


def test_an_empty_or_local_path_has_nothing_to_hang(make_ctx, run_one, tmp_path):
    empty = run_one("system.path", make_ctx(env={"PATH": ""}, root="/"))
    assert empty.status.value == "skip" and "LD_LIBRARY_PATH are empty" in empty.summary
    env = {"PATH": str(tmp_path), "LD_LIBRARY_PATH": str(tmp_path / "lib")}
    local = run_one("system.path", make_ctx(env=env, root="/"))
    assert local.status.value == "skip", local
    assert "every PATH and LD_LIBRARY_PATH folder is on a local file system" in local.summary
    node = Node(env=env)
    assert node.searchable_path() == str(tmp_path)
    assert node.library_path() == [str(tmp_path / "lib")]


# The files a job names: its ds_config (--deepspeed-config, statted before any check ran, in
# the doctor's main thread) and the runner's hostfile, on the same dead mount.
JOB_FILES = FUSE_MOUNT + """
fuse_mount "$MNT" files-hang
echo '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}' > "$MNT/ds.json"
echo "localhost slots=8" > "$MNT/hostfile"
[ "$DOWN" = 0 ] || touch "$MNT/.ost-down"
export DSENV_HOSTFILE="$MNT/hostfile"
timeout -s KILL 60 "$PY" -m dsenv doctor --only job,launch --launcher deepspeed --deepspeed-config "$MNT/ds.json" --probe-timeout 2 --json > "$OUT" || true
"""


def _job_files(tmp_path, down: bool) -> tuple[dict, float]:
    needs_fuse()
    out = tmp_path / "report.json"
    start = time.monotonic()
    done = in_namespace(JOB_FILES, timeout=100, env={
        "MNT": str(tmp_path / "mnt"), "OUT": str(out), "DOWN": "1" if down else "0",
        "HOME": str(tmp_path / "home")})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}, seconds


def test_a_config_and_hostfile_that_stopped_answering_are_not_judged(tmp_path):
    """Before, the doctor's usage check statted the ds_config in its main thread and blocked
    there (no check ran, no report); the config and the hostfile are now statted in a child
    first, and the checks that read them say so."""
    found, seconds = _job_files(tmp_path, down=True)
    assert seconds < 40, seconds
    mnt = tmp_path / "mnt"
    for check, what in (("job.ds-config", f"the DeepSpeed config {mnt / 'ds.json'}"),
                        ("job.batch-size", f"the DeepSpeed config {mnt / 'ds.json'}"),
                        ("launch.ds-hostfile", f"the hostfile {mnt / 'hostfile'}")):
        assert found[check]["status"] == "warn", found[check]
        assert found[check]["summary"].startswith(f"not judged: {what} gave no answer"), \
            found[check]["summary"]
    assert not [r["id"] for r in found.values() if r["status"] in ("error", "ok")]


def test_the_same_config_and_hostfile_that_answer_are_read(tmp_path):
    found, seconds = _job_files(tmp_path, down=False)
    assert found["job.ds-config"]["status"] == "ok", found["job.ds-config"]
    assert not [r["id"] for r in found.values() if "not judged" in r["summary"]]
    assert seconds < 40, seconds


def test_every_search_path_has_its_meaning():
    """system.path says what a folder that gave no answer means for each search path the node
    walks (dsenv.facts.node.SEARCH_PATHS): one table each, kept in step."""
    from dsenv.doctor.checks.node.system import UNANSWERED_MEANS
    from dsenv.facts.node import SEARCH_PATHS

    assert set(UNANSWERED_MEANS) == set(SEARCH_PATHS)

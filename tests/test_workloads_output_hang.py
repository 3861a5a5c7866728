"""A run's output folder on a file server that stopped answering (workloads/cli.py
answering_output_dir, workloads/fetch/command.py, mounts.unanswered).

The run's first touch of its output folder (resolving it, making it, taking its lock) is a stat
that blocks in the kernel when the folder's file server stopped answering, where no deadline
reaches: `dsenv smoke` hung there before printing anything. A stat in a child with the probe
deadline goes first; no answer ends the run in one line naming the folder and its mount.
tests/harness/fusefs.py's ``all-hang`` mount answers nothing after it is mounted (a server
gone with the mount still in place); ``local`` is the same FUSE mount answering (the twin).
"""

from __future__ import annotations

import time

import pytest

from tests.harness.hubserver import SECRET, HubServer, bert_squad_repos, hub_env
from tests.harness.mountns import FUSE_MOUNT, in_namespace, needs_fuse

SMOKE = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
set +e
timeout -s KILL 90 "$PY" -m dsenv smoke bert-squad --output-dir "$MNT/out" --probe-timeout 2 \\
    > "$OUT" 2>&1
echo "exit $?" >> "$OUT"
"""

# The same check alone, with an answering mount too (a whole smoke on the in-memory FUSE file
# system is more than it implements).
CHECK = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
timeout -s KILL 60 "$PY" -c '
import sys
from dsenv.workloads.cli import answering_output_dir
from dsenv.workloads.errors import WorkloadError
try:
    print("answered", answering_output_dir(sys.argv[1], 2))
except WorkloadError as exc:
    print("refused", exc)
' "$MNT/out" > "$OUT" 2>&1 || echo "exit $?" >> "$OUT"
"""


def _run(tmp_path, script: str, mode: str) -> tuple[str, float]:
    needs_fuse()
    out = tmp_path / "out.txt"
    start = time.monotonic()
    done = in_namespace(script, timeout=150, env={
        "MNT": str(tmp_path / "mnt"), "MODE": mode, "OUT": str(out),
        "HOME": str(tmp_path / "home")})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_text(), seconds


def test_a_smoke_whose_output_folder_stopped_answering_ends_in_one_line(tmp_path):
    output, seconds = _run(tmp_path, SMOKE, "all-hang")
    assert seconds < 60, (seconds, output)  # the probe deadline (2 s), not the kill at 90 s
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1] == "exit 2", output
    assert lines[0].startswith("environment "), output  # which interpreter runs it, first
    said = " ".join(lines[1:-1])
    assert said.startswith(f"dsenv smoke bert-squad: the output folder (--output-dir) "
                           f"{tmp_path / 'mnt' / 'out'} gave no answer to a stat within 2 s "
                           f"(fuse.dsenvtest on {tmp_path / 'mnt'})"), said
    assert "pass an --output-dir on a file system that answers" in said
    assert "Traceback" not in output


def test_the_same_folder_answering_is_taken(tmp_path):
    output, _ = _run(tmp_path, CHECK, "local")
    assert output.strip() == f"answered {tmp_path / 'mnt' / 'out'}", output


def test_the_check_alone_refuses_the_folder_that_stopped_answering(tmp_path):
    output, seconds = _run(tmp_path, CHECK, "all-hang")
    assert seconds < 45, (seconds, output)
    assert output.startswith(f"refused the output folder (--output-dir) {tmp_path / 'mnt'}"
                             f"/out gave no answer to a stat within 2 s"), output


def test_a_local_output_folder_needs_no_probe(tmp_path, monkeypatch):
    """A local disk cannot stop answering the way a file server does: no child is started."""
    from dsenv.facts.node import Node
    from dsenv.workloads import cli

    ran = []
    monkeypatch.setattr(Node, "run", lambda self, *a, **k: ran.append(a))
    assert cli.answering_output_dir(str(tmp_path / "out")) == str(tmp_path / "out")
    assert ran == []


LAUNCH = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
set +e
timeout -s KILL 90 "$PY" -m dsenv launch bert-squad --nodes 1 --launcher srun --cpu \\
    --out "$JOB" --output-dir "$MNT/out" --probe-timeout 2 > "$OUT" 2>&1
echo "exit $?" >> "$OUT"
"""


def _launch(tmp_path, mode: str) -> tuple[str, float]:
    needs_fuse()
    out, job = tmp_path / "out.txt", tmp_path / "job.sbatch"
    start = time.monotonic()
    done = in_namespace(LAUNCH, timeout=150, env={
        "MNT": str(tmp_path / "mnt"), "MODE": mode, "OUT": str(out), "JOB": str(job),
        "HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert job.is_file(), out.read_text()  # the script is written either way
    return " ".join(out.read_text().split()), time.monotonic() - start


def test_launch_warns_of_an_output_folder_that_stopped_answering_and_does_not_hang(tmp_path):
    """`dsenv launch` judged node-local paths by resolving them: it hung until killed."""
    said, seconds = _launch(tmp_path, "all-hang")
    assert seconds < 60, (seconds, said)
    assert said.endswith("exit 0"), said
    assert (f"dsenv launch: warning: output dir {tmp_path / 'mnt' / 'out'} gave no answer to "
            f"a stat within 2 s (fuse.dsenvtest on {tmp_path / 'mnt'}): its file server is "
            f"not answering; a job touching it hangs there too: ask the site about the mount, "
            f"or choose another with --output-dir") in said, said


def test_launch_with_the_same_folder_answering_says_nothing_of_it(tmp_path):
    said, _ = _launch(tmp_path, "local")
    assert said.endswith("exit 0") and "no answer to a stat" not in said, said
    assert f"output dir {tmp_path / 'mnt' / 'out'} (under /tmp)" in said  # still node-local



FETCH = FUSE_MOUNT + """
fuse_mount "$MNT" "$MODE"
set +e
HF_HOME="$MNT/hf" timeout -s KILL 90 "$PY" -m dsenv fetch bert-squad --probe-timeout 2 > "$OUT" 2>&1
echo "exit $?" >> "$OUT"
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The test Hub on 127.0.0.1 (tests/harness/hubserver.py): a fetch that gets past the
    cache check downloads, and writes into the cache."""
    with HubServer(bert_squad_repos(tmp_path_factory.mktemp("hub-content"))) as server:
        yield server


def _fetch(tmp_path, hub, mode: str) -> tuple[str, float]:
    needs_fuse()
    out = tmp_path / "out.txt"
    hub.reset()
    start = time.monotonic()
    # in_namespace lays this over the test process's environment (HF_HUB_OFFLINE=1 there)
    env = hub_env(tmp_path / "unused", hub.url, MNT=str(tmp_path / "mnt"), MODE=mode,
                  OUT=str(out), HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="0")
    done = in_namespace(FETCH, timeout=150, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    output = out.read_text()
    assert SECRET not in output and "Traceback" not in output, output
    return output, time.monotonic() - start


def test_fetch_into_a_cache_that_stopped_answering_ends_in_one_line(tmp_path, hub):
    """Before, the fetch downloaded from the Hub and blocked on its first write there."""
    output, seconds = _fetch(tmp_path, hub, "all-hang")
    assert seconds < 60, (seconds, output)
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1] == "exit 2" and len(lines) == 2, output
    assert lines[0] == (f"dsenv fetch: the hub cache {tmp_path / 'mnt' / 'hf' / 'hub'} gave no "
                        f"answer to a stat within 2 s (fuse.dsenvtest on {tmp_path / 'mnt'}): "
                        "its file server is not answering; choose a cache on a file system "
                        "that answers (--cache-dir, HF_HOME) and ask the site about the mount")
    assert hub.requests == []  # nothing downloaded that could not be kept


def test_fetch_into_the_same_cache_answering_goes_on_to_the_hub(tmp_path, hub):
    output, _ = _fetch(tmp_path, hub, "local")
    assert "gave no answer to a stat" not in output, output
    assert hub.requests, output  # past the check, it asked the Hub

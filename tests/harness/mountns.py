"""Run a shell script in a private mount namespace (``unshare -m``, as root): what it mounts
(a read-only bind, a tmpfs, a FUSE file system from tests/harness/fusefs.py) exists only for it
and the processes it starts, and is gone when they end. And act as another user: folders made
by one (:func:`folder_of_another_user`), a function of this process run as one (:func:`as_user`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

FUSEFS = Path(__file__).with_name("fusefs.py")
REPO = Path(__file__).resolve().parents[2]


@functools.cache
def namespace_problem() -> str | None:
    """None when ``unshare -m`` and mount work here, else why not."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces)"
    if shutil.which("unshare") is None:
        return "no unshare"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec",
                            'd=$(mktemp -d); mount -t tmpfs none "$d"; umount "$d"; rmdir "$d"'],
                           capture_output=True, text=True,
                           timeout=30)
    return None if probe.returncode == 0 else f"unshare -m: {probe.stderr.strip()}"


def needs_namespace():
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)


@functools.cache
def fuse_problem() -> str | None:
    """None when tests/harness/fusefs.py can mount and serve here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    with tempfile.TemporaryDirectory() as folder:
        probe = in_namespace(FUSE_MOUNT + 'fuse_mount "$D/m" local\nls "$D/m"\n',
                             env={"D": folder}, timeout=60)
    return None if probe.returncode == 0 else f"FUSE mount: {probe.stderr.strip()[-200:]}"


def needs_fuse():
    needs_namespace()
    problem = fuse_problem()
    if problem:
        pytest.skip(problem)


def in_namespace(script: str, env: dict | None = None, timeout: float = 240,
                 unshare: tuple[str, ...] = ("-m", "--propagation", "private")
                 ) -> subprocess.CompletedProcess:
    """Run ``script`` with sh in new namespaces (``unshare``'s flags: a mount namespace unless
    told otherwise, ``("-n",)`` a network one); $PY is this interpreter and $FUSEFS the FUSE
    server. Everything it started is killed if it runs past ``timeout``."""
    full_env = {**os.environ, **(env or {}), "PY": sys.executable, "FUSEFS": str(FUSEFS)}
    proc = subprocess.Popen(["unshare", *unshare, "sh", "-ec", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"namespace script ran past {timeout} s:\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# Shell snippets: mount a FUSE file system whose locks fail ($1: mount point, $2: mode) and
# wait until it serves; stop it on exit.
FUSE_MOUNT = """
fuse_mount() {
    FUSE_DIR=$1
    mkdir -p "$FUSE_DIR"
    "$PY" "$FUSEFS" "$FUSE_DIR" "$2" > "$FUSE_DIR.ready" 2> "$FUSE_DIR.log" &
    FUSE_PID=$!
    # both may fail harmlessly (the server exits once its mount is gone): never the script's
    # exit status, which a failed last command of an EXIT trap can become (seen once in CI)
    trap 'umount -l "$FUSE_DIR" 2>/dev/null || true; kill $FUSE_PID 2>/dev/null || true' EXIT
    i=0
    until grep -q ready "$FUSE_DIR.ready" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 200 ] || { cat "$FUSE_DIR.log" >&2; exit 3; }; sleep 0.05
    done
}
"""

READ_ONLY = """
read_only() { mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; }
"""


def doctor_json(done: subprocess.CompletedProcess) -> dict:
    """The JSON report a namespace script printed last (the doctor's --json output)."""
    assert "Traceback" not in done.stderr, done.stderr
    start = done.stdout.find("{")
    assert start >= 0, done.stdout + done.stderr
    return json.loads(done.stdout[start:])


def result(report: dict, check_id: str) -> dict:
    return next(r for r in report["results"] if r["id"] == check_id)


@contextlib.contextmanager
def folder_of_another_user(name: str):
    """``/tmp/dsenv-shared-XXXX/NAME`` made by user ``nobody`` (mode 755) inside a sticky,
    world-writable folder like /tmp: a cache a shared module or another user created.
    Needs root and runuser (skips otherwise); removed afterwards."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to create a folder as another user")
    shared = Path(tempfile.mkdtemp(prefix="dsenv-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        folder = shared / name
        subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", "-m", "755", str(folder)],
                       check=True, timeout=30)
        yield folder
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def third_user_cannot_write(argv: list[str]) -> bool:
    """Whether user ``daemon`` is refused ``argv`` (mkdir/touch in another user's folder)."""
    done = subprocess.run(["runuser", "-u", "daemon", "--", *argv], capture_output=True,
                          text=True, timeout=30)
    return done.returncode != 0 and "Permission denied" in done.stderr


# -- a function of this process as another user, for real (fork, then setgid/setuid) ----------
# The interpreter lives under /root (mode 700 here), so another user cannot start it; a forked
# child needs no file of it: it keeps every module the parent imported. So import (and run
# once, as root) whatever the function uses before calling as_user: a module the child imports
# for the first time fails with PermissionError.

T = TypeVar("T")


def needs_root_and(*users: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"no user {user!r} on this machine")


def as_user(user: str, func: Callable[[], T], umask: int = 0o022, timeout: int = 120) -> T:
    """``func()`` in a child running as ``user`` (its primary group, no others) with
    ``umask``; its return value (picklable) comes back, its exception is raised here. A child
    still running after ``timeout`` seconds is killed (SIGALRM) and the call fails."""
    entry = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            signal.alarm(timeout)
            os.close(read_end)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.umask(umask)
            try:
                payload = ("ok", func())
            except BaseException as exc:  # handed to the parent, raised there
                payload = ("raised", (type(exc).__name__, str(exc), traceback.format_exc()))
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(payload, out)
        except BaseException:
            status = 3
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    late = f", killed after {timeout} s" if code == -signal.SIGALRM else ""
    assert code == 0 and data, f"the child as {user} died (exit {code}{late})"
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise ChildRaised(*value)
    return value


class ChildRaised(Exception):
    """What the function raised in the child: the exception's type name, message, traceback."""

    def __init__(self, kind: str, message: str, trace: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.trace = kind, message, trace

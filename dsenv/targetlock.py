"""One dsenv run at a time per folder or file it builds: an exclusive lock beside the target.

``.NAME.lock`` next to ``NAME`` is locked with flock(2) for the whole run, so the kernel
releases it when the process dies however it dies (SIGKILL included), and Linux NFS clients
turn it into a POSIX lock the server sees. The holder removes the file as it releases it
(a killed holder leaves it, empty of meaning: the next run locks it and carries on). The file holds who owns it (pid, host, since,
command) so a second run can say whom it waits for. What a dead run left beside the target
(its staging folder, its log) may be cleared by whoever holds the lock next: a live run
always holds the lock while it has files there.

    with hold(prefix, "dsenv provision", wait=600, on_wait=print) as lock:
        ...  # only this process builds prefix now
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dsenv.argtypes import non_negative_float
from dsenv.errors import DsenvError

POLL_SECONDS = 0.2
# A holder takes the lock, then writes who it is (over a record a killed run may have left): a
# run that finds the lock in between asks again for this long before it says it waits for
# "another dsenv run".
OWNER_GRACE_SECONDS = 2.0


class TargetBusy(DsenvError):
    """Another run holds the target's lock and we may not (or no longer) wait. Exit 75,
    sysexits' EX_TEMPFAIL: the same command can succeed later (array jobs may retry)."""

    exit_code = 75


_HELD: dict[Path, TargetLock] = {}  # the locks this process holds, by lock file


def held_here(target: str | os.PathLike) -> bool:
    """Whether this process already holds the target's lock."""
    return lock_path(target).absolute() in _HELD


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    since: str  # ISO 8601, UTC
    command: str

    def describe(self) -> str:
        return f"{self.command} (pid {self.pid} on {self.host}, since {self.since})"


def lock_path(target: str | os.PathLike) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


def read_owner(target: str | os.PathLike) -> Owner | None:
    """Who wrote the lock file last (the holder while it is held); None when unreadable."""
    try:
        data = json.loads(lock_path(target).read_text(encoding="utf-8"))
        return Owner(int(data["pid"]), str(data["host"]), str(data["since"]),
                     str(data.get("command", "dsenv")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive_here(owner: Owner) -> bool:
    """False only for a holder on this host whose process is gone: a record a killed run
    left, which the next holder has not overwritten yet."""
    if owner.host != socket.gethostname():
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_owner(target: str | os.PathLike) -> Owner | None:
    """The holder while the lock is held: the written record, unless it is a dead run's."""
    owner = read_owner(target)
    return owner if owner is not None and _alive_here(owner) else None


def is_held(target: str | os.PathLike) -> bool:
    """Whether some process (this one included) holds the target's lock right now."""
    path = lock_path(target)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops the probe's own shared lock
    return False


class TargetLock:
    """The exclusive lock on one target; see the module docstring."""

    def __init__(self, target: str | os.PathLike, command: str, advice: str = ""):
        self.target = Path(target)
        self.path = lock_path(self.target)
        self.command = command
        self.advice = advice  # what a refused run should do instead, for its one line
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: float | None = None,
                on_wait: Callable[[Owner | None], None] | None = None) -> None:
        """Take the lock. ``wait``: seconds to wait for another holder (0: refuse at once,
        None: no limit). ``on_wait`` is called once, with the holder, when we must wait.
        TargetBusy names the holder when the wait ends without the lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        deadline = None if wait is None else started + wait
        told = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                got = self._try_lock(fd)
            except BaseException:
                os.close(fd)
                raise
            if got and self._still_the_lock_file(fd):
                break
            os.close(fd)  # not ours, or the holder removed that file as it released
            if got:
                continue
            owner = current_owner(self.target)
            if owner is None and time.monotonic() - started < OWNER_GRACE_SECONDS:
                time.sleep(POLL_SECONDS / 4)  # the holder is writing who it is
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise TargetBusy(self._busy_message(owner, wait))
            if not told and on_wait is not None:
                on_wait(owner)
                told = True
            time.sleep(POLL_SECONDS)
        self._fd = fd
        self._write_owner()
        _HELD[self.path.absolute()] = self

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise

    def _still_the_lock_file(self, fd: int) -> bool:
        """The holder unlinks the lock file before it lets go (nothing stays beside the
        target), so a lock won on a file that is no longer at the path counts for nothing."""
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (on_disk.st_ino, on_disk.st_dev) == (mine.st_ino, mine.st_dev)

    def _busy_message(self, owner: Owner | None, wait: float | None) -> str:
        who = owner.describe() if owner else "another dsenv run"
        if self.advice:
            return f"{self.target} is in use by {who}: {self.advice}"
        if not wait:
            return (f"{self.target} is being built by {who}: wait for it (drop --no-wait, or "
                    f"--wait SECONDS), or choose another target")
        return (f"{self.target} is still being built by {who} after waiting {wait:.0f} s: "
                f"wait longer (--wait SECONDS) or choose another target")

    def _write_owner(self) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "since": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "command": self.command}
        data = (json.dumps(owner) + "\n").encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.pop(self.path.absolute(), None)
        try:
            os.unlink(self.path)  # while still locked: waiters retry on a fresh file
        except OSError:
            pass
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def hold(target: str | os.PathLike, command: str, wait: float | None = None,
         on_wait: Callable[[Owner | None], None] | None = None) -> Iterator[TargetLock]:
    """``with hold(target, "dsenv provision", wait=...)``: the lock for the block."""
    lock = TargetLock(target, command)
    lock.acquire(wait, on_wait)
    try:
        yield lock
    finally:
        lock.release()


def waiting_line(target: str | os.PathLike, owner: Owner | None) -> str:
    """The line a run prints when it must wait."""
    who = owner.describe() if owner else "another dsenv run"
    return f"waiting for {who} to finish with {target} ..."


def add_wait_arguments(parser, default: float, what: str) -> None:
    """``--wait SECONDS`` / ``--no-wait`` for a command that builds ``what``; ``args.wait``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--wait", type=non_negative_float, default=default, metavar="SECONDS",
                       help=f"when another dsenv run is building the same {what}, wait this "
                            f"long for it (default {default:.0f})")
    group.add_argument("--no-wait", dest="wait", action="store_const", const=0.0,
                       help=f"refuse at once when another dsenv run builds the same {what}")

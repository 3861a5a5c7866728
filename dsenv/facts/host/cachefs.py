"""Cache folders of kernel compilers and downloads: where, whose, writable, and do locks work.

Triton keeps compiled kernels in TRITON_CACHE_DIR, else ``$TRITON_HOME/.triton/cache``, else
``~/.triton/cache`` (triton/knobs.py ``cache_knobs``). MIOpen keeps its user find-db in
MIOPEN_USER_DB_PATH (default ``~/.config/miopen``) and compiled kernels in
MIOPEN_CUSTOM_CACHE_DIR (default ``~/.cache/miopen``), both SQLite.

Each folder is tested for real in the folder itself, or in its nearest existing parent while
it does not exist yet (it will be created there, on the same file system): a temporary file
is created, ``fcntl.flock(LOCK_EX|LOCK_NB)`` and ``fcntl.lockf(LOCK_EX|LOCK_NB)`` are taken
and released on it, and it is removed. The test runs in a child (lockprobe.py) with a
deadline: a hung network file system costs the doctor that deadline, not the run (a thread
blocked in the kernel there would keep the doctor from exiting; a child is left behind;
where this interpreter cannot be started again, the test falls back to a thread).
Once a folder's test hung, later folders on the same mount are not tried: each would cost
the deadline again.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import lockprobe, mounts
from dsenv.facts.node import Node


@dataclass(frozen=True)
class CacheFolder:
    role: str  # "Triton cache"
    path: Path
    variable: str  # the variable that moves it
    source: str  # the variable that decided it, or "default"

    def describe(self) -> str:
        how = self.source if self.source != "default" else f"default, {self.variable} unset"
        return f"{self.role}: {self.path} ({how})"


def _home(env) -> str:
    return env.get("HOME") or os.path.expanduser("~")


def _user_path(value: str, env) -> Path:
    """'~' and '~/x' against the job's HOME (MIOpen expands a leading ~ itself)."""
    if value == "~" or value.startswith("~/"):
        value = _home(env) + value[1:]
    return Path(value)


def triton_folder(env) -> CacheFolder:
    explicit = (env.get("TRITON_CACHE_DIR") or "").strip()
    if explicit:
        return CacheFolder("Triton cache", Path(explicit), "TRITON_CACHE_DIR", "TRITON_CACHE_DIR")
    home = env.get("TRITON_HOME")
    source = "TRITON_HOME" if home else "default"
    return CacheFolder("Triton cache", Path(home or _home(env)) / ".triton" / "cache",
                       "TRITON_CACHE_DIR", source)


def miopen_folders(env) -> list[CacheFolder]:
    found = []
    for role, var, default in (("MIOpen user database", "MIOPEN_USER_DB_PATH", "~/.config/miopen"),
                               ("MIOpen kernel cache", "MIOPEN_CUSTOM_CACHE_DIR",
                                "~/.cache/miopen")):
        value = env.get(var)
        found.append(CacheFolder(role, _user_path(value or default, env), var,
                                 var if value else "default"))
    return found


def temp_folder(env) -> CacheFolder:
    value = (env.get("TMPDIR") or "").strip()
    return CacheFolder("temporary files", Path(value or "/tmp"), "TMPDIR",
                       "TMPDIR" if value else "default")


def shared_object_folders(env) -> list[CacheFolder]:
    """Where a training job writes shared objects it then loads: the temporary folder (Triton's
    helper modules, torch's and Inductor's scratch builds), Inductor's cache
    (TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>), Triton's cache and torch's
    JIT extensions (TORCH_EXTENSIONS_DIR, else $XDG_CACHE_HOME or ~/.cache, /torch_extensions).
    A folder on a noexec mount builds fine and fails to load."""
    tmp = temp_folder(env)
    user = env.get("USER") or env.get("LOGNAME") or "user"
    inductor = (env.get("TORCHINDUCTOR_CACHE_DIR") or "").strip()
    extensions = (env.get("TORCH_EXTENSIONS_DIR") or "").strip()
    cache_home = (env.get("XDG_CACHE_HOME") or "").strip() or f"{_home(env)}/.cache"
    return [tmp,
            CacheFolder("Inductor cache", Path(inductor) if inductor else
                        tmp.path / f"torchinductor_{user}", "TORCHINDUCTOR_CACHE_DIR",
                        "TORCHINDUCTOR_CACHE_DIR" if inductor else "default"),
            triton_folder(env),
            CacheFolder("torch extensions", Path(extensions or f"{cache_home}/torch_extensions"),
                        "TORCH_EXTENSIONS_DIR", "TORCH_EXTENSIONS_DIR" if extensions
                        else "default")]


# -- a folder, tested -------------------------------------------------------------------


@dataclass(frozen=True)
class FolderTest:
    where: Path | None  # the folder tested: the cache folder or its nearest existing parent
    created: bool  # a file could be created there
    error: str | None = None  # why not, or why the test gave no answer
    flock: int | None = None  # 0: works; else the errno; None: not tried
    lockf: int | None = None
    hung: bool = False  # no answer within the deadline: a file system that stopped answering
    exists: bool = False  # the cache folder itself
    owner: int | None = None  # uid of the cache folder (None while it does not exist)
    where_owner: int | None = None  # uid of ``where``

    def lock_error(self) -> str:
        """'flock: [Errno 38] Function not implemented (ENOSYS)'."""
        parts = []
        for name, code in (("flock", self.flock), ("lockf", self.lockf)):
            if code:
                parts.append(f"{name}: [Errno {code}] {os.strerror(code)} "
                             f"({errno.errorcode.get(code, '?')})")
        return "; ".join(parts)


def try_folder(node: Node, path: Path) -> FolderTest:
    """Create, lock and remove a file in ``path`` (or its nearest existing parent), in a
    child with the probe timeout as deadline; once per folder and doctor run."""
    path = os.path.abspath(path)
    point = mounts.point_of(node, path)

    def run() -> FolderTest:
        if point in mounts.hung_points(node):
            return FolderTest(None, False, f"not tried: a test under {point} gave no answer "
                              "earlier (a hung file system?)", hung=True)
        done = node.run([sys.executable, "-I", "-S", lockprobe.__file__, path])
        if done.not_found:  # this interpreter cannot be started again (run as another user
            return _in_thread(node, path, point)  # after a fork, an embedded Python)
        if done.timed_out:
            return _no_answer(node, point)
        mounts.answered(node, point)
        try:
            return _answer(json.loads(done.stdout))
        except (json.JSONDecodeError, AttributeError, TypeError):
            return FolderTest(None, False, f"the lock test failed: {done.describe()}")

    return node.memo(f"{__name__}.try_folder:{path}", run)


def _in_thread(node: Node, path: str, point: str) -> FolderTest:
    """The same test in a thread with the deadline: it answers as the child does, but a
    thread blocked on a hung file system keeps the process from exiting."""
    box: list[dict] = []
    worker = threading.Thread(target=lambda: box.append(lockprobe.create_and_lock(path)),
                              daemon=True, name=f"lock test {path}")
    worker.start()
    worker.join(node.probe_timeout)
    return _answer(box[0]) if box else _no_answer(node, point)


def _no_answer(node: Node, point: str) -> FolderTest:
    """The test gave no answer: the mount is not tried again in this run."""
    mounts.hung_points(node).add(point)
    return FolderTest(None, False, f"no answer within {node.probe_timeout:.0f} s creating and "
                      "locking a file there (a hung file system?)", hung=True)


def _answer(found: dict) -> FolderTest:
    where = found.pop("where")
    return FolderTest(Path(where) if where else None, **found)


@dataclass(frozen=True)
class FolderState:
    folder: CacheFolder
    test: FolderTest
    exists: bool
    owner: int | None  # uid of the folder itself (None while it does not exist)
    mount: mounts.Mount | None

    @property
    def writable(self) -> bool:
        return self.test.created

    @property
    def foreign_owner(self) -> bool:
        return self.owner is not None and self.owner != os.geteuid()

    def describe(self) -> str:
        parts = [self.folder.describe()]
        if not self.exists and not self.test.hung:
            parts.append(f"missing, created on first use in {self.test.where}")
        if self.owner is not None:
            parts.append(f"owner uid {self.owner}")
        parts.append("writable" if self.writable else
                     f"NOT tested: {self.test.error}" if self.test.hung else
                     f"NOT writable: {self.test.error}")
        if self.mount is not None:
            parts.append(f"on {self.mount.describe()}")
        return ", ".join(parts)


def inspect(node: Node, folder: CacheFolder) -> FolderState:
    test = try_folder(node, folder.path)
    mount = None if test.hung else mounts.mount_for(node, folder.path)  # realpath: stats
    return FolderState(folder, test, test.exists, test.owner if test.exists else None, mount)

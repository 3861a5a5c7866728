"""Cache folders of kernel compilers and downloads: where, whose, writable, and do locks work.

Triton keeps compiled kernels in TRITON_CACHE_DIR, else ``$TRITON_HOME/.triton/cache``, else
``~/.triton/cache`` (triton/knobs.py ``cache_knobs``). MIOpen keeps its user find-db in
MIOPEN_USER_DB_PATH (default ``~/.config/miopen``) and compiled kernels in
MIOPEN_CUSTOM_CACHE_DIR (default ``~/.cache/miopen``), both SQLite.

Each folder is tested for real in the folder itself, or in its nearest existing parent while
it does not exist yet (it will be created there, on the same file system): a temporary file
is created, ``fcntl.flock(LOCK_EX|LOCK_NB)`` and ``fcntl.lockf(LOCK_EX|LOCK_NB)`` are taken
and released on it, and it is removed. The test runs in a thread with a deadline, so a
hung network file system costs the doctor that deadline, not the run.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import mounts
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

    def lock_error(self) -> str:
        """'flock: [Errno 38] Function not implemented (ENOSYS)'."""
        parts = []
        for name, code in (("flock", self.flock), ("lockf", self.lockf)):
            if code:
                parts.append(f"{name}: [Errno {code}] {os.strerror(code)} "
                             f"({errno.errorcode.get(code, '?')})")
        return "; ".join(parts)


def _try(lock) -> int:
    try:
        lock()
        return 0
    except OSError as exc:
        return exc.errno or -1


def _create_and_lock(where: Path) -> FolderTest:
    try:
        fd, name = tempfile.mkstemp(dir=where, prefix=".dsenv-lock-test-")
    except OSError as exc:
        return FolderTest(where, False, f"{exc.strerror or exc} ({where})")
    try:
        flock = _try(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        if not flock:
            _try(lambda: fcntl.flock(fd, fcntl.LOCK_UN))
        lockf = _try(lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        if not lockf:
            _try(lambda: fcntl.lockf(fd, fcntl.LOCK_UN))
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    return FolderTest(where, True, None, flock, lockf)


def try_folder(node: Node, path: Path) -> FolderTest:
    """Create, lock and remove a file in ``path`` (or its nearest existing parent); once per
    folder and doctor run, with the probe timeout as deadline."""
    where = mounts.nearest_existing(Path(path))
    if where is None or not where.is_dir():
        reason = f"{where} is not a folder" if where else "no parent folder exists"
        return FolderTest(where, False, reason)

    def run() -> FolderTest:
        box: list[FolderTest] = []
        worker = threading.Thread(target=lambda: box.append(_create_and_lock(where)), daemon=True)
        worker.start()
        worker.join(node.probe_timeout)
        if box:
            return box[0]
        return FolderTest(where, False, f"no answer within {node.probe_timeout:.0f} s "
                          "creating and locking a file there (a hung file system?)")

    return node.memo(f"{__name__}.try_folder:{os.path.realpath(where)}", run)


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
        if not self.exists:
            parts.append(f"missing, created on first use in {self.test.where}")
        if self.owner is not None:
            parts.append(f"owner uid {self.owner}")
        parts.append("writable" if self.writable else f"NOT writable: {self.test.error}")
        if self.mount is not None:
            parts.append(f"on {self.mount.describe()}")
        return ", ".join(parts)


def inspect(node: Node, folder: CacheFolder) -> FolderState:
    path = Path(folder.path)
    try:
        exists, owner = path.is_dir(), path.stat().st_uid
    except OSError:
        exists, owner = False, None
    return FolderState(folder, try_folder(node, path), exists, owner if exists else None,
                       mounts.mount_for(node, path))

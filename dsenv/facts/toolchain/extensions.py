"""torch's JIT extensions folder as torch resolves it, the build locks in it and their holders.

torch.utils.cpp_extension builds each op in ``<root>/<op>``: ``root`` is TORCH_EXTENSIONS_DIR
as given, else ``realpath($XDG_CACHE_HOME or ~/.cache)/torch_extensions/py<XY>_<accel>``
(``rocm<hip>``, ``cu<cuda>`` or ``cpu``, from the job's torch). A build takes the folder's
``lock`` file with O_CREAT|O_EXCL (torch/utils/file_baton.py), keeps it open while it runs,
runs ninja, nvcc and the compiler with the build folder as their working directory, and
removes the file at the end; waiters poll until it is gone. A build killed by the OOM
killer, scancel or a time limit leaves the file, and every later load of that op waits
forever (https://github.com/pytorch/pytorch/issues/189245).

A lock is live while a process on this node has it open, has the build folder as its
working directory, or has a file in the build folder open: /proc/<pid>/fd and
/proc/<pid>/cwd, read through :meth:`Node.path`. Another user's processes cannot be read
unless the doctor runs as root; they are counted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import mounts, processes
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env, torch_info


@dataclass(frozen=True)
class ExtensionsRoot:
    path: Path | None  # this environment's build root; None: torch unknown, name not known
    source: str  # "TORCH_EXTENSIONS_DIR" or "default"
    scan: Path  # the folder searched for op folders
    depth: int  # 1: <scan>/<op>/lock; 2: <scan>/py<XY>_<accel>/<op>/lock

    @property
    def explicit(self) -> bool:
        return self.source == "TORCH_EXTENSIONS_DIR"


def accelerator_tag(torch: torch_info.TorchBuild) -> str:
    """'rocm62...', 'cu121' or 'cpu', as _get_build_directory names the folder."""
    if torch.hip:
        return "rocm" + torch.hip.replace(".", "")
    if torch.cuda:
        return "cu" + torch.cuda.replace(".", "")
    return "cpu"


def default_base(node: Node) -> Path:
    """torch.utils.cpp_extension.get_default_build_root(): realpath of the user cache dir
    (its text where that file system gives no answer: resolving it would hang)."""
    home = node.env.get("HOME") or os.path.expanduser("~")
    cache = node.env.get("XDG_CACHE_HOME", os.path.join(home, ".cache"))
    base = os.path.join(cache, "torch_extensions")
    return Path(os.path.realpath(base) if mounts.answers(node, base) else os.path.abspath(base))


@probe
def extensions_root(node: Node) -> ExtensionsRoot:
    explicit = node.env.get("TORCH_EXTENSIONS_DIR")
    if explicit is not None:
        return ExtensionsRoot(Path(explicit), "TORCH_EXTENSIONS_DIR", Path(explicit), 1)
    base = default_base(node)
    torch = torch_info.torch_build(node)
    if not torch.installed:
        return ExtensionsRoot(None, "default", base, 2)
    folder = f"{target_env.python_tag(node)}_{accelerator_tag(torch)}"
    return ExtensionsRoot(base / folder, "default", base, 2)


# -- locks and who holds them ------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str  # /proc/<pid>/comm
    how: str  # "has the lock open", "works in the build folder", "has <file> open"

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name}) {self.how}"


@dataclass(frozen=True)
class BuildLock:
    path: Path
    age: float  # seconds since the lock was written
    owner: int | None  # uid of the lock file
    holders: tuple[Holder, ...] = ()

    @property
    def op(self) -> str:
        return self.path.parent.name

    @property
    def stale(self) -> bool:
        return not self.holders


@dataclass(frozen=True)
class LockScan:
    locks: tuple[BuildLock, ...]
    processes: int = 0  # processes looked at
    unreadable: int = 0  # processes whose open files this user may not read


# The deepest the doctor reads below the folder it scans: <scan>/py<XY>_<accel>/<op>/<file>.
WALK_DEPTH = 3


def files_answer(node: Node) -> bool:
    """Whether the JIT builds, their locks and .so files may be read in this process: every
    entry of the scanned folder down to WALK_DEPTH statted in a child first on a mount that can
    hang (mounts.files_answer), one walk that the lock scan, the JIT cache and the symbol scan
    share (their folders are the scanned one or below it)."""
    return mounts.files_answer(node, extensions_root(node).scan, WALK_DEPTH)


def find_locks(root: ExtensionsRoot) -> list[Path]:
    pattern = "*/lock" if root.depth == 1 else "*/*/lock"
    try:
        return sorted(p for p in root.scan.glob(pattern) if p.is_file())
    except OSError:
        return []


def _match(target: str, lock: str, build: str) -> str | None:
    if target == lock:
        return "has the lock open"
    if target.startswith(build + "/"):
        return f"has {os.path.relpath(target, build)} open"
    return None


def scan_holders(node: Node, locks: list[Path]) -> tuple[dict[Path, list[Holder]], int, int]:
    """({lock: holders}, processes looked at, processes not readable), from /proc."""
    builds = {lock: (os.path.realpath(lock), os.path.realpath(lock.parent)) for lock in locks}
    found: dict[Path, list[Holder]] = {lock: [] for lock in locks}
    walk = processes.Walk()
    for process in processes.open_files(node, walk):
        for lock, (lock_real, build) in builds.items():
            cwd = process.cwd
            how = "works in the build folder" if cwd == build or \
                cwd.startswith(build + "/") else None
            for target in process.open:
                how = _match(target, lock_real, build) or how
                if how == "has the lock open":
                    break
            if how:
                found[lock].append(Holder(process.pid, process.comm, how))
    return found, walk.seen, walk.unreadable


def describe_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


@probe
def build_locks(node: Node) -> LockScan:
    """Every ``lock`` in the extensions folder(s) and the processes that keep each alive."""
    paths = find_locks(extensions_root(node))
    if not paths:
        return LockScan(())
    holders, seen, unreadable = scan_holders(node, paths)
    now, locks = time.time(), []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            continue  # the build finished meanwhile
        locks.append(BuildLock(path, max(0.0, now - info.st_mtime), info.st_uid,
                               tuple(holders[path])))
    return LockScan(tuple(locks), seen, unreadable)

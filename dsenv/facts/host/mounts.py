"""Which file system a folder lives on, from the mount table: local, network or FUSE.

Read from /proc/self/mountinfo (else /proc/mounts) through :meth:`Node.path`, so tests
give a recorded table under a fake root. A folder belongs to the mount with the longest
mount point that is a prefix of its real path; of two mounts on one point, the later one
(it covers the earlier). Nothing is mounted or statted on the file system itself: a hung
NFS server cannot stall this probe. Before a path on a mount that can stop answering (network,
FUSE, autofs) is touched in this process, :func:`answers` stats it in a child with the probe
deadline: a thread blocked in the kernel on a hung file server cannot be abandoned, and would
keep the doctor from exiting. A mount that answered may still hang on some of its files (a
Lustre with one storage target down): before files under a folder are statted or read here,
:func:`files_answer` stats each of them in a child first.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsenv.facts.host import lockprobe

if TYPE_CHECKING:  # Node looks up commands through this module (Node.searchable_path)
    from dsenv.facts.node import Node

# Shared between nodes: caches, locks and renames here race between jobs on several nodes.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "glusterfs",
    "panfs", "wekafs", "afs", "gfs2", "ocfs2", "orangefs", "pvfs2", "quobyte", "vastfs",
    "fuse.sshfs", "fuse.glusterfs", "fuse.ceph-fuse", "fuse.juicefs", "fuse.s3fs",
    "fuse.gcsfuse", "fuse.goofys", "fuse.rclone", "fuse.beegfs", "fuse.weka",
})
# FUSE file systems that are local to the node (containers, image mounts).
LOCAL_FUSE_TYPES = frozenset({
    "fuse.fuse-overlayfs", "fuse.squashfuse", "fuse.squashfuse_ll", "fuse.lxcfs",
    "fuse.portal", "fuse.gvfsd-fuse", "fuse.apptainer", "fuse.singularity", "fusectl",
    "fuseblk",
})


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    options: frozenset[str]  # per-mount and super-block options together

    @property
    def kind(self) -> str:
        """'network', 'fuse' (a FUSE file system of unknown reach) or 'local'."""
        if self.fstype in NETWORK_TYPES:
            return "network"
        if self.fstype.startswith("fuse") and self.fstype not in LOCAL_FUSE_TYPES:
            return "fuse"
        return "local"

    @property
    def shared(self) -> bool:
        return self.kind != "local"

    @property
    def may_hang(self) -> bool:
        """A file server behind it can stop answering (autofs: a stat mounts one)."""
        return self.shared or self.fstype == "autofs"

    def option(self, name: str) -> str | None:
        """The value of ``name=value`` (or '' for a bare flag), None when absent."""
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value
        return None

    def describe(self) -> str:
        what = {"network": "network file system", "fuse": "FUSE file system",
                "local": "local file system"}[self.kind]
        return f"{self.fstype} ({what}, {self.source} on {self.point})"

    def lock_scope(self) -> str | None:
        """What the mount options say about flock(): 'none' (it fails), 'node-local' (it
        works but other nodes do not see the lock), 'cluster' or None (not decided by them).

        Lustre clients refuse flock() with ENOSYS unless mounted with ``flock`` (coherent
        across clients) or ``localflock`` (this node only); NFS with ``nolock`` or
        ``local_lock=all|flock`` keeps flock() locks on the client."""
        if self.fstype == "lustre":
            if "flock" in self.options:
                return "cluster"
            return "node-local" if "localflock" in self.options else "none"
        if self.fstype.startswith("nfs"):
            if "nolock" in self.options or self.option("local_lock") in ("all", "flock"):
                return "node-local"
        return None


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """Mount tables write space, tab, newline and backslash as octal escapes (\\040)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo: ``id parent dev root point opts [tags] - type source superopts``."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        options = set(fields[5].split(","))
        if len(tail) > 2:
            options.update(tail[2].split(","))
        mounts.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1]),
                            frozenset(options)))
    return mounts


def parse_mounts(text: str) -> list[Mount]:
    """/proc/mounts (fstab format): ``source point type options dump pass``."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append(Mount(_unescape(fields[1]), fields[2], _unescape(fields[0]),
                                frozenset(fields[3].split(","))))
    return mounts


def mount_table(node: Node) -> tuple[Mount, ...]:
    """The node's mounts, read once per node."""
    return node.memo(f"{__name__}.mount_table", lambda: _read_mount_table(node))


def _read_mount_table(node: Node) -> tuple[Mount, ...]:
    for name, parse in (("/proc/self/mountinfo", parse_mountinfo),
                        ("/proc/mounts", parse_mounts)):
        try:
            return tuple(parse(node.path(name).read_text(errors="replace")))
        except OSError:
            continue
    return ()


def _holding(node: Node, path: str) -> Mount | None:
    """The mount whose point is the longest prefix of ``path`` (of two on one point, the
    later one: it covers the earlier)."""
    best, best_len = None, -1
    for mount in mount_table(node):
        point = mount.point.rstrip("/") or "/"
        inside = path == point or point == "/" or path.startswith(point + "/")
        if inside and len(point) >= best_len:
            best, best_len = mount, len(point)
    return best


def point_of(node: Node, path: str) -> str:
    """The mount point ``path`` lies under, from the mount table and the path's text alone
    (resolving symlinks would touch a file system that may be hung)."""
    mount = _holding(node, os.path.abspath(path))
    return (mount.point.rstrip("/") or "/") if mount is not None else "/"


def may_hang(node: Node, path: Path | str) -> bool:
    """Whether ``path`` lies on a mount whose file server can stop answering (by its text)."""
    mount = _holding(node, os.path.abspath(path))
    return mount is not None and mount.may_hang


def answers(node: Node, path: Path | str) -> bool:
    """Whether ``path`` may be touched in this process: True on a local mount; on one that can
    hang, its nearest existing folder is statted first in a child with the probe deadline
    (once per mount and run); False once a probe there gave no answer, or a walk of a folder
    that holds ``path`` did (:func:`files_answer`)."""
    path = os.path.abspath(path)
    mount = _holding(node, path)
    if mount is None or not mount.may_hang:
        return True
    point = mount.point.rstrip("/") or "/"

    def stat_in_child() -> bool:
        if point in hung_points(node):
            return False
        done = node.run([sys.executable, "-I", "-S", lockprobe.__file__, "--stat", path])
        if done.timed_out:
            hung_points(node).add(point)
            return False
        return True  # answered (an error, or an interpreter that cannot start, is no hang)

    return point not in hung_points(node) and not _in_hung_folder(node, path) and \
        node.memo(f"{__name__}.answers:{point}", stat_in_child)


MAX_WALKED = 2000  # entries a child stats under one folder (files_answer): well inside the
# deadline on a slow but healthy file server (a stat there takes about a millisecond)


def files_answer(node: Node, path: Path | str, depth: int = 0) -> bool:
    """Whether ``path`` and the entries down to ``depth`` levels below it may be statted and read
    in this process: :func:`answers` for the mount, then on a mount that can hang each entry is
    statted in a child first (once per folder and run; at most MAX_WALKED, the rest taken as
    answering). A mount whose metadata answers can still hang on some files: a Lustre with one
    storage target (OST) down lists folders and stats them, but a stat of a file with objects
    on that target waits for it (the file's size is asked there), and so does a read. False
    once a walk there gave no answer; :func:`answers` is then False below ``path`` too."""
    path = os.path.abspath(path)
    if not answers(node, path):
        return False
    mount = _holding(node, path)
    if mount is None or not mount.may_hang:
        return True

    def walk_in_child() -> bool:
        done = node.run([sys.executable, "-I", "-S", lockprobe.__file__, "--walk", path,
                         str(depth), str(MAX_WALKED)])
        if done.timed_out:
            hung_folders(node).add(path)
            return False
        return True

    return node.memo(f"{__name__}.files_answer:{path}:{depth}", walk_in_child)


def walk_folders(node: Node, folders, depth: int, wait: bool = True) -> dict[str, bool]:
    """:func:`files_answer` for each of ``folders`` at once, one thread each (each that hangs
    costs the probe deadline: in turn they would add up). ``wait=False`` starts them and
    returns at once (an empty dict): whoever reads a folder later asks :func:`files_answer`,
    which is memoised, and waits only for what is still running. A walk that raised is left
    out; asking again meets what went wrong."""
    answered: dict[str, bool] = {}

    def walk(folder: str) -> None:
        try:
            answered[folder] = files_answer(node, folder, depth)
        except Exception:  # noqa: BLE001 - a thread must not die with it; see the docstring
            pass

    threads = [threading.Thread(target=walk, args=(str(f),), daemon=True, name=f"walk {f}")
               for f in folders]
    for thread in threads:
        thread.start()
    if wait:
        for thread in threads:
            thread.join()
    return answered


class NoAnswer(Exception):
    """Files a fact is read from gave no answer to a stat in a child within the probe deadline
    (:func:`files_answer`): the fact is not read here, rather than judged on nothing or read in
    this process, where it would hang. Raised to whoever asks for the fact (a memoised probe
    hands it to every check that needs it); the doctor's runner makes it a verdict."""

    def __init__(self, what: str, path: Path | str):
        self.what, self.path = what, str(path)
        super().__init__(f"{what} {path} gave no answer to a stat")


def unanswered(node: Node, path: Path | str, what: str) -> str | None:
    """None when :func:`answers`; else what went wrong, in words naming ``what`` ("the output
    folder (--output-dir)"), the path and its mount, for the caller's one line."""
    if answers(node, path):
        return None
    mount = mount_for(node, path)
    where = f" ({mount.fstype} on {mount.point})" if mount is not None else ""
    return (f"{what} {os.path.abspath(path)} gave no answer to a stat within "
            f"{node.probe_timeout:g} s{where}: its file server is not answering")


def require_files(node: Node, path: Path | str, depth: int, what: str) -> None:
    """:func:`files_answer`, or :class:`NoAnswer` naming ``what`` ("the environment")."""
    if not files_answer(node, path, depth):
        raise NoAnswer(what, os.path.abspath(path))


def hung_folders(node: Node) -> set[str]:
    """Folders (or files) where a walk in a child got no answer while their mount answered."""
    return node.memo(f"{__name__}.hung_folders", set)


def _in_hung_folder(node: Node, path: str) -> bool:
    return any(path == hung or path.startswith(hung.rstrip("/") + "/")
               for hung in hung_folders(node))


def answered(node: Node, point: str) -> None:
    """A probe in a child (cachefs' write test) got an answer under ``point``: :func:`answers`
    needs no child of its own there."""
    node.memo(f"{__name__}.answers:{point}", lambda: True)


def hung_points(node: Node) -> set[str]:
    """Mount points where a probe in a child got no answer in this run: later probes there
    are not tried, each would cost its deadline again (cachefs, tempdir)."""
    return node.memo(f"{__name__}.hung_points", set)


def nearest_existing(path: Path, node: Node | None = None) -> Path | None:
    """``path`` or its nearest existing parent (lockprobe's, the child that runs stdlib only);
    with ``node``, None where the file system there does not answer (:func:`answers`)."""
    if node is not None and not answers(node, path):
        return None
    found = lockprobe.nearest_existing(str(path))
    return Path(found) if found is not None else None


def mount_for(node: Node, path: Path | str) -> Mount | None:
    """The mount holding ``path`` (or, while it does not exist, the one it will be made on):
    symlinks in the existing part of the path are resolved first, where its file system
    answers (else the path's text decides)."""
    real = os.path.realpath(path) if answers(node, path) else os.path.abspath(path)
    return _holding(node, real)

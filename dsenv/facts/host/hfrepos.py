"""What a download into the Hugging Face hub cache writes, per repository, tried as this user.

huggingface_hub keeps each repository in its own folders of the hub cache and writes there on
every download that is not already complete (file_download.py
``_hf_hub_download_to_cache_dir``, as read in huggingface_hub 2.4):

- ``HF_HUB_CACHE/.locks/<repo folder>/<etag>.lock``: the lock every download takes first
  (its folder made with ``mkdir(parents=True)``; the file opened O_RDWR by filelock, created
  with mode 0o664 in 2.4, 0o644 in older releases);
- ``HF_HUB_CACHE/<repo folder>/blobs/<etag>.incomplete``, renamed to ``blobs/<etag>``;
- ``HF_HUB_CACHE/<repo folder>/snapshots/<commit>/<file>``: a link to the blob;
- ``HF_HUB_CACHE/<repo folder>/refs/<revision>``: the commit a branch names;

where ``<repo folder>`` is ``models--ORG--NAME`` (``datasets--``, ``spaces--``:
``repo_folder_name``). In a cache shared between users those folders belong to whoever
downloaded the repository first: the top-level folders may be writable for everyone while a
repository's ``.locks/<repo folder>/`` is not, and the download dies with PermissionError on
``<etag>.lock``. So each folder is tried for real, as the user running this, by creating and
removing a file in it (or, while it does not exist, in the nearest folder that does: where it
would be created); lock files already there are checked for the write access filelock needs.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import cachefs, mounts
from dsenv.facts.node import Node

REPO_FOLDER = re.compile(r"(?:models|datasets|spaces)--.+")
LOCKS = ".locks"
PARTS = ("blobs", "snapshots", "refs")  # below the repository's folder
MAX_LOCK_FILES = 500  # lock files looked at per repository
MAX_REPOS = 100  # repositories tried when the whole cache is judged


def cached_repos(node: Node, hub: Path, limit: int = MAX_REPOS) -> tuple[list[str], int]:
    """The repository folders in the hub cache (or only in its .locks): at most ``limit``,
    those whose folders another user owns first (where a download fails), then by name; and
    how many were left out. None are listed where the cache's file system does not answer."""
    found = set()
    if not mounts.answers(node, hub):
        return [], 0
    for where in (hub, hub / LOCKS):
        try:
            with os.scandir(where) as entries:
                found.update(e.name for e in entries
                             if REPO_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    me = os.geteuid()

    def mine(folder: str) -> bool:
        return all(uid_of(p) in (me, None) for p in (hub / LOCKS / folder, hub / folder))

    ordered = sorted(found, key=lambda f: (mine(f), f))
    return ordered[:limit], max(0, len(ordered) - limit)


def owner_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True)
class FolderWrite:
    role: str  # "lock folder", "blob folder", ...
    path: Path  # the folder the download writes in
    where: Path | None  # the folder tried: ``path``, or the nearest existing one above it
    error: str | None  # None: a file was created and removed there
    owner: int | None  # uid of ``where``
    hung: bool = False  # the test gave no answer: the file system stopped answering

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        place = str(self.path) if self.where in (self.path, None) else \
            f"{self.path} (not there yet: created in {self.where})"
        state = "writable" if self.ok else \
            f"NOT tested: {self.error}" if self.hung else f"NOT writable: {self.error}"
        return f"{self.role} {place}, owner {owner_name(self.owner)}: {state}"


@dataclass(frozen=True)
class RepoWrites:
    folder: str  # "models--org--name", or "" for a repository not in the cache yet
    writes: tuple[FolderWrite, ...]
    stuck_locks: tuple[Path, ...]  # lock files there that this user cannot open for writing
    locks_unanswered: bool = False  # a file under the hub's .locks gave no answer to a stat

    @property
    def broken(self) -> list[FolderWrite]:
        return [w for w in self.writes if not w.ok]

    @property
    def ok(self) -> bool:
        return not self.broken and not self.stuck_locks

    @property
    def hung(self) -> list[FolderWrite]:
        return [w for w in self.writes if w.hung]

    @property
    def present(self) -> bool:
        return any(w.where == w.path for w in self.writes)


def uid_of(path: Path | None) -> int | None:
    try:
        return path.stat().st_uid if path is not None else None
    except OSError:
        return None


def _tried(node: Node, role: str, path: Path) -> FolderWrite:
    test = cachefs.try_folder(node, path)
    error = None if test.created else (test.error or "no file could be created")
    return FolderWrite(role, path, test.where, error, test.where_owner, test.hung)


def _stuck_locks(lock_dir: Path) -> tuple[Path, ...]:
    """Lock files filelock would open with O_RDWR and cannot (another user's 0644 file)."""
    stuck = []
    try:
        with os.scandir(lock_dir) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_LOCK_FILES:
                    break
                if entry.name.endswith(".lock") and entry.is_file(follow_symlinks=False) \
                        and not os.access(entry.path, os.W_OK):
                    stuck.append(Path(entry.path))
    except OSError:
        pass
    return tuple(sorted(stuck))


def repo_writes(node: Node, hub: Path, folder: str) -> RepoWrites:
    """Try every folder a download of the repository in ``folder`` writes (``folder`` "":
    a repository not in the cache yet, whose folders would be created in .locks and the
    hub cache itself)."""
    hub = Path(hub)
    if not folder:
        writes = (_tried(node, "lock folders", hub / LOCKS),
                  _tried(node, "repository folders", hub))
        return RepoWrites("", writes, ())
    lock_dir = hub / LOCKS / folder
    writes = (_tried(node, "lock folder", lock_dir),
              *(_tried(node, f"{part[:-1]} folder", hub / folder / part) for part in PARTS))
    # every lock file statted in a child first, once for the whole .locks: on a mount whose
    # folders answer, a lock file can still hang (filelock opens it, so would the download)
    readable = mounts.files_answer(node, hub / LOCKS, 2)
    stuck = _stuck_locks(lock_dir) if readable else ()
    return RepoWrites(folder, writes, stuck, locks_unanswered=not readable and
                      mounts.answers(node, hub))

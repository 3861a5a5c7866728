"""The temporary folder a job's programs write to, and the room on it.

Python's tempfile (pip's downloads and sdist builds, Triton's and torch's scratch files) takes
the first of TMPDIR, TEMP, TMP that is an existing folder, else /tmp (then /var/tmp); a
program run in the job gets the same. The room is read with statvfs in a thread with a
deadline: a temporary folder on a hung network file system cannot stall the doctor.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from dsenv.facts.host import mounts
from dsenv.facts.node import Node

VARIABLES = ("TMPDIR", "TEMP", "TMP")
DEFAULTS = ("/tmp", "/var/tmp")
STATVFS_SECONDS = 5.0


@dataclass(frozen=True)
class TempFolder:
    path: str  # as the job sees it
    source: str  # the variable that set it, or "default"
    free: int | None  # bytes an unprivileged writer may use; None when statvfs did not answer
    size: int | None
    mount: mounts.Mount | None
    ignored: tuple[str, ...] = ()  # variables set to a folder that does not exist

    def describe(self) -> str:
        where = f" on {self.mount.point} ({self.mount.fstype})" if self.mount else ""
        return f"{self.path} ({self.source}){where}"


def temp_folder(node: Node) -> TempFolder | None:
    """The folder tempfile would pick for the job, None when none of them exists."""
    ignored = []
    candidates = [(node.env[v], v) for v in VARIABLES if node.env.get(v)]
    for path, source in [*candidates, *((d, "default") for d in DEFAULTS)]:
        if node.path(path).is_dir():
            free, size = _room(str(node.path(path)))
            return TempFolder(path, source, free, size, mounts.mount_for(node, node.path(path)),
                              tuple(ignored))
        if source != "default":
            ignored.append(f"{source}={path}")
    return None


def _room(path: str) -> tuple[int | None, int | None]:
    answer: list[os.statvfs_result] = []

    def stat() -> None:
        try:
            answer.append(os.statvfs(path))
        except OSError:
            pass  # no answer: the check says it could not read the room

    worker = threading.Thread(target=stat, daemon=True)
    worker.start()
    worker.join(STATVFS_SECONDS)
    if not answer:
        return None, None
    stats = answer[0]
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize

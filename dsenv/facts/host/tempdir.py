"""The temporary folder a job's programs write to, and the room on it.

Python's tempfile (pip's downloads and sdist builds, Triton's and torch's scratch files) takes
the first of TMPDIR, TEMP, TMP that is an existing folder, else /tmp (then /var/tmp); a
program run in the job gets the same. The room is read by coreutils' `stat -f` in a child
with a deadline: on a hung (hard-mounted) network file system statvfs blocks in the kernel
uninterruptibly, which a thread would carry into this process's exit; a child is killed and
left behind.
"""

from __future__ import annotations

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
    hung: bool = False  # its file system gave no answer to a stat: writes there hang

    def describe(self) -> str:
        where = f" on {self.mount.point} ({self.mount.fstype})" if self.mount else ""
        return f"{self.path} ({self.source}){where}"


def temp_folder(node: Node) -> TempFolder | None:
    """The folder tempfile would pick for the job, None when none of them exists."""
    ignored = []
    candidates = [(node.env[v], v) for v in VARIABLES if node.env.get(v)]
    for path, source in [*candidates, *((d, "default") for d in DEFAULTS)]:
        if not mounts.answers(node, node.path(path)):  # taken as tempfile would: it hangs there
            return TempFolder(path, source, None, None, mounts.mount_for(node, node.path(path)),
                              tuple(ignored), hung=True)
        if node.path(path).is_dir():
            free, size = room(node, str(node.path(path)))
            return TempFolder(path, source, free, size, mounts.mount_for(node, node.path(path)),
                              tuple(ignored))
        if source != "default":
            ignored.append(f"{source}={path}")
    return None


def room(node: Node, path: str) -> tuple[int | None, int | None]:
    """(bytes free to an unprivileged writer, size) of ``path``'s file system; (None, None)
    when `stat -f` fails or gives no answer within STATVFS_SECONDS (or another probe on that
    mount gave none)."""
    point = mounts.point_of(node, path)

    def read() -> tuple[int | None, int | None]:
        if point in mounts.hung_points(node):
            return None, None
        done = node.run(["stat", "-f", "-c", "%a %S %b", path], timeout=STATVFS_SECONDS)
        if done.timed_out:
            mounts.hung_points(node).add(point)
        try:
            available, block, blocks = (int(x) for x in done.stdout.split())
        except ValueError:  # no stat, an error, or the deadline passed
            return None, None
        return available * block, blocks * block

    # once per folder and run: the HF cache folders not created yet share one parent
    return node.memo(f"{__name__}.room:{path}", read)

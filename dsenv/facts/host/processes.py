"""The processes of this node as /proc shows them (through ``node.path``): their command,
working directory and open files. One walk for every check that asks who holds something
(a torch-extensions build lock, a port)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node


@dataclass
class ProcessFiles:
    pid: int
    folder: Path  # /proc/<pid> (under the context's root)
    cwd: str  # "" when unreadable
    open: list[str]  # readlink of every /proc/<pid>/fd entry

    @property
    def comm(self) -> str:
        try:
            return (self.folder / "comm").read_text().strip() or "?"
        except OSError:
            return "?"

    @property
    def command(self) -> str:
        """The command line, cut to 120 characters."""
        try:
            words = (self.folder / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return "?"
        text = " ".join(w.decode(errors="replace") for w in words if w)
        return (text[:117] + "...") if len(text) > 120 else (text or "?")


@dataclass
class Walk:
    """How much of /proc the last walk could read: other users' open files stay hidden
    without root."""

    seen: int = 0
    unreadable: int = 0
    cut_short: bool = False  # the deadline ended the walk


def open_files(node: Node, walk: Walk | None = None, seconds: float | None = None,
               include_self: bool = False) -> Iterator[ProcessFiles]:
    """Every process (but this one, unless ``include_self``) whose open files this user may
    read; ``walk`` counts the rest. ``seconds`` bounds the walk on a busy node."""
    walk = walk if walk is not None else Walk()
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        pids = sorted(int(e.name) for e in os.scandir(node.path("/proc")) if e.name.isdigit())
    except OSError:
        return
    for pid in pids:
        if pid == os.getpid() and not include_self:
            continue
        if deadline is not None and time.monotonic() > deadline:
            walk.cut_short = True
            return
        folder = node.path(f"/proc/{pid}")
        try:
            fds = os.listdir(folder / "fd")
        except PermissionError:
            walk.unreadable += 1
            continue
        except OSError:
            continue  # gone meanwhile
        walk.seen += 1
        targets = [t for t in (_readlink(folder / "fd" / fd) for fd in fds) if t]
        yield ProcessFiles(pid, folder, _readlink(folder / "cwd"), targets)


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""

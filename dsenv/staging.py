"""Files and folders written beside their target and renamed into place.

Readers see the old file or the whole new one, never half of it:

    write_file_atomically(path, text)   # str or bytes; mode 0o644 unless told

An interrupted build leaves only a hidden ``.NAME.tmp-PID`` beside the target, never a
half-written target; the next build clears such leftovers before it starts.

    with staged_dir(target) as tmp:   # tmp is empty; fill it
        model.save_pretrained(tmp)
    # target now holds what tmp held; an older target was replaced only after
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dsenv import targetlock

# How long another run's build of the same target is waited for before one line ends it.
DEFAULT_WAIT = 600.0


def clear_leftovers(target: Path) -> None:
    """Remove what an interrupted earlier build left next to ``target``."""
    target = Path(target)
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for stale in target.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def replace_dir(tmp: Path, target: Path) -> None:
    """Put the finished ``tmp`` folder at ``target``; an old ``target`` goes only after."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists() or target.is_symlink():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(target: Path, command: str = "dsenv",
               wait: float | None = DEFAULT_WAIT) -> Iterator[Path]:
    """A fresh hidden folder beside ``target``, renamed to ``target`` when the block ends
    without an exception and removed when it raises. The target's lock is held throughout
    (taken here, waiting up to ``wait`` seconds for another run, unless this process holds
    it already), so the leftovers cleared first can only be a dead run's."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    locked = (contextlib.nullcontext() if targetlock.held_here(target)
              else targetlock.hold(target, command, wait=wait))
    with locked:
        clear_leftovers(target)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.mkdir()
        try:
            yield tmp
            replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def write_file_atomically(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> Path:
    """``data`` at ``path`` through a uniquely named temporary file beside it and a rename
    (two writers never share the temporary file; the last rename wins whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

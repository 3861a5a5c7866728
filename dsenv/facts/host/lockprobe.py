"""Run as a child (``python -I -S lockprobe.py PATH``): can a file be created and locked in PATH?
(``lockprobe.py --stat PATH``: does the file system under PATH answer a stat at all?
``lockprobe.py --walk PATH DEPTH LIMIT``: does every entry down to DEPTH levels below PATH answer
one, at most LIMIT of them?)

Every touch of the folder happens here, in a process of its own: on a hard-mounted file
server that stopped answering, stat, create and flock block in the kernel, and a blocked
thread would keep the doctor from exiting (a thread cannot be abandoned, a child can).
The standard library only, so the child starts in milliseconds without dsenv on its path.

Prints one JSON object: ``where`` (PATH or its nearest existing parent, where the file is
made: the folder will be created on that file system), ``exists`` and ``owner`` (uid) of
PATH, ``where_owner``, ``created``, ``error`` (why not), and ``flock``/``lockf`` (0: works,
else the errno; null: not tried).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys


def nearest_existing(path: str) -> str | None:
    while True:
        if os.path.exists(path):
            return path
        parent = os.path.dirname(path) or "."  # a relative path ends at "." as pathlib's does
        if parent == path:
            return None
        path = parent


def _uid(path: str | None) -> int | None:
    try:
        return os.stat(path).st_uid if path else None
    except OSError:
        return None


def _try(lock, fd: int, how: int) -> int:
    try:
        lock(fd, how)
        return 0
    except OSError as exc:
        return exc.errno or -1


def create_and_lock(path: str) -> dict:
    path = os.path.abspath(path)
    where = nearest_existing(path)
    found = {"where": where, "exists": os.path.isdir(path), "owner": _uid(path),
             "where_owner": _uid(where), "created": False, "error": None,
             "flock": None, "lockf": None}
    if where is None or not os.path.isdir(where):
        found["error"] = f"{where} is not a folder" if where else "no parent folder exists"
        return found
    name = os.path.join(where, f".dsenv-lock-test-{os.getpid()}")
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        found["error"] = f"{exc.strerror or exc} ({where})"
        return found
    try:
        found["flock"] = _try(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not found["flock"]:
            _try(fcntl.flock, fd, fcntl.LOCK_UN)
        found["lockf"] = _try(fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not found["lockf"]:
            _try(fcntl.lockf, fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    found["created"] = True
    return found


def answered(path: str) -> dict:
    """Stat PATH's nearest existing folder (LOOKUP and GETATTR on the way): returning at all
    is the answer; a file server that stopped answering keeps this child waiting."""
    return {"where": nearest_existing(os.path.abspath(path))}


def walked(path: str, depth: int, limit: int) -> dict:
    """lstat PATH and every entry down to ``depth`` levels below it (at most ``limit``): on a
    Lustre whose one storage target is down, folders and listings answer (the metadata server)
    while a stat of a file with objects on that target waits for the target (its size is asked
    there), so a folder's own stat says nothing about its files. Returning at all is the
    answer; ``statted`` how many entries were, ``complete`` whether the walk saw them all."""
    path, count = os.path.abspath(path), 0
    folders = [(path, 0)]
    try:
        os.lstat(path)
    except OSError:
        return {"statted": 0, "complete": True}
    while folders:
        folder, level = folders.pop()
        if level >= depth:
            continue
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if count >= limit:
                        return {"statted": count, "complete": False}
                    try:
                        entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    count += 1
                    if entry.is_dir(follow_symlinks=False):
                        folders.append((entry.path, level + 1))
        except OSError:
            continue
    return {"statted": count, "complete": True}


if __name__ == "__main__":
    if sys.argv[1] == "--stat":
        print(json.dumps(answered(sys.argv[2])))
    elif sys.argv[1] == "--walk":
        print(json.dumps(walked(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        print(json.dumps(create_and_lock(sys.argv[1])))

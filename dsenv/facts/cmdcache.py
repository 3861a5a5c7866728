"""Answers of slow, file-determined commands kept on disk between doctor runs.

`ompi_info` takes ~0.2 s and says the same thing until Open MPI is reinstalled. Its output
is kept under ``$DSENV_CACHE_DIR`` (else ``$XDG_CACHE_HOME/dsenv``, ``~/.cache/dsenv``) with
what it depends on: the command line, the variables named, and the modification time and
size of the files and folders named (the binary, the install's component folders). Any of
those changed: the command runs again. Only successful runs are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from dsenv import proc
from dsenv.facts.host import mounts
from dsenv.facts.node import Node
from dsenv.jsonfiles import write_json_atomically

CACHE_FILE = "commands.json"
ENTRIES = 32
_lock = threading.Lock()


def cache_dir(env) -> Path:
    if env.get("DSENV_CACHE_DIR"):
        return Path(env["DSENV_CACHE_DIR"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "dsenv"
    return Path(env.get("HOME", os.path.expanduser("~"))) / ".cache" / "dsenv"


def stamp(paths: Iterable[str]) -> dict[str, list[int] | None]:
    """{path: [mtime_ns, size]} (None: missing) of files and folders."""
    out: dict[str, list[int] | None] = {}
    for path in paths:
        try:
            st = os.stat(path)
            out[path] = [st.st_mtime_ns, st.st_size]
        except OSError:
            out[path] = None
    return out


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_run(node: Node, argv: list[str], *, watch: Iterable[str] = (),
               variables: Iterable[str] = (),
               more_watch: Callable[[str], Iterable[str]] | None = None,
               timeout: float | None = None) -> tuple[proc.CommandResult, bool]:
    """(the result of ``argv``, whether it came from the cache). ``watch``: files and folders
    whose change invalidates the answer; ``more_watch(stdout)``: more of them, named by the
    output itself (an install prefix); ``variables``: environment variables it depends on
    (a name ending in ``*`` covers a prefix); ``timeout``: the node's probe timeout unless
    given."""
    names = sorted({k for v in variables for k in node.env
                    if (k.startswith(v[:-1]) if v.endswith("*") else k == v)})
    key = hashlib.sha256(json.dumps([list(argv), {k: node.env[k] for k in names}])
                         .encode()).hexdigest()
    path = cache_dir(node.env) / CACHE_FILE
    if not mounts.files_answer(node, path):  # a hung file server: asked each time
        return node.run(argv, timeout), False
    entry = _read(path).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("stdout"), str) \
            and entry.get("watch") == stamp(entry.get("watch") or {}):
        return proc.CommandResult(tuple(argv), 0, entry["stdout"]), True
    result = node.run(argv, timeout)
    if result.ok:
        watched = list(dict.fromkeys([*watch, *(more_watch(result.stdout) if more_watch else ())]))
        with _lock:
            entries = _read(path)
            entries.pop(key, None)
            kept = dict(list(entries.items())[-(ENTRIES - 1):])
            kept[key] = {"argv": list(argv), "watch": stamp(watched), "stdout": result.stdout}
            try:
                write_json_atomically(path, kept)
            except OSError:
                pass  # an unwritable cache only costs the next run the same time
    return result, False

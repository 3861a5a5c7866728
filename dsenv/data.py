"""Data tables shipped inside the package (TOML), loaded once.

Parsing TOML is slow for its size: the failure catalogue's tables (~450 KB) take 50-85 ms of
every `dsenv explain` and `dsenv doctor`. As Python keeps a module's bytecode, a parsed table
is kept beside it, in the table folder's __pycache__, as marshal data named by the table's
content hash and the interpreter's cache tag: the next process loads it in ~2 ms. A table that
changed has another hash; a folder that cannot be written (a system install) or a cache file
that does not load leave the plain parse. (It is data, not bytecode: PYTHONDONTWRITEBYTECODE,
which images often set, does not turn it off; DSENV_TABLE_CACHE=off does.)
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
from functools import cache
from importlib import resources
from pathlib import Path

from dsenv.staging import write_file_atomically

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@cache
def load_table(package: str, name: str) -> dict:
    """``load_table("dsenv.envs", "gpu_archs.toml")`` -> parsed TOML."""
    source = resources.files(package).joinpath(name)
    raw = source.read_bytes()
    kept = parsed_copy(source, raw)
    if kept is not None:
        try:
            return marshal.loads(kept.read_bytes())
        except (OSError, EOFError, ValueError, TypeError):
            pass  # not kept yet, or not loadable: parse
    table = tomllib.loads(raw.decode("utf-8"))
    if kept is not None:
        keep(kept, table)
    return table


def parsed_copy(source, raw: bytes) -> Path | None:
    """Where the parsed copy of the table ``source`` (holding ``raw``) is kept; None when the
    table is not a file on disk (a zip import)."""
    if not isinstance(source, Path) or os.environ.get("DSENV_TABLE_CACHE") == "off":
        return None
    digest = hashlib.sha1(raw).hexdigest()[:16]
    tag = sys.implementation.cache_tag or "python"
    return source.parent / "__pycache__" / f"{source.stem}.{digest}.{tag}.marshal"


def keep(path: Path, table: dict) -> None:
    """Write ``table`` to ``path`` (staged, then renamed into place) and drop the copies of
    the table's earlier contents; any failure leaves nothing behind and is not an error."""
    try:
        data = marshal.dumps(table)
    except ValueError:  # a value marshal cannot hold (a TOML date): parse each time
        return
    stem, tag_suffix = path.name.split(".", 1)[0], path.name.split(".", 2)[2]
    try:
        write_file_atomically(path, data)
        for old in path.parent.glob(f"{stem}.*.{tag_suffix}"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        return

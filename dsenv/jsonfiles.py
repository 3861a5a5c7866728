"""JSON files read with one clear error line, and written atomically (temp name, rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


class JsonFileError(ValueError):
    """A JSON file that cannot be read or parsed; the message names file, line and column."""


def read_json(path: str | Path, what: str) -> object:
    """Parse ``path``; ``what`` names it in errors ("ds_config", "SQuAD file")."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JsonFileError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JsonFileError(f"{what} {path}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{what} {path}: not valid JSON (line {exc.lineno}, column "
                            f"{exc.colno}: {exc.msg})") from None


def write_json_atomically(path: str | Path, data: object, **dump_options) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, **dump_options)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

"""JSON files read with one clear error line, and written atomically (temp name, rename)."""

from __future__ import annotations

import json
from pathlib import Path

from dsenv.staging import write_file_atomically


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
    return write_file_atomically(path, json.dumps(data, **dump_options) + "\n")

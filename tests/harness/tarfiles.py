"""Small sdists made by the tests (a DeepSpeed-like package that uv really builds)."""

from __future__ import annotations

import io
import tarfile


def add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    """One text file into an open tar archive."""
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))

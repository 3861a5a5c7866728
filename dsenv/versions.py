"""Version strings compared as numbers ("12.10" after "12.9")."""

from __future__ import annotations

import re


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'12.6.85' -> (12, 6, 85); 'V13.0' -> (13, 0); '' -> ()."""
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def major_minor(text: str | None) -> str:
    """'12.6.85' -> '12.6'."""
    return ".".join(str(p) for p in version_tuple(text)[:2])

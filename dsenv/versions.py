"""Version strings compared as numbers ("12.10" after "12.9")."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'12.6.85' -> (12, 6, 85); 'V13.0' -> (13, 0); '' -> ()."""
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def major_minor(text: str | None) -> str:
    """'12.6.85' -> '12.6'."""
    return ".".join(str(p) for p in version_tuple(text)[:2])


def same_version(a: str, b: str) -> bool:
    """'2.13.0' == '2.13' by PEP 440; text that is not a version compares as text."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b

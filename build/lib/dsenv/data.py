"""Data tables shipped inside the package (TOML), loaded once."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@cache
def load_table(package: str, name: str) -> dict:
    """``load_table("dsenv.envs", "gpu_archs.toml")`` -> parsed TOML."""
    return tomllib.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))

"""envs/deepspeed_arch_lists.toml: how each DeepSpeed release reads TORCH_CUDA_ARCH_LIST."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dsenv.data import load_table


@dataclass(frozen=True)
class ArchListParser:
    deepspeed: str  # the releases, a PEP 440 specifier
    reads: bool  # its JIT path reads the list at all
    accepts: str  # a regex an entry must match in full
    source: str  # the line that reads it, at a release

    def rejects(self, entries: list[str]) -> list[str]:
        """The entries this release's op builders cannot read."""
        if not self.reads:
            return []
        return [e for e in entries if not re.fullmatch(self.accepts, e)]


def deepspeed_parser(version: str) -> ArchListParser | None:
    """The row for a DeepSpeed release, None when none is recorded."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    for row in load_table("dsenv.envs", "deepspeed_arch_lists.toml").get("parser", []):
        if wanted in SpecifierSet(row["deepspeed"]):
            return ArchListParser(**row)
    return None

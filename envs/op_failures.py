"""envs/op_build_failures.toml: ops a given compiler is known not to compile."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dsenv.data import load_table


@dataclass(frozen=True)
class BuildFailure:
    op: str
    deepspeed: str
    nvcc: str
    error: str
    source: str

    def applies(self, op: str, deepspeed: str, nvcc: str | None) -> bool:
        if op != self.op or not nvcc:
            return False
        try:
            return (Version(deepspeed) in SpecifierSet(self.deepspeed)
                    and Version(nvcc) in SpecifierSet(self.nvcc))
        except InvalidVersion:
            return False


def build_failures() -> list[BuildFailure]:
    return [BuildFailure(**row) for row in
            load_table("dsenv.envs", "op_build_failures.toml").get("failure", [])]


def known_failure(op: str, deepspeed: str, nvcc: str | None) -> BuildFailure | None:
    """The recorded failure of ``op`` with this DeepSpeed and nvcc, if there is one."""
    return next((f for f in build_failures() if f.applies(op, deepspeed, nvcc)), None)

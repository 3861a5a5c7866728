"""envs/stacks.toml: which torch build, from which index, with which lock and toolkit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dsenv.data import load_table
from dsenv.envs import archs
from dsenv.envs.targets import sm_name, vendor_of
from dsenv.errors import UsageError
from dsenv.versions import version_tuple


@dataclass(frozen=True)
class Stack:
    """One row of envs/stacks.toml: a torch build, its source, lock and toolkit."""

    name: str
    vendor: str
    status: str
    torch: str
    local: str
    index_url: str
    find_links: tuple[str, ...]
    lock: str
    toolkit: str  # CUDA / ROCm version torch is built with; "" for cpu
    archs: tuple[str, ...]
    ptx: tuple[str, ...] = ()
    fallback_for: str = ""  # the stack this one replaces when that one's index is unreachable

    @property
    def torch_version(self) -> str:
        return self.torch + self.local

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch_version}"

    @property
    def toolkit_major(self) -> int | None:
        parts = version_tuple(self.toolkit)
        return parts[0] if parts else None

    @property
    def lock_path(self) -> Path:
        """envs/locks/<lock> inside the installed package (written by `dsenv lock`)."""
        return Path(str(resources.files("dsenv.envs").joinpath("locks", self.lock)))

    def available_find_links(self) -> list[str]:
        return [p for p in self.find_links if os.path.isdir(p)]

    def serves(self, arch: str) -> bool:
        """Whether torch's wheels of this stack carry kernels that run on ``arch``."""
        if self.vendor != vendor_of(arch):
            return False
        capability = archs.cuda_capability(arch)
        if capability is None:
            return arch in self.archs
        for shipped in self.archs:
            have = archs.cuda_capability(shipped)
            if have[0] == capability[0] and have[1] <= capability[1]:
                return True
        return any(archs.cuda_capability(p) <= capability for p in self.ptx)

    def describe_archs(self) -> str:
        text = ", ".join(sm_name(a) for a in self.archs)
        return text + (f" (+PTX {', '.join(sm_name(p) for p in self.ptx)})" if self.ptx else "")

    def to_json(self) -> dict:
        return {"name": self.name, "vendor": self.vendor, "torch": self.torch_version,
                "index_url": self.index_url, "lock": self.lock, "toolkit": self.toolkit}


def load_stacks() -> dict[str, Stack]:
    rows = load_table("dsenv.envs", "stacks.toml")["stack"]
    return {r["name"]: Stack(r["name"], r["vendor"], r["status"], r["torch"], r["local"],
                             r["index_url"], tuple(r.get("find_links", ())), r["lock"],
                             r.get("toolkit", ""), tuple(r.get("archs", ())),
                             tuple(r.get("ptx", ())), r.get("fallback_for", "")) for r in rows}


def stack_names() -> list[str]:
    return list(load_stacks())


def get_stack(name: str) -> Stack:
    stacks = load_stacks()
    if name not in stacks:
        raise UsageError(f"--stack {name}: unknown stack; known stacks: "
                             + ", ".join(stacks))
    return stacks[name]

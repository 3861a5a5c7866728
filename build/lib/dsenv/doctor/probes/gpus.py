"""GPU inventory: NVIDIA through nvidia-smi, AMD through rocm-smi/amd-smi/rocminfo."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    vendor: str  # "nvidia" | "amd"
    index: int  # physical index as the vendor tool numbers it
    name: str
    arch: str  # normalized: "8.0" or "gfx90a" (dsenv.envs.archs.normalize_arch)
    memory_mib: int | None = None
    driver: str | None = None
    uuid: str | None = None
    bus_id: str | None = None

"""GPU architecture facts, read from gpu_archs.toml: names, archs, bf16 support."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsenv.data import load_table


@dataclass(frozen=True)
class GpuModel:
    names: tuple[str, ...]
    vendor: str  # "nvidia" | "amd"
    arch: str  # "8.0" or "gfx90a"
    generation: str
    bf16: bool


MODELS: tuple[GpuModel, ...] = tuple(
    GpuModel(tuple(row["names"]), row["vendor"], row["arch"], row["generation"], row["bf16"])
    for row in load_table("dsenv.envs", "gpu_archs.toml")["gpu"]
)


def normalize_arch(text: str) -> str:
    """'sm_80' / '80' / '8.0' -> '8.0'; 'gfx90a:xnack-' -> 'gfx90a'. ValueError otherwise."""
    value = text.strip().lower()
    if value.startswith("gfx"):
        match = re.fullmatch(r"gfx[0-9a-f]{3,4}", value.split(":")[0])
        if match:
            return match.group()
    match = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?(?:\+ptx)?", value)
    if match:
        major, minor = match.groups()
        if minor is None:  # "80" / "sm_80" / "sm_100": last digit is the minor
            digits = match.group(1)
            if len(digits) < 2:
                raise ValueError(f"{text!r} is not a GPU architecture")
            major, minor = digits[:-1], digits[-1]
        return f"{int(major)}.{minor}"
    raise ValueError(f"{text!r} is not a GPU architecture (expected e.g. 8.0, sm_80 or gfx90a)")


def cuda_capability(arch: str) -> tuple[int, int] | None:
    """'8.0' -> (8, 0); AMD archs -> None."""
    if arch.startswith("gfx"):
        return None
    major, minor = arch.split(".")
    return int(major), int(minor)


def model_for_name(name: str) -> GpuModel | None:
    """The table row whose name appears in a device name ('NVIDIA A100-SXM4-80GB' -> A100)."""
    upper = name.upper()
    best = None
    for model in MODELS:
        for candidate in model.names:
            if re.search(rf"(?<![A-Z0-9]){re.escape(candidate.upper())}(?![0-9])", upper):
                if best is None or len(candidate) > len(best[1]):
                    best = (model, candidate)
    return best[0] if best else None


def models_for_arch(arch: str) -> list[GpuModel]:
    return [m for m in MODELS if m.arch == arch]


def bf16_supported(arch: str) -> bool:
    capability = cuda_capability(arch)
    if capability is not None:
        return capability >= (8, 0)
    rows = models_for_arch(arch)
    return any(m.bf16 for m in rows)

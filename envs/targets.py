"""``--arch SPEC`` -> :class:`Target`: a vendor and its GPU architectures.

Archs and GPU names come from envs/gpu_archs.toml. ``auto`` needs the GPUs of a node, which
the caller passes in as ``detect`` (provision asks the node-facts GPU probes). Nothing here
imports torch or DeepSpeed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dsenv.data import load_table
from dsenv.envs import archs
from dsenv.errors import UsageError
from dsenv.suggest import did_you_mean

VENDORS = ("nvidia", "amd", "cpu")
# The variables torch's extension builder (torch/utils/cpp_extension.py) and DeepSpeed's op
# builders read; both split them on ";" (spaces are accepted too and turned into ";").
ARCH_VARIABLES = {"nvidia": "TORCH_CUDA_ARCH_LIST", "amd": "PYTORCH_ROCM_ARCH"}
ACCEPTED_FORMS = ("compute capabilities (7.0, sm_80, 80, '8.0;9.0', '8.0,9.0'), AMD gfx "
                  "targets (gfx908, gfx90a, gfx942), GPU names ({names}), 'auto' (the GPUs "
                  "of this node) or 'cpu' (a CPU-only stack)")


# -- archs ------------------------------------------------------------------------------
def known_archs(vendor: str) -> tuple[str, ...]:
    return tuple(load_table("dsenv.envs", "gpu_archs.toml")["known_archs"][vendor])


def vendor_of(arch: str) -> str:
    return "amd" if arch.startswith("gfx") else "nvidia"


def arch_key(arch: str) -> tuple:
    """Numeric order: 9.0 before 10.0, gfx90a before gfx1100."""
    capability = archs.cuda_capability(arch)
    if capability is not None:
        return (0, capability)
    return (1, (int(arch[3:], 16), 0))


def sm_name(arch: str) -> str:
    """'7.0' -> 'sm_70'; AMD targets stay as they are."""
    capability = archs.cuda_capability(arch)
    return f"sm_{capability[0]}{capability[1]}" if capability else arch


def generation(arch: str) -> str:
    rows = archs.models_for_arch(arch)
    return rows[0].generation if rows else ""


def describe_arch(arch: str) -> str:
    """'sm_70 (Volta)'."""
    gen = generation(arch)
    return f"{sm_name(arch)} ({gen})" if gen else sm_name(arch)


def all_gpu_names() -> list[str]:
    return [name for model in archs.MODELS for name in model.names]


def _accepted() -> str:
    return ACCEPTED_FORMS.format(names=", ".join(all_gpu_names()))


# -- targets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What the environment is built for: a vendor and its GPU architectures."""

    vendor: str  # "nvidia" | "amd" | "cpu"
    archs: tuple[str, ...] = ()  # normalized ("7.0", "gfx90a"), sorted, no duplicates
    gpu_names: tuple[str, ...] = ()  # names given on the command line or detected
    source: str = ""  # how it was resolved ("--arch V100", "auto: nvidia-smi ...")

    @property
    def bf16(self) -> bool:
        """Native bfloat16 on every target arch (CPU: torch's CPU kernels have bf16)."""
        return all(archs.bf16_supported(a) for a in self.archs)

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"

    def arch_env(self) -> dict[str, str]:
        """{"TORCH_CUDA_ARCH_LIST": "7.0;8.0"} / {"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"} / {}."""
        if self.vendor not in ARCH_VARIABLES:
            return {}
        return {ARCH_VARIABLES[self.vendor]: ";".join(self.archs)}

    def describe(self) -> str:
        if self.vendor == "cpu":
            return "cpu (no GPU)"
        text = f"{self.vendor} " + ", ".join(describe_arch(a) for a in self.archs)
        return text + (f" [{', '.join(self.gpu_names)}]" if self.gpu_names else "")

    def to_json(self) -> dict:
        return {"vendor": self.vendor, "archs": list(self.archs),
                "gpu_names": list(self.gpu_names), "bf16": self.bf16, "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> Target:
        return cls(data["vendor"], tuple(data.get("archs", ())), tuple(data.get("gpu_names", ())),
                   data.get("source", ""))


CPU = Target("cpu", source="--arch cpu")


def make_target(vendor: str, arch_list: Iterable[str], names: Iterable[str] = (),
                source: str = "") -> Target:
    unique = sorted(set(arch_list), key=arch_key)
    seen: list[str] = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return Target(vendor, tuple(unique), tuple(seen), source)


def _model_named(text: str) -> archs.GpuModel | None:
    return _named(text)[0]


def _named(text: str) -> tuple[archs.GpuModel | None, str]:
    """The table row with this GPU name (case-insensitive) and the table's spelling."""
    wanted = text.strip().lower()
    for model in archs.MODELS:
        for name in model.names:
            if name.lower() == wanted:
                return model, name
    return None, text


def _parse_arch(token: str, spec: str) -> str:
    try:
        arch = archs.normalize_arch(token)
    except ValueError:
        arch = None
    if arch is None or arch not in known_archs(vendor_of(arch)):
        choices = [*known_archs("nvidia"), *known_archs("amd"), *all_gpu_names(), "auto", "cpu"]
        raise UsageError(
            f"--arch {spec}: {token!r} is neither a GPU architecture nor a GPU name dsenv "
            f"knows;" + (did_you_mean(token, choices) or " accepted: compute capabilities "
                         "(7.0, sm_80), AMD gfx targets (gfx90a), GPU names (A100, H100, "
                         "MI250X), 'auto' or 'cpu' (see `dsenv provision --help`)"))
    return arch


def _pieces(spec: str) -> list[str]:
    """'8.0;9.0' / '8.0,9.0' / '7.0 8.0' / 'Tesla V100, A100' -> the entries."""
    pieces = []
    for part in re.split(r"[;,]", spec):
        part = part.strip()
        if not part:
            continue
        if _model_named(part) or not re.search(r"\s", part):
            pieces.append(part)
        else:  # "7.0 8.0" (TORCH_CUDA_ARCH_LIST style)
            pieces.extend(part.split())
    return pieces


def resolve_arch(spec: str, detect: Callable[[], Iterable] | None = None) -> Target:
    """``--arch`` -> Target.

    ``spec``: compute capabilities ("7.0", "sm_80", "8.0;9.0", "8.0,9.0"), AMD gfx targets,
    GPU names (case-insensitive: "V100", "mi250x"), "cpu", or "auto". For "auto",
    ``detect()`` returns the visible GPUs (objects with ``vendor``, ``arch``, ``name``, like
    the doctor's :class:`~dsenv.facts.gpu.inventory.Gpu`); by default the doctor's GPU probes
    run on this node. UsageError for unknown entries, NVIDIA and AMD mixed, or no GPU.
    """
    text = (spec or "").strip()
    if not text:
        raise UsageError(f"--arch is empty; accepted: {_accepted()}")
    if text.lower() == "cpu":
        return CPU
    if text.lower() == "auto":
        return _from_detected(text, detect)
    found: list[tuple[str, str, str | None]] = []  # (vendor, arch, name)
    whole = _model_named(text)
    pieces = [text] if whole else _pieces(text)
    for piece in pieces:
        if piece.lower() in ("cpu", "auto"):
            raise UsageError(f"--arch {text}: {piece!r} cannot be combined with other "
                                 "archs; pass it alone")
        model = _model_named(piece)
        if model is not None:
            found.append((model.vendor, model.arch, piece))
        else:
            arch = _parse_arch(piece, text)
            found.append((vendor_of(arch), arch, None))
    _one_vendor(text, [(v, a) for v, a, _ in found])
    names = [_named(name)[1] for _, _, name in found if name is not None]
    return make_target(found[0][0], [a for _, a, _ in found], names, f"--arch {text}")


def _one_vendor(spec: str, items: list[tuple[str, str]]) -> None:
    vendors = sorted({v for v, _ in items})
    if len(vendors) > 1:
        by = {v: sorted({describe_arch(a) for w, a in items if w == v}) for v in vendors}
        listed = "; ".join(f"{v}: {', '.join(a)}" for v, a in by.items())
        raise UsageError(
            f"--arch {spec}: mixes NVIDIA and AMD GPUs ({listed}); one environment is built "
            "for one vendor's torch: provision one environment per GPU partition")


def _from_detected(spec: str, detect) -> Target:
    if detect is None:
        raise UsageError("--arch auto needs the GPUs of this node; pass --arch explicitly")
    found = detect()
    gpus, tools = found if isinstance(found, tuple) else (list(found), "")
    if not gpus:
        raise UsageError(
            "--arch auto: no GPU visible on this node" + (f" ({tools})" if tools else "")
            + ": pass --arch with the compute nodes' GPUs, e.g. `--arch 8.0` or a GPU name "
            "(`--arch A100`), or `--arch cpu` for a CPU-only stack")
    unknown = [g for g in gpus if not getattr(g, "arch", "")]
    if unknown:
        raise UsageError(
            f"--arch auto: the architecture of {unknown[0].name} is unknown (not reported by "
            "the vendor tool and not in envs/gpu_archs.toml): pass --arch, e.g. `--arch 8.0`")
    _one_vendor(spec, [(g.vendor, g.arch) for g in gpus])
    names = [g.name for g in gpus]
    source = "auto: " + ", ".join(f"{g.name} ({sm_name(g.arch)})" for g in gpus)
    return make_target(gpus[0].vendor, [g.arch for g in gpus], names, source)

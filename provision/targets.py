"""``--arch SPEC`` -> :class:`Target`; a target (and the node's nvcc) -> :class:`Stack`.

Archs and GPU names come from envs/gpu_archs.toml, stacks from envs/stacks.toml, what an
nvcc can build from envs/cuda_toolkits.toml (through the doctor's toolkit probe helpers), and
``--arch auto`` asks the doctor's GPU probes (nvidia-smi, amd-smi, rocminfo, rocm-smi, after
CUDA/ROCR/HIP_VISIBLE_DEVICES). Nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dsenv.envs import archs

from dsenv.data import load_table

from . import ProvisionError

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
        raise ProvisionError(
            f"--arch {spec}: {token!r} is neither a GPU architecture nor a GPU name dsenv "
            f"knows; accepted: {_accepted()}")
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
    the doctor's :class:`~dsenv.doctor.probes.gpus.Gpu`); by default the doctor's GPU probes
    run on this node. ProvisionError for unknown entries, NVIDIA and AMD mixed, or no GPU.
    """
    text = (spec or "").strip()
    if not text:
        raise ProvisionError(f"--arch is empty; accepted: {_accepted()}")
    if text.lower() == "cpu":
        return CPU
    if text.lower() == "auto":
        return _from_detected(text, detect)
    found: list[tuple[str, str, str | None]] = []  # (vendor, arch, name)
    whole = _model_named(text)
    pieces = [text] if whole else _pieces(text)
    for piece in pieces:
        if piece.lower() in ("cpu", "auto"):
            raise ProvisionError(f"--arch {text}: {piece!r} cannot be combined with other "
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
        raise ProvisionError(
            f"--arch {spec}: mixes NVIDIA and AMD GPUs ({listed}); one environment is built "
            "for one vendor's torch: provision one environment per GPU partition")


def _from_detected(spec: str, detect) -> Target:
    tools = ""
    if detect is None:
        gpus, tools = _detect_here()
    else:
        gpus = list(detect())
    if not gpus:
        raise ProvisionError(
            "--arch auto: no GPU visible on this node" + (f" ({tools})" if tools else "")
            + ": pass --arch with the compute nodes' GPUs, e.g. `--arch 8.0` or a GPU name "
            "(`--arch A100`), or `--arch cpu` for a CPU-only stack")
    unknown = [g for g in gpus if not getattr(g, "arch", "")]
    if unknown:
        raise ProvisionError(
            f"--arch auto: the architecture of {unknown[0].name} is unknown (not reported by "
            "the vendor tool and not in envs/gpu_archs.toml): pass --arch, e.g. `--arch 8.0`")
    _one_vendor(spec, [(g.vendor, g.arch) for g in gpus])
    names = [g.name for g in gpus]
    source = "auto: " + ", ".join(f"{g.name} ({sm_name(g.arch)})" for g in gpus)
    return make_target(gpus[0].vendor, [g.arch for g in gpus], names, source)


def detect_gpus(env=None) -> list:
    """The GPUs a job started here would see, through the doctor's probes."""
    return _detect_here(env)[0]


def _detect_here(env=None) -> tuple[list, str]:
    from dsenv.doctor.context import Context, Options
    from dsenv.doctor.probes import gpus

    ctx = Context(options=Options(target="login"), env=dict(env if env is not None
                                                              else os.environ))
    found = list(gpus.visible_gpus(ctx))
    tools = "; ".join(f"{t.tool}: {t.status if t.status != 'ok' else t.detail}"
                      for t in gpus.inventory(ctx).tools)
    return found, tools


# -- stacks -----------------------------------------------------------------------------
def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


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
                             tuple(r.get("ptx", ()))) for r in rows}


def stack_names() -> list[str]:
    return list(load_stacks())


def get_stack(name: str) -> Stack:
    stacks = load_stacks()
    if name not in stacks:
        raise ProvisionError(f"--stack {name}: unknown stack; known stacks: "
                             + ", ".join(stacks))
    return stacks[name]


def _newest_first(stacks: Iterable[Stack]) -> list[Stack]:
    return sorted(stacks, key=lambda s: version_tuple(s.toolkit), reverse=True)


def _unserved(stack: Stack, target: Target) -> list[str]:
    return [a for a in target.archs if not stack.serves(a)]


def _major_minor(version: str) -> str:
    return ".".join(str(p) for p in version_tuple(version)[:2])


def _dropped_by(arch: str) -> str | None:
    """'CUDA 13 dropped sm_50–sm_72': the toolkit release that stopped building ``arch``."""
    from dsenv.doctor.probes import toolkit

    rows = sorted(load_table("dsenv.envs", "cuda_toolkits.toml")["toolkit"],
                  key=lambda r: version_tuple(r["version"]))
    for before, after in zip(rows, rows[1:], strict=False):
        if (toolkit.can_build(toolkit.toolkit_row(before["version"]), arch)
                and not toolkit.can_build(toolkit.toolkit_row(after["version"]), arch)):
            lowest = archs.cuda_capability(after["min_arch"])
            if archs.cuda_capability(arch) >= lowest:
                return None  # dropped at the top end, not the bottom
            below = [a for a in known_archs("nvidia") if archs.cuda_capability(a) < lowest
                     and archs.cuda_capability(a) >= archs.cuda_capability(before["min_arch"])]
            major = version_tuple(after["version"])[0]
            return f"CUDA {major} dropped {sm_name(below[0])}–{sm_name(below[-1])}"
    return None


def _nvcc_refusal(toolkit_version: str, target: Target, serving: list[Stack]) -> str | None:
    """Why this node's nvcc cannot compile ops for the target (None when it can)."""
    from dsenv.doctor.probes import toolkit

    label = f"CUDA {_major_minor(toolkit_version)}"
    row = toolkit.toolkit_row(toolkit_version)
    fix_stack = next((s for s in serving if (r := toolkit.toolkit_row(s.toolkit)) is not None
                      and all(toolkit.can_build(r, a) for a in target.archs)), None)
    if fix_stack is not None:
        fix_version = fix_stack.toolkit
    else:  # no stack given: the newest toolkit of the table that builds every arch
        rows = [r for r in load_table("dsenv.envs", "cuda_toolkits.toml")["toolkit"]
                if all(toolkit.can_build(toolkit.toolkit_row(r["version"]), a)
                       for a in target.archs)]
        fix_version = max((r["version"] for r in rows), key=version_tuple, default=None)
    if fix_version:
        fix = (f"load a CUDA {version_tuple(fix_version)[0]}.x module (e.g. `module load "
               f"cuda/{fix_version}`) or pass --ops none")
    else:
        fix = "pass --ops none (no CUDA toolkit builds every one of these archs)"
    if row is None:
        return (f"{label}'s nvcc is not in envs/cuda_toolkits.toml (oldest known: 11.0), so "
                f"it cannot be trusted to build {', '.join(map(sm_name, target.archs))}: {fix}")
    cannot = [a for a in target.archs if not toolkit.can_build(row, a)]
    if not cannot:
        return None
    lowest, highest = archs.cuda_capability(row.min_arch), archs.cuda_capability(row.max_arch)
    why = []
    too_old = [a for a in cannot if archs.cuda_capability(a) < lowest]
    too_new = [a for a in cannot if archs.cuda_capability(a) > highest]
    if too_old:
        drops = sorted({d for a in too_old if (d := _dropped_by(a))})
        why.extend(drops or [f"its oldest arch is {sm_name(row.min_arch)}"])
    if too_new:
        why.append(f"its newest arch is {sm_name(row.max_arch)}")
    gens = sorted({generation(a) for a in cannot if generation(a)})
    inside = "; ".join(([", ".join(gens)] if gens else []) + why)
    return (f"{label}'s nvcc cannot build {', '.join(sm_name(a) for a in cannot)} "
            f"({inside}): {fix}")


def _major_refusal(toolkit_version: str, serving: list[Stack]) -> str | None:
    major = version_tuple(toolkit_version)[0]
    if any(s.toolkit_major == major for s in serving):
        return None
    offered = ", ".join(f"{s.name} (CUDA {s.toolkit})" for s in serving)
    example = serving[0]
    return (f"nvcc {toolkit_version} is CUDA {major}, but torch for these archs is built with "
            f"another CUDA major ({offered}); DeepSpeed refuses to compile ops with an nvcc "
            "whose CUDA major differs from torch's (op_builder/builder.py "
            f"assert_no_cuda_mismatch): load a CUDA {example.toolkit_major}.x module (e.g. "
            f"`module load cuda/{example.toolkit}`) or pass --ops none")


def _stack_problem(stack: Stack, target: Target, toolkit_version: str | None) -> str | None:
    if stack.vendor != target.vendor:
        return f"it is built for {stack.vendor}, the target is {target.describe()}"
    missing = _unserved(stack, target)
    if missing:
        return (f"torch {stack.torch_version} ships kernels for {stack.describe_archs()}; "
                f"{', '.join(describe_arch(a) for a in missing)} is not among them")
    if target.vendor == "nvidia" and toolkit_version:
        return (_nvcc_refusal(toolkit_version, target, [stack])
                or _major_refusal(toolkit_version, [stack]))
    return None


def choose_stack(target: Target, toolkit_version: str | None = None,
                 requested: str | None = None) -> Stack:
    """The stack to build for ``target``.

    Without ``requested``: the newest non-experimental stack of the target's vendor whose
    torch ships kernels for every target arch. ``toolkit_version`` is the version of the
    nvcc that will compile DeepSpeed's ops on this node (pass it only when ops are compiled:
    with --ops none nvcc is never used): it must build every target arch (CUDA 13 cannot build
    sm_70) and have the CUDA major of the stack's torch. ProvisionError with the reason and
    a way out when nothing fits, or when ``requested`` cannot serve the target.
    """
    stacks = load_stacks()
    if requested:
        stack = get_stack(requested)
        problem = _stack_problem(stack, target, toolkit_version)
        if problem:
            others = [s.name for s in _newest_first(stacks.values())
                      if s.name != stack.name and not _stack_problem(s, target, toolkit_version)]
            hint = f" (stacks that can: {', '.join(others)})" if others else ""
            raise ProvisionError(f"--stack {requested} cannot serve {target.describe()}: "
                                 f"{problem}{hint}")
        return stack
    same_vendor = [s for s in stacks.values()
                   if s.vendor == target.vendor and s.status != "experimental"]
    if not same_vendor:
        raise ProvisionError(f"no {target.vendor} stack in envs/stacks.toml")
    serving = [s for s in _newest_first(same_vendor) if not _unserved(s, target)]
    if not serving:
        offered = "; ".join(f"{s.name}: {s.describe_archs()}" for s in _newest_first(same_vendor))
        missing = sorted({a for s in same_vendor for a in _unserved(s, target)}, key=arch_key)
        raise ProvisionError(
            f"no torch {same_vendor[0].torch} stack ships kernels for "
            f"{', '.join(describe_arch(a) for a in missing)} ({offered}): provision for newer "
            "GPUs with --arch, build torch from source for these, or use `--arch cpu`")
    if target.vendor == "nvidia" and toolkit_version:
        refusal = _nvcc_refusal(toolkit_version, target, serving)
        if refusal:
            raise ProvisionError(refusal)
        refusal = _major_refusal(toolkit_version, serving)
        if refusal:
            raise ProvisionError(refusal)
        major = version_tuple(toolkit_version)[0]
        serving = [s for s in serving if s.toolkit_major == major]
    return serving[0]


def node_nvcc_version(env=None) -> str | None:
    """The version of the nvcc DeepSpeed would compile with here (the doctor's probe)."""
    from dsenv.doctor.context import Context, Options
    from dsenv.doctor.probes import toolkit

    ctx = Context(options=Options(target="login"),
                  env=dict(env if env is not None else os.environ))
    tool = toolkit.nvcc(ctx)
    return tool.version if tool.found else None

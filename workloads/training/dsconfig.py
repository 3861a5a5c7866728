"""DeepSpeed configs: presets by name, a user's ds_config on top, derived batch sizes.

Pure Python (no torch): the batch arithmetic is checked before any engine starts.

    train_batch_size = micro-batch x gradient accumulation x world size

is always derived here and never taken on trust from a file, so the same command works on
1, 2 or 64 GPUs. A user ds_config whose train_batch_size contradicts the world size is
rejected with the numbers. The file itself is read and its batch values judged by the
doctor's reader (dsenv/facts/python/dsconfig.py), so `dsenv doctor --deepspeed-config` and
`dsenv smoke/run --deepspeed-config` give one verdict on one file.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path

from dsenv.data import load_table
from dsenv.facts.python import dsconfig as ds_file
from dsenv.workloads.errors import WorkloadError

LR_SCALINGS = ("none", "linear", "sqrt")
_ADAMS = ("adam", "adamw")


def presets() -> dict:
    return load_table("dsenv.workloads", "presets.toml")


def preset_names() -> tuple[str, ...]:
    return tuple(presets())


def check_inputs(preset: str, user_config: str | Path | None) -> dict:
    """Fail fast (before torch is even imported) on an unknown preset or a bad ds_config."""
    if preset not in presets():
        raise WorkloadError(f"unknown preset {preset!r}; choose one of {', '.join(presets())}")
    return load_user_config(user_config) if user_config else {}


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int
    grad_accum: int
    world_size: int

    @property
    def train_batch_size(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def describe(self) -> str:
        return (f"{self.train_batch_size} = micro-batch {self.micro_batch} x grad-accum "
                f"{self.grad_accum} x world size {self.world_size}")


@dataclass(frozen=True)
class PlannedConfig:
    preset: str
    config: dict
    batch: BatchPlan
    base_lr: float
    lr: float
    lr_scaling: str
    user_config: str | None
    # Gradient clipping dsenv applies between backward and step instead of DeepSpeed (its
    # clip_grad_norm_ makes two host syncs a step); 0: none, or DeepSpeed's own.
    outside_clipping: float = 0.0
    variant: str = "default"  # which of the preset's configs: "default" or "gpu"
    variant_source: str | None = None

    def summary(self) -> dict:
        return {"preset": self.preset, "user_config": self.user_config,
                "micro_batch": self.batch.micro_batch, "grad_accum": self.batch.grad_accum,
                "world_size": self.batch.world_size,
                "train_batch_size": self.batch.train_batch_size,
                "base_lr": self.base_lr, "lr": self.lr, "lr_scaling": self.lr_scaling,
                "config_variant": self.variant, "config_variant_source": self.variant_source,
                "outside_clipping": self.outside_clipping}


def load_user_config(path: str | Path) -> dict:
    """A user's ds_config, read and its batch values judged as the doctor's job check does
    (one line naming the file and the key: NaN, "sixteen", 0, 2.5, true are refused)."""
    try:
        return ds_file.check_batch_values(ds_file.read_config(path), path)
    except ds_file.DsConfigError as exc:
        raise WorkloadError(str(exc)) from None


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; ``override`` wins. Neither input is modified."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _given(config: dict, key: str) -> int | None:
    """A batch value from a user config; HF's "auto" counts as not given."""
    try:
        return ds_file.batch_value(config, key)
    except ds_file.DsConfigError as exc:
        raise WorkloadError(str(exc)) from None


def plan_batch(world_size: int, default_micro_batch: int, user: dict,
               micro_batch: int | None = None, grad_accum: int | None = None) -> BatchPlan:
    """Micro-batch and accumulation from the command line, else the user config, else the
    workload's default; what is missing DeepSpeed's way (ds_file.derive_batch), the global
    batch derived, and a contradicting one rejected."""
    user_tbs = _given(user, ds_file.TRAIN)
    mb = micro_batch or _given(user, ds_file.MICRO)
    ga = grad_accum or _given(user, ds_file.ACCUM)
    if mb is None and user_tbs is None:
        mb = default_micro_batch
    _, mb, ga, derived = ds_file.derive_batch(user_tbs, mb, ga, world_size)
    if ds_file.MICRO in derived and (mb < 1 or user_tbs != mb * ga * world_size):
        raise WorkloadError(
            f"ds_config train_batch_size {user_tbs} cannot be split over grad-accum {ga} x "
            f"world size {world_size} = {ga * world_size}; drop train_batch_size (dsenv "
            f"derives it) or set train_micro_batch_size_per_gpu")
    plan = BatchPlan(mb, max(ga, 1), world_size)
    if user_tbs is not None and user_tbs != plan.train_batch_size:
        raise WorkloadError(
            f"ds_config train_batch_size {user_tbs} contradicts this run: micro-batch "
            f"{plan.micro_batch} x grad-accum {plan.grad_accum} x world size {world_size} = "
            f"{plan.train_batch_size}; drop train_batch_size (dsenv derives it)")
    return plan


def scale_lr(lr: float, world_size: int, scaling: str) -> float:
    if scaling == "none":
        return lr
    if scaling == "linear":
        return lr * world_size
    if scaling == "sqrt":
        return lr * math.sqrt(world_size)
    raise WorkloadError(f"unknown --lr-scaling {scaling!r}; choose one of {', '.join(LR_SCALINGS)}")


def _enabled(config: dict, key: str) -> bool:
    section = config.get(key)
    return isinstance(section, dict) and bool(section.get("enabled"))


def offloads_optimizer(config: dict) -> bool:
    zero = config.get("zero_optimization") or {}
    return (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")


def build_config(preset: str, world_size: int, *, on_gpu: bool, default_micro_batch: int,
                 default_lr: float, micro_batch: int | None = None,
                 grad_accum: int | None = None, lr: float | None = None,
                 lr_scaling: str = "none", user_config: str | Path | None = None,
                 warmup_steps: int = 0, total_steps: int | None = None) -> PlannedConfig:
    user = check_inputs(preset, user_config)
    entry = presets()[preset]
    if entry.get("needs") == "gpu" and not on_gpu:
        raise WorkloadError(f"preset {preset} needs a GPU (no GPU here); use bf16 or fp32 on CPU")
    # A user's ds_config that picks its own precision keeps the preset's default variant:
    # the GPU variant's torch_autocast would run beside the user's bf16/fp16 mode.
    own_precision = any(key in user for key in ("bf16", "fp16", "torch_autocast", "amp"))
    variant = gpu_variant(entry) if on_gpu and not own_precision else None
    config = merge(variant["config"] if variant else entry["config"], user)
    if _enabled(config, "fp16") and not on_gpu:
        raise WorkloadError("fp16 needs a GPU (DeepSpeed's CPU accelerator has no fp16); "
                            "use bf16 or fp32 on CPU")

    batch = plan_batch(world_size, default_micro_batch, user, micro_batch, grad_accum)
    config["train_micro_batch_size_per_gpu"] = batch.micro_batch
    config["gradient_accumulation_steps"] = batch.grad_accum
    config["train_batch_size"] = batch.train_batch_size

    optimizer = config.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = optimizer.setdefault("params", {})
    user_lr = ((user.get("optimizer") or {}).get("params") or {}).get("lr")
    base_lr = lr if lr is not None else (user_lr if isinstance(user_lr, (int, float))
                                         else default_lr)
    if base_lr < 0:
        raise WorkloadError(f"learning rate must be >= 0, got {base_lr}")
    effective_lr = scale_lr(float(base_lr), world_size, lr_scaling)
    params["lr"] = effective_lr
    if (not on_gpu and str(optimizer.get("type", "")).lower() in _ADAMS
            and not offloads_optimizer(config)):
        params.setdefault("torch_adam", True)  # no fused_adam JIT build on CPU

    outside = outside_clipping(config) if variant and variant.get("clip_outside_engine") else 0.0
    if outside:
        config["gradient_clipping"] = 0.0
    planned = PlannedConfig(preset, config, batch, float(base_lr), effective_lr, lr_scaling,
                            str(user_config) if user_config else None, outside,
                            "gpu" if variant else "default",
                            variant.get("source") if variant else None)
    return with_schedule(planned, warmup_steps, total_steps) if total_steps else planned


def gpu_variant(entry: dict) -> dict | None:
    """The preset's GPU configuration when this DeepSpeed has what it needs, else None (the
    default configuration runs)."""
    variant = entry.get("gpu")
    if not variant:
        return None
    needed = variant.get("requires_deepspeed_file")
    return variant if not needed or _deepspeed_has(needed) else None


def _deepspeed_has(relative: str) -> bool:
    """Whether the installed DeepSpeed ships ``relative`` (asked of the package's files,
    without importing it: importing deepspeed imports torch)."""
    try:
        spec = find_spec("deepspeed")
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec else None
    return bool(origin) and (Path(origin).parent / relative).is_file()


def outside_clipping(config: dict) -> float:
    """The clipping norm dsenv applies itself: only without ZeRO (gradients whole in every
    rank after backward's all-reduce) and without fp16 loss scaling (gradients unscaled)."""
    stage = int((config.get("zero_optimization") or {}).get("stage", 0))
    autocast = config.get("torch_autocast") or {}
    scaled = _enabled(config, "fp16") or (
        autocast.get("enabled") and str(autocast.get("dtype", "")).endswith("16")
        and "bfloat" not in str(autocast.get("dtype", "")))
    clip = config.get("gradient_clipping") or 0.0
    return float(clip) if stage == 0 and not scaled and float(clip) > 0 else 0.0


def with_schedule(planned: PlannedConfig, warmup_steps: int, total_steps: int) -> PlannedConfig:
    """Linear warm-up then linear decay over ``total_steps``, unless the user's ds_config
    brought its own scheduler (for runs whose step count is known only after the data)."""
    if "scheduler" in planned.config:
        return planned
    config = copy.deepcopy(planned.config)
    config["scheduler"] = {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": planned.lr,
        "warmup_num_steps": max(1, warmup_steps), "warmup_type": "linear",
        "total_num_steps": max(total_steps, warmup_steps + 1)}}
    return replace(planned, config=config)


def zero_stage(preset: str, user_config: str | Path | None = None) -> int:
    """The ZeRO stage a preset (with a user's ds_config over it) runs, before any engine."""
    config = merge(presets()[preset]["config"], check_inputs(preset, user_config))
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def without_gradient_sync(planned: PlannedConfig) -> PlannedConfig:
    """The config for ranks that train independently (--no-sync-gradients: one model per
    rank, the best kept): no ZeRO, whose stages partition gradients and optimizer states
    over the ranks, and no gradient clipping, since DeepSpeed averages the clipping norm over
    the ranks: the one collective a step would still make."""
    stage = int((planned.config.get("zero_optimization") or {}).get("stage", 0))
    if stage:
        raise WorkloadError(f"--no-sync-gradients trains one model per rank: it needs a preset "
                            f"without ZeRO (fp32, bf16, fp16), not {planned.preset} (ZeRO "
                            f"stage {stage})")
    config = copy.deepcopy(planned.config)
    config["gradient_clipping"] = 0.0
    return replace(planned, config=config, outside_clipping=0.0)


def required_ops(config: dict, on_gpu: bool, world_size: int = 2) -> list[str]:
    """The DeepSpeed C++ ops this config makes DeepSpeed load (JIT-built when missing).
    shm_comm speeds up CPU collectives between ranks of a node: one rank has none
    (engine.init_distributed keeps DeepSpeed from building it then)."""
    ops = [] if on_gpu or world_size < 2 else ["deepspeed_shm_comm"]
    optimizer = config.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() in _ADAMS:
        if (optimizer.get("params") or {}).get("torch_adam"):
            pass
        elif offloads_optimizer(config):
            ops.append("cpu_adam")
        else:
            ops.append("fused_adam")
    return ops

"""A DeepSpeed JSON config, read and judged the way DeepSpeed's DeepSpeedConfig does.

Batch sizes follow runtime/config.py (_set_batch_related_parameters + _batch_assertion):
any two of train_batch_size, train_micro_batch_size_per_gpu and
gradient_accumulation_steps determine the third with integer division, one alone means
gradient accumulation 1, and then train = micro x accumulation x data-parallel world must
hold exactly. "auto" values are filled later by the Hugging Face Trainer from its
TrainingArguments (train = per-device x accumulation x world, always consistent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .context import Context, probe

TRAIN = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
ACCUM = "gradient_accumulation_steps"
AUTO = "auto"


@dataclass(frozen=True)
class LoadedConfig:
    path: Path
    data: dict | None
    error: str | None = None  # "line 3 column 5: Expecting ',' delimiter"
    line: int | None = None
    column: int | None = None


def _no_duplicates(pairs):
    """DeepSpeed loads with dict_raise_error_on_duplicate_keys: repeated keys are an error."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} (DeepSpeed refuses duplicate keys)")
        seen[key] = value
    return seen


def parse_config_text(text: str, path: Path = Path("<config>")) -> LoadedConfig:
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        return LoadedConfig(path, None, f"line {exc.lineno} column {exc.colno}: {exc.msg}",
                            exc.lineno, exc.colno)
    except ValueError as exc:
        return LoadedConfig(path, None, str(exc))
    if not isinstance(data, dict):
        return LoadedConfig(path, None, f"the top level is a JSON {type(data).__name__}, "
                            "not an object")
    return LoadedConfig(path, data)


def config_path(ctx: Context) -> Path | None:
    return Path(ctx.options.deepspeed_config) if ctx.options.deepspeed_config else None


@probe
def loaded(ctx: Context) -> LoadedConfig | None:
    path = config_path(ctx)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return LoadedConfig(path, None, f"cannot read it: {exc}")
    return parse_config_text(text, path)


# -- batch sizes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchVerdict:
    good: bool
    summary: str
    fix: str | None = None
    train: int | None = None
    micro: int | None = None
    accum: int | None = None
    detail: str = ""  # the three values as DeepSpeed ends up with them


def _value(config: dict, key: str):
    value = config.get(key)
    return AUTO if value == AUTO else value


def _fit_micro(train: int, world: int, accum: int | None) -> str | None:
    """The micro batch (and accumulation) that make ``train`` fit ``world`` ranks, if any."""
    per_rank, rest = divmod(train, world)
    if rest or per_rank == 0:
        return None
    accum = accum or 1
    if per_rank % accum == 0:
        return f'"{MICRO}": {per_rank // accum}, "{ACCUM}": {accum}'
    return f'"{MICRO}": {per_rank}, "{ACCUM}": 1'


def judge_batch(config: dict, world: int) -> BatchVerdict:
    """DeepSpeed's rule for ``world`` data-parallel ranks; a fix names both ways out."""
    train, micro, accum = (_value(config, k) for k in (TRAIN, MICRO, ACCUM))
    if AUTO in (train, micro, accum):
        return _judge_auto(train, micro, accum, world)
    for key, value in ((TRAIN, train), (MICRO, micro), (ACCUM, accum)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value <= 0):
            return BatchVerdict(False, f"{key} = {value!r}: DeepSpeed wants a positive integer",
                                f'set "{key}" to a positive integer')
    if train is None and micro is None:
        return BatchVerdict(False, f"neither {TRAIN} nor {MICRO} is given: DeepSpeed asserts "
                            "'Either train_batch_size or train_micro_batch_size_per_gpu needs "
                            "to be provided'", f'add "{MICRO}": <per-GPU batch>')
    derived = []
    if train is not None and micro is not None and accum is None:
        accum = train // micro // world
        derived.append(ACCUM)
    elif train is not None and accum is not None and micro is None:
        micro = train // world // accum
        derived.append(MICRO)
    elif micro is not None and accum is not None and train is None:
        train = micro * accum * world
        derived.append(TRAIN)
    elif train is not None and micro is None and accum is None:
        accum, micro = 1, train // world
        derived += [ACCUM, MICRO]
    elif micro is not None and train is None and accum is None:
        accum, train = 1, micro * world
        derived += [ACCUM, TRAIN]
    shown = (f"{TRAIN}={train}, {MICRO}={micro}, {ACCUM}={accum}, world={world}"
             + (f" (derived by DeepSpeed: {', '.join(derived)})" if derived else ""))
    if micro > 0 and accum > 0 and train == micro * accum * world:
        return BatchVerdict(True, f"{train} = {micro} x {accum} x {world} ranks", None,
                            train, micro, accum, shown)
    if micro == 0 or accum == 0:
        problem = f"{MICRO if micro == 0 else ACCUM} comes out as 0"
    else:
        problem = f"{train} != {micro} x {accum} x {world} = {micro * accum * world}"
    right_train = max(micro, 1) * max(accum, 1) * world
    fits = _fit_micro(train, world, accum if ACCUM not in derived else None)
    fix = f'set "{TRAIN}": {right_train}'
    if fits:
        fix += f", or keep {train} with {fits}"
    else:  # train cannot be split evenly: the two nearest totals that can
        step = max(accum, 1) * world
        fix += (f" or {right_train + step} ({MICRO} {max(micro, 1) + 1}); {train} cannot be "
                f"split evenly over {world} ranks")
    return BatchVerdict(False, f"batch sizes do not add up for {world} ranks: {problem}; "
                        "DeepSpeed asserts 'train_batch_size is not equal to "
                        "micro_batch_per_gpu * gradient_acc_step * world_size'", fix,
                        train, micro, accum, shown)


def _judge_auto(train, micro, accum, world: int) -> BatchVerdict:
    autos = [k for k, v in ((TRAIN, train), (MICRO, micro), (ACCUM, accum)) if v == AUTO]
    note = (f"{', '.join(autos)} = \"auto\": the Hugging Face Trainer fills them from "
            "--per_device_train_batch_size and --gradient_accumulation_steps")
    if isinstance(train, int) and train != AUTO:
        if train % world:
            return BatchVerdict(False, f"{TRAIN} = {train} is fixed but {world} ranks cannot "
                                f"share it evenly ({note})",
                                f'set "{TRAIN}": "auto" (or a multiple of {world})')
        return BatchVerdict(True, f"{note}; make per-device batch x accumulation = "
                            f"{train // world} to match {TRAIN} = {train}")
    return BatchVerdict(True, note)


# -- precision ------------------------------------------------------------------------------


def precision_flags(config: dict) -> dict[str, object]:
    """{"fp16": True/False/"auto", "bf16": ...} as DeepSpeed reads them ("bfloat16" is the
    old name of the bf16 section)."""
    bf16 = config.get("bf16")
    if bf16 is None:
        bf16 = config.get("bfloat16", {})
    flags = {}
    for name, section in (("fp16", config.get("fp16", {})), ("bf16", bf16)):
        enabled = section.get("enabled", False) if isinstance(section, dict) else False
        flags[name] = AUTO if enabled == AUTO else bool(enabled)
    return flags

"""A DeepSpeed JSON config (ds_config), read and judged the way DeepSpeed's DeepSpeedConfig
does: the one reader for the doctor's job checks and the workloads' --deepspeed-config.

- :func:`read_config`: the file as a dict, or :class:`DsConfigError`, one line: no such file,
  broken JSON (with line and column), a top level that is not an object, a repeated key
  (DeepSpeed loads with dict_raise_error_on_duplicate_keys).
- :func:`batch_problems` / :func:`check_batch_values`: train_batch_size,
  train_micro_batch_size_per_gpu and gradient_accumulation_steps are each a positive integer
  (typed [integer] in https://www.deepspeed.ai/docs/config-json/) or "auto", which the
  Hugging Face Trainer fills in from its TrainingArguments before DeepSpeed sees it. NaN,
  Infinity, 0, negatives, fractions, booleans and other strings are refused naming the key,
  whatever the world size.
- :func:`derive_batch` / :func:`judge_batch`: runtime/config.py's arithmetic for a known
  world (_set_batch_related_parameters + _batch_assertion): any two of the three determine
  the third with integer division, one alone means gradient accumulation 1, and then
  train = micro x accumulation x data-parallel world must hold exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dsenv.errors import UsageError
from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe
from dsenv.jsonfiles import JsonFileError, read_json

TRAIN = "train_batch_size"
MICRO = "train_micro_batch_size_per_gpu"
ACCUM = "gradient_accumulation_steps"
BATCH_KEYS = (TRAIN, MICRO, ACCUM)
AUTO = "auto"
DOCS = "https://www.deepspeed.ai/docs/config-json/#batch-size-related-parameters"
# the names in DeepSpeed's _batch_assertion: "<name>: <value> has to be greater than 0"
_ASSERTED_AS = {TRAIN: "Train batch size", MICRO: "Micro batch size per gpu",
                ACCUM: "Gradient accumulation steps"}


class DsConfigError(UsageError):
    """A ds_config DeepSpeed would refuse: one line naming the file and, for a value, the key."""


# -- reading --------------------------------------------------------------------------------


class _RepeatedKey(ValueError):
    pass


def _refuse_repeats(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


def _json_kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")


def read_config(path: str | Path) -> dict:
    """The JSON object in ``path``; :class:`DsConfigError` (one line) when DeepSpeed could
    not load it. Batch values are not judged here: see :func:`check_batch_values`."""
    path = Path(path)
    try:
        data = read_json(path, "ds_config")
    except JsonFileError as exc:
        raise DsConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise DsConfigError(f"ds_config {path}: expected a JSON object at the top level, got "
                            f"a JSON {_json_kind(data)}")
    try:  # read_json keeps the last of two equal keys; DeepSpeed refuses them
        json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_refuse_repeats)
    except _RepeatedKey as exc:
        raise DsConfigError(f"ds_config {path}: duplicate key {exc.args[0]!r} (DeepSpeed "
                            "refuses repeated keys)") from None
    return data


@dataclass(frozen=True)
class LoadedConfig:
    path: Path
    data: dict | None
    error: str | None = None  # the one line read_config raised


def config_path(node: Node) -> Path | None:
    return Path(node.job.deepspeed_config) if node.job.deepspeed_config else None


@probe
def loaded(node: Node) -> LoadedConfig | None:
    path = config_path(node)
    if path is None:
        return None
    mounts.require_files(node, path, 0, "the DeepSpeed config")
    try:
        return LoadedConfig(path, read_config(path))
    except DsConfigError as exc:
        return LoadedConfig(path, None, str(exc))


# -- batch values, with or without a world size ---------------------------------------------


def _shown(value) -> str:
    """The value as the file spells it: NaN, Infinity, true, "sixteen"."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def value_problem(key: str, value) -> str | None:
    """Why DeepSpeed would refuse ``value`` for batch key ``key``; None when it is a positive
    integer, "auto" or absent (None: DeepSpeed derives it from the other two)."""
    if value is None or value == AUTO:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None
    if isinstance(value, bool):
        what = " is a boolean"
    elif isinstance(value, str):
        what = " is a string"
    elif isinstance(value, float) and math.isnan(value):
        what = " is not a number"
    elif isinstance(value, float) and math.isinf(value):
        what = " is infinite"
    elif isinstance(value, (int, float)) and value > 0:
        what = " is not an integer"
    elif isinstance(value, (int, float)):
        what = ""
    else:
        what = f" is a JSON {_json_kind(value)}"
    problem = f'{key} = {_shown(value)}{what}: it must be a whole number >= 1 or "auto"'
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not value > 0:
        return f"{problem} (DeepSpeed asserts '{_ASSERTED_AS[key]}: {value} has to be " \
               "greater than 0')"
    return f"{problem} (DeepSpeed takes an integer there)"


def value_fix(key: str) -> str:
    return (f'set "{key}" to a positive integer, or to "auto" when the Hugging Face Trainer '
            f"starts DeepSpeed ({DOCS})")


def batch_problems(config: dict) -> list[tuple[str, str]]:
    """(key, problem) for each batch value DeepSpeed would refuse, in DeepSpeed's order."""
    found = [(key, value_problem(key, config.get(key))) for key in BATCH_KEYS]
    return [(key, problem) for key, problem in found if problem]


def check_batch_values(config: dict, source: str | Path) -> dict:
    """``config`` unchanged, or :class:`DsConfigError` naming ``source`` and the first bad key."""
    problems = batch_problems(config)
    if problems:
        key, problem = problems[0]
        raise DsConfigError(f"ds_config {source}: {problem}; {value_fix(key)}")
    return config


def batch_value(config: dict, key: str) -> int | None:
    """A batch value as a whole number; None when absent or "auto" (not given yet)."""
    problem = value_problem(key, config.get(key))
    if problem:
        raise DsConfigError(f"ds_config: {problem}; {value_fix(key)}")
    value = config.get(key)
    return None if value == AUTO else value


# -- batch sizes for a world size -----------------------------------------------------------


def derive_batch(train: int | None, micro: int | None, accum: int | None,
                 world: int) -> tuple[int | None, int | None, int | None, tuple[str, ...]]:
    """DeepSpeed's _set_batch_related_parameters: (train, micro, accum, the keys it derived).
    With neither train nor micro given nothing can be derived (DeepSpeed asserts)."""
    if train is not None and micro is not None and accum is not None:
        return train, micro, accum, ()
    if train is not None and micro is not None:
        return train, micro, train // micro // world, (ACCUM,)
    if train is not None and accum is not None:
        return train, train // world // accum, accum, (MICRO,)
    if micro is not None and accum is not None:
        return micro * accum * world, micro, accum, (TRAIN,)
    if train is not None:
        return train, train // world, 1, (ACCUM, MICRO)
    if micro is not None:
        return micro * world, micro, 1, (ACCUM, TRAIN)
    return train, micro, accum, ()


@dataclass(frozen=True)
class BatchVerdict:
    good: bool
    summary: str
    fix: str | None = None
    train: int | None = None
    micro: int | None = None
    accum: int | None = None
    detail: str = ""  # the three values as DeepSpeed ends up with them


def judge_values(config: dict) -> BatchVerdict | None:
    """The failing verdict for batch values DeepSpeed refuses (no world size needed)."""
    problems = batch_problems(config)
    if not problems:
        return None
    key, problem = problems[0]
    return BatchVerdict(False, "; ".join(p for _, p in problems), value_fix(key))


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
    refused = judge_values(config)
    if refused:
        return refused
    train, micro, accum = (config.get(k) for k in BATCH_KEYS)
    if AUTO in (train, micro, accum):
        return _judge_auto(train, micro, accum, world)
    if train is None and micro is None:
        return BatchVerdict(False, f"neither {TRAIN} nor {MICRO} is given: DeepSpeed asserts "
                            "'Either train_batch_size or train_micro_batch_size_per_gpu needs "
                            "to be provided'", f'add "{MICRO}": <per-GPU batch>')
    train, micro, accum, derived = derive_batch(train, micro, accum, world)
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
    if isinstance(train, int):
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

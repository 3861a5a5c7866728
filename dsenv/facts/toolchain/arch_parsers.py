"""What torch's and DeepSpeed's own code make of a TORCH_CUDA_ARCH_LIST: asked, not copied.

Three programs read the list before a CUDA op is built: torch's extension builder
(``torch.utils.cpp_extension._get_cuda_arch_flags``: named generations, ``+PTX``, the arch
variants its release knows, e.g. ``9.0a``), DeepSpeed's op builders
(``CUDAOpBuilder.compute_capability_args``: DeepSpeed 0.19.0 to at least 0.19.8 read each
entry with ``int()`` and fail on ``9.0a``, deepspeed/ops/op_builder/builder.py:710 in
0.19.8), and nvcc. This module asks the first two by calling that code on the list and on
each entry, and spells a list torch accepts in the plain numbers DeepSpeed reads, taken from
the ``-gencode`` flags torch itself makes of it (``9.0a`` -> ``9.0``, ``Hopper`` ->
``9.0+PTX``); DeepSpeed is then asked again whether it reads that spelling.

It runs in the interpreter that builds the ops: imported by a smoke or run (torch and
DeepSpeed already loaded), or run by the doctor in the environment under test as
``python -c <this file's text> LIST``, which prints one JSON line after :data:`MARK`. So it
imports only the standard library at module level, nothing of dsenv, and keeps to Python 3.8.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from contextlib import contextmanager
from importlib.metadata import version

MARK = "DSENV-ARCHS "
IGNORED = " (the visible GPUs: the list is not read)"
CONTROL = "8.0"  # a list every DeepSpeed that reads one reads
VARIABLE = "TORCH_CUDA_ARCH_LIST"
_GENCODE = re.compile(r"arch=compute_(\d+)([a-z]*),code=(sm|compute)_(\d+)([a-z]*)")


def entries(value: str) -> list:
    """The list's entries: spaces or semicolons between them, as torch and DeepSpeed split."""
    return [token for token in re.split(r"[;\s]+", value.strip()) if token]


# What an entry's letters after the minor number select, and so what building for the plain
# number instead drops. DeepSpeed 0.19.8's op sources (deepspeed/ops/csrc) hold no code for
# them: nothing guarded by __CUDA_ARCH_FEAT_SM90_ALL or the arch/family-specific macros.
VARIANTS = {"a": "sm_{num}a's arch-specific instructions",
            "f": "sm_{num}f's family-specific instructions"}


def dropped(changed) -> str:
    """What building the plain numbers instead of the ``changed`` entries costs."""
    costs = []
    for entry in changed:
        match = re.match(r"(\d+)\.(\d+)([a-z]+)", entry)
        if match and match.group(3) in VARIANTS:
            costs.append(VARIANTS[match.group(3)].format(num=match.group(1) + match.group(2)))
    if not costs:
        return "nothing: the same archs, spelled as numbers"
    return f"only {', '.join(costs)}, which DeepSpeed's op sources do not use"


@contextmanager
def _arch_list(value: str):
    """TORCH_CUDA_ARCH_LIST set to ``value`` inside, as it was afterwards (DeepSpeed's
    parser rewrites it)."""
    saved = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = saved


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return type(exc).__name__ + (": " + text[0] if text else "")


def _where(exc: BaseException, package: str) -> str:
    """'deepspeed/ops/op_builder/builder.py:710 (compute_capability_args)': the last frame of
    the traceback inside ``package``, as the installed files number it."""
    found, function = "", ""
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = frame.filename.replace(os.sep, "/").split("/")
        if package in parts:
            found = "/".join(parts[len(parts) - 1 - parts[::-1].index(package):]) + \
                f":{frame.lineno}"
            if not frame.name.startswith("<"):  # a lambda or generator: its function's name
                function = frame.name
    return f"{found} ({function})" if found and function else found


def torch_flags(value: str):
    """(the -gencode flags torch's extension builder makes of ``value``, None) or
    (None, its error)."""
    from torch.utils import cpp_extension  # torch: the caller builds ops with it anyway

    try:
        with _arch_list(value):
            return list(cpp_extension._get_cuda_arch_flags()), None
    except Exception as exc:  # noqa: BLE001 - torch's answer, whatever it raises
        return None, _error(exc)


def spelled(flags: list) -> str:
    """torch's -gencode flags as plain numbers: sm_90a -> 9.0, a PTX entry adds +PTX."""
    archs = {}
    for flag in flags:
        match = _GENCODE.search(flag)
        if match:
            num = match.group(4)
            key = (int(num[:-1]), int(num[-1]))
            archs[key] = archs.get(key, False) or match.group(3) == "compute"
    return ";".join(f"{major}.{minor}{'+PTX' if ptx else ''}"
                    for (major, minor), ptx in sorted(archs.items()))


def _probe_builder():
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder  # deepspeed: the caller's own

    class ArchProbe(CUDAOpBuilder):  # the smallest CUDA builder: its arch parsing only
        BUILD_VAR = "DS_BUILD_DSENV_ARCH_PROBE"
        NAME = "dsenv_arch_probe"

        def __init__(self):
            super().__init__(name=self.NAME)

        def absolute_name(self):
            return "dsenv_arch_probe"

        def sources(self):
            return []

    return ArchProbe()


def deepspeed_archs(value: str):
    """(the arch list DeepSpeed's JIT builds for, None, "") or (None, its error, where it
    raised). Asked as jit_load() asks: JIT mode, the list preserved on the builder. A
    release before 0.19 answers with -gencode flags for the visible GPUs: it ignores the
    list, so torch never reads it either (explicit arch flags win in _get_cuda_arch_flags)."""
    builder = _probe_builder()
    builder.jit_mode = True
    builder._jit_arch_list = value  # what jit_load() sets (DeepSpeed >= 0.19); ignored before
    try:
        with _arch_list(value):
            args = builder.compute_capability_args()
            # 0.19 sets the list for torch and returns no flags; older releases return flags
            return (spelled(args) + IGNORED if args else os.environ.get(VARIABLE, "")), None, ""
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's answer, whatever it raises
        return None, _error(exc), _where(exc, "deepspeed")


def _version(dist: str):
    try:
        return version(dist)
    except Exception:  # noqa: BLE001 - not installed, or broken metadata
        return None


def ask(value: str) -> dict:
    """What torch's and DeepSpeed's code make of ``value``, the whole list and each entry;
    ``translated``: the plain-number spelling DeepSpeed reads, where it cannot read
    ``value`` but torch can."""
    import torch  # torch: the caller builds ops with it anyway

    answer = {"value": value, "torch": torch.__version__, "cuda": torch.version.cuda,
              "hip": getattr(torch.version, "hip", None), "deepspeed": _version("deepspeed"),
              "entries": {}, "translated": None}
    if answer["hip"] or not entries(value):
        return answer
    flags, answer["torch_error"] = torch_flags(value)
    with_deepspeed = answer["deepspeed"] is not None
    if with_deepspeed:  # a control: a release that does not read the list needs a GPU here
        answer["deepspeed_unaskable"] = deepspeed_archs(CONTROL)[1]
        with_deepspeed = answer["deepspeed_unaskable"] is None
    if with_deepspeed:
        archs, answer["deepspeed_error"], answer["deepspeed_where"] = deepspeed_archs(value)
        answer["deepspeed_archs"] = archs
    for entry in entries(value):
        entry_flags, torch_error = torch_flags(entry)
        answer["entries"][entry] = {
            "torch": torch_error, "numbers": spelled(entry_flags) if entry_flags else None,
            "deepspeed": deepspeed_archs(entry)[1] if with_deepspeed else None}
    if with_deepspeed and answer["deepspeed_error"] and flags:
        numbers = spelled(flags)
        archs, error, _ = deepspeed_archs(numbers) if numbers else (None, "no archs", "")
        if error is None:
            answer["translated"], answer["translated_archs"] = numbers, archs
    return answer


if __name__ == "__main__":  # the doctor: python -c <this file> LIST, in the job's interpreter
    try:
        result = ask(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - no torch, a broken DeepSpeed: said, not raised
        result = {"error": _error(exc)}
    print(MARK + json.dumps(result))

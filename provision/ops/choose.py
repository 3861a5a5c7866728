"""``--ops auto|none|all|LIST`` -> :class:`OpsChoice`: which DeepSpeed ops to precompile.

The installed DeepSpeed's op builders say which ops exist and which the target allows
(ops_builders.py); what cannot be built *here* is taken off, each with its reason
(ops_reasons.py); the rest is the choice, with DeepSpeed setup.py's own additions
(pin_memory with async_io and gds) and the caveats of the build (bf16 off with old archs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target, describe_arch, sm_name
from dsenv.errors import UsageError
from dsenv.provision import ProvisionError
from dsenv.provision.ops.builders import OpsReport, inspect_ops
from dsenv.provision.ops.reasons import compilers_here, group_omissions, here_reasons, target_reason
from dsenv.versions import version_tuple

MODES = ("auto", "none", "all")
BUILD_OPS_VAR = "DS_BUILD_OPS"  # setup.py: BUILD_OP_DEFAULT = DS_BUILD_OPS (0 on Linux)
# setup.py (sdist deepspeed-0.19.8, lines 182-191): async_io and gds load pin_memory's shared
# manager at runtime, so precompiling either precompiles pin_memory too.
PIN_MEMORY_DEPENDENTS = ("async_io", "gds")


class UnknownOpError(ProvisionError, UsageError):
    """``--ops`` names an op the DeepSpeed asked does not have: a usage error (exit 2), in a
    dry run as in a real one."""


@dataclass(frozen=True)
class OpsChoice:
    mode: str  # as given: "auto", "none", "all" or the list
    accelerator: str  # the DeepSpeed accelerator whose op builders were asked ("cuda" | "cpu")
    build: tuple[str, ...]  # op names (deepspeed's ALL_OPS / installed_ops keys)
    omitted: dict[str, str] = field(default_factory=dict)  # op -> one-line reason
    notes: dict[str, str] = field(default_factory=dict)  # op -> caveat for an op built
    warnings: tuple[str, ...] = ()  # caveats for the whole build
    build_vars: dict[str, str] = field(default_factory=dict)  # every op -> its DS_BUILD_* var
    deepspeed: str = ""  # the DeepSpeed version whose builders decided
    gpu_ops: tuple[str, ...] = ()  # ops compiled with nvcc/hipcc (CUDAOpBuilder)

    def omitted_lines(self) -> list[str]:
        """The omitted ops, one line per reason (ops_reasons.group_omissions)."""
        return group_omissions(self.omitted, self.gpu_ops)

    def env(self) -> dict[str, str]:
        """The variables for ``pip install deepspeed`` (setup.py): DS_BUILD_OPS=0, then
        DS_BUILD_<OP>=1 for each op to build and =0 for every other op (so a stray variable
        in the caller's shell cannot add one), and DS_ACCELERATOR, because setup.py takes
        the op list from the accelerator it detects (cpu on a node without GPUs)."""
        env = {BUILD_OPS_VAR: "0", "DS_ACCELERATOR": self.accelerator}
        for op, var in sorted(self.build_vars.items()):
            if var:
                env[var] = "1" if op in self.build else env.get(var, "0")
        return env

    def to_json(self) -> dict:
        return {"mode": self.mode, "accelerator": self.accelerator, "build": list(self.build),
                "omitted": dict(self.omitted), "notes": dict(self.notes),
                "warnings": list(self.warnings), "deepspeed": self.deepspeed}


def parse_mode(mode: str) -> tuple[str, list[str]]:
    text = (mode or "").strip()
    if text.lower() in MODES:
        return text.lower(), []
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ProvisionError("--ops is empty: pass auto, none, all or a comma list of op names")
    return "list", names


def _arch_notes(report: OpsReport, target: Target, build: list[str]) -> dict[str, str]:
    notes = {}
    if target.vendor != "nvidia":
        return notes
    for name in build:
        op = report.ops[name]
        kept = op.kept_archs
        if op.gpu and kept and len(kept) < len(target.archs):
            dropped = [a for a in target.archs if a not in kept]
            notes[name] = (f"built for {', '.join(map(sm_name, kept))} only: "
                           f"{op.builder}.filter_ccs ({op.arch_rule.get('filter_where')}) "
                           f"drops {', '.join(describe_arch(a) for a in dropped)} (needs "
                           f"{sm_name(op.minimum_arch or kept[0])} or newer)")
    return notes


def _warnings(report: OpsReport, target: Target, build: list[str]) -> tuple[str, ...]:
    gpu_ops = [n for n in build if report.ops[n].gpu]
    found = []
    if target.vendor == "nvidia" and gpu_ops:
        old = [a for a in target.archs if version_tuple(a)[0] <= 7]
        if old and len(old) < len(target.archs):
            found.append(
                f"{', '.join(map(sm_name, old))} in the arch list turns off DeepSpeed's bf16 "
                "kernels for every arch of these ops (enable_bf16 is False when any arch is "
                f"7.x or older: CUDAOpBuilder.compute_capability_args, "
                f"{report.builder_where.get('compute_capability_args')}): build separate "
                "environments for the old and the new GPUs to keep bf16")
    if target.vendor == "amd" and gpu_ops and len(target.archs) > 1:
        found.append(
            "on a node whose rocminfo lists a GPU, DeepSpeed replaces PYTORCH_ROCM_ARCH with "
            f"that GPU's arch ({report.builder_where.get('builder')}): build on a node without "
            f"GPUs (login node) to get {', '.join(target.archs)}")
    return tuple(found)


def choose_ops(target: Target, stack: Stack | None, mode: str, python: str = sys.executable,
               timeout: float = 120, *, env=None, judge_torch: bool = True,
               report: OpsReport | None = None) -> OpsChoice:
    """Decide which DeepSpeed ops to precompile for ``target`` with ``stack``.

    ``mode``: "auto" (every op DeepSpeed allows for the target that can be built here; the
    rest in ``omitted`` with reasons), "none", "all" (every op DeepSpeed allows for the
    target; ProvisionError when one of them cannot be built here) or a comma list of op
    names (ProvisionError for an unknown op, or one that cannot be built for this target or
    here). ``python`` is the interpreter whose DeepSpeed is asked (the environment's).
    ``env`` is the environment whose PATH/CUDA_HOME/ROCM_PATH locate the compilers
    (default: this process's). ``judge_torch=False`` skips the check that the interpreter's
    torch is the target's kind of build (for planning before the environment's torch exists).
    ``report``: a :func:`inspect_ops` answer for this target to reuse (no subprocess).
    """
    kind, names = parse_mode(mode)
    if report is None:
        report = inspect_ops(target, python, timeout, env)
    build_vars = {name: op.build_var for name, op in report.ops.items()}
    common = {"mode": mode, "accelerator": report.accelerator, "build_vars": build_vars,
              "deepspeed": report.deepspeed,
              "gpu_ops": tuple(n for n, op in report.ops.items() if op.gpu)}
    if kind == "none":
        return OpsChoice(build=(), **common)
    tools = compilers_here(env)
    by_target = {n: r for n, op in report.ops.items() if (r := target_reason(op, target))}
    by_here = {n: r for n, r in here_reasons(report, target, stack, tools, judge_torch).items()
               if n not in by_target}
    omitted: dict[str, str] = {}
    if kind == "list":
        check_known(report, names, mode, target)
        bad = {n: by_target.get(n) or by_here.get(n) for n in names
               if n in by_target or n in by_here}
        if bad:
            raise ProvisionError(
                f"--ops {mode}: cannot build for {target.describe()}: "
                + "; ".join(f"{n}: {r}" for n, r in bad.items()))
        build = list(dict.fromkeys(names))
    else:
        candidates = [n for n in report.ops if n not in by_target]
        omitted.update(by_target)
        if kind == "all":
            blocked = {n: by_here[n] for n in candidates if n in by_here}
            if blocked:
                raise ProvisionError(
                    f"--ops all: {len(blocked)} op(s) DeepSpeed allows for "
                    f"{target.describe()} cannot be built here: "
                    + "; ".join(f"{n}: {r}" for n, r in blocked.items())
                    + " (fix those, or use --ops auto to build the rest)")
        omitted.update({n: by_here[n] for n in candidates if n in by_here})
        build = [n for n in candidates if n not in by_here]
    notes = {}
    dependents = [n for n in PIN_MEMORY_DEPENDENTS if n in build]
    if dependents and "pin_memory" in report.ops and "pin_memory" not in build:
        why = by_target.get("pin_memory") or by_here.get("pin_memory")
        if why is None:
            build.append("pin_memory")
            notes["pin_memory"] = (f"built too: DeepSpeed's setup.py precompiles pin_memory "
                                   f"with {', '.join(dependents)}, which load its shared "
                                   "manager at runtime")
        elif kind == "list":
            raise ProvisionError(f"--ops {mode}: {', '.join(dependents)} need pin_memory, "
                                 f"which cannot be built: {why}")
        else:
            for name in dependents:
                build.remove(name)
                omitted[name] = f"needs pin_memory, which cannot be built: {why}"
    order = list(report.ops)
    build.sort(key=order.index)
    notes.update(_arch_notes(report, target, build))
    return OpsChoice(build=tuple(build), omitted=dict(sorted(omitted.items())), notes=notes,
                     warnings=_warnings(report, target, build), **common)


def check_known(report: OpsReport, names: list[str], mode: str, target: Target) -> None:
    """UnknownOpError (one line naming the op and the known ones) for a name in ``names``
    that ``report``'s DeepSpeed does not have for the target's accelerator."""
    unknown = [n for n in names if n not in report.ops]
    if not unknown:
        return
    elsewhere = [n for n in unknown if n in report.other_ops]
    extra = ""
    if elsewhere:
        extra = (f"; {', '.join(elsewhere)} belong to DeepSpeed's "
                 f"{report.other_accelerator} accelerator, not to the "
                 f"{report.accelerator} accelerator a {target.vendor} target builds")
    raise UnknownOpError(
        f"--ops {mode}: unknown op(s) {', '.join(unknown)}{extra}; DeepSpeed "
        f"{report.deepspeed} ({report.accelerator}) knows: {', '.join(report.ops)}")


def check_op_names(target: Target, mode: str, python: str = sys.executable) -> None:
    """Before anything is installed: an ``--ops`` list is checked against ``python``'s
    DeepSpeed (the real run asks the new environment's again). Nothing to check without a
    list, or when that interpreter has no DeepSpeed."""
    kind, names = parse_mode(mode)
    if kind != "list":
        return
    try:
        report = inspect_ops(target, python)
    except ProvisionError:
        return  # no DeepSpeed here: the environment's DeepSpeed judges the names
    check_known(report, names, mode, target)


def preview_ops(target: Target, stack: Stack, mode: str) -> tuple[OpsChoice | None, list[str]]:
    """What --ops would choose, asked of this interpreter's DeepSpeed (the real run asks the
    new environment's DeepSpeed, whose version the lock fixes): the choice the plan assumes
    (None when this interpreter cannot say) and plan notes about it."""
    try:
        choice = choose_ops(target, stack, mode, judge_torch=False)
    except UnknownOpError:
        raise  # a usage error, as in the real run
    except ProvisionError as exc:
        return None, [f"ops: {exc}"]
    lines = [f"ops (DeepSpeed {choice.deepspeed} here): build "
             f"{', '.join(choice.build) or 'none'}"]
    lines += [f"ops: omit {line}" for line in choice.omitted_lines()]
    lines += [f"ops: {warning}" for warning in choice.warnings]
    return choice, lines

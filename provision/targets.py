"""Which stack serves a target on this node: the target's archs against the stacks' torch
builds (envs/stacks.toml) and what this node's nvcc can build (envs/cuda_toolkits.toml, read
through the toolkit probe); ``--arch auto`` through the GPU probes. Nothing here imports torch
or DeepSpeed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from dsenv.data import load_table
from dsenv.envs import archs
from dsenv.envs import targets as arch_targets
from dsenv.envs.stacks import Stack, get_stack, load_stacks
from dsenv.envs.targets import Target, arch_key, describe_arch, generation, known_archs, sm_name
from dsenv.facts.gpu import inventory as gpu_probes
from dsenv.facts.node import Node
from dsenv.facts.toolchain import toolkit
from dsenv.provision import ProvisionError
from dsenv.provision.ops import cuda as cuda_toolkit
from dsenv.provision.uvcmd import index_unreachable
from dsenv.versions import major_minor, version_tuple


def resolve_arch(spec: str, detect=None) -> Target:
    """``--arch`` -> Target, ``auto`` answered by this node's GPU probes unless ``detect``
    is given (see :func:`dsenv.envs.targets.resolve_arch`)."""
    return arch_targets.resolve_arch(spec, detect or _detect_here)


def detect_gpus(env=None) -> list:
    """The GPUs a job started here would see, through the node-facts GPU probes."""
    return _detect_here(env)[0]


def _detect_here(env=None) -> tuple[list, str]:
    ctx = Node(wanted_target="login", env=dict(env if env is not None
                                                              else os.environ))
    found = list(gpu_probes.visible_gpus(ctx))
    tools = "; ".join(f"{t.tool}: {t.status if t.status != 'ok' else t.detail}"
                      for t in gpu_probes.inventory(ctx).tools)
    return found, tools


def _newest_first(stacks: Iterable[Stack]) -> list[Stack]:
    return sorted(stacks, key=lambda s: version_tuple(s.toolkit), reverse=True)


def _unserved(stack: Stack, target: Target) -> list[str]:
    return [a for a in target.archs if not stack.serves(a)]


def _dropped_by(arch: str) -> str | None:
    """'CUDA 13 dropped sm_50–sm_72': the toolkit release that stopped building ``arch``."""
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


def nvcc_refusal(toolkit_version: str, target: Target, serving: list[Stack]) -> str | None:
    """Why this node's nvcc cannot compile ops for the target (None when it can)."""
    label = f"CUDA {major_minor(toolkit_version)}"
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
               f"cuda/{fix_version}`, or CUDA_HOME=<its root>) or pass --ops none")
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


def _stack_problem(stack: Stack, target: Target, toolkit_version: str | None,
                   toolkit_wheels: bool = False) -> str | None:
    if stack.vendor != target.vendor:
        return f"it is built for {stack.vendor}, the target is {target.describe()}"
    missing = _unserved(stack, target)
    if missing:
        return (f"torch {stack.torch_version} ships kernels for {stack.describe_archs()}; "
                f"{', '.join(describe_arch(a) for a in missing)} is not among them")
    if target.vendor == "nvidia" and toolkit_wheels:
        choice = cuda_toolkit.toolkit_choice(stack, target, toolkit_version)
        if choice.kind == "refused":
            return f"{choice.reason}: {cuda_toolkit.refusal_fix(choice)}"
        return None
    if target.vendor == "nvidia" and toolkit_version:
        return (nvcc_refusal(toolkit_version, target, [stack])
                or _major_refusal(toolkit_version, [stack]))
    return None


def choose_stack(target: Target, toolkit_version: str | None = None,
                 requested: str | None = None, *, toolkit_wheels: bool = False,
                 index_unreachable: Callable[[str], str | None] | None = None,
                 notes: list[str] | None = None) -> Stack:
    """The stack to build for ``target``.

    Without ``requested``: the newest non-experimental stack of the target's vendor whose
    torch ships kernels for every target arch. A stack with ``fallback_for`` stands in for
    that stack only when ``index_unreachable(its index_url)`` gives a reason (not asked when
    ``index_unreachable`` is None: the primary stays first). ``toolkit_version`` is the
    version of the nvcc that will compile DeepSpeed's ops on this node (pass it only when
    ops are compiled: with --ops none nvcc is never used); ``None`` with ops compiled means
    pass ``toolkit_wheels`` and no nvcc was found. The nvcc must build every target arch
    (CUDA 13 cannot build sm_70) and have the CUDA major of the stack's torch; with
    ``toolkit_wheels`` a stack whose toolkit NVIDIA publishes as wheels is chosen anyway
    (provision/ops/cuda.py installs it), a stack the node's nvcc fits first.
    ProvisionError with the reason and a way out when nothing fits, or when ``requested``
    cannot serve the target. ``notes`` collects lines for the plan (a fallback taken).
    """
    stacks = load_stacks()
    if requested:
        stack = get_stack(requested)
        problem = _stack_problem(stack, target, toolkit_version, toolkit_wheels)
        if problem:
            # preferred first: a fallback stack (fallback_for) after the stacks it stands in for
            ordered = sorted(_newest_first(stacks.values()), key=lambda s: bool(s.fallback_for))
            others = [s.name for s in ordered
                      if s.name != stack.name
                      and not _stack_problem(s, target, toolkit_version, toolkit_wheels)]
            hint = f" (stacks that can: {', '.join(others)})" if others else ""
            raise ProvisionError(f"--stack {requested} cannot serve {target.describe()}: "
                                 f"{problem}{hint}")
        return stack
    same_vendor = [s for s in stacks.values() if s.vendor == target.vendor
                   and s.status != "experimental" and not s.fallback_for]
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
    if index_unreachable is not None:
        serving = _with_fallbacks(serving, stacks, target, index_unreachable, notes)
    if target.vendor != "nvidia" or (not toolkit_version and not toolkit_wheels):
        return serving[0]
    if toolkit_wheels:
        choices = [(s, cuda_toolkit.toolkit_choice(s, target, toolkit_version)) for s in serving]
        for wanted in ("node", "wheels"):
            found = next((s for s, c in choices if c.kind == wanted), None)
            if found is not None:
                return found
        stack, choice = choices[0]
        node = toolkit_version and (nvcc_refusal(toolkit_version, target, serving)
                                    or _major_refusal(toolkit_version, serving))
        if node:  # the node's own reason, as without wheels, and why the wheels do not help
            raise ProvisionError(f"{node}; {choice.why_not}")
        raise ProvisionError(f"no nvcc for the ops of stack {stack.name} ({target.describe()}):"
                             f" {choice.reason}: {cuda_toolkit.refusal_fix(choice)}")
    refusal = nvcc_refusal(toolkit_version, target, serving)
    if refusal:
        raise ProvisionError(refusal)
    refusal = _major_refusal(toolkit_version, serving)
    if refusal:
        raise ProvisionError(refusal)
    major = version_tuple(toolkit_version)[0]
    serving = [s for s in serving if s.toolkit_major == major]
    return serving[0]


def _with_fallbacks(serving: list[Stack], stacks: dict[str, Stack], target: Target,
                    index_unreachable: Callable[[str], str | None],
                    notes: list[str] | None) -> list[Stack]:
    """``serving`` with a stack replaced by its fallback (``fallback_for``) when the stack's
    index does not answer and the fallback serves the target too. Only the first stack's
    index is asked (the one that would be chosen)."""
    first = serving[0]
    fallbacks = [s for s in stacks.values() if s.fallback_for == first.name
                 and not _unserved(s, target)]
    if not fallbacks:
        return serving
    why = index_unreachable(first.index_url)
    if why is None:
        return serving
    fallback = fallbacks[0]
    if notes is not None:
        notes.append(f"stack {fallback.name} (torch {fallback.torch_version} from "
                     f"{fallback.index_url}) instead of {first.name}: {first.index_url} does "
                     f"not answer ({why})")
    return [fallback, *serving[1:]]


def choose_stack_and_toolkit(target: Target, ops_mode: str, requested: str | None, *,
                             toolkit_wheels: bool = True, env=None
                             ) -> tuple[Stack, cuda_toolkit.ToolkitChoice, list[str]]:
    """``dsenv provision``'s stack and the nvcc its CUDA ops compile with, plus plan notes.

    nvcc only matters when ops are compiled (with --ops none it is never used). A stack with
    a ``fallback_for`` replaces that stack when its index does not answer (asked with a
    HEAD request, only for the stack that would be chosen and only when a fallback exists).
    """
    notes: list[str] = []
    compiles = target.vendor == "nvidia" and ops_mode.strip().lower() != "none"
    node = node_nvcc(env) if compiles else None
    version = node.version if node is not None and node.found else None
    try:
        stack = choose_stack(target, version, requested,
                             toolkit_wheels=toolkit_wheels and compiles,
                             index_unreachable=index_unreachable, notes=notes)
    except ProvisionError as exc:  # say which stack was judged when a fallback was taken
        if not notes:
            raise
        raise ProvisionError(f"{exc} ({'; '.join(notes)})") from None
    if not compiles:
        return stack, cuda_toolkit.ToolkitChoice("none"), notes
    choice = cuda_toolkit.toolkit_choice(stack, target, version, allow_wheels=toolkit_wheels)
    if choice.kind == "node" and node is not None and node.path:
        home = cuda_toolkit.nvcc_home(node.path) or (Path(node.home) if node.home else None)
        choice = cuda_toolkit.ToolkitChoice("node", version or "", home=str(home or ""))
    if choice.kind == "refused":  # choose_stack let it through: nvcc given, no wheels asked
        raise ProvisionError(f"{choice.reason}: {cuda_toolkit.refusal_fix(choice)}")
    notes.append(choice.note())
    return stack, choice, notes


def node_nvcc(env=None) -> toolkit.Tool:
    """The nvcc DeepSpeed would compile with here (the node-facts probe)."""
    ctx = Node(wanted_target="login",
                  env=dict(env if env is not None else os.environ))
    return toolkit.nvcc(ctx)


def node_nvcc_version(env=None) -> str | None:
    """The version of the nvcc DeepSpeed would compile with here (the node-facts probe)."""
    ctx = Node(wanted_target="login",
                  env=dict(env if env is not None else os.environ))
    tool = toolkit.nvcc(ctx)
    return tool.version if tool.found else None

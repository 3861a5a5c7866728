"""Slurm's compressed lists, read in one place: hostlists (SLURM_JOB_NODELIST,
SLURM_STEP_NODELIST: ``nid[0007-0009,0012],gpu1``) and task counts (SLURM_TASKS_PER_NODE,
SLURM_STEP_TASKS_PER_NODE: ``2(x3),1``).

Expanded here as ``scontrol show hostnames`` expands them: scontrol needs the cluster's
configuration, which a login shell or a container may lack, and the ranks of a job read
these in an environment dsenv provisioned (its lock holds dsenv's dependencies).
python-hostlist (PyPI) expands the same syntax; it is not a dependency (GPL-2.0-or-later,
and one more package every lock would need); tests/test_slurmlists.py holds this parser to
its recorded answers.
A malformed list is a :class:`SlurmListError` naming the list and what is wrong with it.
"""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 100_000  # a longer expansion is a typo ("n[1-1000000]"), not a cluster
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class SlurmListError(ValueError):
    """A hostlist or task-count list Slurm would not have written (one line)."""


def _split_top(text: str) -> list[str]:
    """'a[1-2],b,c[3,5]' -> ['a[1-2]', 'b', 'c[3,5]'] (commas inside brackets stay)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        if char == "[":
            depth += 1
            if depth > 1:
                raise SlurmListError(f"hostlist {text!r}: a bracket inside a bracket")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmListError(f"hostlist {text!r}: ']' without its '['")
        current += char
    if depth:
        raise SlurmListError(f"hostlist {text!r}: '[' without its ']'")
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _range_values(spec: str, text: str) -> list[str]:
    """'0007-0009,0012' -> ['0007', '0008', '0009', '0012'] (zero padding kept)."""
    values = []
    for item in spec.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            raise SlurmListError(f"hostlist {text!r}: {item or 'an empty range'!r} is not a "
                                 "number or a range N-M")
        low, high = match.group(1), match.group(2)
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low):
            raise SlurmListError(f"hostlist {text!r}: range {low}-{high} runs backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise SlurmListError(f"hostlist {text!r}: range {low}-{high} names more than "
                                 f"{MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") else 0
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def expand_hostlist(text: str | None) -> list[str]:
    """Every host of a Slurm hostlist, in order, repeats kept (as ``scontrol show hostnames``):
    'nid[0007-0009,0012],gpu1' -> nid0007 nid0008 nid0009 nid0012 gpu1; several bracket
    groups ('rack[1-2]-n[01-02]') give every combination. '' -> []."""
    hosts: list[str] = []
    for part in _split_top((text or "").strip()):
        pieces = re.split(r"\[([^\]]*)\]", part)  # text, range, text, range, ..., text
        choices = [[piece] if i % 2 == 0 else _range_values(piece, text or "")
                   for i, piece in enumerate(pieces)]
        count = 1
        for choice in choices:
            count *= len(choice)
        if len(hosts) + count > MAX_HOSTS:
            raise SlurmListError(f"hostlist {text!r} names more than {MAX_HOSTS} hosts")
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return hosts


def first_host(text: str | None) -> str | None:
    """The first host of a Slurm hostlist ('nid[0007-0010,0012],gpu1' -> 'nid0007'), None
    for an empty one."""
    hosts = expand_hostlist(text)
    return hosts[0] if hosts else None


def tasks_per_node(text: str | None) -> list[int]:
    """SLURM_TASKS_PER_NODE's tasks on each node, in node order: '2(x3),1' -> [2, 2, 2, 1],
    '8' -> [8], '' -> []."""
    counts: list[int] = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = _COUNT.fullmatch(part)
        if not match:
            raise SlurmListError(f"task counts {text!r}: {part!r} is not N or N(xM)")
        repeats = int(match.group(2) or 1)
        if len(counts) + repeats > MAX_HOSTS:
            raise SlurmListError(f"task counts {text!r} name more than {MAX_HOSTS} nodes")
        counts += [int(match.group(1))] * repeats
    return counts


def first_count(text: str | None) -> int | None:
    """A Slurm count variable's number for this node: '8' -> 8 (SLURM_NNODES,
    SLURM_CPUS_PER_TASK, ...), '4(x2)' -> 4 (SLURM_TASKS_PER_NODE: the first node's);
    None when unset or unreadable ('', 'auto')."""
    try:
        counts = tasks_per_node(text)
    except SlurmListError:
        return None
    return counts[0] if counts else None

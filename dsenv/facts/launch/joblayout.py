"""How the job is laid out: nodes planned, ranks per node, the CPUs each rank gets, and the
hosts of a Slurm allocation.

Read from the job's shape as the caller knows it (the doctor's --nodes, --gpus-per-node,
--launcher), Slurm's variables and
this process's CPU affinity; nothing here runs a command. Slurm's hostlists and task counts
are read by slurmlists.py (without scontrol, which needs the cluster's configuration).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dsenv.envs.launchers import TASK_PER_RANK
from dsenv.facts.launch.slurmlists import expand_hostlist, first_count
from dsenv.facts.node import Node


@dataclass(frozen=True)
class Count:
    value: int | None
    source: str  # where the number comes from: "--nodes 2", "SLURM_NNODES=2", or why unknown


def planned_nodes(node: Node) -> Count:
    if node.job.nodes:
        return Count(node.job.nodes, f"--nodes {node.job.nodes}")
    for name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        value = first_count(node.env.get(name))
        if value:
            return Count(value, f"{name}={node.env[name]}")
    return Count(None, "no --nodes and no SLURM_NNODES")


def ranks_per_node(node: Node) -> Count:
    gpus = node.job.gpus_per_node
    if gpus:
        return Count(gpus, f"--gpus-per-node {gpus}")
    launcher = node.job.launcher
    if launcher in (None, *TASK_PER_RANK):
        for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            value = first_count(node.env.get(name))
            if value:
                return Count(value, f"{name}={node.env[name]}")
    value = first_count(node.env.get("SLURM_GPUS_ON_NODE"))
    if value and launcher not in TASK_PER_RANK:
        return Count(value, f"SLURM_GPUS_ON_NODE={node.env['SLURM_GPUS_ON_NODE']} (a rank per GPU)")
    return Count(None, "no --gpus-per-node and no Slurm task count")


def affinity_cpus() -> int:
    """CPUs this process may run on: its affinity mask (a Slurm step's or a cgroup's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuShare:
    available: int  # CPUs this process may run on
    ranks: int
    per_rank: int  # CPUs each rank gets (0: more ranks than CPUs)
    evidence: tuple[str, ...]


def cpu_share(node: Node, ranks: int) -> CpuShare:
    """The CPUs each of ``ranks`` ranks on this node gets.

    srun/mpirun under Slurm give each rank a task of SLURM_CPUS_PER_TASK CPUs; torchrun and
    DeepSpeed's runner fork every rank of the node into the launcher's own CPU set.
    """
    available = affinity_cpus()
    evidence = [f"{available} CPU(s) in this process's affinity mask (os.sched_getaffinity)"]
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if name in node.env:
            evidence.append(f"{name}={node.env[name]}")
    per_task = first_count(node.env.get("SLURM_CPUS_PER_TASK"))
    if node.job.launcher in TASK_PER_RANK and per_task:
        return CpuShare(available, ranks, per_task, tuple(evidence))
    return CpuShare(available, ranks, available // max(ranks, 1), tuple(evidence))


def allocated_hosts(node: Node) -> list[str] | None:
    """The hosts of this Slurm job (SLURM_JOB_NODELIST), or None outside an allocation."""
    nodelist = node.env.get("SLURM_JOB_NODELIST") or node.env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        return expand_hostlist(nodelist)
    except ValueError:  # a range we cannot read: say nothing rather than something wrong
        return None


def short_name(host: str) -> str:
    """'gpu07.cluster.example.org' -> 'gpu07'; IP addresses stay whole."""
    return host if re.fullmatch(r"[\d.]+|.*:.*", host) else host.split(".", 1)[0]

"""Who else used the run's CPU cores (and GPUs) while it was timed: the facts a performance
verdict needs to know whether it can judge (workloads/report.py). Nothing here judges.

CPU: /proc/stat's per-core counters for the cores the run may use (its affinity), read at
the start and the end of the timed steps; the run's own CPU time (utime+stime of every
process of the run on this node, its threads included, /proc/PID/stat) is subtracted, so
what is left is the time other processes took on those cores, plus the time the hypervisor
gave to other guests (steal). The processes that took most are named. GPU: other processes
that hold the run's GPUs (nvidia-smi --query-compute-apps), read once at the end.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
TOP = 3  # other processes named


@dataclass(frozen=True)
class Sample:
    wall: float  # time.monotonic()
    cores: tuple[int, ...]
    busy: int  # ticks the cores were not idle (user, nice, system, irq, softirq)
    steal: int  # ticks the hypervisor ran other guests instead
    per_process: dict[int, tuple[str, int]]  # pid -> (command name, utime+stime ticks)


@dataclass(frozen=True)
class Contention:
    seconds: float  # wall time between the samples
    cores: int  # cores the run may use
    run_cpu_s: float  # CPU time the run's processes got on this node
    others_cpu_s: float  # CPU time others (and steal) took on the run's cores
    load1: float | None  # 1-minute load average at the end
    top: tuple[tuple[str, int, float], ...] = ()  # (command, pid, CPU seconds) of others
    gpu_others: tuple[str, ...] = field(default_factory=tuple)  # "pid name" on the GPUs

    @property
    def others_share(self) -> float:
        """Others' CPU time as a share of the run's cores' capacity in the window."""
        capacity = self.seconds * max(self.cores, 1)
        return self.others_cpu_s / capacity if capacity > 0 else 0.0

    @property
    def run_share(self) -> float:
        capacity = self.seconds * max(self.cores, 1)
        return self.run_cpu_s / capacity if capacity > 0 else 0.0

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "cores": self.cores, "run_cpu_s": self.run_cpu_s,
                "others_cpu_s": self.others_cpu_s, "others_share": self.others_share,
                "run_share": self.run_share, "load1": self.load1,
                "top_others": [{"command": c, "pid": p, "cpu_s": s} for c, p, s in self.top],
                "gpu_others": list(self.gpu_others)}


def run_cores() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def _core_ticks(cores: tuple[int, ...], root: Path) -> tuple[int, int]:
    wanted = {f"cpu{c}" for c in cores}
    busy = steal = 0
    try:
        lines = (root / "proc/stat").read_text().splitlines()
    except OSError:
        return 0, 0
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted:
            values = [int(x) for x in parts[1:9]] + [0] * max(0, 9 - len(parts))
            user, nice, system, _idle, _iowait, irq, softirq, st = values[:8]
            busy += user + nice + system + irq + softirq
            steal += st
    return busy, steal


def _processes(root: Path) -> dict[int, tuple[str, int]]:
    found = {}
    for entry in (root / "proc").iterdir() if (root / "proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # gone, or not ours to read
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        try:  # fields[11], fields[12]: utime, stime (man 5 proc, counted from field 3)
            found[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
        except (IndexError, ValueError):
            continue
    return found


def sample(cores: tuple[int, ...] | None = None, root: Path = Path("/")) -> Sample:
    cores = run_cores() if cores is None else cores
    busy, steal = _core_ticks(cores, root)
    return Sample(time.monotonic(), cores, busy, steal, _processes(root))


def between(start: Sample, end: Sample, run_pids: set[int], root: Path = Path("/"),
            gpu_others: tuple[str, ...] = ()) -> Contention:
    """What happened on the run's cores from ``start`` to ``end``; ``run_pids``: the run's
    processes on this node (every rank here)."""
    seconds = max(end.wall - start.wall, 0.0)

    def used(pid: int) -> int:
        before = start.per_process.get(pid)
        after = end.per_process.get(pid)
        return max(0, (after[1] if after else 0) - (before[1] if before else 0))

    run_ticks = sum(used(pid) for pid in run_pids)
    core_ticks = max(0, end.busy - start.busy) + max(0, end.steal - start.steal)
    others = max(0.0, (core_ticks - run_ticks) / TICKS)
    cores = set(end.cores)
    top = sorted(((end.per_process[pid][0], pid, used(pid) / TICKS)
                  for pid in end.per_process if pid not in run_pids and used(pid) > 0
                  and _may_run_on(pid, cores)), key=lambda item: -item[2])[:TOP]
    return Contention(seconds, len(end.cores), run_ticks / TICKS, others, _load1(root),
                      tuple(top), gpu_others)


def _may_run_on(pid: int, cores: set[int]) -> bool:
    """Whether ``pid`` may run on one of ``cores`` (its affinity; True when unreadable)."""
    try:
        return bool(os.sched_getaffinity(pid) & cores)
    except (AttributeError, OSError):
        return True


def _load1(root: Path) -> float | None:
    try:
        return float((root / "proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def gpu_processes(devices: str | None = None, timeout: float = 5.0) -> list[tuple[int, str]]:
    """(pid, name) of the compute processes on this node's NVIDIA GPUs (empty when there is
    no nvidia-smi or it does not answer in ``timeout``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    done = proc.run([smi, "--query-compute-apps=pid,process_name", "--format=csv,noheader"]
                    + (["-i", devices] if devices else []), timeout=timeout)
    if not done.ok:
        return []
    return parse_compute_apps(done.stdout)


def parse_compute_apps(text: str) -> list[tuple[int, str]]:
    found = []
    for line in text.splitlines():
        pid, _, name = line.partition(",")
        if pid.strip().isdigit():
            found.append((int(pid.strip()), name.strip()))
    return found

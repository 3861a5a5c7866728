"""Facts about the host: CPU, memory, mounts, Slurm variables, container runtime."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field

from dsenv.facts.launch.slurmlists import first_count
from dsenv.facts.node import Node, probe


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]
    logical_cpus: int
    arch: str


def parse_proc_cpuinfo(text: str) -> tuple[str, frozenset[str], int]:
    """(model name, flags, processor count) from /proc/cpuinfo (x86 "flags", ARM "Features")."""
    model, flags, count = "", frozenset(), 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            count += 1
        elif key in ("model name", "Model Name", "cpu model", "Processor") and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags, count


@probe
def cpu(node: Node) -> CpuInfo:
    proc_cpuinfo = node.path("/proc/cpuinfo")
    if proc_cpuinfo.is_file():
        model, flags, count = parse_proc_cpuinfo(proc_cpuinfo.read_text(errors="replace"))
        return CpuInfo(model or platform.processor() or "unknown", flags,
                       count or os.cpu_count() or 0, platform.machine())
    # No /proc (macOS login nodes, odd containers): py-cpuinfo's slower full probe.
    import cpuinfo  # cpuinfo: ~20 ms to import (multiprocessing, ctypes); only this path needs it

    data = cpuinfo.get_cpu_info()
    return CpuInfo(data.get("brand_raw", "unknown"), frozenset(data.get("flags", [])),
                   data.get("count", os.cpu_count() or 0), data.get("arch", platform.machine()))


def os_release(node: Node) -> dict[str, str]:
    path = node.path("/etc/os-release")
    values = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"')
    return values


def parse_size(text: str) -> int | None:
    """'64m', '8G', '65536k' (mount option sizes) -> bytes."""
    match = re.fullmatch(r"(\d+)([kKmMgGtT]?)", text.strip())
    if not match:
        return None
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(match.group(1)) * scale[match.group(2).lower()]


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str | None
    variables: dict[str, str] = field(default_factory=dict)

    @property
    def inside(self) -> bool:
        return bool(self.job_id)

    def integer(self, name: str) -> int | None:
        """A count variable's number for this node ("4(x2)" -> 4: slurmlists.first_count)."""
        return first_count(self.variables.get(name))


def slurm_allocation(node: Node) -> SlurmAllocation:
    variables = {k: v for k, v in node.env.items() if k.startswith("SLURM_")}
    return SlurmAllocation(variables.get("SLURM_JOB_ID"), variables)


# (runtime, how it shows itself: a file under the root or an environment variable)
CONTAINER_MARKERS = (
    ("Apptainer", "env", "APPTAINER_CONTAINER"),
    ("Singularity", "env", "SINGULARITY_CONTAINER"),
    ("Apptainer/Singularity", "file", "/.singularity.d"),
    ("enroot", "env", "ENROOT_ROOTFS"),
    ("enroot", "file", "/etc/enroot"),
    ("Podman", "file", "/run/.containerenv"),
    ("Docker", "file", "/.dockerenv"),
)


def container_runtime(node: Node) -> tuple[str, str] | None:
    """(runtime name, evidence) when running inside a container, else None."""
    for name, kind, marker in CONTAINER_MARKERS:
        if kind == "env" and node.env.get(marker):
            return name, f"{marker}={node.env[marker]}"
        if kind == "file" and node.path(marker).exists():
            return name, f"{marker} exists"
    cgroup = node.path("/proc/1/cgroup")
    if cgroup.is_file():
        text = cgroup.read_text(errors="replace")
        for word, name in (("docker", "Docker"), ("kubepods", "Kubernetes"), ("lxc", "LXC")):
            if word in text:
                return name, f"/proc/1/cgroup mentions {word}"
    return None

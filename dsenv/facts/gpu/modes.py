"""NVIDIA GPU state beyond the inventory: compute mode, processes already on the GPUs, NVLink
between them (``nvidia-smi topo -m``), and which MIG instances a process is offered.

Parsers are pure (text in, records out) and fed recorded real outputs in the tests; the
runners go through ``node.run`` (always with a timeout) and say how the tool ended.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from dsenv.facts.gpu.inventory import Gpu, ListedGpu, MigDevice, apply_visibility, match_device
from dsenv.facts.node import Node, probe
from dsenv.proc import CommandResult

MODES_ARGV = ("nvidia-smi", "--query-gpu=index,uuid,compute_mode", "--format=csv")
APPS_ARGV = ("nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name", "--format=csv")
TOPO_ARGV = ("nvidia-smi", "topo", "-m")


@dataclass(frozen=True)
class GpuMode:
    index: int
    uuid: str | None
    mode: str  # as nvidia-smi prints it: Default, Exclusive_Process, Prohibited

    @property
    def kind(self) -> str:
        """'default', 'exclusive' or 'prohibited' ('E. Process' of the table view counts)."""
        word = re.sub(r"[^a-z]", "", self.mode.lower())
        if word.startswith(("exclusive", "eprocess", "ethread")):
            return "exclusive"
        return "prohibited" if word.startswith("prohibited") else "default"

    def describe(self) -> str:
        return f"GPU {self.index}" + (f" ({self.uuid})" if self.uuid else "") + f": {self.mode}"


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str | None
    pid: str | None
    name: str

    def describe(self) -> str:
        return (f"pid {self.pid} " if self.pid else "") + f"{self.name} on {self.gpu_uuid or '?'}"


def _rows(text: str) -> list[dict[str, str]]:
    """CSV with a header ('memory.total [MiB]' -> 'memory.total'); '[N/A]' cells -> ''."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    cleaned = []
    for row in rows[1:]:
        if len(row) == len(header):
            cleaned.append({k: ("" if v.strip() in ("[N/A]", "N/A") else v.strip())
                            for k, v in zip(header, row, strict=True)})
    return cleaned


def parse_compute_modes(text: str) -> list[GpuMode]:
    modes = []
    for position, row in enumerate(_rows(text)):
        if "compute_mode" not in row:
            continue
        index = row.get("index", "")
        modes.append(GpuMode(int(index) if index.isdigit() else position,
                             row.get("uuid") or row.get("gpu_uuid") or None, row["compute_mode"]))
    return modes


def parse_compute_apps(text: str) -> list[ComputeApp]:
    return [ComputeApp(row.get("gpu_uuid") or None, row.get("pid") or None,
                       row.get("process_name") or row.get("name") or "?")
            for row in _rows(text)]


def parse_topology_nvlinks(text: str) -> list[str]:
    """The NV# cells of ``nvidia-smi topo -m``'s GPU rows ('NV12'), legend excluded."""
    links = []
    for line in text.splitlines():
        if line.strip().startswith("Legend"):
            break
        fields = line.split()
        if fields and re.fullmatch(r"GPU\d+", fields[0]):
            links += [f for f in fields[1:] if re.fullmatch(r"NV\d+", f)]
    return links


@dataclass(frozen=True)
class MigView:
    """What CUDA_VISIBLE_DEVICES leaves a process of a node's MIG devices."""

    devices: tuple[MigDevice, ...]  # the MIG devices offered to the process
    whole: tuple[ListedGpu, ...]  # the visible GPUs that are not MIG-partitioned
    unknown: tuple[str, ...]  # MIG-... entries naming no MIG device of this node
    named: int  # MIG devices CUDA_VISIBLE_DEVICES names one by one (0: it names none)


def mig_view(gpus: list[ListedGpu], env) -> MigView:
    """CUDA_VISIBLE_DEVICES applied to ``nvidia-smi -L``'s list: unset, every GPU and its MIG
    devices; GPU indices or UUIDs, those GPUs; MIG UUIDs, those MIG devices. As the runtime
    does, entries after the first one naming nothing are not reached."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return MigView(tuple(d for g in gpus for d in g.mig),
                       tuple(g for g in gpus if not g.mig), (), 0)
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    by_uuid = {d.uuid.lower(): d for g in gpus for d in g.mig}
    devices: list[MigDevice] = []
    whole: list[ListedGpu] = []
    unknown: list[str] = []
    for token in tokens:
        if token.upper().startswith("MIG-"):
            device = by_uuid.get(token.lower())
            if device is None:
                unknown.append(token)
                break
            devices.append(device)
            continue
        named_gpu = match_device(token, [Gpu("nvidia", g.index, g.name, "", uuid=g.uuid)
                                         for g in gpus], by_position=False)
        if named_gpu is None:
            break  # gpu.visible-devices judges GPU entries that name nothing
        gpu = next(g for g in gpus if g.index == named_gpu.index)
        devices += gpu.mig
        whole += [] if gpu.mig else [gpu]
    named = sum(t.upper().startswith("MIG-") for t in tokens)
    return MigView(tuple(dict.fromkeys(devices)), tuple(whole), tuple(unknown), named)


@dataclass(frozen=True)
class ModeReport:
    visible: tuple[GpuMode, ...] = ()
    hidden: int = 0  # GPUs that *_VISIBLE_DEVICES hides from the job
    result: CommandResult | None = None  # how nvidia-smi ended; None when it is not on PATH


def visible_modes(modes: list[GpuMode], env) -> tuple[list[GpuMode], int]:
    """The modes of the GPUs CUDA_VISIBLE_DEVICES leaves to the job (physical indices kept)."""
    as_gpus = [Gpu("nvidia", m.index, "", "", uuid=m.uuid) for m in modes]
    seen = {g.index for g in apply_visibility(as_gpus, env).gpus}
    kept = [m for m in modes if m.index in seen]
    return kept, len(modes) - len(kept)


@probe
def compute_modes(node: Node) -> ModeReport:
    if not node.which("nvidia-smi"):
        return ModeReport()
    result = node.run(list(MODES_ARGV))
    modes = parse_compute_modes(result.stdout) if result.ok else []
    kept, hidden = visible_modes(modes, node.env)
    return ModeReport(tuple(kept), hidden, result)


def compute_apps(node: Node) -> tuple[list[ComputeApp], CommandResult]:
    result = node.run(list(APPS_ARGV))
    return (parse_compute_apps(result.stdout) if result.ok else []), result


@probe
def nvlinks(node: Node) -> list[str] | None:
    """NV# links between the GPUs, [] without any, None when nvidia-smi cannot say."""
    if not node.which("nvidia-smi"):
        return None
    result = node.run(list(TOPO_ARGV))
    return parse_topology_nvlinks(result.stdout) if result.ok else None

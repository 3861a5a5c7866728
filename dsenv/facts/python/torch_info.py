"""torch without importing it: its build from torch/version.py, and one subprocess probe.

The doctor never imports torch. What the build says (version, CUDA or HIP) is read from
``torch/version.py`` of the torch the job's interpreter would import (:mod:`.target_env`),
parsed with ``ast`` (:mod:`.pyfiles`). Every
area (torch, toolkit, comm, deepspeed) gets it from the one :func:`torch_build` probe.
What only a live torch knows (arch list, device capabilities, whether a tensor op runs)
comes from ONE subprocess of the environment's interpreter that imports torch, run only
when GPUs are visible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.pyfiles import package_dir, read_assignments


@dataclass(frozen=True)
class TorchBuild:
    version: str | None  # "2.13.0+cpu"; None: torch is not installed
    cuda: str | None = None  # "12.1" for a CUDA build
    hip: str | None = None  # "6.2.41133-dd7f95766" for a ROCm build
    location: str | None = None  # the torch package folder

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def kind(self) -> str:
        """'cuda', 'hip', 'cpu' or 'none'."""
        if not self.installed:
            return "none"
        return "hip" if self.hip else "cuda" if self.cuda else "cpu"

    @property
    def gpu_build(self) -> bool:
        return self.kind in ("cuda", "hip")

    @property
    def version_file(self) -> Path | None:
        return Path(self.location) / "version.py" if self.location else None

    def describe(self) -> str:
        extra = {"cuda": f"CUDA {self.cuda}", "hip": f"ROCm/HIP {self.hip}", "cpu": "CPU-only",
                 "none": ""}[self.kind]
        return f"torch {self.version} ({extra} build)" if self.installed else "torch not installed"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def read_torch_build(search_path: list[str]) -> TorchBuild:
    """The torch that ``search_path`` would import, read from its version.py (not imported)."""
    return read_torch_folder(package_dir("torch", search_path))


def read_torch_folder(folder: Path | None) -> TorchBuild:
    """The torch package in ``folder``, read from its version.py (not imported)."""
    if folder is None or not (folder / "version.py").is_file():
        return TorchBuild(None)
    try:
        values = read_assignments(folder / "version.py")
    except (OSError, SyntaxError, ValueError):
        values = {}
    return TorchBuild(_text(values.get("__version__")) or "unknown", _text(values.get("cuda")),
                      _text(values.get("hip")), str(folder))


@probe
def torch_build(node: Node) -> TorchBuild:
    """The torch the job's interpreter will import (where its find_spec says)."""
    return read_torch_folder(target_env.module_folder(node, "torch"))


# -- the one subprocess that imports torch -------------------------------------------------
MARKER = "DSENV_TORCH_PROBE "
PROBE_SCRIPT = """\
import json, torch
c = torch.cuda
out = {"torch": torch.__version__, "cuda": torch.version.cuda,
       "hip": getattr(torch.version, "hip", None), "devices": [], "arch_list": []}
try:
    out["available"] = c.is_available()
    out["device_count"] = c.device_count()
    out["arch_list"] = c.get_arch_list()
    if not out["available"]:
        c.init()
except Exception as e:
    out["init_error"] = type(e).__name__ + ": " + str(e)
for i in range(out.get("device_count") or 0):
    d = {"index": i}
    try:
        p = c.get_device_properties(i)
        d.update(name=p.name, capability="%d.%d" % (p.major, p.minor),
                 gcn_arch=getattr(p, "gcnArchName", None))
        x = torch.arange(4.0, device="cuda:%d" % i)
        d["tensor_sum"] = float((x * 2).sum().item())
    except Exception as e:
        d["error"] = type(e).__name__ + ": " + str(e)
    out["devices"].append(d)
print(__MARK__ + json.dumps(out))
""".replace("__MARK__", repr(MARKER))
EXPECTED_SUM = 12.0  # 2 * (0 + 1 + 2 + 3)


@dataclass(frozen=True)
class DeviceRun:
    index: int
    name: str | None = None
    capability: str | None = None
    gcn_arch: str | None = None
    tensor_sum: float | None = None
    error: str | None = None

    @property
    def arch(self) -> str | None:
        """'8.0' on CUDA; 'gfx90a' on ROCm (gcnArchName 'gfx90a:sramecc+:xnack-')."""
        if self.gcn_arch:
            return self.gcn_arch.split(":")[0]
        return self.capability

    @property
    def usable(self) -> bool:
        return self.error is None and self.tensor_sum == EXPECTED_SUM


@dataclass(frozen=True)
class TorchRuntime:
    ran: bool  # False: the probe did not run, hung or crashed; see `problem`
    problem: str = ""
    available: bool = False
    device_count: int = 0
    arch_list: tuple[str, ...] = ()
    devices: tuple[DeviceRun, ...] = ()
    init_error: str | None = None
    hung: bool = False
    evidence: tuple[str, ...] = field(default_factory=tuple)


def parse_probe_output(stdout: str) -> TorchRuntime:
    """The probe's JSON line (after its marker; torch may print other lines) -> TorchRuntime."""
    data = proc.marked_json(stdout, MARKER)
    if not isinstance(data, dict):
        raise ValueError("the torch probe printed no result line that parses")
    devices = tuple(DeviceRun(**{k: d.get(k) for k in DeviceRun.__dataclass_fields__})
                    for d in data.get("devices", []))
    return TorchRuntime(True, available=bool(data.get("available")),
                        device_count=int(data.get("device_count") or 0),
                        arch_list=tuple(data.get("arch_list") or ()), devices=devices,
                        init_error=data.get("init_error"))


def probe_timeout(node: Node) -> float:
    """Importing torch and initialising every GPU takes longer than one tool call."""
    return node.probe_timeout * 2


@probe
def torch_runtime(node: Node) -> TorchRuntime:
    build = torch_build(node)
    if build.kind not in ("cuda", "hip"):
        return TorchRuntime(False, f"not run: {build.describe()}")
    if not gpu_probe.visible_gpus(node):
        return TorchRuntime(False, "not run: no GPU visible")
    python = target_env.environment(node).python
    if python is None:
        return TorchRuntime(False, "not run: the environment has no interpreter here")
    result = node.run([python, "-c", PROBE_SCRIPT], timeout=probe_timeout(node))
    if result.timed_out:
        return TorchRuntime(False, result.describe(), hung=True)
    try:
        return parse_probe_output(result.stdout)
    except ValueError:  # no result line, or one that does not parse
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return TorchRuntime(False, result.describe(), evidence=tuple(tail))


# -- does a compiled arch list cover a device? -----------------------------------------------
_CUDA_ENTRY = re.compile(r"(sm|compute)_(\d+)([af]?)$")


def _capability(arch: str) -> tuple[int, int]:
    major, _, minor = arch.partition(".")
    return int(major), int(minor or 0)


def covering_entry(arch_list, device_arch: str) -> str | None:
    """The arch-list entry that lets a device run torch's kernels, or None.

    CUDA: ``sm_XY`` cubins run on devices of major X with minor >= Y (``sm_XYa`` only on
    exactly X.Y); ``compute_XY`` PTX is JIT-compiled for any capability >= X.Y. ROCm:
    code objects are per gfx target, so the names must match exactly.
    """
    if device_arch.startswith("gfx"):
        return next((e for e in arch_list if e.split(":")[0] == device_arch), None)
    major, minor = _capability(device_arch)
    for entry in arch_list:
        match = _CUDA_ENTRY.match(entry)
        if not match:
            continue
        kind, digits, suffix = match.groups()
        e_major, e_minor = int(digits[:-1]), int(digits[-1])
        if kind == "compute" and (major, minor) >= (e_major, e_minor):
            return entry
        if kind == "sm" and major == e_major and (
                minor == e_minor if suffix == "a" else minor >= e_minor):
            return entry
    return None

"""torch without importing it: its build from torch/version.py, and one subprocess probe.

The doctor never imports torch. What the build says (version, CUDA or HIP) is read from
``torch/version.py`` of the torch the job's interpreter would import (:mod:`.target_env`),
parsed with ``ast`` (:mod:`.pyfiles`). Every
area (torch, toolkit, comm, deepspeed) gets it from the one :func:`torch_build` probe.
What a live GPU answers (device capabilities, whether work runs on each GPU) comes from
ONE probe, :func:`torch_runtime`, asked in one of two ways:

- on a CUDA build, by default, without torch: the CUDA driver runs a kernel on each GPU
  (:mod:`dsenv.facts.gpu.cuda_driver`, ~0.3 s on an H200) and the arch list is read from
  the kernels libtorch_cuda.so carries (:mod:`dsenv.facts.toolchain.fatbin`). On an H200 node
  ``import torch`` alone took 2.9-4.2 s, CUDA's initialisation and a tensor op 0.4 s more:
  the doctor then took as long as ``ds_report`` (2026-11-26);
- with ``--verbose`` (the node's ``thorough``), on a ROCm build, or where libtorch_cuda.so is
  not found: ONE subprocess of the environment's interpreter that imports torch, run only
  when GPUs are visible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsenv import proc
from dsenv.facts.gpu import cuda_driver
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.pyfiles import package_dir, read_assignments
from dsenv.facts.toolchain import fatbin

# The one reason a check gives when the judged environment has no torch: the same words
# everywhere, so the doctor's screen folds those skips into one reason.
NOT_INSTALLED = "torch is not installed"


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

    work: str = "tensor op"  # what ran: "tensor op" (torch), "kernel" or "memset" (driver)

    @property
    def arch(self) -> str | None:
        """'8.0' on CUDA; 'gfx90a' on ROCm (gcnArchName 'gfx90a:sramecc+:xnack-'). torch 2.11
        fills gcnArchName on CUDA too, with the device's name ('NVIDIA H200')."""
        if self.gcn_arch and self.gcn_arch.startswith("gfx"):
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
    # "torch": the subprocess that imports torch; "driver": the CUDA driver ran the work and
    # the arch list was read from ``arch_source`` (torch not imported)
    source: str = "torch"
    arch_source: str = "torch.cuda.get_arch_list()"
    seconds: float | None = None  # how long asking took

    @property
    def asked(self) -> str:
        """How the answer was got, for evidence."""
        if self.source == "driver":
            return ("asked the CUDA driver directly, torch not imported (`dsenv doctor "
                    "--verbose` asks torch itself)")
        return "asked torch in the environment's interpreter"


def parse_probe_output(stdout: str) -> TorchRuntime:
    """The probe's JSON line (after its marker; torch may print other lines) -> TorchRuntime."""
    data = proc.marked_json(stdout, MARKER)
    if not isinstance(data, dict):
        raise ValueError("the torch probe printed no result line that parses")
    devices = tuple(DeviceRun(**{k: d[k] for k in DeviceRun.__dataclass_fields__ if k in d})
                    for d in data.get("devices", []))
    return TorchRuntime(True, available=bool(data.get("available")),
                        device_count=int(data.get("device_count") or 0),
                        arch_list=tuple(data.get("arch_list") or ()), devices=devices,
                        init_error=data.get("init_error"))


def probe_timeout(node: Node) -> float:
    """Importing torch and initialising every GPU takes longer than one tool call."""
    return node.probe_timeout * 2


TORCH_CUDA_LIBRARY = "libtorch_cuda.so"


def cuda_library(node: Node, build: TorchBuild) -> Path | None:
    """torch's libtorch_cuda.so: in torch/lib (pip wheels), else the environment's lib
    (conda packages put torch's libraries there)."""
    places = [Path(build.location) / "lib"] if build.location else []
    places.append(target_env.environment(node).prefix / "lib")
    return next((p / TORCH_CUDA_LIBRARY for p in places
                 if (p / TORCH_CUDA_LIBRARY).is_file()), None)


def driver_runtime(node: Node, build: TorchBuild) -> TorchRuntime | None:
    """The answer without torch (see the module's doc); None where torch must be asked."""
    library = cuda_library(node, build)
    if library is None:
        return None
    node.start(cuda_driver.driver_run)  # the driver's seconds overlap the file's reading
    try:
        code = fatbin.read_device_code(library)
    except fatbin.FatbinError:
        return None
    if not code.elf and not code.ptx:
        return None
    run = cuda_driver.driver_run(node)
    devices = tuple(DeviceRun(d.index, d.name, d.capability, None, d.tensor_sum, d.error,
                              work=d.work or "kernel") for d in run.devices)
    evidence = [f"CUDA driver {run.driver_version}: cuInit and a kernel on each GPU took "
                f"{run.seconds.get('total', 0):.2f} s"] if run.ran and run.driver_version else []
    evidence += [f"cuda:{d.index}: {d.note}" for d in run.devices if d.note]
    return TorchRuntime(
        run.ran, run.problem, available=run.available, device_count=run.device_count,
        arch_list=tuple(code.built_for()), devices=devices, init_error=run.init_error,
        hung=run.hung, evidence=(*run.evidence, *evidence), source="driver",
        arch_source=f"kernels in {library} ({code.entries} entries; sm_XY: at least a "
                    "quarter as many kernels as the best-covered arch)",
        seconds=run.seconds.get("total"))


@probe
def torch_runtime(node: Node) -> TorchRuntime:
    build = torch_build(node)
    if build.kind not in ("cuda", "hip"):
        return TorchRuntime(False, f"not run: {build.describe()}")
    if build.kind == "cuda" and not node.thorough:
        answer = driver_runtime(node, build)
        if answer is not None:
            return answer
    if not gpu_probe.visible_gpus(node):  # importing torch costs seconds: only with GPUs
        return TorchRuntime(False, "not run: no GPU visible")
    python = target_env.environment(node).python
    if python is None:
        return TorchRuntime(False, "not run: the environment has no interpreter here")
    result = node.run([python, "-c", PROBE_SCRIPT], timeout=probe_timeout(node))
    if result.timed_out:
        return TorchRuntime(False, result.describe(), hung=True)
    try:
        return replace(parse_probe_output(result.stdout), seconds=result.seconds)
    except ValueError:  # no result line, or one that does not parse
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return TorchRuntime(False, result.describe(), evidence=tuple(tail))


def start_runtime(node: Node) -> None:
    """Start :func:`torch_runtime` in the background on a compute node where it will ask
    the CUDA driver, so it overlaps nvidia-smi (which the checks ask first) instead of
    following it. (Asking torch waits on nvidia-smi anyway: it runs only with GPUs.)"""
    build = torch_build(node)
    if node.is_compute and build.kind == "cuda" and not node.thorough \
            and cuda_library(node, build) is not None:
        node.start(torch_runtime)


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

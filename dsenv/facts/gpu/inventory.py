"""GPU inventory: NVIDIA through nvidia-smi, AMD through amd-smi/rocm-smi/rocminfo.

Parsers are pure (text in, records out); :func:`inventory` runs the tools once per doctor
run and keeps how each ended (absent, hung, failed) so the checks can report the tool's
health; :func:`visible_gpus` applies CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES /
HIP_VISIBLE_DEVICES, the way the CUDA and ROCm runtimes would.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field

from dsenv.envs import archs
from dsenv.facts.node import Node, probe
from dsenv.proc import CommandResult


@dataclass(frozen=True)
class Gpu:
    vendor: str  # "nvidia" | "amd"
    index: int  # physical index as the vendor tool numbers it
    name: str
    arch: str  # normalized: "8.0" or "gfx90a" (dsenv.envs.archs.normalize_arch)
    memory_mib: int | None = None
    driver: str | None = None
    uuid: str | None = None
    bus_id: str | None = None


# -- NVIDIA ------------------------------------------------------------------------------
NVIDIA_FIELDS = ("index", "name", "uuid", "memory.total", "driver_version", "compute_cap",
                 "pci.bus_id")
# Drivers before ~510 reject the whole query: 'Field "compute_cap" is not a valid field'.
NVIDIA_FIELDS_OLD = tuple(f for f in NVIDIA_FIELDS if f != "compute_cap")


def nvidia_smi_argv(fields=NVIDIA_FIELDS) -> list[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,nounits"]


def _clean(value: str | None) -> str | None:
    value = (value or "").strip()
    return None if value in ("", "[N/A]", "N/A", "[Not Supported]") else value


def _arch_from(compute_cap: str | None, name: str) -> str:
    """'8.0' from nvidia-smi, or from the model name on drivers without compute_cap."""
    if compute_cap:
        try:
            return archs.normalize_arch(compute_cap)
        except ValueError:
            pass
    model = archs.model_for_name(name)
    return model.arch if model else ""


def parse_nvidia_csv(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` (header line first).

    Columns are found by header name ('memory.total [MiB]' -> 'memory.total'), so any subset
    and order of the queried fields parses; a missing column becomes None.
    """
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    gpus = []
    for position, row in enumerate(rows[1:]):
        if len(row) != len(header):
            continue
        cell = dict(zip(header, (_clean(v) for v in row), strict=True))
        name = cell.get("name") or "unknown NVIDIA GPU"
        memory = re.match(r"\d+", cell.get("memory.total") or "")
        index = cell.get("index")
        gpus.append(Gpu(
            vendor="nvidia", index=int(index) if index and index.isdigit() else position,
            name=name, arch=_arch_from(cell.get("compute_cap"), name),
            memory_mib=int(memory.group()) if memory else None,
            driver=cell.get("driver_version"), uuid=cell.get("uuid"),
            bus_id=cell.get("pci.bus_id")))
    return gpus


# every driver with MIG (R450 on) lists each GPU's MIG devices under it; older ones, GPUs only
LIST_ARGV = ("nvidia-smi", "-L")
LISTED_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[^)\s]+)\)")
# "  MIG 1g.10gb     Device  0: (UUID: MIG-feb88891-...)"; R450: "(UUID: MIG-GPU-<uuid>/1/0)"
LISTED_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class MigDevice:
    profile: str  # "1g.10gb"
    device: int  # its number under the parent GPU
    uuid: str  # MIG-<uuid>, or R450's MIG-GPU-<uuid>/<gi>/<ci>

    def describe(self) -> str:
        return f"MIG {self.profile} device {self.device} ({self.uuid})"


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    mig: tuple[MigDevice, ...] = ()  # empty: a whole GPU (MIG off, or on with no instance)


def parse_gpu_list(text: str) -> list[ListedGpu]:
    """``nvidia-smi -L``: each GPU and the MIG devices listed under it."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        if gpu := LISTED_GPU.match(line):
            gpus.append(ListedGpu(int(gpu[1]), gpu[2], gpu[3]))
        elif (mig := LISTED_MIG.match(line)) and gpus:
            last = gpus[-1]
            gpus[-1] = ListedGpu(last.index, last.name, last.uuid,
                                 (*last.mig, MigDevice(mig[1], int(mig[2]), mig[3])))
    return gpus


@dataclass(frozen=True)
class GpuList:
    gpus: tuple[ListedGpu, ...] = ()
    result: CommandResult | None = None  # how nvidia-smi ended; None when it is not on PATH


@probe
def gpu_list(node: Node) -> GpuList:
    """``nvidia-smi -L``, run once per doctor run (only where a question needs MIG devices)."""
    if not node.which("nvidia-smi"):
        return GpuList()
    result = node.run(list(LIST_ARGV))
    return GpuList(tuple(parse_gpu_list(result.stdout)) if result.ok else (), result)


# -- AMD -----------------------------------------------------------------------------------
def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents of ``rocminfo``: arch from 'Name: gfx90a', model from 'Marketing Name'."""
    gpus = []
    for block in re.split(r"\*{3,}\s*\n\s*Agent \d+\s*\n\s*\*{3,}", text)[1:]:
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and line.startswith("  ") and not line.startswith("   "):
                fields.setdefault(key.strip(), value.strip())
        if fields.get("Device Type") != "GPU" or not fields.get("Name", "").startswith("gfx"):
            continue
        uuid = fields.get("Uuid")
        gpus.append(Gpu(vendor="amd", index=len(gpus),
                        name=fields.get("Marketing Name") or fields["Name"],
                        arch=archs.normalize_arch(fields["Name"]),
                        uuid=uuid if uuid and uuid != "GPU-XX" else None))
    return gpus


def parse_amd_smi_static(text: str) -> list[Gpu]:
    """GPUs from ``amd-smi static --asic --bus`` (its 'GPU: N' blocks of 'KEY: value')."""
    gpus = []
    for block in re.split(r"^GPU: ", text, flags=re.MULTILINE)[1:]:
        index, _, body = block.partition("\n")
        fields = {}
        for line in body.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        gfx = fields.get("TARGET_GRAPHICS_VERSION", "")
        name = fields.get("MARKET_NAME") or "unknown AMD GPU"
        try:
            arch = archs.normalize_arch(gfx)
        except ValueError:
            model = archs.model_for_name(name)
            arch = model.arch if model else ""
        gpus.append(Gpu(vendor="amd", index=int(index) if index.strip().isdigit() else len(gpus),
                        name=name, arch=arch, bus_id=fields.get("BDF")))
    return gpus


def parse_rocm_smi_product(text: str) -> list[Gpu]:
    """GPUs from ``rocm-smi --showproductname --json``.

    Its 'GFX Version' is not trusted (MI250X reports 'gfx9010'), so the arch comes from the
    model name; rocminfo is the better source and is preferred when present.
    """
    data = json.loads(text[text.find("{"):]) if "{" in text else {}
    gpus = []
    for card, fields in sorted(data.items()):
        if not card.startswith("card"):
            continue
        name = fields.get("Card Series") or fields.get("Card series") or "unknown AMD GPU"
        model = archs.model_for_name(name)
        gpus.append(Gpu(vendor="amd", index=int(card[4:]) if card[4:].isdigit() else len(gpus),
                        name=name, arch=model.arch if model else ""))
    return gpus


# -- running the tools -----------------------------------------------------------------------
@dataclass(frozen=True)
class ToolOutcome:
    """How one vendor tool ended: 'absent', 'ok', 'hung' or 'error'."""

    tool: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    listed: int | None = None  # GPUs in its answer ('ok' only)

    @property
    def found(self) -> bool:
        return self.status != "absent"


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[Gpu, ...] = ()
    tools: tuple[ToolOutcome, ...] = ()

    def tool(self, name: str) -> ToolOutcome:
        for outcome in self.tools:
            if outcome.tool == name:
                return outcome
        return ToolOutcome(name, "absent")


def _outcome(tool: str, result, gpus: list[Gpu] | None = None) -> ToolOutcome:
    if result.not_found:
        return ToolOutcome(tool, "absent", result.describe())
    if result.timed_out:
        return ToolOutcome(tool, "hung", result.describe(), result.seconds)
    if not result.ok or gpus is None:
        return ToolOutcome(tool, "error", result.describe(), result.seconds)
    return ToolOutcome(tool, "ok", f"{len(gpus)} GPU(s)", result.seconds, len(gpus))


def _run_parser(parser, text: str) -> list[Gpu] | None:
    try:
        return parser(text)
    except (ValueError, KeyError):
        return None


def probe_nvidia(node: Node) -> tuple[list[Gpu], ToolOutcome]:
    if not node.which("nvidia-smi"):
        return [], ToolOutcome("nvidia-smi", "absent", "nvidia-smi: not found on PATH")
    result = node.run(nvidia_smi_argv())
    if not result.ok and "compute_cap" in result.stdout + result.stderr:
        result = node.run(nvidia_smi_argv(NVIDIA_FIELDS_OLD))  # old driver: name -> arch
    gpus = _run_parser(parse_nvidia_csv, result.stdout) if result.ok else None
    return gpus or [], _outcome("nvidia-smi", result, gpus)


AMD_TOOLS = (  # (tool, argv, parser): the first that answers names the GPUs
    ("amd-smi", ["amd-smi", "static", "--asic", "--bus"], parse_amd_smi_static),
    ("rocminfo", ["rocminfo"], parse_rocminfo),
    ("rocm-smi", ["rocm-smi", "--showproductname", "--json"], parse_rocm_smi_product),
)


def probe_amd(node: Node) -> tuple[list[Gpu], list[ToolOutcome]]:
    found: list[Gpu] = []
    outcomes = []
    for tool, argv, parser in AMD_TOOLS:
        if not node.which(tool):
            outcomes.append(ToolOutcome(tool, "absent", f"{tool}: not found on PATH"))
            continue
        if found:  # one tool that answered is enough
            continue
        result = node.run(argv)
        gpus = _run_parser(parser, result.stdout) if result.ok else None
        outcomes.append(_outcome(tool, result, gpus))
        found = gpus or []
    return found, outcomes


@probe
def inventory(node: Node) -> Inventory:
    nvidia, nvidia_outcome = probe_nvidia(node)
    amd, amd_outcomes = probe_amd(node)
    return Inventory(tuple(nvidia + amd), (nvidia_outcome, *amd_outcomes))


# -- visibility ----------------------------------------------------------------------------
# Every variable that hides GPUs from a process, in the order reports name them.
VISIBILITY_NAMES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
# Which of them each vendor's runtime reads.
VISIBILITY_VARIABLES = {"nvidia": ("CUDA_VISIBLE_DEVICES",),
                        "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                "CUDA_VISIBLE_DEVICES")}


@dataclass(frozen=True)
class Visibility:
    gpus: tuple[Gpu, ...]
    physical: tuple[Gpu, ...]
    settings: dict[str, str] = field(default_factory=dict)  # the variables that applied
    unknown: tuple[str, ...] = ()  # entries naming no device ("7", "GPU-dead", "NoDevFiles")


def match_device(token: str, gpus: list[Gpu], by_position: bool) -> Gpu | None:
    """The GPU one *_VISIBLE_DEVICES entry names: an index (physical, or the position among
    those left), a UUID or its prefix; None when it names none."""
    if re.fullmatch(r"\d+", token):
        number = int(token)
        if by_position:
            return gpus[number] if number < len(gpus) else None
        return next((g for g in gpus if g.index == number), None)
    matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith(token.lower())]
    if not matches and not token.upper().startswith("GPU-"):
        matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith("gpu-" + token.lower())]
    return matches[0] if len(matches) == 1 else None


def select(value: str, gpus: list[Gpu], by_position: bool,
           mig_parents: dict[str, int] | None = None) -> tuple[list[Gpu], list[str]]:
    """Apply one *_VISIBLE_DEVICES value; like the runtime, stop at the first unknown entry.
    A MIG UUID selects its parent GPU (``mig_parents``: MIG UUID, lower case -> GPU index,
    from ``nvidia-smi -L``); without that list every GPU is kept, as none can be ruled out."""
    chosen: list[Gpu] = []
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    if mig_parents is None and tokens and all(t.upper().startswith("MIG-") for t in tokens):
        return list(gpus), []
    for position, token in enumerate(tokens):
        if mig_parents is not None and token.upper().startswith("MIG-"):
            parent = mig_parents.get(token.lower())
            gpu = next((g for g in gpus if g.index == parent), None)
        else:
            gpu = match_device(token, gpus, by_position)
        if gpu is None:
            return chosen, tokens[position:]
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen, []


def apply_visibility(gpus: list[Gpu], env, mig_parents: dict[str, int] | None = None
                     ) -> Visibility:
    visible, settings, unknown = [], {}, []
    for vendor, variables in VISIBILITY_VARIABLES.items():
        devices = [g for g in gpus if g.vendor == vendor]
        if not devices:
            continue
        for position, name in enumerate(variables):
            if name not in env or (vendor == "amd" and name == "CUDA_VISIBLE_DEVICES"
                                   and "HIP_VISIBLE_DEVICES" in settings):
                continue
            settings[name] = env[name]
            # ROCR and CUDA on NVIDIA name physical devices; HIP/CUDA on AMD index what is left.
            devices, bad = select(env[name], devices, by_position=position > 0,
                                  mig_parents=mig_parents if vendor == "nvidia" else None)
            unknown.extend(bad)
        visible.extend(devices)
    return Visibility(tuple(visible), tuple(gpus), settings, tuple(unknown))


@probe
def visibility(node: Node) -> Visibility:
    gpus = list(inventory(node).gpus)
    mig_parents = None
    if "MIG-" in node.env.get("CUDA_VISIBLE_DEVICES", "").upper() and any(
            g.vendor == "nvidia" for g in gpus):
        listing = gpu_list(node)  # which GPU each MIG UUID belongs to, or that none does
        if listing.result is not None and listing.result.ok and listing.gpus:
            mig_parents = {d.uuid.lower(): g.index for g in listing.gpus for d in g.mig}
    return apply_visibility(gpus, node.env, mig_parents)


@probe
def visible_gpus(node: Node) -> list[Gpu]:
    """The GPUs a process started with this environment would see (physical indices kept)."""
    return list(visibility(node).gpus)

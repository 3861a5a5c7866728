"""The interconnect NCCL/RCCL will use: InfiniBand/RoCE ports, GID tables, Slingshot, NICs.

Everything is read from /sys through ``node.path`` (tests point it at a recorded tree) and from
package metadata and file names; nothing here imports torch or loads a library.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.comm.ncclconf import nccl_setting
from dsenv.facts.node import Node, probe
from dsenv.facts.python import pyenv, sharedlibs, target_env, torch_info

# -- InfiniBand / RoCE ports ------------------------------------------------------------------


@dataclass(frozen=True)
class IbPort:
    device: str  # mlx5_0
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED (from "4: ACTIVE")
    phys_state: str  # LinkUp, Disabled, Polling (from "5: LinkUp")
    link_layer: str  # InfiniBand | Ethernet (Ethernet = RoCE)
    rate: str  # "200 Gb/sec (4X HDR)"

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"

    @property
    def roce(self) -> bool:
        return self.link_layer.lower() == "ethernet"

    def describe(self) -> str:
        kind = "RoCE" if self.roce else self.link_layer or "?"
        return f"{self.name}: {self.state or '?'} ({self.phys_state or '?'}), {kind}, {self.rate or '?'}"


def sysfs_value(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'; 'InfiniBand' -> 'InfiniBand'."""
    text = text.strip()
    return re.sub(r"^\d+:\s*", "", text)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # unused GID entries answer EINVAL
        return ""


@probe
def ib_ports(node: Node) -> list[IbPort]:
    """Every port of every RDMA device under /sys/class/infiniband."""
    root = node.path("/sys/class/infiniband")
    if not root.is_dir():
        return []
    found = []
    for device in sorted(root.iterdir(), key=lambda p: p.name):
        ports = device / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: p.name):
            if not port.name.isdigit():
                continue
            found.append(IbPort(device.name, int(port.name),
                                sysfs_value(_read(port / "state")),
                                sysfs_value(_read(port / "phys_state")),
                                _read(port / "link_layer"), _read(port / "rate")))
    return found


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # as sysfs writes it: 0000:0000:0000:0000:0000:ffff:0a98:000c
    kind: str  # "RoCE v2", "IB/RoCE v1", "" when unreadable
    netdev: str = ""

    @property
    def ipv4(self) -> str | None:
        return ipv4_mapped(self.gid)


def ipv4_mapped(gid: str) -> str | None:
    """'0000:...:ffff:0a98:000c' or '::ffff:10.152.0.12' -> '10.152.0.12'; else None."""
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def gid_table(node: Node, port: IbPort) -> list[Gid]:
    base = node.path(f"/sys/class/infiniband/{port.device}/ports/{port.port}")
    gids = base / "gids"
    if not gids.is_dir():
        return []
    table = []
    for entry in sorted((p for p in gids.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        gid = _read(entry)
        if not gid or set(gid.replace(":", "")) <= {"0"}:
            continue
        table.append(Gid(int(entry.name), gid, _read(base / "gid_attrs/types" / entry.name),
                         _read(base / "gid_attrs/ndevs" / entry.name)))
    return table


def pick_roce_gid(table: list[Gid]) -> Gid | None:
    """The GID NCCL should use on RoCE: the first RoCE v2 entry carrying an IPv4 address."""
    return next((g for g in table if "v2" in g.kind.lower() and g.ipv4), None)


# -- Slingshot and NICs -----------------------------------------------------------------------


def cxi_devices(node: Node) -> list[str]:
    folder = node.path("/sys/class/cxi")
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("cxi")) if folder.is_dir() else []


def net_interfaces(node: Node) -> list[str]:
    folder = node.path("/sys/class/net")
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# -- NCCL's list syntax: "^" excludes, "=" matches exactly, otherwise prefixes ----------------


@dataclass(frozen=True)
class NcclList:
    items: tuple[tuple[str, int | None], ...]  # (name, port or None)
    exclude: bool = False
    exact: bool = False

    def matches(self, item: str, name: str) -> bool:
        return name == item if self.exact else name.startswith(item)

    def unmatched(self, names) -> list[str]:
        """The items that name nothing in ``names``."""
        return [item for item, _ in self.items if not any(self.matches(item, n) for n in names)]

    def selected(self, names) -> list[str]:
        hit = [n for n in names if any(self.matches(item, n) for item, _ in self.items)]
        return [n for n in names if n not in hit] if self.exclude else hit


def parse_nccl_list(value: str) -> NcclList:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA syntax: '^=mlx5_0:1,mlx5_1' etc."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, port = part.partition(":")
        items.append((name, int(port) if port.isdigit() else None))
    return NcclList(tuple(items), exclude, exact)


# -- NCCL / RCCL version and the network plugin -----------------------------------------------

NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
_LIB_VERSION = re.compile(r"lib(nccl|rccl)\.so\.(\d+(?:\.\d+)+)$")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                   "/usr/lib", "/usr/local/lib", "/opt/rocm/lib")


@dataclass(frozen=True)
class CommLibrary:
    name: str  # NCCL | RCCL
    version: str | None
    source: str


def library_version_from_name(path: str) -> str | None:
    """'libnccl.so.2.18.3' -> '2.18.3' (a bare 'libnccl.so.2' names no release)."""
    match = _LIB_VERSION.search(os.path.basename(path))
    if match and match.group(2).count(".") >= 2:
        return match.group(2)
    return None


def _lib_files(folder: Path, stem: str) -> list[Path]:
    try:
        return sorted(folder.glob(f"{stem}.so*"))
    except OSError:
        return []


def _versioned(files: list[Path]) -> tuple[str | None, Path | None]:
    for f in files:
        resolved = Path(os.path.realpath(f))
        version = library_version_from_name(resolved.name) or library_version_from_name(f.name)
        if version:
            return version, resolved
    return None, (files[0] if files else None)


@probe
def comm_library(node: Node) -> CommLibrary | None:
    """NCCL (CUDA torch) or RCCL (ROCm torch) of the environment under test: wheel
    metadata, torch/lib, the environment's lib/, then the system."""
    build = torch_info.torch_build(node)
    name, stem = ("RCCL", "librccl") if build.kind == "hip" else ("NCCL", "libnccl")
    if name == "NCCL":
        path = pyenv.search_path(node)
        for dist_name in NCCL_WHEELS:
            dist = pyenv.find_distribution(dist_name, path)
            if dist is not None:
                return CommLibrary(name, dist.version, f"pip package {dist_name}")
    folders = [Path(build.location) / "lib"] if build.location else []
    folders += [Path(target_env.environment(node).prefix) / "lib"]
    folders += [Path(d) for d in node.library_path()]
    folders += [node.path(d) for d in SYSTEM_LIB_DIRS]
    unversioned = None
    for folder in folders:
        version, path = _versioned(_lib_files(folder, stem))
        if version:
            return CommLibrary(name, version, str(path))
        unversioned = unversioned or path
    if unversioned:
        return CommLibrary(name, None, str(unversioned))
    return None


def ibverbs_error(node: Node) -> str:
    """Why the dynamic linker would not find libibverbs.so.1 (which NCCL dlopens for
    InfiniBand/RoCE): LD_LIBRARY_PATH, the ld.so cache, the default folders; "" when found."""
    if sharedlibs.find_library(node, ["libibverbs.so.1"]):
        return ""
    return ("libibverbs.so.1 is not on LD_LIBRARY_PATH, in the ld.so cache (`ldconfig -p`) or "
            "in /lib64, /usr/lib64, /lib, /usr/lib")


def nccl_copies(node: Node) -> list[CommLibrary]:
    """Every NCCL a CUDA torch of the environment under test may load, one per version: the
    nvidia-nccl-* wheels, torch/lib, the environment's lib/ and LD_LIBRARY_PATH (which the
    loader searches before the wheel's RPATH)."""
    build = torch_info.torch_build(node)
    if build.kind != "cuda":
        return []
    found: dict[str, CommLibrary] = {}
    path = pyenv.search_path(node)
    for dist_name in NCCL_WHEELS:
        dist = pyenv.find_distribution(dist_name, path)
        if dist is not None and dist.version:
            found.setdefault(dist.version.split("+")[0], CommLibrary(
                "NCCL", dist.version, f"pip package {dist_name}"))
    folders = [Path(build.location) / "lib"] if build.location else []
    folders += [Path(target_env.environment(node).prefix) / "lib"]
    folders += [Path(d) for d in node.library_path()]
    for folder in folders:
        version, lib = _versioned(_lib_files(folder, "libnccl"))
        if version:
            found.setdefault(version, CommLibrary("NCCL", version, str(lib)))
    return list(found.values())


def net_plugin_names(node: Node, rocm: bool | None) -> list[str]:
    """The file names NCCL/RCCL dlopen for its network plugin (NCCL_NET_PLUGIN decides, from
    the environment or NCCL's configuration files)."""
    setting = nccl_setting(node, "NCCL_NET_PLUGIN")
    chosen = setting.value if setting else ""
    stems = ["librccl-net", "libnccl-net"] if rocm is None else (
        ["librccl-net"] if rocm else ["libnccl-net"])
    if chosen and chosen.lower() != "none":
        if "/" in chosen or chosen.endswith(".so"):
            return [chosen]
        return [f"{stem}-{chosen}.so" for stem in stems] + [chosen]
    return [f"{stem}.so" for stem in stems]


def find_net_plugin(node: Node, rocm: bool | None) -> str | None:
    """Where the OFI (aws-ofi-nccl / aws-ofi-rccl) plugin would be found, or None."""
    folders = node.library_path()
    for name in net_plugin_names(node, rocm):
        if "/" in name:
            if Path(name).is_file():
                return name
            continue
        for folder in folders:
            candidate = Path(folder) / name
            if candidate.is_file():
                return str(candidate)
    return None

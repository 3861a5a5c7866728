"""What one rank of ``dsenv doctor --distributed`` reports about itself: host, ranks, the
GPU it uses (name, UUID, PCI bus, NUMA node), its CPU affinity's NUMA nodes and the network
interface its sockets use towards MASTER_ADDR."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import psutil

from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.outcome import RankRecord
from dsenv.facts.gpu.inventory import VISIBILITY_NAMES
from dsenv.facts.host.fingerprint import selected_interfaces


def socket_interface(master_addr: str, env: Mapping[str, str], backend: str
                     ) -> tuple[str, str | None]:
    """(interface, local address) this rank's sockets use towards ``master_addr``: among
    those NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME selects (the one the route takes when it
    is one of them), else the one the routing table picks."""
    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    addresses = {name: [a.address for a in entries if a.family in (socket.AF_INET,
                                                                    socket.AF_INET6)]
                 for name, entries in psutil.net_if_addrs().items()}
    routed, local = "?", None
    try:
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, 9))  # UDP connect sends nothing: it only routes
            local = probe.getsockname()[0]
        routed = next((n for n, addrs in addresses.items() if local in addrs), "?")
    except OSError:
        pass
    chosen = env.get(variable, "").strip()
    if not chosen:
        return routed, local
    selected, _ = selected_interfaces(variable, chosen, addresses)
    if not selected:
        return f"none ({variable}={chosen} matches no interface here)", None
    name = routed if routed in selected else selected[0]
    return f"{name} ({variable}={chosen})", (addresses.get(name) or [None])[0]


def local_record(info, env: Mapping[str, str], backend: str) -> RankRecord:
    """What this rank reports about itself (rank 0 checks them: doctor/distributed/ranks.py);
    the rank adds its ``fingerprint``."""
    visible = next((f"{v}={env[v]}" for v in VISIBILITY_NAMES if v in env), "")
    record: RankRecord = {"rank": info.rank, "local_rank": info.local_rank, "world_size": info.world_size,
              "local_size": info.local_size, "launcher": info.launcher,
              "host": socket.gethostname(), "pid": os.getpid(), "visible": visible,
              "device": "cpu", "device_name": None, "device_uuid": None,
              "device_bus_id": None, "device_numa": None}
    if backend == "nccl":
        import torch  # torch: only a rank on a GPU reads its device here

        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        bus = None
        if getattr(props, "pci_bus_id", None) is not None:
            bus = (f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:"
                   f"{getattr(props, 'pci_device_id', 0):02x}.0")
        record.update(device=f"cuda:{index}", device_name=props.name,
                      device_uuid=str(uuid) if uuid is not None else None, device_bus_id=bus)
        if bus:
            try:
                record["device_numa"] = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node")
                                            .read_text())
            except (OSError, ValueError):
                pass
    try:
        record["numa"] = ranks.numa_nodes_of(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        record["numa"] = []
    record["interface"], record["address"] = socket_interface(info.master_addr or "127.0.0.1",
                                                              env, backend)
    return record

"""The node's IP interfaces and the ones NCCL's socket bootstrap would pick from them.

Read with `ip -j addr show` (iproute2's JSON): each interface's name, state and addresses.
NCCL without NCCL_SOCKET_IFNAME walks getifaddrs() and keeps the interfaces that have an IPv4
or IPv6 address (not ::1; link-local ones count, the up state is not looked at), trying in this
order until one list is not empty: names starting with "ib", the subnet of NCCL_COMM_ID when it
is set, every name but "docker*" and "lo*", then "docker*", then "lo*" (NVIDIA/nccl
src/misc/socket.cc, ncclFindInterfaces and findInterfaces). Nothing here judges the choice.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from dsenv.facts.node import Node

# NCCL's automatic order when NCCL_SOCKET_IFNAME is unset: (prefix list, what it means)
NCCL_ORDER = (("ib", "InfiniBand's IP interfaces (ib*)"),
              ("^docker,lo", "any interface but docker* and lo*"),
              ("docker", "Docker's bridge (docker*), as nothing else has an address"),
              ("lo", "the loopback (lo), as nothing else has an address"))


@dataclass(frozen=True)
class Interface:
    name: str
    state: str  # iproute2's operstate: UP, DOWN, UNKNOWN (lo, tunnels)
    addresses: tuple[str, ...]  # the IPv4 and IPv6 addresses NCCL would consider

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.addresses) or 'no address'}; {self.state.lower()})"


@dataclass(frozen=True)
class Interfaces:
    found: tuple[Interface, ...] | None  # None: they could not be read
    why: str  # how they were read, or why not


def read(node: Node) -> Interfaces:
    return node.memo("comm.interfaces", lambda: _read(node))


def _read(node: Node) -> Interfaces:
    if node.which("ip") is None:
        return Interfaces(None, "`ip` (iproute2) is not on PATH")
    done = node.run(["ip", "-j", "addr", "show"])
    if not done.ok:
        return Interfaces(None, f"`ip -j addr show` failed: {done.describe()}")
    try:
        rows = json.loads(done.stdout or "[]")
    except ValueError:
        return Interfaces(None, "`ip -j addr show` printed no JSON (an iproute2 without -j)")
    found = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not row.get("ifname"):
            continue
        addresses = tuple(a["local"] for a in row.get("addr_info", ())
                          if a.get("family") in ("inet", "inet6") and a.get("local")
                          and not _is_ipv6_loopback(a["local"]))
        found.append(Interface(row["ifname"], str(row.get("operstate", "UNKNOWN")), addresses))
    return Interfaces(tuple(found), "ip -j addr show")


def _is_ipv6_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) == ipaddress.IPv6Address("::1")
    except ValueError:
        return False


def _matches(name: str, prefix_list: str) -> bool:
    exclude = prefix_list.startswith("^")
    hit = any(name.startswith(p) for p in prefix_list.lstrip("^").split(",") if p)
    return hit != exclude


def nccl_choice(interfaces: tuple[Interface, ...]) -> tuple[list[Interface], str]:
    """The interfaces NCCL's bootstrap would pick without NCCL_SOCKET_IFNAME (NCCL_COMM_ID's
    subnet aside), and which step of its order chose them; ([], "") when none has an address."""
    with_address = [i for i in interfaces if i.addresses]
    for prefixes, meaning in NCCL_ORDER:
        chosen = [i for i in with_address if _matches(i.name, prefixes)]
        if chosen:
            return chosen, meaning
    return [], ""

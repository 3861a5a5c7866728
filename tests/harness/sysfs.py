"""/sys trees written as the kernel shows what a recorded tool printed (tests/fixtures/comm):
the InfiniBand ports, their GID tables and the network interfaces the comm tests read."""

import ipaddress
import re

IB = "sys/class/infiniband"
SYSFS_STATE = {"Active": "4: ACTIVE", "Down": "1: DOWN", "Initializing": "2: INIT",
               "Armed": "3: ARMED"}
SYSFS_PHYS = {"LinkUp": "5: LinkUp", "Disabled": "3: Disabled", "Polling": "2: Polling"}


def put(root, path, text):
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def ibstat_to_sysfs(text, root):
    """Write /sys/class/infiniband/<ca>/ports/<n>/* as the kernel shows what `ibstat` printed."""
    ca = port = None
    for line in text.splitlines():
        if m := re.match(r"CA '(\S+)'", line):
            ca = m.group(1)
        elif m := re.match(r"\s+Port (\d+):", line):
            port = f"{IB}/{ca}/ports/{m.group(1)}"
        elif port and ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            if key == "State":
                put(root, f"{port}/state", SYSFS_STATE[value])
            elif key == "Physical state":
                put(root, f"{port}/phys_state", SYSFS_PHYS[value])
            elif key == "Rate":
                put(root, f"{port}/rate", f"{value} Gb/sec")
            elif key == "Link layer":
                put(root, f"{port}/link_layer", value)


def ibdev2netdev_to_sysfs(text, root):
    """/sys/class/net/<netdev> and each HCA port's state and link layer, from `ibdev2netdev`
    ("mlx5_0 port 1 ==> ibp26s0 (Up)"); plus lo."""
    for hca, port, netdev, state in re.findall(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)",
                                               text, re.M):
        (root / "sys/class/net" / netdev).mkdir(parents=True)
        put(root, f"{IB}/{hca}/ports/{port}/state", "4: ACTIVE" if state == "Up" else "1: DOWN")
        put(root, f"{IB}/{hca}/ports/{port}/link_layer",
            "Ethernet" if netdev.startswith("en") else "InfiniBand")
    (root / "sys/class/net/lo").mkdir(parents=True)
    return root


def gids_to_sysfs(rows, root, device, port=1):
    """rows: (index, gid, type, netdev); gids/<i> in the kernel's full form."""
    base = f"{IB}/{device}/ports/{port}"
    for index, gid, kind, netdev in rows:
        put(root, f"{base}/gids/{index}", ipaddress.IPv6Address(gid).exploded)
        put(root, f"{base}/gid_attrs/types/{index}", kind)
        if netdev:
            put(root, f"{base}/gid_attrs/ndevs/{index}", netdev)


def ibv_devinfo_gids(text):
    """(index, gid, type, '') rows from `ibv_devinfo -v`'s GID lines."""
    kinds = {"RoCE v1": "IB/RoCE v1", "RoCE v2": "RoCE v2"}
    return [(int(i), gid, kinds[kind], "")
            for i, gid, kind in re.findall(r"GID\[\s*(\d+)\]:\s+(\S+), (RoCE v\d)", text)]

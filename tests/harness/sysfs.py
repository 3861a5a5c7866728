"""/sys trees written as the kernel shows what a recorded tool printed (tests/fixtures/comm):
the InfiniBand ports the comm tests read."""

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

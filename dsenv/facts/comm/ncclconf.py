"""The NCCL settings a job will run with: its environment, then NCCL's configuration files.

NCCL reads ``NAME=value`` lines from ${NCCL_CONF_FILE} (NCCL >= 2.23; before, and when it is
unset, ~/.nccl.conf) and from /etc/nccl.conf, and a file never overrides a variable that is
already set, so the environment wins, then the user's file, then the system's
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # "environment" or the file it came from


def parse_conf(text: str) -> dict[str, str]:
    """'NAME=value' lines; '#' comments and lines without '=' are skipped."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values.setdefault(name.strip(), value.strip())
    return values


def conf_files(node: Node) -> list[Path]:
    """NCCL's files in the order it reads them: the user's first, then /etc/nccl.conf."""
    files = []
    user = node.env.get("NCCL_CONF_FILE", "").strip()
    if user:
        files.append(Path(user))
    elif node.env.get("HOME"):
        files.append(Path(node.env["HOME"]) / ".nccl.conf")
    files.append(node.path("/etc/nccl.conf"))
    return files


def nccl_settings(node: Node) -> dict[str, Setting]:
    """Every NCCL_* setting the job would see, each with where it comes from."""
    found = {name: Setting(name, value, "environment")
             for name, value in node.env.items() if name.startswith("NCCL_")}
    for path in conf_files(node):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name, value in parse_conf(text).items():
            if name.startswith("NCCL_") and name not in found:
                found[name] = Setting(name, value, str(path))
    return found

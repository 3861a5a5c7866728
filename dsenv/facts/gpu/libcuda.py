"""The libcuda.so.1 a CUDA program on this node loads, and the NVIDIA kernel module it must match.

The user-space driver (libcuda.so.<driver version>) works only with a kernel module of its own
version: another one fails CUDA's initialisation with cudaErrorSystemDriverMismatch (803) and
NVML with "Driver/library version mismatch". That happens after a driver update not rebooted
into, with an image's own libcuda, and with CUDA's forward-compatibility libcuda (cuda-compat,
/usr/local/cuda*/compat) found first on LD_LIBRARY_PATH or in the ld.so cache
(NVIDIA/nvidia-container-toolkit#1679) on a node whose driver is newer than it. The loader's
order is the one read here: LD_LIBRARY_PATH's folders, then the ld.so cache (`ldconfig -p`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node
from dsenv.facts.python import sharedlibs

SONAME = "libcuda.so.1"
# /proc/driver/nvidia/version, proprietary ("NVIDIA UNIX x86_64 Kernel Module  580.95.05  ...")
# and open ("NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build ...") forms.
MODULE = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\b")
FILE_VERSION = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")
COMPAT = re.compile(r"(?:^|/)compat(?:/|$)|cuda[-_]compat")


@dataclass(frozen=True)
class LoadedLibcuda:
    found: str  # libcuda.so.1 where the loader finds it
    target: str  # the file it resolves to
    how: str  # which of the loader's places
    version: str | None  # the driver version its file name carries

    @property
    def compat(self) -> bool:
        """CUDA's forward-compatibility package's libcuda."""
        return bool(COMPAT.search(self.found) or COMPAT.search(self.target))


def parse_module_version(text: str) -> str | None:
    found = MODULE.search(text)
    return found.group(1) if found else None


def kernel_module_version(node: Node) -> str | None:
    """The loaded NVIDIA kernel module's version; None without one (or without /proc)."""
    try:
        return parse_module_version(node.path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def loaded_libcuda(node: Node) -> LoadedLibcuda | None:
    """The libcuda.so.1 the loader would take; None when it finds none."""
    places = [(Path(folder) / SONAME, f"LD_LIBRARY_PATH ({folder})")
              for folder in node.library_path()]
    places += [(node.path(path), "the ld.so cache (ldconfig -p)")
               for path in sharedlibs.ldconfig_cache(node).get(SONAME, [])]
    for path, how in places:
        if path.exists():
            target = os.path.realpath(path)
            version = FILE_VERSION.match(os.path.basename(target))
            return LoadedLibcuda(str(path), target, how, version.group(1) if version else None)
    return None

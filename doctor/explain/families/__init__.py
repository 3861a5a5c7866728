"""Error families read by structure: each module reads one family's messages into their parts
(the NCCL source file and call that failed, the variable a launcher wanted, the arch nvcc
refused, the Hub's host and status, the gfx target ROCm lacks ...) and maps the parts to the
catalogue mode they name (doctor/modes/*.toml), so that wordings and versions no catalogue
pattern quotes are still understood.

A family module has ``FAMILY`` (its name) and ``read(message) -> list[Reading]``, or
``read(message, around)`` when the lines around the failure can carry its parts (torch's "sm_61
is not compatible" warning printed above the "no kernel image" error it explains); it imports
nothing from the rest of explain. rank.py weighs a reading like a structural loader finding.
The loader and linker family, which names libraries rather than modes, is ../loader.py.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import cache

# The family modules, in the order their readings are listed.
MODULES = ("nccl", "launch", "mpi", "gpu", "build", "hub_repos", "huggingface", "rocm",
           "container", "python", "system", "programs")


@dataclass(frozen=True)
class Reading:
    family: str
    mode: str  # the catalogue mode id the structure names
    parts: tuple[tuple[str, str], ...]  # what was extracted, in order: (label, value)
    text: str  # the text the parser matched

    def describe(self) -> str:
        return ", ".join(f"{label} {value}" for label, value in self.parts if value)


def reading(family: str, mode: str, text: str, **parts: str) -> Reading:
    return Reading(family, mode, tuple((k.replace("_", " "), v) for k, v in parts.items()),
                   text)


@cache
def parsers() -> tuple:
    found = []
    for name in MODULES:
        try:
            found.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as e:  # a family not written yet
            if e.name != f"{__name__}.{name}":
                raise
    return tuple(found)


@cache
def _reads_around(parser) -> bool:
    return len(inspect.signature(parser.read).parameters) > 1


def read(message: str, around: str = "") -> list[Reading]:
    """Every family's readings of ``message`` (and of ``around``, the lines near it, for the
    parsers that take them), each mode once (the first reading kept)."""
    seen: dict[str, Reading] = {}
    for parser in parsers():
        for r in parser.read(message, around) if _reads_around(parser) else parser.read(message):
            seen.setdefault(r.mode, r)
    return list(seen.values())

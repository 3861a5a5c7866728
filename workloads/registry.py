"""The bundled workloads, read from their one table (workloads/workloads.toml): every list
of workload names (the smoke and run choices, `smoke all`, fetch, launch, the doctor's
--for) comes from here. Light: no workload module is imported until :func:`load_module`.

    names()                  every workload, in the table's order
    smoke_names()            those with a smoke (all of them today)
    full_names()             those with a full run (`dsenv run`)
    fetchable_names()        those with full-run assets (`dsenv fetch`)
    entry(name)              its row: module, help lines, assets, reference keys
    load_module(name)        its module (it satisfies workloads/contract.py's Workload)
    reference_key(name, mode)  its entry in references.toml for "smoke" or "full"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

from dsenv.data import load_table
from dsenv.workloads.errors import WorkloadError

MODES = ("smoke", "full")  # the registry's modes; `dsenv run` is the full one
SMOKE_ALL = "all"  # `dsenv smoke all`: every smoke in turn, one table


@dataclass(frozen=True)
class Entry:
    name: str
    module: str  # dotted module path
    smoke: str  # the smoke's help line ("": no smoke)
    full: str = ""  # the full run's help line ("": no full run)
    assets: tuple[str, ...] = ()  # names in workloads/assets.toml
    references: dict[str, str] = field(default_factory=dict)  # mode -> references.toml key
    imports: tuple[str, ...] = ()  # distributions the run imports in the job's environment


def read(table: dict) -> dict[str, Entry]:
    """name -> Entry of a parsed workloads.toml (tests pass a doctored copy)."""
    return {name: Entry(name, row["module"], row.get("smoke", ""), row.get("full", ""),
                        tuple(row.get("assets", ())), dict(row.get("references", {})),
                        tuple(row.get("imports", ())))
            for name, row in table["workload"].items()}


def entries() -> dict[str, Entry]:
    return read(load_table("dsenv.workloads", "workloads.toml"))


def names() -> tuple[str, ...]:
    return tuple(entries())


def smoke_names() -> tuple[str, ...]:
    return tuple(name for name, e in entries().items() if e.smoke)


def full_names() -> tuple[str, ...]:
    return tuple(name for name, e in entries().items() if e.full)


def fetchable_names() -> tuple[str, ...]:
    return tuple(name for name, e in entries().items() if e.assets)


def entry(name: str) -> Entry:
    found = entries().get(name)
    if found is None:
        raise WorkloadError(f"unknown workload {name!r}; choose one of {', '.join(names())}")
    return found


def load_module(name: str) -> ModuleType:
    """The workload's module (light: a workload imports no torch at module import)."""
    return importlib.import_module(entry(name).module)


def reference_key(name: str, mode: str) -> str:
    """The workload's entry in references.toml for ``mode`` ("smoke" or "full")."""
    return entry(name).references.get(mode, "")

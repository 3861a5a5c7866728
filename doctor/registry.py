"""The check registry: ``@check("area.name", "Title")`` on a function ``(ctx) -> Finding``.

The checks themselves live in doctor/checks/ (one module per area); :func:`all_checks`
imports that package, which registers them all. ``dsenv --help`` reads only :data:`AREAS`
from here, so it imports none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsenv.verdicts.findings import Finding

# Report order; a check's area is the part of its id before the dot.
# "distributed" has no registered checks: `dsenv doctor --distributed` adds its results.
AREAS = ("system", "python", "gpu", "torch", "toolkit", "deepspeed", "comm", "mpi", "launch",
         "cache", "job", "distributed")


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    func: Callable[..., Finding]

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]


CHECKS: dict[str, Check] = {}


def check(check_id: str, title: str):
    area = check_id.split(".", 1)[0]
    if area not in AREAS:
        raise ValueError(f"check {check_id!r}: unknown area {area!r}")

    def register(func):
        if check_id in CHECKS:
            raise ValueError(f"check {check_id!r} registered twice")
        CHECKS[check_id] = Check(check_id, title, func)
        return func

    return register


def named(check_id: str) -> Check | None:
    """One check, importing only the module that defines it (`dsenv explain --here` runs
    one check: the other ~20 modules are not needed); every check when that module is not
    found by its ``@check("ID"`` line."""
    if check_id in CHECKS:
        return CHECKS[check_id]
    folder = Path(__file__).parent / "checks"
    marker = f'@check("{check_id}"'
    for path in sorted(folder.rglob("*.py")):
        if marker in path.read_text(encoding="utf-8", errors="replace"):
            dotted = ".".join(path.relative_to(folder).with_suffix("").parts)
            # dsenv.doctor.checks: the one module (the package imports them all: off --help)
            importlib.import_module(f"dsenv.doctor.checks.{dotted}")
            return CHECKS.get(check_id)
    return next((c for c in all_checks() if c.id == check_id), None)


def all_checks() -> list[Check]:
    """Every check, in report order (by area, then as its module defines them)."""
    from dsenv.doctor import checks  # noqa: F401  (dsenv.doctor.checks: registers every check; off --help)

    return sorted(CHECKS.values(), key=lambda c: AREAS.index(c.area))

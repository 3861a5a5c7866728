"""Does every locked package import in the finished environment? Every module of every
package of the lock is imported with the environment's interpreter, in a subprocess with a
timeout: a crash or hang is one failure, the others are still checked."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dsenv import proc
from dsenv.provision import ProvisionError
from dsenv.provision.container import MARK
from dsenv.provision.locks import LockedRequirement, read_lock

_IMPORT_NAMES = r"""
import importlib.metadata as md, json, sys
SKIP = {"test", "tests", "testing", "doc", "docs", "example", "examples", "benchmarks",
        "scripts", "tools", "build"}
def top_levels(dist):
    text = dist.read_text("top_level.txt")
    if text:
        names = [line.strip().replace("/", ".") for line in text.splitlines()]
    else:
        names = []
        for path in dist.files or []:
            parts = path.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(
                    (".dist-info", ".data", ".egg-info", ".pth")):
                continue
            if len(parts) > 1:
                names.append(parts[0])
            elif parts[0].endswith(".py"):
                names.append(parts[0][:-3])
            elif ".so" in parts[0] or parts[0].endswith(".pyd"):
                names.append(parts[0].split(".")[0])
    return sorted({n for n in names
                   if n and n.isidentifier() and not n.startswith("_") and n not in SKIP})
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = top_levels(md.distribution(name))
    except md.PackageNotFoundError:
        out[name] = None
print("@@dsenv@@" + json.dumps(out))
"""


def import_names(python: str | os.PathLike, distributions: Iterable[str], *,
                 env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> dict[str, list[str] | None]:
    """``{distribution: [top-level import names]}`` as ``python``'s environment installed them
    (``top_level.txt``, else the top-level entries of ``RECORD``); None for a distribution
    that is not installed there. Private (``_x``) and test/doc folders are left out."""
    names = sorted(set(distributions))
    result = proc.run([os.fspath(python), "-s", "-c", _IMPORT_NAMES, json.dumps(names)],
                      timeout=timeout, env=env)
    payload = proc.marked_json(result.stdout, MARK)
    if not result.ok or payload is None:
        raise ProvisionError(f"import check: cannot read package metadata with {python}: "
                             f"{result.describe()}")
    return payload


@dataclass(frozen=True)
class ImportFailure:
    module: str
    error: str  # "ModuleNotFoundError: No module named 'x'", "timed out after 60 s", ...
    distribution: str | None = None

    def __str__(self) -> str:
        owner = f" ({self.distribution})" if self.distribution else ""
        return f"import {self.module}{owner}: {self.error}"


_IMPORTER = r"""
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
for module in json.loads(sys.argv[1]):
    print("@@dsenv@@" + json.dumps({"start": module}), flush=True)
    try:
        importlib.import_module(module)
        error = None
    except BaseException as exc:
        error = (type(exc).__name__ + ": " + str(exc)).strip().splitlines()[0][:300]
    print("@@dsenv@@" + json.dumps({"module": module, "error": error}), flush=True)
"""


def import_check(python: str | os.PathLike, modules: Iterable[str], *,
                 env: Mapping[str, str] | None = None, timeout: float = 300.0,
                 owners: Mapping[str, str] | None = None) -> list[ImportFailure]:
    """Import every module in ``modules`` with ``python`` (one subprocess, run again after the
    module that crashed or hung it); returns the failures, empty when all import.
    ``timeout`` bounds each subprocess; ``owners`` maps modules to distributions for messages.
    """
    todo = list(dict.fromkeys(modules))
    failures: list[ImportFailure] = []
    owners = owners or {}
    while todo:
        result = proc.run([os.fspath(python), "-s", "-c", _IMPORTER, json.dumps(todo)],
                          timeout=timeout, env=env)
        done: set[str] = set()
        current = None
        for line in result.stdout.splitlines():
            if not line.startswith(MARK):
                continue
            record = json.loads(line[len(MARK):])
            if "start" in record:
                current = record["start"]
                continue
            done.add(record["module"])
            current = None
            if record["error"]:
                failures.append(ImportFailure(record["module"], record["error"],
                                              owners.get(record["module"])))
        if result.ok:
            break
        if current is None:  # died before its first import or between two
            if not done:
                raise ProvisionError(f"import check: {python} does not run: "
                                     f"{result.describe()}")
            todo = [m for m in todo if m not in done]
            continue
        how = (f"timed out after {timeout:.0f} s" if result.timed_out
               else f"crashed the interpreter (exit {result.returncode})")
        failures.append(ImportFailure(current, how, owners.get(current)))
        done.add(current)
        todo = [m for m in todo if m not in done]
    return failures


def lock_modules(python: str | os.PathLike, lock: str | os.PathLike, *,
                 env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{import name: distribution}`` for every package of ``lock`` in ``python``'s env; a
    locked distribution that is not installed maps to itself (its import then fails)."""
    lock = Path(lock)
    entries: list[LockedRequirement] = read_lock(lock.read_text(), str(lock))
    names = import_names(python, [e.name for e in entries], env=env)
    modules: dict[str, str] = {}
    for dist, tops in names.items():
        for module in tops if tops is not None else [dist.replace("-", "_")]:
            modules.setdefault(module, dist)
    return modules


def import_check_lock(python: str | os.PathLike, lock: str | os.PathLike, *,
                      env: Mapping[str, str] | None = None,
                      timeout: float = 300.0) -> list[ImportFailure]:
    """:func:`import_check` of every module of every package ``lock`` expects."""
    modules = lock_modules(python, lock, env=env)
    return import_check(python, modules, env=env, timeout=timeout, owners=modules)

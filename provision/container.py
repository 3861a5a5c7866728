"""`--kind container`: a venv with ``--system-site-packages`` on top of a vendor image's Python.

Vendor images (NGC's PyTorch, AMD's ROCm images) bring a torch built for their GPUs and
much of the stack; CSCS's BERT-SQuAD course (github.com/eth-cscs/pytorch-training) adds the
rest with ``python -m venv --system-site-packages`` and ``pip install``. dsenv does the same
from a lock, installing only what the image lacks:

* :func:`plan_missing` compares the lock with the distributions the image's interpreter sees
  (first on ``sys.path`` wins, as at import time): a package at the locked version is used
  from the image; anything absent, or at another version, is installed into the venv (where
  it shadows the image's copy). ``keep`` names packages taken from the image whatever their
  version (the image's own torch build, e.g. ``2.13.0a0+nv25.10``).
* The missing ones are installed with ``uv pip install --require-hashes --no-deps``: the
  lock is already a complete, resolved set; ``--no-deps`` stops a second resolution that
  would see neither the image's packages (uv only looks inside the venv, so it would
  reinstall the image's torch and its nvidia-* wheels into the venv) nor the ``keep`` choice;
  hashes are still checked for every file installed.
* Then every module of every locked package is imported in the finished environment
  (import_check.py) and ``ldd`` runs on every shared object of the env (shared_libs.py).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from dsenv import proc
from dsenv.provision import ProvisionError
from dsenv.provision.locks import read_lock
from dsenv.provision.shown import Command, temporary_names
from dsenv.provision.uvcmd import Sources, uv_command
from dsenv.provision.venv import make_venv, run_sync
from dsenv.versions import same_version

MARK = "@@dsenv@@"  # the children's JSON answer lines start with it
MISSING_SCRATCH = "dsenv-missing-"  # the temporary folder of install_lines


@dataclass(frozen=True)
class ContainerPlan:
    """What the image provides and what the venv must add, for one lock."""

    present: dict[str, str]  # name -> version: the image has the locked version
    missing: list[str]  # lock lines (requirement + hashes) to install into the venv
    shadowed: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (image, lock)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (image, lock)

    def missing_names(self) -> list[str]:
        return [line.split("==", 1)[0] for line in self.missing]

    def summary(self) -> str:
        """``42 from the image, 12 to install (3 shadow the image's: ...)`` for a plan line."""
        text = f"{len(self.present)} from the image, {len(self.missing)} to install"
        if self.shadowed:
            names = ", ".join(f"{n} {img}->{lock}" for n, (img, lock) in self.shadowed.items())
            text += f" ({len(self.shadowed)} shadow the image's: {names})"
        if self.kept:
            names = ", ".join(f"{n} {img}" for n, (img, _) in self.kept.items())
            text += f"; kept from the image: {names}"
        return text


_DISTRIBUTIONS = r"""
import importlib.metadata as md, json, re
seen = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name:
        seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
print("@@dsenv@@" + json.dumps(seen))
"""


def image_distributions(python: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                        timeout: float = 120.0) -> dict[str, str]:
    """``{normalized name: version}`` of what ``python`` sees (user site left out, ``-s``)."""
    result = proc.run([os.fspath(python), "-s", "-c", _DISTRIBUTIONS], timeout=timeout, env=env)
    payload = proc.marked_json(result.stdout, MARK)
    if not result.ok or payload is None:
        raise ProvisionError(f"container: cannot list the packages of {python}: "
                             f"{result.describe()}: check that it is the image's Python")
    return payload


def plan_container(lock: str | os.PathLike, base_python: str | os.PathLike, *,
                   keep: Iterable[str] = (), env: Mapping[str, str] | None = None,
                   timeout: float = 120.0) -> ContainerPlan:
    """Split ``lock`` into what ``base_python`` (the image's interpreter) already has at the
    locked version and what must be installed on top (see the module's docstring)."""
    lock = Path(lock)
    entries = read_lock(lock.read_text(), str(lock))
    installed = image_distributions(base_python, env=env, timeout=timeout)
    keep = {canonicalize_name(name) for name in keep}
    present: dict[str, str] = {}
    missing: list[str] = []
    shadowed: dict[str, tuple[str, str]] = {}
    kept: dict[str, tuple[str, str]] = {}
    for entry in entries:
        have = installed.get(entry.name)
        if have is not None and same_version(have, entry.version):
            present[entry.name] = have
        elif have is not None and entry.name in keep:
            kept[entry.name] = (have, entry.version)
        else:
            missing.append(entry.line())
            if have is not None:
                shadowed[entry.name] = (have, entry.version)
    return ContainerPlan(present, missing, shadowed, kept)


def plan_missing(lock: str | os.PathLike, base_python: str | os.PathLike, *,
                 keep: Iterable[str] = (), env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> tuple[dict[str, str], list[str]]:
    """``(present, missing)``: ``{name: version}`` the image provides at the locked version,
    and the lock lines (with hashes) to install into the venv."""
    plan = plan_container(lock, base_python, keep=keep, env=env, timeout=timeout)
    return plan.present, plan.missing


def create_container_env(
    prefix: str | os.PathLike,
    lock: str | os.PathLike,
    *,
    base_python: str | os.PathLike,
    keep: Iterable[str] = (),
    sources: Sources | None = None,
    compile_bytecode: bool = True,
    offline: bool | None = None,
    env: Mapping[str, str] | None = None,
    log: str | os.PathLike | None = None,
    timeout: float = 3600.0,
) -> ContainerPlan:
    """A relocatable ``--system-site-packages`` venv at ``prefix`` (empty staging folder) on
    ``base_python``, with the lock's packages the image lacks installed (hashes required,
    ``--no-deps``) from ``sources`` (default PyPI). Returns the plan that was carried out."""
    plan = plan_container(lock, base_python, keep=keep, env=env)
    python = make_venv(prefix, python=base_python, system_site_packages=True, env=env, log=log)
    install_lines(python, plan.missing, sources=sources or Sources(),
                  compile_bytecode=compile_bytecode, offline=offline, env=env, log=log,
                  timeout=timeout)
    return plan


def install_lines(python: str | os.PathLike, lines: Sequence[str], *, sources: Sources,
                  compile_bytecode: bool = True, offline: bool | None = None,
                  env: Mapping[str, str] | None = None, log: str | os.PathLike | None = None,
                  timeout: float = 3600.0) -> None:
    """``uv pip install --require-hashes --no-deps`` of lock ``lines`` into ``python``'s env."""
    if not lines:
        return
    with tempfile.TemporaryDirectory(prefix=MISSING_SCRATCH) as scratch:
        missing_file(Path(scratch)).write_text("".join(f"{line}\n" for line in lines))
        run_sync(lambda cache_only: install_lines_command(python, Path(scratch), sources,
                                                          compile_bytecode, cache_only),
                 what=f"install {len(lines)} packages the image lacks", sources=sources,
                 offline=offline, env=env, log=log, timeout=timeout,
                 names=temporary_names(scratch, MISSING_SCRATCH))


def missing_file(scratch: Path) -> Path:
    """The requirements file of the lock lines the image lacks, in the install's folder."""
    return scratch / "missing.txt"


def install_lines_command(python: str | os.PathLike, scratch: Path, sources: Sources,
                          compile_bytecode: bool = True, offline: bool = False) -> Command:
    """The ``uv pip install --require-hashes --no-deps -r missing.txt`` that
    :func:`install_lines` runs (and the plan shows, with ``scratch`` as
    ``shown.temporary(MISSING_SCRATCH)``)."""
    return uv_command(["pip", "install", "--require-hashes", "--no-deps", "--python",
                       os.fspath(python), "--color", "never", *sources.args(),
                       *(["--compile-bytecode"] if compile_bytecode else []),
                       *(["--offline"] if offline else []), "-r", str(missing_file(scratch))])

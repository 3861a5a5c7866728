"""The workload contract: what a bundled workload module (workloads/bert_squad.py, ...)
defines for the skeleton in workloads/runner.py, as typed Protocols. Every module named in
workloads/workloads.toml satisfies :class:`Workload` (tests/test_tables_agree.py checks it
with :func:`problems`), and either :class:`SavedDataset` or :class:`OwnData`.

A workload keeps only its data, model, batches and evaluation; the skeleton calls these by
name. ``SMOKE``/``FULL`` are its ``Settings`` (a subclass of runner.Settings), ``s`` below.

Optional hooks, each its own Protocol: :class:`SavedDataset` (its save_to_disk data set,
read by runner.read_saved) or :class:`OwnData` (its own files); :class:`Prepares`
(tokenizing before the steps are planned, and the full run's status meanwhile);
:class:`NeedsPackages`; :class:`Checks` (more options to refuse early); :class:`Settles` (a
full run's Settings after the command line).

Light: nothing here imports torch, and nothing imports the runner at run time.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the runner imports the workloads' helpers
    from dsenv.workloads.runner import Run, Settings


@runtime_checkable
class Workload(Protocol):
    """What every workload module defines."""

    NAME: str  # its name in workloads/workloads.toml
    SMOKE: Settings  # the smoke's settings
    FULL: Settings  # the full run's settings
    THRESHOLDS: tuple[str, ...]  # the Settings fields that are sanity thresholds
    OPTIONS: dict[str, str]  # a full run's command-line options -> the Settings field each sets
    ASSETS: str  # the status while rank 0 makes the smoke's assets

    def write_synthetic(self, folder: Path, s: Settings, seed: int) -> None:
        """The smoke's synthetic data set."""

    def train_tokenizer(self, data_dir: Path, s: Settings) -> Any:
        """A tokenizer trained on the training split."""

    def tiny_model(self, s: Settings, tokenizer: Any) -> Any:
        """The smoke's initial tiny model."""

    def samples(self, data: Any, s: Settings) -> tuple[int, str, str]:
        """(training samples, their name in errors, on the first line)."""

    def train_and_evaluate(self, run: Run, data: Any) -> int:
        """Model, training, evaluation, saving, then runner.conclude: the exit code."""

    def run(self, args: Any, mode: str = "smoke") -> int:
        """``runner.run(this module, args, mode)`` (or the workload's own first)."""


@runtime_checkable
class SavedDataset(Protocol):
    """A workload whose data is a save_to_disk data set (runner.read_saved)."""

    COLUMNS: tuple[str, ...]
    SPLITS: tuple[str, ...]


@runtime_checkable
class OwnData(Protocol):
    """A workload that reads its own files instead."""

    def read_data(self, args: Any, mode: str, generated: Path | None) -> Any:
        """--data-dir, the smoke's generated folder, or the fetched data."""


@runtime_checkable
class Prepares(Protocol):
    def prepare(self, data: Any, init_model: Path, s: Settings, args: Any) -> Any:
        """The data tokenized (before the steps are planned)."""

    def preparing(self, data: Any, s: Settings) -> str:
        """The full run's status line while it prepares."""


@runtime_checkable
class NeedsPackages(Protocol):
    PACKAGES: dict[str, str]  # module -> distribution beyond torch and transformers


@runtime_checkable
class Checks(Protocol):
    def check(self, args: Any) -> None:
        """More options to refuse before anything starts (WorkloadError)."""


@runtime_checkable
class Settles(Protocol):
    def settled(self, s: Settings) -> Settings:
        """A full run's Settings after the command line."""


OPTIONAL = (SavedDataset, OwnData, Prepares, NeedsPackages, Checks, Settles)


def members(protocol: type) -> dict[str, inspect.Signature | None]:
    """The names ``protocol`` asks for: a method's signature (``self`` dropped), None for
    a constant."""
    found: dict[str, inspect.Signature | None] = dict.fromkeys(
        getattr(protocol, "__annotations__", {}))
    for name, value in vars(protocol).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            signature = inspect.signature(value)
            found[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return found


def _mismatch(module: ModuleType, name: str, wanted: inspect.Signature | None) -> str | None:
    value = getattr(module, name)
    if wanted is None:
        return f"{name} is a function, not a constant" if inspect.isfunction(value) else None
    if not callable(value):
        return f"{name} is not a function"
    # called as the skeleton calls it: required parameters by position, the others by name
    args = [p.name for p in wanted.parameters.values() if p.default is p.empty]
    kwargs = {p.name: p.default for p in wanted.parameters.values() if p.default is not p.empty}
    signature = inspect.signature(value)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{name}{signature} cannot be called as {name}{wanted}: {exc}"
    return None


def problems(module: ModuleType) -> list[str]:
    """Where ``module`` breaks the contract (empty: it keeps it): a missing name, a function
    the skeleton cannot call as it does, a half-kept optional hook, no way to read its
    data."""
    found = [f"no {name}" for name in members(Workload) if not hasattr(module, name)]
    for protocol in (Workload, *OPTIONAL):
        wanted = members(protocol)
        present = [name for name in wanted if hasattr(module, name)]
        if protocol is not Workload and present and len(present) < len(wanted):
            found.append(f"{protocol.__name__} half kept: has {', '.join(present)}, not "
                         f"{', '.join(n for n in wanted if n not in present)}")
        found += filter(None, (_mismatch(module, name, wanted[name]) for name in present))
    if not isinstance(module, SavedDataset) and not isinstance(module, OwnData):
        found.append("neither COLUMNS and SPLITS (a save_to_disk data set) nor read_data")
    return found

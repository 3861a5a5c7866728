"""Each workload's full-run assets: declared once in assets.toml (which workload needs which:
workloads.toml, through registry.py), placed by ``dsenv fetch``, found by the full runs and
by ``dsenv doctor --for WORKLOAD``.

Where things live (the one layout fetch, the loaders and the doctor share):

- models and dataset repositories: huggingface_hub's cache (HF_HUB_CACHE, else
  $HF_HOME/hub), in its own layout, so ``from_pretrained(repo, revision=...)`` finds them
  with HF_HUB_OFFLINE=1;
- data sets prepared for the workloads (``datasets`` ``save_to_disk``, read back offline
  with ``load_from_disk``):
  ``<datasets cache>/dsenv/<owner>--<name>/`` (HF_DATASETS_CACHE, else $HF_HOME/datasets);
- one manifest per workload, every file with its size and sha256:
  ``<datasets cache>/dsenv/manifests/<workload>.json``.

``CacheLayout.under(DIR)`` is the same layout below one folder: what ``dsenv fetch
--cache-dir DIR`` writes and ``dsenv fetch --from DIR`` reads.
Nothing here imports torch, transformers or datasets at module import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.data import load_table
from dsenv.envs.launchers import OFFLINE_VARIABLES
from dsenv.facts.host.hfcache import resolve_dirs
from dsenv.workloads import registry
from dsenv.workloads.errors import WorkloadError

WORKLOAD_NAMES: tuple[str, ...] = registry.fetchable_names()  # those with full-run assets


@dataclass(frozen=True)
class CacheLayout:
    hub: Path  # huggingface_hub cache
    saved: Path  # save_to_disk data sets and manifests

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CacheLayout:
        """The folders huggingface_hub and datasets would use with this environment."""
        dirs = resolve_dirs(os.environ if env is None else env)
        return cls(dirs.hub, dirs.datasets / "dsenv")

    @classmethod
    def under(cls, root: Path) -> CacheLayout:
        """The layout below one folder, as if HF_HOME=root (a portable bundle)."""
        root = Path(root)
        return cls(root / "hub", root / "datasets" / "dsenv")

    @property
    def manifests(self) -> Path:
        return self.saved / "manifests"

    def manifest_path(self, workload: str) -> Path:
        return self.manifests / f"{workload}.json"

    def area(self, name: str) -> Path:
        """Manifest paths are relative to an area, so a bundle maps onto any layout."""
        return {"hub": self.hub, "saved": self.saved}[name]


@dataclass(frozen=True)
class Asset:
    kind: str  # "model" or "dataset"
    repo: str
    revision: str
    files: tuple[str, ...] = ()  # model: files that must be in the snapshot
    splits: dict[str, str] = field(default_factory=dict)  # dataset: split -> file pattern
    name: str = ""  # its section in assets.toml: [asset.NAME]

    @property
    def cache_folder(self) -> str:
        """The folder name huggingface_hub uses in HF_HUB_CACHE."""
        return f"{self.kind}s--{self.repo.replace('/', '--')}"

    @property
    def saved_folder(self) -> str:
        return self.repo.replace("/", "--")

    @property
    def patterns(self) -> list[str]:
        """What to download from the repository (allow_patterns)."""
        return list(self.files) if self.kind == "model" else sorted(set(self.splits.values()))

    def describe(self) -> str:
        return f"{self.kind} {self.repo}@{self.revision}"

    def snapshot(self, layout: CacheLayout) -> Path | None:
        return _snapshot_dir(layout.hub / self.cache_folder, self.revision)

    def saved_dir(self, layout: CacheLayout) -> Path:
        return layout.saved / self.saved_folder

    def missing_in(self, layout: CacheLayout) -> list[str]:
        """What of this asset a full run would not find (empty: all there)."""
        if self.kind == "dataset":
            saved = self.saved_dir(layout)
            if not (saved / "dataset_dict.json").is_file():
                return [f"{self.describe()} (no prepared data set in {saved})"]
            return [f"{self.repo}: split {name}" for name in self.splits
                    if not (saved / name / "dataset_info.json").is_file()]
        snapshot = self.snapshot(layout)
        if snapshot is None:
            return [f"{self.describe()} (no snapshot in {layout.hub / self.cache_folder})"]
        return [f"{self.repo}: {name}" for name in self.files if not (snapshot / name).exists()]


def _snapshot_dir(repo_dir: Path, revision: str) -> Path | None:
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        snapshot = repo_dir / "snapshots" / ref.read_text().strip()
        return snapshot if snapshot.is_dir() else None
    exact = repo_dir / "snapshots" / revision  # a pinned commit hash
    return exact if exact.is_dir() else None


def declared_assets(table: dict | None = None) -> dict[str, Asset]:
    """name -> Asset of assets.toml (``table``: a parsed copy, for tests)."""
    rows = (table or load_table("dsenv.workloads", "assets.toml"))["asset"]
    return {name: Asset(a["kind"], a["repo"], a["revision"], tuple(a.get("files", ())),
                        dict(a.get("splits", {})), name)
            for name, a in rows.items()}


def assets_for(workload: str) -> list[Asset]:
    if workload not in WORKLOAD_NAMES:
        raise WorkloadError(f"unknown workload {workload!r}; choose one of "
                            f"{', '.join(WORKLOAD_NAMES)}")
    declared = declared_assets()
    return [declared[name] for name in registry.entry(workload).assets]


def asset_of(workload: str, kind: str) -> Asset:
    """The workload's one asset of ``kind`` (its model, its data set)."""
    found = [a for a in assets_for(workload) if a.kind == kind]
    if len(found) != 1:
        raise WorkloadError(f"assets.toml: {workload} declares {len(found)} {kind} assets")
    return found[0]


# ----------------------------------------------------------------------------- full runs
def force_offline(env: dict | None = None) -> None:
    """Full runs never download: a missing file is an error naming `dsenv fetch`, not a
    hang on retries from a compute node without internet. Call before importing
    huggingface_hub, transformers or datasets (they read these at import)."""
    env = os.environ if env is None else env
    for name in OFFLINE_VARIABLES:
        env[name] = "1"


def _not_fetched(workload: str, missing: list[str], layout: CacheLayout) -> WorkloadError:
    return WorkloadError(
        f"{'; '.join(missing)}: not in the offline cache; on a node with internet run "
        f"`dsenv fetch {workload}` (or `dsenv fetch {workload} --from DIR` with a copy), "
        f"with the same HF_HOME/HF_HUB_CACHE/HF_DATASETS_CACHE as this job "
        f"(hub cache {layout.hub}, data sets {layout.saved})")


def model_path(workload: str, layout: CacheLayout | None = None) -> Path:
    """The cached snapshot folder of the workload's model (for from_pretrained)."""
    layout = layout or CacheLayout.from_env()
    asset = asset_of(workload, "model")
    missing = asset.missing_in(layout)
    if missing:
        raise _not_fetched(workload, missing, layout)
    return asset.snapshot(layout)


def load_dataset(workload: str, layout: CacheLayout | None = None):
    """The workload's prepared data set (a datasets.DatasetDict), read from disk."""
    layout = layout or CacheLayout.from_env()
    asset = asset_of(workload, "dataset")
    missing = asset.missing_in(layout)
    if missing:
        raise _not_fetched(workload, missing, layout)
    import datasets  # datasets: only once a full run reads it

    path = asset.saved_dir(layout)
    try:
        return datasets.load_from_disk(str(path))
    except Exception as exc:  # arrow/json errors of a damaged copy
        raise WorkloadError(f"prepared data set {path} is damaged ({type(exc).__name__}: "
                            f"{exc}); `dsenv fetch --verify` shows which file, `dsenv fetch "
                            f"{workload}` fetches it again") from None

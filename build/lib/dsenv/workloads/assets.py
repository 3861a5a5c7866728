"""Each workload's full-run assets, declared once in assets.toml, found in the HF cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsenv.data import load_table

_TABLE = load_table("dsenv.workloads", "assets.toml")
WORKLOAD_NAMES: tuple[str, ...] = tuple(_TABLE)


@dataclass(frozen=True)
class Asset:
    kind: str  # "model" or "dataset"
    repo: str
    revision: str
    files: tuple[str, ...]

    @property
    def cache_folder(self) -> str:
        """The folder name huggingface_hub uses in HF_HUB_CACHE."""
        return f"{self.kind}s--{self.repo.replace('/', '--')}"

    def missing_in(self, hub_cache: Path) -> list[str]:
        """What of this asset is absent from ``hub_cache`` (empty: present)."""
        repo_dir = hub_cache / self.cache_folder
        snapshot = _snapshot_dir(repo_dir, self.revision)
        if snapshot is None:
            return [f"{self.kind} {self.repo}@{self.revision} (no snapshot in {repo_dir})"]
        return [f"{self.repo}: {name}" for name in self.files if not (snapshot / name).exists()]


def _snapshot_dir(repo_dir: Path, revision: str) -> Path | None:
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        snapshot = repo_dir / "snapshots" / ref.read_text().strip()
        return snapshot if snapshot.is_dir() else None
    exact = repo_dir / "snapshots" / revision  # a pinned commit hash
    return exact if exact.is_dir() else None


def assets_for(workload: str) -> list[Asset]:
    if workload not in _TABLE:
        raise KeyError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOAD_NAMES)}")
    return [Asset(a["kind"], a["repo"], a["revision"], tuple(a.get("files", ())))
            for a in _TABLE[workload]["assets"]]

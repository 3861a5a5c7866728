"""``dsenv fetch``'s manifests: every file of a workload's assets with its size and sha256
(schema ``dsenv.fetch/1``), relative to an area ("hub": the hub cache, "saved": the prepared
data sets) so a bundle maps onto any cache; reading and checking them, ``--verify``; and
the short lines every part of fetch prints.

    load_manifest(path, workload) -> dict    # FetchError naming what is wrong
    check_manifest(layout, manifest) -> Checked   # missing or changed files
    verify(layout, workloads, out, cache_dir) -> exit code
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from dsenv.jsonfiles import JsonFileError, read_json
from dsenv.redact import Redactor
from dsenv.workloads.errors import FetchError
from dsenv.workloads.fetch.assets import CacheLayout

SCHEMA = "dsenv.fetch/1"
CHUNK = 1 << 20
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX40 = re.compile(r"[0-9a-f]{40}")


# ----------------------------------------------------------------------------- output
class Output:
    """Short lines on stdout (rich), errors as one line on stderr; secrets masked."""

    def __init__(self, redactor: Redactor):
        from rich.console import Console  # rich: kept off dsenv --help

        self.redactor = redactor
        self.console = Console(highlight=False, soft_wrap=True)

    def line(self, text: str, mark: str = "", style: str = "") -> None:
        from rich.text import Text  # rich: kept off dsenv --help

        shown = Text()
        if mark:
            shown.append(mark + " ", style=style)
        shown.append(self.redactor.scrub(text))
        self.console.print(shown)

    def ok(self, text: str) -> None:
        self.line(text, "✓", "green")

    def bad(self, text: str) -> None:
        self.line(text, "✗", "red")


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def one_line(text: object) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(text).__name__


# ----------------------------------------------------------------------------- hashing
def file_digest(path: Path) -> tuple[int, str, str]:
    """(size, sha256, git blob sha1) of a file's content (symlinks followed)."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha256.update(chunk)
            git.update(chunk)
    return size, sha256.hexdigest(), git.hexdigest()


def matches_blob_name(path: Path, sha256: str, git_sha1: str) -> bool:
    """A hub cache file against its blob's name (the Hub's ETag: sha256 for LFS files, the
    git blob sha1 for the others). True when the name is neither (nothing to judge)."""
    real = path.resolve()
    if real.parent.name != "blobs":
        return True  # no symlinks here: huggingface_hub copied the file
    name = real.name
    if HEX64.fullmatch(name):
        return name == sha256
    if HEX40.fullmatch(name):
        return name == git_sha1
    return True


# ----------------------------------------------------------------------------- manifests
@dataclass
class Problem:
    path: Path
    what: str  # "missing" or "changed (...)"

    def describe(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass
class Checked:
    files: int = 0
    size: int = 0
    problems: list[Problem] = field(default_factory=list)


def _safe_relative(value: object) -> bool:
    if not isinstance(value, str) or not value or "\\" in value:
        return False
    path = PurePosixPath(value)
    return not path.is_absolute() and ".." not in path.parts and "." not in path.parts


def load_manifest(path: Path, workload: str | None = None) -> dict:
    """Read and check a manifest; FetchError (exit 2) naming what is wrong."""
    again = f"`dsenv fetch {workload}`" if workload else "`dsenv fetch WORKLOAD`"
    try:
        data = read_json(path, "fetch manifest")
    except JsonFileError as exc:
        raise FetchError(f"{exc}; make it again with {again}") from None

    def bad(what: str) -> FetchError:
        return FetchError(f"fetch manifest {path}: {what}; make it again with {again}")

    if not isinstance(data, dict):
        raise bad("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise bad(f"schema {data.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("workload", "created"):
        if not isinstance(data.get(key), str):
            raise bad(f"no {key!r} string")
    if not isinstance(data.get("assets"), list):
        raise bad("no 'assets' list")
    for index, entry in enumerate(data["assets"]):
        where = f"assets[{index}]"
        if not isinstance(entry, dict):
            raise bad(f"{where} is not an object")
        for key in ("kind", "repo", "revision", "commit", "area", "root"):
            if not isinstance(entry.get(key), str):
                raise bad(f"{where} has no {key!r} string")
        if entry["area"] not in ("hub", "saved"):
            raise bad(f"{where}: area {entry['area']!r} is neither 'hub' nor 'saved'")
        if not _safe_relative(entry["root"]) or len(PurePosixPath(entry["root"]).parts) != 1:
            raise bad(f"{where}: root {entry['root']!r} is not one folder name")
        if not isinstance(entry.get("files"), list):
            raise bad(f"{where} has no 'files' list")
        for number, item in enumerate(entry["files"]):
            spot = f"{where}.files[{number}]"
            if not isinstance(item, dict):
                raise bad(f"{spot} is not an object")
            if not _safe_relative(item.get("path")) or \
                    not item["path"].startswith(entry["root"] + "/"):
                raise bad(f"{spot}: path {item.get('path')!r} is not a relative path below "
                          f"{entry['root']}/")
            if not isinstance(item.get("size"), int) or item["size"] < 0:
                raise bad(f"{spot} ({item['path']}) has no valid 'size'")
            if not isinstance(item.get("sha256"), str) or not HEX64.fullmatch(item["sha256"]):
                raise bad(f"{spot} ({item['path']}) has no valid 'sha256'")
    return data


def check_entry(layout: CacheLayout, entry: dict, sizes_only: bool = False) -> Checked:
    """Every file of one manifest entry against its size and sha256."""
    result = Checked()
    base = layout.area(entry["area"])
    for item in entry["files"]:
        path = base / item["path"]
        result.files += 1
        result.size += item["size"]
        if not path.is_file():
            result.problems.append(Problem(path, "missing"))
            continue
        size = path.stat().st_size
        if size != item["size"]:
            result.problems.append(Problem(path, f"changed (size {item['size']} -> {size})"))
            continue
        if sizes_only:
            continue
        _, sha256, _ = file_digest(path)
        if sha256 != item["sha256"]:
            result.problems.append(Problem(path, f"changed (sha256 {sha256[:12]}..., "
                                                 f"expected {item['sha256'][:12]}...)"))
    return result


def check_manifest(layout: CacheLayout, manifest: dict) -> Checked:
    total = Checked()
    for entry in manifest["assets"]:
        checked = check_entry(layout, entry)
        total.files += checked.files
        total.size += checked.size
        total.problems += checked.problems
    return total


def files_entry(base: Path, paths: Iterable[Path]) -> list[dict]:
    files = []
    for path in sorted(paths):
        size, sha256, _ = file_digest(path)
        files.append({"path": path.relative_to(base).as_posix(), "size": size,
                      "sha256": sha256})
    return files


# ----------------------------------------------------------------------------- --verify
def verify(layout: CacheLayout, workloads: list[str], out: Output,
           cache_dir: Path | None) -> int:
    where = f" --cache-dir {cache_dir}" if cache_dir else ""
    if workloads:
        paths = [(name, layout.manifest_path(name)) for name in workloads]
    else:
        paths = [(p.stem, p) for p in sorted(layout.manifests.glob("*.json"))]
        if not paths:
            out.bad(f"no fetch manifests in {layout.manifests}: nothing fetched here yet "
                    f"(`dsenv fetch WORKLOAD{where}`)")
            return 1
    manifests = [(name, path, load_manifest(path, name) if path.is_file() else None)
                 for name, path in paths]  # every manifest readable before any verdict
    failed = total_files = total_size = 0
    for name, path, manifest in manifests:
        if manifest is None:
            failed += 1
            out.bad(f"{name}: not fetched (no manifest {path}): `dsenv fetch {name}{where}`")
            continue
        checked = check_manifest(layout, manifest)
        total_files += checked.files
        total_size += checked.size
        for problem in checked.problems:
            out.bad(problem.describe())
        if checked.problems:
            failed += 1
            again = (f"`dsenv fetch {name}{where} --from {manifest['imported_from']}` copies"
                     if isinstance(manifest.get("imported_from"), str)
                     else f"`dsenv fetch {name}{where}` fetches")
            out.bad(f"{name}: {len(checked.problems)} of {checked.files} files missing or "
                    f"changed; {again} them again")
        else:
            out.ok(f"{name}: {checked.files} files, {human_size(checked.size)} match "
                   f"{path}")
    if failed:
        return 1
    out.line(f"verified {total_files} files, {human_size(total_size)}: all match")
    return 0

"""``dsenv fetch``: a bundled workload's full-run assets, downloaded into the offline cache.

On a node with internet (a login node), before jobs run on compute nodes without it:

    dsenv fetch bert-squad                 # models and data set repos into the hub cache,
                                           # data sets prepared with save_to_disk, a manifest
    dsenv fetch bert-squad --cache-dir DIR # the same layout below DIR: a portable bundle
    dsenv fetch bert-squad --from DIR      # import such a bundle (no network at all)
    dsenv fetch --verify [WORKLOAD ...]    # every manifest file against its size and sha256

Where everything goes is workloads/assets.py's layout (``CacheLayout``). The manifest
(``dsenv.fetch/1``) lists every file with its size and sha256, relative to an area ("hub":
the hub cache, "saved": the prepared data sets), so a bundle maps onto any cache.

Exit codes: 0 done (or all files match), 1 ``--verify`` found missing or changed files,
2 bad input, an unreachable or refusing Hub, a damaged bundle or manifest.

Imports stay light: huggingface_hub and datasets load only when fetching.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit, urlunsplit

from dsenv.envs.launchers import HUB_OFFLINE_VARIABLES
from dsenv.workloads.assets import WORKLOAD_NAMES, Asset, CacheLayout, assets_for

from dsenv import __version__
from dsenv.errors import DsenvError
from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.redact import Redactor
from dsenv.staging import staged_dir

SCHEMA = "dsenv.fetch/1"
# huggingface_hub reads these at import; fetch sets them when the user has not.
DEFAULT_TIMEOUTS = {"HF_HUB_ETAG_TIMEOUT": "10", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


class FetchError(DsenvError):
    """One line on stderr and exit code 2: bad input, unreachable, damaged."""


# ----------------------------------------------------------------------------- CLI
def add_fetch_parser(subparsers) -> None:
    """Add ``fetch`` to dsenv's sub-commands."""
    names = ", ".join(WORKLOAD_NAMES)
    fetch = subparsers.add_parser(
        "fetch", help="download a workload's model and data into the offline cache",
        description="Download a bundled workload's full-run assets (model and data set "
                    "repositories into the Hugging Face hub cache, data sets prepared with "
                    "save_to_disk) and write a manifest with every file's size and sha256, so "
                    "that jobs on compute nodes without internet find them. Run it on a node "
                    "with internet; for offline login nodes make a bundle with --cache-dir "
                    "elsewhere and import it with --from. Exit 0: done or all files match; "
                    "1: --verify found missing or changed files; 2: bad input, hub "
                    "unreachable, damaged bundle or manifest.")
    fetch.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                       help=f"{names}, or all (with --verify: default every manifest)")
    fetch.add_argument("--cache-dir", type=Path, metavar="DIR",
                       help="use the cache layout below DIR instead of HF_HOME/HF_HUB_CACHE/"
                            "HF_DATASETS_CACHE: a portable bundle to copy elsewhere")
    fetch.add_argument("--from", dest="from_dir", type=Path, metavar="DIR",
                       help="import a bundle made by `dsenv fetch WORKLOAD --cache-dir DIR` on "
                            "another machine (no network)")
    fetch.add_argument("--verify", action="store_true",
                       help="recompute the size and sha256 of every file in the manifests; "
                            "exit 1 if any is missing or changed")


def run_fetch(args) -> int:
    out = Output(Redactor(os.environ))
    workloads = _chosen_workloads(args.workloads, required=not args.verify)
    layout = CacheLayout.under(args.cache_dir) if args.cache_dir else CacheLayout.from_env()
    if args.verify:
        if args.from_dir:
            raise FetchError("--verify checks a cache, --from imports one: give one of them "
                             "(`dsenv fetch --verify --cache-dir DIR` checks a bundle)")
        return verify(layout, workloads, out, args.cache_dir)
    if args.from_dir:
        return import_bundle(Path(args.from_dir), layout, workloads, out,
                             every="all" in args.workloads)
    return fetch(layout, workloads, out)


def _chosen_workloads(names: list[str], required: bool) -> list[str]:
    valid = f"{', '.join(WORKLOAD_NAMES)} or all"
    if not names:
        if required:
            raise FetchError(f"name a workload to fetch: {valid} (e.g. `dsenv fetch "
                             f"{WORKLOAD_NAMES[0]}`)")
        return []
    chosen: list[str] = []
    for name in names:
        if name == "all":
            chosen.extend(WORKLOAD_NAMES)
        elif name in WORKLOAD_NAMES:
            chosen.append(name)
        else:
            raise FetchError(f"unknown workload {name!r}; choose {valid}")
    return list(dict.fromkeys(chosen))


# ----------------------------------------------------------------------------- output
class Output:
    """Short lines on stdout (rich), errors as one line on stderr; secrets masked."""

    def __init__(self, redactor: Redactor):
        from rich.console import Console

        self.redactor = redactor
        self.console = Console(highlight=False, soft_wrap=True)

    def line(self, text: str, mark: str = "", style: str = "") -> None:
        from rich.text import Text

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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _one_line(text: object) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(text).__name__


def shown_endpoint(endpoint: str) -> str:
    """The endpoint without user:password@ (a proxy-style URL may carry them)."""
    parts = urlsplit(endpoint)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))
    return endpoint


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
    if _HEX64.fullmatch(name):
        return name == sha256
    if _HEX40.fullmatch(name):
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
            if not isinstance(item.get("sha256"), str) or not _HEX64.fullmatch(item["sha256"]):
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


def _files_entry(base: Path, paths: Iterable[Path]) -> list[dict]:
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


# ----------------------------------------------------------------------------- --from
def import_bundle(bundle: Path, layout: CacheLayout, workloads: list[str], out: Output,
                  every: bool = False) -> int:
    """Copy a bundle's assets into ``layout`` after checking every file; no network.
    ``every`` (``all``): the workloads the bundle holds."""
    source = CacheLayout.under(bundle)
    if not bundle.is_dir():
        raise FetchError(f"--from {bundle}: no such folder; make a bundle on a node with "
                         f"internet with `dsenv fetch WORKLOAD --cache-dir DIR` and copy DIR "
                         f"here (cp -a, rsync -a or tar keep its symlinks)")
    if every:
        present = [w for w in workloads if source.manifest_path(w).is_file()]
        workloads = present or workloads
    manifests = []
    for name in workloads:
        path = source.manifest_path(name)
        if not path.is_file():
            raise FetchError(f"no bundle of {name} in {bundle} (no {path}); make one on a node "
                             f"with internet with `dsenv fetch {name} --cache-dir DIR`, copy "
                             f"DIR here and run `dsenv fetch {name} --from DIR`")
        manifest = load_manifest(path, name)
        checked = check_manifest(source, manifest)
        if checked.problems:
            first = checked.problems[0]
            more = f" (and {len(checked.problems) - 1} more)" if len(checked.problems) > 1 else ""
            raise FetchError(f"bundle {bundle} is damaged, nothing imported: {first.describe()}"
                             f"{more}; copy it again (or make it again with `dsenv fetch {name} "
                             f"--cache-dir DIR`)")
        manifests.append((name, manifest))

    copied: set[tuple[str, str]] = set()
    for name, manifest in manifests:
        out.line(f"dsenv fetch {name} --from {bundle} (made {manifest['created']} from "
                 f"{manifest.get('endpoint', '?')})")
        for entry in manifest["assets"]:
            key = (entry["area"], entry["root"])
            if key not in copied:
                _copy_root(source, layout, entry)
                copied.add(key)
            out.ok(f"{_entry_label(entry)}: {len(entry['files'])} files, "
                   f"{human_size(sum(f['size'] for f in entry['files']))} imported")
        local = dict(manifest, imported_from=str(bundle.resolve()), imported=_now())
        path = write_json_atomically(layout.manifest_path(name), local, indent=1)
        out.line(f"manifest {path}")
    return 0


def _copy_root(source: CacheLayout, layout: CacheLayout, entry: dict) -> None:
    src = source.area(entry["area"]) / entry["root"]
    dest = layout.area(entry["area"]) / entry["root"]
    if src.resolve() == dest.resolve():
        return  # importing a layout onto itself
    if not src.is_dir():
        raise FetchError(f"bundle folder {src} is missing; copy the bundle again")
    with staged_dir(dest) as tmp:
        shutil.copytree(src, tmp, symlinks=True, dirs_exist_ok=True)
        inside = tmp.resolve()
        for item in entry["files"]:
            copy = tmp / PurePosixPath(item["path"]).relative_to(entry["root"])
            real = copy.resolve()
            if not real.is_relative_to(inside):
                raise FetchError(f"bundle file {src / copy.relative_to(tmp)} links outside the "
                                 f"bundle ({real}); copy the bundle with its relative symlinks "
                                 f"(cp -a, rsync -a, tar)")
            if not real.is_file() or real.stat().st_size != item["size"]:
                raise FetchError(f"copying {src} to {dest} failed at {item['path']} (size "
                                 f"differs): check the free space there, then run again")


def _entry_label(entry: dict) -> str:
    what = entry["kind"] if entry["area"] == "hub" else "prepared data set"
    return f"{what} {entry['repo']}@{entry['revision']} -> {entry['commit'][:12]}"


# ----------------------------------------------------------------------------- fetch
@dataclass
class Hub:
    """huggingface_hub, imported with fetch's settings; errors explained in one line."""

    module: object
    api: object
    endpoint: str
    etag_timeout: float


def _offline_variables(env) -> list[str]:
    return [f"{k}={env[k]}" for k in HUB_OFFLINE_VARIABLES
            if env.get(k, "").upper() in TRUE_VALUES]


def _offline_error(variables: list[str]) -> FetchError:
    variables = variables or ["HF_HUB_OFFLINE=1"]
    shown = " and ".join(variables) + (" are" if len(variables) > 1 else " is")
    names = " ".join(f"-u {v.split('=')[0]}" for v in variables)
    them = "them" if len(variables) > 1 else "it"
    return FetchError(f"fetch needs the network, but {shown} set (offline mode): unset {them} "
                      f"for fetch (`env {names} dsenv fetch ...`), or import a bundle made "
                      f"elsewhere with `dsenv fetch WORKLOAD --from DIR`")


def open_hub() -> Hub:
    """Import huggingface_hub after setting short timeouts (and quiet bars off a terminal)."""
    offline = _offline_variables(os.environ)
    if offline:
        raise _offline_error(offline)
    for name, value in DEFAULT_TIMEOUTS.items():
        os.environ.setdefault(name, value)
    if not sys.stdout.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()  # failures are explained by fetch, in one line
    if constants.HF_HUB_OFFLINE:
        raise _offline_error(offline)
    etag_timeout = float(constants.HF_HUB_ETAG_TIMEOUT)
    _bound_http_timeouts(huggingface_hub, etag_timeout, float(constants.HF_HUB_DOWNLOAD_TIMEOUT))
    return Hub(huggingface_hub, huggingface_hub.HfApi(), constants.ENDPOINT, etag_timeout)


def _bound_http_timeouts(huggingface_hub, connect: float, read: float) -> None:
    """huggingface_hub 2.4's session has no timeout and its repo_info / list_repo_tree pass
    ``timeout=None`` (wait forever): give every request without one connect/read limits,
    keeping the library's own request hooks (offline check, request ids)."""
    if not hasattr(huggingface_hub, "set_client_factory"):
        return
    session = huggingface_hub.get_session()
    client_type = type(session)
    hooks = list(session.event_hooks.get("request", []))
    limits = {"connect": connect, "read": read, "write": read, "pool": read}

    def fill_timeouts(request) -> None:
        current = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {key: current.get(key) if current.get(key) is not None
                                         else default for key, default in limits.items()}

    def factory():
        return client_type(event_hooks={"request": [*hooks, fill_timeouts]},
                           follow_redirects=True, timeout=read)

    huggingface_hub.set_client_factory(factory)


def explain(exc: BaseException, hub: Hub, asset: Asset, workload: str) -> FetchError | None:
    """One line for what huggingface_hub raised (None: not a hub or network failure)."""
    from huggingface_hub import errors

    endpoint = shown_endpoint(hub.endpoint)
    what = asset.describe()
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return _offline_error(_offline_variables(os.environ))
    if isinstance(exc, errors.GatedRepoError):
        return FetchError(f"{what} is gated at {endpoint}: accept its terms on the Hub with your "
                          f"account, then set HF_TOKEN (or `hf auth login`)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return FetchError(f"{what}: repository not found at {endpoint} (HTTP "
                          f"{_status(exc)}); check the repo in workloads/assets.toml and "
                          f"HF_ENDPOINT, and HF_TOKEN for a private repository")
    if isinstance(exc, errors.RevisionNotFoundError):
        return FetchError(f"{what}: revision {asset.revision!r} not found at {endpoint}; check "
                          f"the revision in workloads/assets.toml")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return FetchError(f"{what}: a file is missing at {endpoint} ({_one_line(exc)})")
    if isinstance(exc, errors.FileMetadataError):
        return FetchError(f"{what}: {endpoint} does not answer like a Hugging Face Hub "
                          f"({_one_line(exc)}); check HF_ENDPOINT and the proxy settings")
    network = _network_reason(exc, hub)
    if network is not None:
        return FetchError(
            f"cannot reach the Hub at {endpoint} for {what} ({network}): run `dsenv fetch "
            f"{workload}` on a node with internet, check HF_ENDPOINT and HTTPS_PROXY/NO_PROXY, "
            f"or make a bundle elsewhere with `dsenv fetch {workload} --cache-dir DIR` and "
            f"import it here with `dsenv fetch {workload} --from DIR`")
    if isinstance(exc, errors.HfHubHTTPError):
        return FetchError(f"{what}: {endpoint} answered HTTP {_status(exc)} "
                          f"({_one_line(exc)}); try again later, and check HF_TOKEN")
    return None


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "?"))


def _network_reason(exc: BaseException, hub: Hub) -> str | None:
    """Why the Hub could not be reached, or None when ``exc`` is something else."""
    from huggingface_hub import errors

    seen = exc
    if isinstance(exc, errors.LocalEntryNotFoundError) and exc.__cause__ is not None:
        seen = exc.__cause__  # snapshot_download's "cannot find it locally" after a failure
    names = {cls.__name__ for cls in type(seen).__mro__}
    if names & {"TimeoutException", "Timeout", "ReadTimeout", "ConnectTimeout"}:
        return (f"no answer within the timeouts: HF_HUB_ETAG_TIMEOUT={hub.etag_timeout:g} s, "
                f"HF_HUB_DOWNLOAD_TIMEOUT={os.environ.get('HF_HUB_DOWNLOAD_TIMEOUT')} s")
    if names & {"ProxyError"}:
        return f"proxy failed: {_one_line(seen)}"
    if names & {"TransportError", "NetworkError", "ConnectError", "ConnectionError",
                "RemoteProtocolError"}:
        return _one_line(seen)
    if isinstance(exc, errors.LocalEntryNotFoundError):
        return _one_line(exc)
    return None


@dataclass
class Fetched:
    """One repository at one commit, in the hub cache."""

    commit: str
    snapshot: Path
    files: list[str]  # repository paths matching the asset's patterns
    downloaded: int
    repaired: int
    entry: dict


def fetch(layout: CacheLayout, workloads: list[str], out: Output) -> int:
    hub = open_hub()
    endpoint = shown_endpoint(hub.endpoint)
    repos: dict[tuple, Fetched] = {}
    prepared: dict[tuple, dict] = {}
    for workload in workloads:
        out.line(f"dsenv fetch {workload} from {endpoint} into {layout.hub} (data sets "
                 f"{layout.saved})")
        previous = _previous_manifest(layout, workload)
        entries = []
        for asset in assets_for(workload):
            key = (asset.kind, asset.repo, asset.revision, tuple(asset.patterns))
            try:
                again = key in repos  # shared with a workload fetched above
                if not again:
                    repos[key] = fetch_repo(hub, asset, layout, workload)
                got = repos[key]
                entries.append(got.entry)
                _report_repo(out, asset, got, again)
                if asset.kind == "dataset":
                    if key not in prepared:
                        prepared[key] = prepare_dataset(asset, layout, got, previous, out)
                    entries.append(prepared[key])
            except FetchError:
                raise
            except Exception as exc:
                explained = explain(exc, hub, asset, workload)
                if explained is not None:
                    raise explained from None
                if isinstance(exc, OSError):
                    raise FetchError(f"{asset.describe()}: {exc.strerror or _one_line(exc)} "
                                     f"({exc.filename or layout.hub})") from None
                raise
        manifest = {"schema": SCHEMA, "workload": workload, "created": _now(),
                    "dsenv": __version__, "endpoint": endpoint, "assets": entries}
        path = write_json_atomically(layout.manifest_path(workload),
                                     out.redactor.scrub_obj(manifest), indent=1)
        out.line(f"manifest {path}")
    return 0


def _report_repo(out: Output, asset: Asset, got: Fetched, again: bool = False) -> None:
    size = sum(f["size"] for f in got.entry["files"])
    fresh = "fetched above" if again else \
        (f"{got.downloaded} downloaded" if got.downloaded else "all cached") + \
        (f", {got.repaired} damaged and fetched again" if got.repaired else "")
    out.ok(f"{asset.kind} {asset.repo}@{asset.revision} -> {got.commit[:12]}: "
           f"{len(got.files)} files, {human_size(size)} ({fresh})")


def _previous_manifest(layout: CacheLayout, workload: str) -> dict | None:
    path = layout.manifest_path(workload)
    if not path.is_file():
        return None
    try:
        return load_manifest(path, workload)
    except FetchError:
        return None  # replaced by this fetch


def fetch_repo(hub: Hub, asset: Asset, layout: CacheLayout, workload: str) -> Fetched:
    """snapshot_download of the asset's patterns at its revision, each file checked against
    the Hub's ETag (its blob name); damaged files are downloaded again."""
    from huggingface_hub.utils import filter_repo_objects

    info = hub.api.repo_info(asset.repo, repo_type=asset.kind, revision=asset.revision,
                             timeout=hub.etag_timeout)
    commit = info.sha
    if not isinstance(commit, str) or not _HEX40.fullmatch(commit):
        raise FetchError(f"{asset.describe()}: {shown_endpoint(hub.endpoint)} sent no commit sha "
                         f"for it ({commit!r}); check that HF_ENDPOINT is a Hugging Face Hub")
    listed = [s.rfilename for s in info.siblings] if info.siblings is not None else None
    if listed is not None:
        _check_patterns(asset, listed, workload)
    storage = layout.hub / asset.cache_folder
    snapshot = storage / "snapshots" / commit
    wanted = list(filter_repo_objects(listed, allow_patterns=asset.patterns)) if listed else None
    cached = sum((snapshot / name).is_file() for name in wanted) if wanted else 0
    # the commit, not the branch: snapshot_download then asks the Hub nothing more about it
    folder = Path(hub.module.snapshot_download(
        asset.repo, repo_type=asset.kind, revision=commit, allow_patterns=asset.patterns,
        cache_dir=layout.hub, etag_timeout=hub.etag_timeout))
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files = wanted if wanted is not None else list(
        filter_repo_objects(present, allow_patterns=asset.patterns))
    if listed is None:
        _check_patterns(asset, present, workload)
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise FetchError(f"{asset.describe()}: {', '.join(missing)} not in {folder} after the "
                         f"download; run `dsenv fetch {workload}` again")
    repaired = 0
    for name in files:
        if not _blob_ok(folder / name):
            hub.module.hf_hub_download(asset.repo, name, repo_type=asset.kind, revision=commit,
                                       cache_dir=layout.hub, force_download=True,
                                       etag_timeout=hub.etag_timeout)
            if not _blob_ok(folder / name):
                raise FetchError(f"{asset.describe()}: {name} from {shown_endpoint(hub.endpoint)}"
                                 f" does not match its checksum even when downloaded again")
            repaired += 1
    if asset.revision != commit:
        _write_ref(storage, asset.revision, commit)
    entry = {"kind": asset.kind, "repo": asset.repo, "revision": asset.revision,
             "commit": commit, "area": "hub", "root": asset.cache_folder,
             "patterns": asset.patterns,
             "files": _files_entry(layout.hub, (folder / name for name in files))}
    downloaded = len(files) - cached + repaired  # a damaged cached file came again
    return Fetched(commit, folder, files, downloaded, repaired, entry)


def _blob_ok(path: Path) -> bool:
    _, sha256, git_sha1 = file_digest(path)
    return matches_blob_name(path, sha256, git_sha1)


def _check_patterns(asset: Asset, names: list[str], workload: str) -> None:
    from huggingface_hub.utils import filter_repo_objects

    for pattern in asset.patterns:
        if not list(filter_repo_objects(names, allow_patterns=[pattern])):
            raise FetchError(f"{asset.describe()}: no file matches {pattern!r} (workloads/"
                             f"assets.toml, [{workload}]); the repository has "
                             f"{len(names)} files, e.g. {', '.join(sorted(names)[:5]) or 'none'}")


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, as huggingface_hub writes it (so from_pretrained(repo,
    revision=...) and CacheLayout find the snapshot offline)."""
    ref = storage / "refs" / revision
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ref-", dir=ref.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(commit)
    os.replace(tmp, ref)


def prepare_dataset(asset: Asset, layout: CacheLayout, got: Fetched, previous: dict | None,
                    out: Output) -> dict:
    """The data set repository's split files, prepared with datasets' save_to_disk into
    asset.saved_dir(layout) (built in a staging folder, renamed into place)."""
    from huggingface_hub.utils import filter_repo_objects

    data_files = {split: sorted(filter_repo_objects(got.files, allow_patterns=[pattern]))
                  for split, pattern in asset.splits.items()}
    target = asset.saved_dir(layout)
    reused = _reusable(previous, asset, got.commit, data_files, layout)
    if reused is not None:
        _report_prepared(out, asset, reused, "already prepared")
        return reused
    import datasets

    if not sys.stdout.isatty():
        datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    layout.saved.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".dsenv-prepare-", dir=layout.saved) as scratch:
        try:
            loaded = datasets.load_dataset(
                "parquet", cache_dir=scratch,
                data_files={split: [str(got.snapshot / name) for name in names]
                            for split, names in data_files.items()})
        except Exception as exc:
            raise FetchError(f"{asset.describe()}@{got.commit[:12]}: its files do not load "
                             f"as a data set ({type(exc).__name__}: {_one_line(exc)})") from None
        rows = {split: loaded[split].num_rows for split in data_files}
        with staged_dir(target) as tmp:
            loaded.save_to_disk(str(tmp))
        del loaded
    entry = {"kind": asset.kind, "repo": asset.repo, "revision": asset.revision,
             "commit": got.commit, "area": "saved", "root": asset.saved_folder,
             "splits": rows, "data_files": data_files,
             "files": _files_entry(layout.saved,
                                   (p for p in target.rglob("*") if p.is_file()))}
    _report_prepared(out, asset, entry, "prepared")
    return entry


def _reusable(previous: dict | None, asset: Asset, commit: str, data_files: dict,
              layout: CacheLayout) -> dict | None:
    """The previous fetch's prepared data set, when made from the same files and intact."""
    for entry in (previous or {}).get("assets", []):
        if entry.get("area") == "saved" and entry.get("repo") == asset.repo and \
                entry.get("commit") == commit and entry.get("data_files") == data_files and \
                isinstance(entry.get("splits"), dict) and not asset.missing_in(layout):
            target = asset.saved_dir(layout)
            on_disk = {p.relative_to(layout.saved).as_posix()
                       for p in target.rglob("*") if p.is_file()}
            if on_disk == {f["path"] for f in entry["files"]} and \
                    not check_entry(layout, entry).problems:
                return entry
    return None


def _report_prepared(out: Output, asset: Asset, entry: dict, how: str) -> None:
    rows = ", ".join(f"{split} {count} rows" for split, count in entry["splits"].items())
    size = sum(f["size"] for f in entry["files"])
    out.ok(f"data set {asset.repo} {how} in {asset.saved_folder}: {rows} "
           f"({len(entry['files'])} files, {human_size(size)})")

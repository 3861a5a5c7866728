"""``dsenv fetch WORKLOAD``: a workload's models and data set repositories downloaded from
the Hugging Face Hub into the hub cache (each file checked against the Hub's checksum, a
damaged one downloaded again), its data sets prepared with datasets' save_to_disk, and the
manifest written. Every failure of the Hub or the network is explained in one line.

huggingface_hub and datasets are imported inside the functions (not on dsenv --help), after
fetch has set short timeouts: huggingface_hub reads them at import.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dsenv import __version__
from dsenv.envs.launchers import HUB_OFFLINE_VARIABLES
from dsenv.facts.host.hfcache import is_true
from dsenv.jsonfiles import write_json_atomically
from dsenv.staging import staged_dir, write_file_atomically
from dsenv.workloads.errors import FetchError
from dsenv.workloads.fetch.assets import Asset, CacheLayout, assets_for
from dsenv.workloads.fetch.manifest import (
    HEX40,
    SCHEMA,
    Output,
    check_entry,
    file_digest,
    files_entry,
    human_size,
    load_manifest,
    matches_blob_name,
    now,
    one_line,
)

# huggingface_hub reads these at import; fetch sets them when the user has not.
DEFAULT_TIMEOUTS = {"HF_HUB_ETAG_TIMEOUT": "10", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}


def shown_endpoint(endpoint: str) -> str:
    """The endpoint without user:password@ (a proxy-style URL may carry them)."""
    parts = urlsplit(endpoint)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))
    return endpoint


@dataclass
class Hub:
    """huggingface_hub, imported with fetch's settings; errors explained in one line."""

    module: object
    api: object
    endpoint: str
    etag_timeout: float


def _offline_variables(env) -> list[str]:
    return [f"{k}={env[k]}" for k in HUB_OFFLINE_VARIABLES if is_true(env.get(k))]


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
    # huggingface_hub: kept off dsenv --help, and imported only once the timeouts are set
    import huggingface_hub
    from huggingface_hub import constants  # huggingface_hub: as above
    from huggingface_hub.utils import logging as hub_logging  # huggingface_hub: as above

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
    from huggingface_hub import errors  # huggingface_hub: kept off dsenv --help

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
        return FetchError(f"{what}: a file is missing at {endpoint} ({one_line(exc)})")
    if isinstance(exc, errors.FileMetadataError):
        return FetchError(f"{what}: {endpoint} does not answer like a Hugging Face Hub "
                          f"({one_line(exc)}); check HF_ENDPOINT and the proxy settings")
    network = _network_reason(exc, hub)
    if network is not None:
        return FetchError(
            f"cannot reach the Hub at {endpoint} for {what} ({network}): run `dsenv fetch "
            f"{workload}` on a node with internet, check HF_ENDPOINT and HTTPS_PROXY/NO_PROXY, "
            f"or make a bundle elsewhere with `dsenv fetch {workload} --cache-dir DIR` and "
            f"import it here with `dsenv fetch {workload} --from DIR`")
    if isinstance(exc, errors.HfHubHTTPError):
        return FetchError(f"{what}: {endpoint} answered HTTP {_status(exc)} "
                          f"({one_line(exc)}); try again later, and check HF_TOKEN")
    return None


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "?"))


def _network_reason(exc: BaseException, hub: Hub) -> str | None:
    """Why the Hub could not be reached, or None when ``exc`` is something else."""
    from huggingface_hub import errors  # huggingface_hub: kept off dsenv --help

    seen = exc
    if isinstance(exc, errors.LocalEntryNotFoundError) and exc.__cause__ is not None:
        seen = exc.__cause__  # snapshot_download's "cannot find it locally" after a failure
    names = {cls.__name__ for cls in type(seen).__mro__}
    if names & {"TimeoutException", "Timeout", "ReadTimeout", "ConnectTimeout"}:
        return (f"no answer within the timeouts: HF_HUB_ETAG_TIMEOUT={hub.etag_timeout:g} s, "
                f"HF_HUB_DOWNLOAD_TIMEOUT={os.environ.get('HF_HUB_DOWNLOAD_TIMEOUT')} s")
    if names & {"ProxyError"}:
        return f"proxy failed: {one_line(seen)}"
    if names & {"TransportError", "NetworkError", "ConnectError", "ConnectionError",
                "RemoteProtocolError"}:
        return one_line(seen)
    if isinstance(exc, errors.LocalEntryNotFoundError):
        return one_line(exc)
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
                    raise FetchError(f"{asset.describe()}: {exc.strerror or one_line(exc)} "
                                     f"({exc.filename or layout.hub})") from None
                raise
        manifest = {"schema": SCHEMA, "workload": workload, "created": now(),
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
    from huggingface_hub.utils import filter_repo_objects  # huggingface_hub: off dsenv --help

    info = hub.api.repo_info(asset.repo, repo_type=asset.kind, revision=asset.revision,
                             timeout=hub.etag_timeout)
    commit = info.sha
    if not isinstance(commit, str) or not HEX40.fullmatch(commit):
        raise FetchError(f"{asset.describe()}: {shown_endpoint(hub.endpoint)} sent no commit sha "
                         f"for it ({commit!r}); check that HF_ENDPOINT is a Hugging Face Hub")
    listed = [s.rfilename for s in info.siblings] if info.siblings is not None else None
    if listed is not None:
        _check_patterns(asset, listed)
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
        _check_patterns(asset, present)
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
             "files": files_entry(layout.hub, (folder / name for name in files))}
    downloaded = len(files) - cached + repaired  # a damaged cached file came again
    return Fetched(commit, folder, files, downloaded, repaired, entry)


def _blob_ok(path: Path) -> bool:
    _, sha256, git_sha1 = file_digest(path)
    return matches_blob_name(path, sha256, git_sha1)


def _check_patterns(asset: Asset, names: list[str]) -> None:
    from huggingface_hub.utils import filter_repo_objects  # huggingface_hub: off dsenv --help

    for pattern in asset.patterns:
        if not list(filter_repo_objects(names, allow_patterns=[pattern])):
            raise FetchError(f"{asset.describe()}: no file matches {pattern!r} (workloads/"
                             f"assets.toml, [asset.{asset.name}]); the repository has "
                             f"{len(names)} files, e.g. {', '.join(sorted(names)[:5]) or 'none'}")


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, as huggingface_hub writes it (so from_pretrained(repo,
    revision=...) and CacheLayout find the snapshot offline)."""
    ref = storage / "refs" / revision
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    write_file_atomically(ref, commit)


def prepare_dataset(asset: Asset, layout: CacheLayout, got: Fetched, previous: dict | None,
                    out: Output) -> dict:
    """The data set repository's split files, prepared with datasets' save_to_disk into
    asset.saved_dir(layout) (built in a staging folder, renamed into place)."""
    from huggingface_hub.utils import filter_repo_objects  # huggingface_hub: off dsenv --help

    data_files = {split: sorted(filter_repo_objects(got.files, allow_patterns=[pattern]))
                  for split, pattern in asset.splits.items()}
    target = asset.saved_dir(layout)
    reused = _reusable(previous, asset, got.commit, data_files, layout)
    if reused is not None:
        _report_prepared(out, asset, reused, "already prepared")
        return reused
    import datasets  # datasets: kept off dsenv --help

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
                             f"as a data set ({type(exc).__name__}: {one_line(exc)})") from None
        rows = {split: loaded[split].num_rows for split in data_files}
        with staged_dir(target) as tmp:
            loaded.save_to_disk(str(tmp))
        del loaded
    entry = {"kind": asset.kind, "repo": asset.repo, "revision": asset.revision,
             "commit": got.commit, "area": "saved", "root": asset.saved_folder,
             "splits": rows, "data_files": data_files,
             "files": files_entry(layout.saved,
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

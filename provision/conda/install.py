"""Installing a conda-lock.yml with every hash checked (``--kind conda``).

The conda packages are downloaded here (or taken from a cache of checked archives), checked
against the lock's sha256 and md5, and linked by py-rattler in a subprocess
(conda_rattler.py: its interpreter sometimes crashes at exit); then the lock's pip packages
go in through ``uv pip install --require-hashes --no-deps`` (conda_pip.py). See conda.py for
why the final prefix is written into the files of an environment built in a staging folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dsenv.jsonfiles import write_json_atomically
from dsenv.proc import marked_json, run
from dsenv.provision import ProvisionError
from dsenv.provision.conda.pip import pip_install
from dsenv.provision.conda.recipe import (
    PLATFORM,
    RATTLER_MARK,
    LockedPackage,
    display_url,
    one_line,
    read_conda_lock,
    require_module,
)
from dsenv.staging import write_file_atomically

INSTALL_TIMEOUT = 3600.0  # linking several GB of CUDA libraries, then the pip part
READ_TIMEOUT = 60.0  # seconds a download may stall before it is abandoned
DOWNLOAD_THREADS = 4
_CHUNK = 1 << 20


@dataclass(frozen=True)
class InstallReport:
    prefix: Path  # where the files were written (the staging folder)
    final_prefix: Path  # the path written into them
    platform: str
    conda: tuple[str, ...]  # "name=version" of each conda package linked
    pip: tuple[str, ...]  # "name=version" of each pip package installed
    downloaded: int  # conda archives fetched now
    reused: int  # conda archives already in the cache with the locked hashes
    seconds: float


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Verified conda archives, reused by later installs: ``$DSENV_CONDA_PKGS``, else
    ``$XDG_CACHE_HOME/dsenv/conda-pkgs`` (``~/.cache/dsenv/conda-pkgs``)."""
    env = os.environ if env is None else env
    if env.get("DSENV_CONDA_PKGS"):
        return Path(env["DSENV_CONDA_PKGS"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsenv" / "conda-pkgs"


def install_conda(
    lockfile: Path,
    prefix: Path,
    *,
    platform: str = PLATFORM,
    final_prefix: Path | None = None,
    cache_dir: Path | None = None,
    extras: Sequence[str] = (),
    timeout: float = INSTALL_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> InstallReport:
    """Install a conda-lock.yml into the empty (or new) folder ``prefix``.

    Every conda archive is downloaded (or taken from ``cache_dir``) and its sha256 and md5
    compared with the lock before anything is linked; a mismatch is a ProvisionError naming
    the package. rattler then links the checked archives, writing ``final_prefix`` (default:
    ``prefix``; its real path, symlinks resolved) into the files that embed the environment's
    path; the lock's pip packages follow through uv with ``--require-hashes --no-deps``.
    Only the lock's main category is installed, plus the categories named in ``extras``;
    packages' post-link scripts are not run.
    """
    start = time.monotonic()
    # Real paths go into the files: an environment reached through a symlink (a /home that
    # links to the real storage) cannot be activated on compute nodes that lack the link.
    lockfile, prefix = Path(lockfile), Path(prefix).resolve()
    final = Path(final_prefix).resolve() if final_prefix is not None else prefix
    env = dict(os.environ if env is None else env)
    lock = read_conda_lock(lockfile)
    if platform not in lock.platforms:
        raise ProvisionError(f"conda lock {lockfile} has no packages for {platform} (it was "
                             f"made for {', '.join(lock.platforms) or 'no platform'}): "
                             f"relock with `dsenv lock --kind conda` for {platform}")
    selected = lock.select(platform, extras)
    conda_pkgs = [p for p in selected if p.manager == "conda"]
    pip_pkgs = [p for p in selected if p.manager == "pip"]
    other = sorted({p.manager for p in selected} - {"conda", "pip"})
    if other:
        raise ProvisionError(f"conda lock {lockfile}: unknown package manager(s) "
                             f"{', '.join(other)}: regenerate it with conda-lock 2 or newer")
    if not conda_pkgs:
        raise ProvisionError(f"conda lock {lockfile} lists no conda packages for {platform}: "
                             "regenerate it")
    for pkg in selected:
        if pkg.manager == "conda" and not (pkg.sha256 or pkg.md5):
            raise ProvisionError(f"conda lock {lockfile}: {pkg.spec} has no sha256 or md5, so "
                                 "it cannot be checked: regenerate the lock with conda-lock")
        if pkg.manager == "pip" and not pkg.sha256:
            raise ProvisionError(f"conda lock {lockfile}: pip package {pkg.spec} has no "
                                 "sha256, so it cannot be installed with --require-hashes: "
                                 "lock it from an index that publishes hashes (PyPI does)")
    if prefix.exists() and any(prefix.iterdir()):
        raise ProvisionError(f"conda prefix {prefix} is not empty: install_conda builds a "
                             "fresh environment; pass a new or empty (staging) folder")
    require_module("rattler", "py-rattler")

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(env)
    cache.mkdir(parents=True, exist_ok=True)
    local, downloaded = _fetch_all(conda_pkgs, cache, env)

    prefix.mkdir(parents=True, exist_ok=True)
    extract_dir = prefix / ".dsenv-extract"  # same filesystem: rattler hardlinks from it
    job = {
        "lockfile": str(lockfile.absolute()), "platform": platform, "prefix": str(prefix),
        "final_prefix": str(final) if final != prefix else None,
        "extract_dir": str(extract_dir),
        "files": {p.url: str(local[p.url]) for p in conda_pkgs},
    }
    try:
        _run_rattler_install(job, timeout, env)
    finally:
        shutil.rmtree(extract_dir, ignore_errors=True)
    _restore_record_urls(prefix, {p.file_name: p.url for p in conda_pkgs})

    if pip_pkgs:
        remaining = max(60.0, timeout - (time.monotonic() - start))
        pip_install(pip_pkgs, prefix, remaining, env)
        if final != prefix:
            _relocate_scripts(prefix, final)
    return InstallReport(
        prefix=prefix, final_prefix=final, platform=platform,
        conda=tuple(p.spec for p in conda_pkgs), pip=tuple(p.spec for p in pip_pkgs),
        downloaded=downloaded, reused=len(conda_pkgs) - downloaded,
        seconds=time.monotonic() - start)


def _expand(url: str, env: Mapping[str, str]) -> str:
    """conda-lock writes credentials as ``${VAR}`` placeholders: fill them from ``env``."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: env.get(m.group(1) or m.group(2), m.group(0)), url)


def _hashes(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def _mismatch(pkg: LockedPackage, sha256: str, md5: str) -> str | None:
    if pkg.sha256 and pkg.sha256.lower() != sha256:
        return f"sha256 {sha256[:16]}... differs from the lock's {pkg.sha256[:16]}..."
    if pkg.md5 and pkg.md5.lower() != md5:
        return f"md5 {md5} differs from the lock's {pkg.md5}"
    return None


def _fetch_all(pkgs: Sequence[LockedPackage], cache: Path,
               env: Mapping[str, str]) -> tuple[dict[str, Path], int]:
    """Every archive in ``cache``, checked against the lock: {lock url: path}, downloads."""
    results: dict[str, tuple[Path, bool] | ProvisionError] = {}

    def one(pkg: LockedPackage) -> None:
        try:
            results[pkg.url] = _fetch_verified(pkg, cache, env)
        except ProvisionError as exc:
            results[pkg.url] = exc

    with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
        list(pool.map(one, pkgs))
    for pkg in pkgs:  # the first failure in lock order, so the message is stable
        if isinstance(results[pkg.url], ProvisionError):
            raise results[pkg.url]
    local = {url: res[0] for url, res in results.items()}
    return local, sum(1 for res in results.values() if res[1])


def _fetch_verified(pkg: LockedPackage, cache: Path,
                    env: Mapping[str, str]) -> tuple[Path, bool]:
    """(path of the checked archive in ``cache``, whether it was downloaded now)."""
    name = pkg.file_name
    if not name or "/" in name or name in (".", ".."):
        raise ProvisionError(f"conda lock: {pkg.spec} has an unusable url "
                             f"{display_url(pkg.url)}: regenerate the lock")
    key = pkg.sha256 or pkg.md5
    target = cache / key[:2] / key / name  # one folder per locked hash: no two builds collide
    if target.is_file() and _mismatch(pkg, *_hashes(target)) is None:
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{name}.part-{os.getpid()}-{threading.get_ident()}")
    url = _expand(pkg.url, env)
    shown = display_url(pkg.url)
    sha, md5 = hashlib.sha256(), hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as response, \
                open(part, "wb") as out:
            while chunk := response.read(_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise ProvisionError(f"cannot download conda package {pkg.spec} from {shown} "
                             f"({reason}): check the network and HTTPS_PROXY, or fill the "
                             f"cache {cache} on a node that can reach the channel") from None
    problem = _mismatch(pkg, sha.hexdigest(), md5.hexdigest())
    if problem:
        part.unlink(missing_ok=True)
        raise ProvisionError(f"conda package {pkg.spec} ({shown}): {problem}: the file "
                             "changed since the lock was made (or the mirror serves another "
                             "build); nothing was installed; relock (`dsenv lock --kind "
                             "conda`) only if the channel really replaced it")
    os.replace(part, target)
    return target, True


def _run_rattler_install(job: dict, timeout: float, env: Mapping[str, str]) -> None:
    result = run([sys.executable, "-m", "dsenv.provision.conda.rattler"],
                 timeout=timeout, env=env, input_text=json.dumps(job))
    if result.timed_out:
        raise ProvisionError(f"linking the conda packages into {job['prefix']} did not "
                             f"finish within {timeout:.0f} s (killed): retry with a longer "
                             "timeout, on a faster file system")
    answer = marked_json(result.stdout, RATTLER_MARK) or {}
    if not result.ok or not answer.get("ok"):
        why = answer.get("error") or result.describe()
        raise ProvisionError(f"rattler could not install the conda packages into "
                             f"{job['prefix']}: {one_line(why)}: check free space and "
                             "permissions there, or regenerate the lock")


def _restore_record_urls(prefix: Path, urls: Mapping[str, str]) -> None:
    """rattler linked from the checked local copies, extracted in a folder that is gone now:
    conda-meta should name where each package really comes from (the lock's url) and no
    path of the staging folder."""
    for record in (prefix / "conda-meta").glob("*.json"):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        original = urls.get(data.get("fn", ""))
        if original and (data.get("url") != original or "extracted_package_dir" in data):
            data["url"] = original
            data.pop("extracted_package_dir", None)  # both optional in conda and rattler
            data.pop("link", None)
            write_json_atomically(record, data, indent=2)


def _relocate_scripts(prefix: Path, final: Path) -> None:
    """pip writes its interpreter's path into console scripts: point them at ``final``."""
    old, new = str(prefix).encode(), str(final).encode()
    bindir = prefix / "bin"
    if not bindir.is_dir():
        return
    for script in bindir.iterdir():
        if script.is_symlink() or not script.is_file() or script.stat().st_size > _CHUNK:
            continue
        data = script.read_bytes()
        if not data.startswith(b"#!") or old not in data:
            continue
        # a new inode (written beside it, renamed): never edits a file hardlinked from a cache
        write_file_atomically(script, data.replace(old, new),
                              mode=stat.S_IMODE(script.stat().st_mode))

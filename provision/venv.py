"""`--kind venv`: a virtual environment installed from a lock, hashes required.

``uv venv --relocatable`` then ``uv pip sync --require-hashes``: the environment holds
exactly the lock's packages (sync removes anything else) and every file's hash is checked
against the lock, including wheels already in uv's cache.

Built in a staging folder and renamed into place (dsenv.staging): a plain venv would break on
the rename, because ``bin/activate`` and every console script (``deepspeed``, ``ds_report``,
``torchrun``) embed the absolute path of the folder they were installed into. With
``--relocatable`` uv writes ``bin/activate`` and the scripts' shebangs relative to the script's
own location (``exec "$(dirname -- "$(realpath -- "$0")")"/python``), also for DeepSpeed's
legacy ``scripts=`` files and for later ``uv pip install`` runs into the same venv (the flag
is recorded in ``pyvenv.cfg``), so the renamed environment works unchanged. ``.pyc`` files
keep the staging path in ``co_filename``, which Python corrects when it loads them.

Offline: wheels come from uv's cache when they are there. When an index cannot be reached
(a compute node without internet) the sync is retried once with ``--offline``, so
``UV_OFFLINE`` need not be set; only if the cache lacks a wheel does it fail, saying so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from dsenv.provision import ProvisionError
from dsenv.provision.shown import Command, Names, redact
from dsenv.provision.uvcmd import (
    Sources,
    hash_mismatch,
    run_logged,
    unreachable_index,
    uv_command,
    uv_env,
    uv_error,
    uv_message_lines,
)

DEFAULT_SYNC_TIMEOUT = 3600.0


def venv_python(prefix: str | os.PathLike) -> Path:
    """``<prefix>/bin/python``."""
    return Path(prefix) / "bin" / "python"


def make_venv(
    prefix: str | os.PathLike,
    *,
    python: str | os.PathLike = sys.executable,
    system_site_packages: bool = False,
    env: Mapping[str, str] | None = None,
    log: str | os.PathLike | None = None,
    timeout: float = 300.0,
) -> Path:
    """``uv venv --relocatable`` at ``prefix`` (absent or an empty folder) for the
    interpreter ``python``; returns the venv's python."""
    prefix = Path(prefix)
    if prefix.exists() and any(prefix.iterdir()):
        raise ProvisionError(f"create venv: {prefix} is not empty: give an empty staging "
                             "folder (dsenv.staging.staged_dir) or remove it")
    start = _size(log)
    result = run_logged(venv_command(prefix, python, system_site_packages), timeout=timeout,
                        env=uv_env(env), output=log)
    if not result.ok:
        raise ProvisionError(uv_error(_with_log(result, log, start),
                                      f"create venv {prefix} (Python {python})")
                             + _see(log))
    return venv_python(prefix)


def venv_command(prefix: str | os.PathLike, python: str | os.PathLike,
                 system_site_packages: bool = False) -> Command:
    """The ``uv venv`` that :func:`make_venv` runs (and the plan shows)."""
    return uv_command(["venv", os.fspath(prefix), "--relocatable", "--python",
                       os.fspath(python), "--no-project", "--no-config", "--color", "never",
                       *(["--system-site-packages"] if system_site_packages else [])])


def sync_command(python: str | os.PathLike, lock: str | os.PathLike, sources: Sources,
                 compile_bytecode: bool = True, offline: bool = False) -> Command:
    """The ``uv pip sync --require-hashes`` that :func:`sync_lock` runs (and the plan
    shows); ``offline``: its retry from uv's cache alone."""
    return uv_command(["pip", "sync", "--require-hashes", "--python", os.fspath(python),
                       "--color", "never", *sources.args(),
                       *(["--compile-bytecode"] if compile_bytecode else []),
                       *(["--offline"] if offline else []), os.fspath(lock)])


def create_venv(
    prefix: str | os.PathLike,
    lock: str | os.PathLike,
    *,
    python: str | os.PathLike = sys.executable,
    sources: Sources | None = None,
    system_site_packages: bool = False,
    compile_bytecode: bool = True,
    offline: bool | None = None,
    env: Mapping[str, str] | None = None,
    log: str | os.PathLike | None = None,
    timeout: float = DEFAULT_SYNC_TIMEOUT,
) -> None:
    """Create a relocatable venv at ``prefix`` (the empty STAGING folder; rename it into place
    afterwards) for the interpreter ``python`` and install exactly ``lock`` into it.

    ``sources``: where packages come from (uv ignores pip's configuration; default PyPI).
    ``compile_bytecode``: write .pyc files now (slower install, faster first import on a
    shared file system).
    ``offline``: True never touches the network (uv's cache only); None (default) tries the
    indexes and falls back to the cache when they cannot be reached; False never falls back.
    ``log``: a file that uv's output is appended to.

    Raises :class:`ProvisionError` (one line): a hash that differs from the lock (naming the
    package), an unreachable index with nothing cached, a lock uv rejects, a timeout.
    """
    lock = Path(lock).resolve()
    if not lock.is_file():
        raise ProvisionError(f"create venv: lock {lock} does not exist: write it with "
                             "`dsenv lock --stack NAME`")
    python_in_env = make_venv(prefix, python=python, system_site_packages=system_site_packages,
                              env=env, log=log)
    sync_lock(python_in_env, lock, sources=sources or Sources(), compile_bytecode=compile_bytecode,
              offline=offline, env=env, log=log, timeout=timeout)


def sync_lock(
    python: str | os.PathLike,
    lock: str | os.PathLike,
    *,
    sources: Sources | None = None,
    compile_bytecode: bool = True,
    offline: bool | None = None,
    env: Mapping[str, str] | None = None,
    log: str | os.PathLike | None = None,
    timeout: float = DEFAULT_SYNC_TIMEOUT,
) -> None:
    """``uv pip sync --require-hashes`` of ``lock`` into the environment of ``python``."""
    sources = sources or Sources()
    run_sync(lambda cache_only: sync_command(python, lock, sources, compile_bytecode,
                                             cache_only),
             what=f"install {Path(lock).name}", sources=sources, offline=offline, env=env,
             log=log, timeout=timeout)


def run_sync(command: Callable[[bool], Command], *, what: str, sources: Sources,
             offline: bool | None, env: Mapping[str, str] | None,
             log: str | os.PathLike | None, timeout: float, names: Names = ()) -> None:
    """Run a uv install command (``command(offline)``), retried offline when the network is
    gone and ``offline`` is None (the log says why the retry differs from the plan);
    failures become one-line ProvisionErrors."""
    attempts = [True] if offline else [False, True] if offline is None else [False]
    for attempt, cache_only in enumerate(attempts):
        start = _size(log)
        result = run_logged(command(cache_only), timeout=timeout, env=uv_env(env),
                            output=log, names=names)
        if result.ok:
            return
        result = _with_log(result, log, start)
        network = unreachable_index(result.stderr)
        if network and attempt + 1 < len(attempts):  # try again from uv's cache only
            if log is not None:
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(redact(f"=== dsenv: {network[0]} cannot be reached "
                                        f"({network[1]}): once more from uv's cache alone "
                                        "(--offline)\n"))
            continue
        raise ProvisionError(install_error(result, what, sources, cache_only, log))


def install_error(result, what: str, sources: Sources, offline: bool,
                  log: str | os.PathLike | None) -> str:
    """One line for a failed ``uv pip sync/install``; ``offline``: the failed attempt was the
    cache-only one."""
    mismatch = hash_mismatch(result.stderr)
    if mismatch:
        package, expected, computed = mismatch
        return (f"{what}: the file downloaded for {package} does not match the lock's hash "
                f"(lock {expected}, file {computed}): the index serves a different file than "
                "the one locked; check the mirror, or if the change is intended regenerate the "
                "lock with `dsenv lock`" + _see(log))
    network = unreachable_index(result.stderr)
    if network:
        url, cause = network
        return (f"{what}: cannot reach the package index ({url}: {cause}; "
                f"{sources.describe()}): check the network and HTTPS_PROXY, give a reachable "
                "mirror or --find-links with the wheels, or let it install from uv's cache "
                "(offline)" + _see(log))
    text = result.stderr.lower()
    if offline and ("network was disabled" in text or "connectivity is disabled" in text):
        lines = uv_message_lines(result.stderr)
        culprit = next((line for line in lines if "not found in the cache" in line
                        or "wasn't found in the cache" in line), lines[-1] if lines else "")
        return (f"{what}: the package index cannot be reached and uv's cache lacks files of "
                f"the lock ({culprit[:200]}): provision once where the index is reachable with "
                "the same UV_CACHE_DIR, or give --find-links with the wheels" + _see(log))
    return uv_error(result, what) + _see(log)


def _size(log: str | os.PathLike | None) -> int:
    try:
        return os.path.getsize(log) if log is not None else 0
    except OSError:
        return 0


def _with_log(result, log: str | os.PathLike | None, start: int):
    """The result with what the command wrote to ``log`` (from byte ``start``) as its
    stderr, when its output went to the log."""
    if log is None or result.stderr:
        return result
    try:
        with open(log, "rb") as handle:
            handle.seek(start)
            text = handle.read().decode(errors="replace")
    except OSError:
        return result
    return replace(result, stderr=text[-20000:])


def _see(log: str | os.PathLike | None) -> str:
    return f" (log: {log})" if log is not None else ""

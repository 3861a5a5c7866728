"""Hugging Face cache folders and offline switches, resolved the way the libraries do.

Precedence (huggingface_hub.constants and datasets.config, checked against them in the
tests): hub cache = HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > $HF_HOME/hub >
$XDG_CACHE_HOME/huggingface/hub > ~/.cache/huggingface/hub; datasets cache =
HF_DATASETS_CACHE > $HF_HOME/datasets > $XDG_CACHE_HOME/huggingface/datasets. transformers 5
reads no variable of its own (TRANSFORMERS_CACHE is gone): models go to the hub cache.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dsenv.envs.launchers import HUB_OFFLINE_VARIABLES, OFFLINE_VARIABLES
from dsenv.facts.host import cachefs, tempdir
from dsenv.facts.node import Node

TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT = 2.0


def _expand(value: str, env: Mapping[str, str]) -> str:
    """os.path.expanduser + expandvars, against ``env`` instead of os.environ."""
    if value.startswith("~"):
        home = env.get("HOME", os.path.expanduser("~"))
        value = home + value[1:] if value == "~" or value[1] == "/" else value

    def variable(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return re.sub(r"\$(\w+)|\$\{([^}]*)\}", variable, value)


@dataclass(frozen=True)
class CacheDirs:
    hf_home: Path
    hub: Path
    datasets: Path
    sources: dict[str, str]  # folder role -> which variable decided it

    def items(self) -> list[tuple[str, Path]]:
        return [("HF_HOME", self.hf_home), ("hub cache", self.hub),
                ("datasets cache", self.datasets)]


def resolve_dirs(env: Mapping[str, str]) -> CacheDirs:
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    if env.get("HF_HOME") is not None:
        hf_home, home_from = env["HF_HOME"], "HF_HOME"
    else:
        hf_home = os.path.join(xdg, "huggingface")
        home_from = "XDG_CACHE_HOME" if env.get("XDG_CACHE_HOME") else "default"
    hf_home = _expand(hf_home, env)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name) is not None:
            hub, hub_from = env[name], name
            break
    else:
        hub, hub_from = os.path.join(hf_home, "hub"), home_from
    if env.get("HF_DATASETS_CACHE") is not None:
        datasets, ds_from = env["HF_DATASETS_CACHE"], "HF_DATASETS_CACHE"
    else:
        datasets, ds_from = os.path.join(hf_home, "datasets"), home_from
    return CacheDirs(Path(hf_home), Path(_expand(hub, env)), Path(_expand(datasets, env)),
                     {"HF_HOME": home_from, "hub cache": hub_from, "datasets cache": ds_from})


@dataclass(frozen=True)
class DirState:
    path: Path
    exists: bool
    existing: Path | None  # the folder itself or its nearest existing ancestor
    writable: bool
    error: str | None  # why a write test failed
    free_bytes: int | None
    hung: bool = False  # the write test gave no answer: the file system stopped answering


def inspect_dir(node: Node, path: Path) -> DirState:
    """Present? Writable (a real file created, locked and removed, in a child)? Free space
    (`stat -f`, in a child)? Both with deadlines: a hung file server costs the doctor those,
    and the doctor still exits."""
    test = cachefs.try_folder(node, path)
    free = None
    if not test.hung and test.where is not None:
        free, _size = tempdir.room(node, str(test.where))
    error = None if test.created else (test.error or "no file could be created")
    return DirState(Path(path), test.exists, test.where, test.created, error, free, test.hung)


def is_true(value: str | None) -> bool:
    return value is not None and value.upper() in TRUE_VALUES


@dataclass(frozen=True)
class OfflineState:
    hub: bool  # huggingface_hub and transformers (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)
    datasets: bool  # HF_DATASETS_OFFLINE, else the hub's setting
    variables: dict[str, str]  # the offline variables that are set

    @property
    def partial(self) -> bool:
        return self.hub != self.datasets


def offline_state(env: Mapping[str, str]) -> OfflineState:
    """The rules of huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config."""
    hub = is_true(next((env[name] for name in HUB_OFFLINE_VARIABLES if env.get(name)), None))
    datasets_value = env.get("HF_DATASETS_OFFLINE")
    datasets = hub if datasets_value is None else is_true(datasets_value)
    return OfflineState(hub, datasets, {k: env[k] for k in OFFLINE_VARIABLES if k in env})


def _proxy_for(env: Mapping[str, str], url: str) -> str | None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    for entry in (e.strip().lstrip(".") for e in no_proxy.split(",")):
        if entry and (entry == "*" or host == entry or host.endswith("." + entry)):
            return None
    keys = ("HTTPS_PROXY", "https_proxy") if parts.scheme == "https" else ("HTTP_PROXY",
                                                                           "http_proxy")
    for key in keys:
        if env.get(key):
            return env[key]
    return None


@dataclass(frozen=True)
class Reachability:
    endpoint: str
    host: str
    port: int
    via_proxy: bool
    reachable: bool
    detail: str


def hub_reachability(env: Mapping[str, str], timeout: float = CONNECT_TIMEOUT) -> Reachability:
    """A TCP connect to HF_ENDPOINT's host (or the proxy that would carry the request)."""
    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    proxy = _proxy_for(env, endpoint)
    target = urlsplit(proxy if "://" in (proxy or "") else f"http://{proxy}") if proxy \
        else urlsplit(endpoint)
    host = target.hostname or ""
    port = target.port or (443 if target.scheme == "https" else 80)
    start = time.monotonic()
    try:
        address = _resolve(host, port, timeout)
        left = max(0.1, timeout - (time.monotonic() - start))
        with socket.create_connection(address, timeout=left):
            pass
        return Reachability(endpoint, host, port, bool(proxy), True, f"connected to {host}:{port}")
    except OSError as exc:
        reason = exc.strerror or str(exc) or "timed out"
        return Reachability(endpoint, host, port, bool(proxy), False,
                            f"TCP connect to {host}:{port} failed: {reason}")


def _resolve(host: str, port: int, timeout: float) -> tuple[str, int]:
    """getaddrinfo ignores socket timeouts (a dead resolver stalls for many seconds): wait
    for it in a daemon thread at most ``timeout``."""
    answer: list = []

    def lookup():
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answer.append(exc)

    worker = threading.Thread(target=lookup, daemon=True, name=f"resolve {host}")
    worker.start()
    worker.join(timeout)
    if not answer:
        raise TimeoutError(f"DNS lookup of {host} did not answer within {timeout:.0f} s")
    if isinstance(answer[0], OSError):
        raise answer[0]
    sockaddr = answer[0][0][4]
    return sockaddr[0], sockaddr[1]

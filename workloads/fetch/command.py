"""``dsenv fetch``: a bundled workload's full-run assets, downloaded into the offline cache.

On a node with internet (a login node), before jobs run on compute nodes without it:

    dsenv fetch bert-squad                 # models and data set repos into the hub cache,
                                           # data sets prepared with save_to_disk, a manifest
    dsenv fetch bert-squad --cache-dir DIR # the same layout below DIR: a portable bundle
    dsenv fetch bert-squad --from DIR      # import such a bundle (no network at all)
    dsenv fetch --verify [WORKLOAD ...]    # every manifest file against its size and sha256

Where everything goes is workloads/fetch/assets.py's layout (``CacheLayout``). The parts: the
Hub download (fetch_hub.py), the manifest and --verify (fetch_manifest.py), the bundle
import (fetch_bundle.py); this module is the command line.

Exit codes: 0 done (or all files match), 1 ``--verify`` found missing or changed files,
2 bad input, an unreachable or refusing Hub, a damaged bundle or manifest.

Imports stay light: huggingface_hub and datasets load only when fetching.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from dsenv.argtypes import positive_float
from dsenv.facts.host import mounts
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT, Node
from dsenv.redact import Redactor
from dsenv.workloads.errors import FetchError
from dsenv.workloads.fetch.assets import WORKLOAD_NAMES, CacheLayout
from dsenv.workloads.fetch.bundle import import_bundle
from dsenv.workloads.fetch.hub import fetch
from dsenv.workloads.fetch.manifest import Output, verify


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
    fetch.add_argument("--probe-timeout", type=positive_float, default=DEFAULT_PROBE_TIMEOUT,
                       metavar="S", help="seconds a stat of the caches may take before their "
                       "file server is taken as not answering (default 10)")
    fetch.add_argument("--verify", action="store_true",
                       help="recompute the size and sha256 of every file in the manifests; "
                            "exit 1 if any is missing or changed")


# What fetch itself imports in dsenv's own interpreter (it downloads and checks the cache
# there; the job's environment only reads the cache).
FETCH_IMPORTS = ("huggingface_hub", "datasets")


def run_fetch(args) -> int:
    out = Output(Redactor(os.environ))
    workloads = _chosen_workloads(args.workloads, required=not args.verify)
    missing = [name for name in FETCH_IMPORTS if importlib.util.find_spec(name) is None]
    if missing:
        raise FetchError(f"{' and '.join(missing)} not installed in dsenv's own environment "
                         f"({sys.prefix}): `pip install \"dsenv[train]\"` there (fetch "
                         "downloads with the Hub client and checks data sets with datasets)")
    layout = CacheLayout.under(args.cache_dir) if args.cache_dir else CacheLayout.from_env()
    # On a file server that stopped answering, the first touch of a folder blocks in the
    # kernel where no deadline reaches: each is statted in a child first.
    node = Node(wanted_target="login", probe_timeout=args.probe_timeout)
    for what, path in (("the hub cache", layout.hub), ("the data sets' cache", layout.saved),
                       ("the bundle (--from)", args.from_dir)):
        if path and (problem := mounts.unanswered(node, path, what)):
            raise FetchError(f"{problem}; choose a cache on a file system that answers "
                             "(--cache-dir, HF_HOME) and ask the site about the mount")
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

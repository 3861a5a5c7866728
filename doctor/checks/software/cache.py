"""cache: Hugging Face cache folders, each repository's folders a download writes, offline mode
on compute nodes, a workload's assets."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from packaging.version import InvalidVersion, Version

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.checks.software.builds import files_unanswered, hung
from dsenv.doctor.context import Context
from dsenv.doctor.fix import actions as fix_actions
from dsenv.doctor.registry import check
from dsenv.envs.launchers import OFFLINE_VARIABLES
from dsenv.facts.host import hfcache, hfrepos
from dsenv.facts.node import probe
from dsenv.facts.python import pyenv
from dsenv.verdicts.findings import fail, info, ok, skip, warn
from dsenv.workloads.fetch.assets import CacheLayout, assets_for

GIB = 1 << 30
MIN_FREE_BYTES = 20 * GIB  # a 7B model's safetensors alone are ~15 GB
OFFLINE_FIX = "export " + " ".join(f"{name}=1" for name in OFFLINE_VARIABLES)


def _describe(role: str, source: str, state: hfcache.DirState) -> str:
    where = f"{role}: {state.path} (from {source})"
    if state.hung:
        return f"{where}, NOT tested: {state.error}"
    if not state.exists:
        where += f", missing (created on first use under {state.existing})"
    if state.error:
        return f"{where}, NOT writable: {state.error}"
    free = f", {state.free_bytes / GIB:.0f} GiB free" if state.free_bytes is not None else \
        ", free space not read"
    return f"{where}, writable{free}"


SUGGESTED = {"HF_HOME": "$SCRATCH/huggingface", "HF_HUB_CACHE": "$SCRATCH/huggingface/hub",
             "HUGGINGFACE_HUB_CACHE": "$SCRATCH/huggingface/hub",
             "HF_DATASETS_CACHE": "$SCRATCH/huggingface/datasets"}


def _move_fix(role: str, dirs: hfcache.CacheDirs) -> str:
    """Point the variable that decided this folder at a writable, roomy place."""
    source = dirs.sources[role]
    var = source if source in SUGGESTED else "HF_HOME"
    return f"export {var}={SUGGESTED[var]} (a writable folder on a large filesystem)"


def _transformers_ignores_cache_var(ctx: Context) -> bool:
    dist = pyenv.find_distribution("transformers", pyenv.search_path(ctx))
    try:
        return dist is not None and Version(dist.version).major >= 5
    except InvalidVersion:
        return False


@check("cache.hf-dirs", "Hugging Face cache folders")
def hf_dirs(ctx: Context):
    dirs = hfcache.resolve_dirs(ctx.env)
    seen, states = set(), []
    for role, path in dirs.items():
        if path not in seen:
            seen.add(path)
            states.append((role, hfcache.inspect_dir(ctx, path)))
    evidence = [_describe(role, dirs.sources[role], state) for role, state in states]
    stuck = [(role, s) for role, s in states if s.hung]
    if stuck:
        role, state = stuck[0]
        return warn(hung(role, state.path), _move_fix(role, dirs), *evidence)
    broken = [(role, s) for role, s in states if not s.writable]
    if broken:
        role, state = broken[0]
        home = ctx.env.get("HOME", "")
        if dirs.sources[role] == "default" and home and not hfcache.inspect_dir(
                ctx, Path(home)).writable:
            # the default folders live under a HOME this user cannot write (HOME=/ for an
            # arbitrary uid in a pod): every tool's cache (~/.cache, ~/.config, ~/.triton) fails
            return mode_finding(fail, "cache.xdg-cache-not-writable",
                                f"HOME={home} cannot be written, so the default {role} "
                                f"{state.path} (and every other default cache) cannot either",
                                *evidence)
        return mode_finding(fail, "cache.hf-home-not-writable",
                            f"the {role} {state.path} cannot be written: downloads and dataset "
                            "caching fail", *evidence, here=_move_fix(role, dirs))
    legacy = ctx.env.get("TRANSFORMERS_CACHE")
    if legacy and Path(legacy) != dirs.hub and _transformers_ignores_cache_var(ctx):
        return warn(f"TRANSFORMERS_CACHE={legacy} is ignored by transformers 5: models go to "
                    f"{dirs.hub}", f"export HF_HUB_CACHE={legacy}", *evidence)
    low = [(role, s) for role, s in states
           if s.free_bytes is not None and s.free_bytes < MIN_FREE_BYTES]
    if low:
        role, state = low[0]
        return mode_finding(warn, "cache.home-quota",
                            f"only {state.free_bytes / GIB:.1f} GiB free for the {role} "
                            f"{state.path}; models and datasets need tens of GiB", *evidence,
                            here=_move_fix(role, dirs))
    missing = [s.path for role, s in states if not s.exists and role != "HF_HOME"]
    if missing and ctx.is_compute:
        shown = " and ".join(map(str, missing))
        action = fix_actions.create_dirs(missing, ctx.env)
        return info(f"{shown} not created yet: the job's ranks create "
                    f"{'them' if len(missing) > 1 else 'it'} on first use, with the default "
                    f"umask (`dsenv doctor --fix` creates mode {action.mode:04o} now)",
                    *evidence, action=action)
    unread = " (free space not read: `stat -f` gave no answer)" if all(
        s.free_bytes is None for _, s in states) else ""
    return ok(f"hub cache {dirs.hub}, datasets cache {dirs.datasets}: writable{unread}",
              *evidence)


SHARED_CACHE_SOURCE = ("source: https://github.com/huggingface/huggingface_hub/issues/2580, "
                       "https://github.com/huggingface/huggingface_hub/pull/3714")
# What dies, and on which file, when a download cannot write a repository's folder.
DOWNLOAD_DIES = {"lock folder": "PermissionError on {path}/<etag>.lock (the lock every "
                                "download takes first)",
                 "blob folder": "PermissionError on {path}/<etag>.incomplete",
                 "snapshot folder": "PermissionError creating {path}/<commit>/",
                 "ref folder": "PermissionError writing {path}/<revision>",
                 "lock folders": "PermissionError creating {path}/<repo folder>/",
                 "repository folders": "PermissionError creating {path}/<repo folder>/"}


def _repos_judged(ctx: Context, hub: Path) -> tuple[list[str], str]:
    """(repository folders, where the list comes from): the workload's assets with --for,
    else every repository in the cache and one not in it yet ("")."""
    workload = ctx.options.workload
    if workload:
        return ([a.cache_folder for a in assets_for(workload)],
                f"the assets of {workload} (workloads/assets.toml)")
    found, left_out = hfrepos.cached_repos(ctx, hub)
    more = f" ({left_out} more not tried: those of other users come first)" if left_out else ""
    return [*found, ""], f"every repository in {hub}{more}, and a new one"


LOCK_PERMS = "cache.hub-shared-lock-perms"  # the catalogue mode of every cache.hf-repos failure


def _unwritable(ctx: Context, bad: list[hfrepos.RepoWrites], me: str, evidence: list[str]):
    """A folder a download writes that this user cannot write fails (warns offline: the job
    only reads); another user's lock files alone warn (only a download of a file already
    fetched, such as a new revision that reuses it, takes that lock again)."""
    broken = [r for r in bad if r.broken]
    more = f" ({len(bad)} repositories affected)" if len(bad) > 1 else ""
    if broken:
        write = broken[0].broken[0]
        owner = hfrepos.owner_name(write.owner)
        where = "" if write.where == write.path else f"created in {write.where}, "
        what = (f"the {write.role} {write.path} ({where}owner {owner}) cannot be written by "
                f"you ({me}){more}")
        dies = DOWNLOAD_DIES[write.role].format(path=write.path)
    else:
        lock = bad[0].stuck_locks[0]
        owner = hfrepos.owner_name(hfrepos.uid_of(lock))
        what = (f"{sum(len(r.stuck_locks) for r in bad)} lock file(s) of another user "
                f"({owner}) cannot be opened for writing by you ({me}){more}")
        dies = f"PermissionError on {lock}"
    paths = sorted({str(w.where) for r in bad for w in r.broken if w.where} |
                   {str(p.parent) for r in bad for p in r.stuck_locks})
    fix = (f"use a hub cache of your own (export HF_HUB_CACHE={SUGGESTED['HF_HUB_CACHE']}), "
           f"or have {owner} open those folders to the users sharing the cache: "
           f"`chmod -R g+rwX {' '.join(shlex.quote(p) for p in paths[:6])}` with a group you "
           "all belong to (`chgrp -R GROUP` on the same folders, and `chmod g+s` on them)")
    evidence = [*evidence, SHARED_CACHE_SOURCE]
    if not broken:
        return mode_finding(warn, LOCK_PERMS, f"{what}: a download of a file already fetched (a "
                            "new revision that reuses it, a damaged blob fetched again) dies "
                            f"with {dies}", *evidence, here=fix)
    if hfcache.offline_state(ctx.env).hub:
        return mode_finding(warn, LOCK_PERMS, f"{what}: offline, the job only reads the cache, "
                            f"but a file missing from it cannot be fetched there ({dies})",
                            *evidence, here=fix)
    return mode_finding(fail, LOCK_PERMS, f"{what}: a download dies with {dies}", *evidence,
                        here=fix)


@check("cache.hf-repos", "Repository folders a download writes")
def hf_repos(ctx: Context):
    hub = hfcache.resolve_dirs(ctx.env).hub
    folders, source = _repos_judged(ctx, hub)
    me = hfrepos.owner_name(os.geteuid())
    judged = [hfrepos.repo_writes(ctx, hub, f) for f in folders]
    evidence = [f"repositories judged: {source}; tried as {me}"]
    for repo in judged:
        name = repo.folder or "a repository not in the cache yet"
        if repo.ok:
            evidence.append(f"{name}: " + ", ".join(w.role for w in repo.writes) + " writable")
        evidence += [f"{name}: {w.describe()}" for w in repo.broken]
        evidence += [f"{name}: lock file {p} not writable by you" for p in repo.stuck_locks]
    stuck = [w for r in judged for w in r.hung]
    if stuck:
        return warn(hung(stuck[0].role, stuck[0].path), "use a hub cache on a node-local disk: "
                    f"export HF_HUB_CACHE={SUGGESTED['HF_HUB_CACHE']}", *evidence)
    if any(r.locks_unanswered for r in judged):
        return warn(files_unanswered("lock folders", hub / hfrepos.LOCKS) + " (a download "
                    "opens its repository's lock file there first)", "use a hub cache on a "
                    f"node-local disk: export HF_HUB_CACHE={SUGGESTED['HF_HUB_CACHE']}",
                    *evidence)
    bad = [r for r in judged if not r.ok]
    if bad:
        return _unwritable(ctx, bad, me, evidence)
    named = [r for r in judged if r.folder]
    if not named:
        return ok(f"no repository in {hub} yet; a first download can create its lock and "
                  "repository folders there", *evidence)
    new = " (and those of a new one)" if any(not r.folder for r in judged) else ""
    return ok(f"a download can write the lock, blob, snapshot and ref folders of "
              f"{len(named)} repositor{'y' if len(named) == 1 else 'ies'}{new} in {hub}",
              *evidence)


@probe
def reachability(ctx: Context) -> hfcache.Reachability:
    timeout = min(hfcache.CONNECT_TIMEOUT, ctx.options.probe_timeout)
    return hfcache.hub_reachability(ctx.env, timeout)


@check("cache.offline", "Hub offline mode on compute nodes")
def offline(ctx: Context):
    state = hfcache.offline_state(ctx.env)
    shown = [f"{k}={v}" for k, v in state.variables.items()] or ["no *_OFFLINE variable set"]
    mode = ("offline" if state.hub and state.datasets else
            "online" if not (state.hub or state.datasets) else "partly offline")
    if not ctx.is_compute:
        return info(f"login node: hub access expected here (libraries {mode})", *shown)
    if state.partial:
        online = "datasets" if state.hub else "huggingface_hub/transformers"
        return mode_finding(warn, "cache.hf-online-on-offline-node",
                            f"partly offline: {online} will still try to reach the hub", *shown,
                            here=OFFLINE_FIX, action=_offline_action(ctx))
    if state.hub:
        return ok("offline mode set: from_pretrained and load_dataset read the cache only",
                  *shown)
    reach = reachability(ctx)
    evidence = [*shown, reach.detail + (" (through the proxy)" if reach.via_proxy else "")]
    if reach.reachable:
        return ok(f"{reach.endpoint} reachable from this node", *evidence)
    # through a proxy the job's environment names: the proxy is what fails
    return mode_finding(fail, "hf.proxy-required" if reach.via_proxy
                        else "cache.hf-online-on-offline-node",
                        f"{reach.endpoint} unreachable and offline mode not set: the first "
                        "from_pretrained hangs on retries or crashes", *evidence,
                        here=OFFLINE_FIX, action=_offline_action(ctx))


def _offline_action(ctx: Context):
    """The offline variables in the environment's activate script, inside Slurm jobs (as
    `dsenv provision` writes them for sites whose compute nodes have no internet)."""
    return fix_actions.activate_exports(ctx, fix_actions.OFFLINE,
                                        {name: "1" for name in OFFLINE_VARIABLES}, guard="slurm")


@check("cache.assets", "Workload assets in the offline cache")
def assets(ctx: Context):
    workload = ctx.options.workload
    if not workload:
        return skip("no --for WORKLOAD given")
    layout = CacheLayout.from_env(ctx.env)
    wanted = assets_for(workload)
    missing = [item for asset in wanted for item in asset.missing_in(layout)]
    where = f"hub cache {layout.hub}, data sets {layout.saved}"
    if missing:
        return mode_finding(fail, "hf.offline-incomplete-snapshot",
                            f"{len(missing)} of {workload}'s assets missing ({where})", *missing,
                            here=f"on a login node: `dsenv fetch {workload}` (with the same "
                            "HF_HOME/HF_HUB_CACHE/HF_DATASETS_CACHE as the job)")
    return ok(f"all {len(wanted)} assets of {workload} in the offline cache ({where})",
              *(asset.describe() for asset in wanted))

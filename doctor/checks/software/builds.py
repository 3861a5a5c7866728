"""JIT builds, their caches and libraries: extension locks and folder, ninja, shadowed CUDA
libraries, file locks in the caches, Triton and MIOpen caches (doctor/modes/)."""

from __future__ import annotations

import errno
import os
import shlex
from dataclasses import replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.fix import actions as fix_actions
from dsenv.doctor.registry import check
from dsenv.facts.host import cachefs, hfcache, mounts
from dsenv.facts.python import libshadow, pyenv, target_env
from dsenv.facts.python import torch_info as tp
from dsenv.facts.toolchain import extensions as ext
from dsenv.verdicts.findings import fail, info, ok, skip, warn

# On a shared file system the builder may run on another node, where /proc cannot be seen:
# a lock that young gets a warning, an older one is stale (a JIT build takes minutes).
STALE_ON_SHARED_FS = 3600.0
LOCK_SOURCE = "source: https://github.com/pytorch/pytorch/issues/189245"


def hung(role: str, path) -> str:
    """What a folder whose write test never answered (cachefs.FolderTest.hung) means: not a
    permission problem, nothing could be tried there (cache.hf-dirs, cache.hf-repos too)."""
    return (f"creating a file in the {role} {path} gave no answer: the file system there "
            "stopped answering (a hung network mount?), and the job's writes there will hang "
            "the same way")


def files_unanswered(role: str, path) -> str:
    """What a folder whose files did not answer a stat (mounts.files_answer) means: the mount
    answers, some of its files do not (a Lustre storage target that went down)."""
    return (f"a file under the {role} {path} gave no answer to a stat while the folder did: "
            "part of that file system stopped answering (a storage target down?), and a job "
            "that reads it will hang the same way")


def _quoted(paths) -> str:
    return " ".join(shlex.quote(str(p)) for p in paths)


# -- deepspeed: the JIT extensions folder -----------------------------------------------------


@check("deepspeed.extension-locks", "Stale JIT build locks")
def extension_locks(ctx: Context):
    root = ext.extensions_root(ctx)
    if not ext.files_answer(ctx):
        return skip(f"{root.scan} ({root.source}) not read: its file system gave no answer "
                    "(deepspeed.extensions-dir tells more)")
    if not root.scan.is_dir():
        return ok(f"no extensions folder yet ({root.scan}, {root.source}): nothing is locked")
    scan = ext.build_locks(ctx)
    if not scan.locks:
        return ok(f"no build lock in {root.scan} ({root.source})")
    mount = mounts.mount_for(ctx, root.scan)
    evidence = []
    for lock in scan.locks:
        who = "; ".join(h.describe() for h in lock.holders) or \
            "no process on this node has it open or works in its folder"
        evidence.append(f"{lock.path}: {ext.describe_age(lock.age)} old, {who}")
    if scan.unreadable:
        evidence.append(f"{scan.unreadable} processes of other users could not be inspected")
    stale = [lock for lock in scan.locks if lock.stale]
    ops = ", ".join(sorted({lock.op for lock in stale or scan.locks}))
    if not stale:
        return info(f"JIT build running now ({ops}): jobs loading it wait until it ends",
                    *evidence)
    paths = [lock.path for lock in stale]
    fix = f"rm {_quoted(paths)}"
    oldest = max(lock.age for lock in stale)
    if mount is not None and mount.shared and oldest < STALE_ON_SHARED_FS:
        action = fix_actions.remove_locks(paths, f"on {mount.fstype} a job on another node "
                                          "may hold it")
        return mode_finding(warn, "jit.stale-extension-lock",
                            f"build lock of {ops} held by no process on this node "
                            f"({ext.describe_age(oldest)} old); on {mount.fstype} a job on "
                            "another node may still be building", *evidence,
                            f"{root.scan} is on {mount.describe()}", LOCK_SOURCE,
                            here=fix + " once no job on any node builds it", action=action)
    action = fix_actions.remove_locks(paths)
    return mode_finding(fail, "jit.stale-extension-lock",
                        f"stale JIT build lock of {ops} ({ext.describe_age(oldest)} old, no "
                        "build holds it): the next job that loads it waits forever after "
                        "'Using ... as PyTorch extensions root...'", *evidence, LOCK_SOURCE,
                        here=fix, action=action)


def _extensions_target(ctx: Context) -> str:
    """Where TORCH_EXTENSIONS_DIR should point: inside the environment when that is local and
    writable (private to it), else a node-local folder named after it."""
    prefix = Path(target_env.environment(ctx).prefix)
    mount = mounts.mount_for(ctx, prefix)
    if mount is not None and not mount.shared and cachefs.try_folder(ctx, prefix).created:
        return str(prefix / "torch_extensions")
    return f"/tmp/$USER/torch_extensions/{prefix.name or 'env'}"


@check("deepspeed.extensions-dir", "JIT extensions folder")
def extensions_dir(ctx: Context):
    root = ext.extensions_root(ctx)
    if root.path is None:
        return skip(f"{tp.NOT_INSTALLED}: nothing is JIT-built")
    folder = cachefs.CacheFolder("extensions folder", root.path, "TORCH_EXTENSIONS_DIR",
                                 root.source)
    state = cachefs.inspect(ctx, folder)
    action = fix_actions.activate_exports(ctx, fix_actions.EXTENSIONS,
                                          {"TORCH_EXTENSIONS_DIR": _extensions_target(ctx)})
    fix = action.command
    evidence = [state.describe()]
    if not root.explicit:
        evidence.append("TORCH_EXTENSIONS_DIR unset: every environment with this Python and "
                        "CUDA/ROCm shares the folder")
    if state.test.hung:
        return mode_finding(warn, "jit.extensions-dir-shared",
                            hung("extensions folder", root.path), *evidence, here=fix,
                            action=action)
    if state.mount is not None and state.mount.may_hang and \
            not ext.files_answer(ctx):
        return mode_finding(warn, "jit.extensions-dir-shared",
                            files_unanswered("extensions folder", root.scan), *evidence,
                            here=fix, action=action)
    if not state.writable:
        return mode_finding(fail, "jit.extensions-dir-not-writable",
                            f"the extensions folder {root.path} cannot be written: the first "
                            "JIT build stops with PermissionError", *evidence,
                            "source: https://github.com/deepspeedai/DeepSpeed/issues/2244",
                            here=fix, action=action)
    if state.foreign_owner:
        return mode_finding(warn, "jit.extensions-dir-not-writable",
                            f"{root.path} belongs to uid {state.owner}, not to you (uid "
                            f"{os.geteuid()}): builds and locks there are another user's",
                            *evidence, here=fix, action=action)
    if state.mount is not None and state.mount.shared:
        return mode_finding(warn, "jit.extensions-dir-shared",
                            f"{root.path} is on {state.mount.fstype}: jobs on every node build "
                            "into and load from one folder (racing builds, half-written .so "
                            "files)", *evidence,
                            "source: https://github.com/huggingface/transformers/pull/12723",
                            here=fix, action=action)
    where = state.mount.fstype if state.mount is not None else "file system unknown"
    return ok(f"{root.path}: writable, yours, node-local ({where})", *evidence)


# -- toolkit: ninja ----------------------------------------------------------------------------


def _installed_ninja(ctx: Context, env) -> Path | None:
    """A ninja the environment has but PATH may lack: <prefix>/bin/ninja, or the binary the
    `ninja` Python package ships (ninja/data/bin/ninja)."""
    candidates = [Path(env.prefix) / "bin" / "ninja"]
    package = target_env.module_folder(ctx, "ninja")
    if package is not None:
        candidates.append(package / "data" / "bin" / "ninja")
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


@check("toolkit.ninja", "ninja on the job's PATH")
def ninja(ctx: Context):
    if not tp.torch_build(ctx).installed:
        return skip(f"{tp.NOT_INSTALLED}: nothing is JIT-built")
    env = target_env.environment(ctx)
    python = env.python or "python"
    found = ctx.which("ninja")
    if found:
        run = ctx.run([found, "--version"])  # what torch's verify_ninja_availability runs
        if run.ok:
            version = (run.stdout.strip().splitlines() or ["?"])[0]
            return ok(f"ninja {version} at {found}")
        return fail(f"ninja at {found} does not run: JIT builds stop with 'Ninja is required "
                    "to load C++ extensions'", f"{python} -m pip install --force-reinstall ninja",
                    run.describe())
    installed = _installed_ninja(ctx, env)
    if installed is not None:
        return mode_finding(fail, "jit.ninja-missing",
                            f"ninja is installed ({installed}) but not on the job's PATH: JIT "
                            "builds stop with 'Ninja is required to load C++ extensions'",
                            f"PATH={ctx.env.get('PATH', '')}",
                            f"{installed.parent} is the environment's: it is not activated in "
                            "the job", "source: https://github.com/deepspeedai/DeepSpeed/issues/1687",
                            here=f"export PATH={installed.parent}:$PATH")
    return mode_finding(warn, "jit.ninja-missing",
                        "no ninja on PATH or in the environment: ops that are not precompiled "
                        "cannot be JIT-built ('Ninja is required to load C++ extensions')",
                        f"PATH={ctx.env.get('PATH', '')}", here=f"{python} -m pip install ninja")


# -- torch: CUDA libraries shadowed by LD_LIBRARY_PATH -----------------------------------------


SHADOWS = "torch.ld-library-path-shadows-cuda"  # the catalogue mode every failure reports


@check("torch.library-path", "CUDA libraries on LD_LIBRARY_PATH")
def library_path(ctx: Context):
    torch = tp.torch_build(ctx)
    if not torch.installed:
        return skip(f"{tp.NOT_INSTALLED}: no CUDA libraries from pip wheels to shadow")
    if not torch.cuda:
        return skip(f"{torch.describe()}: no CUDA libraries from pip wheels to shadow")
    folders = ctx.library_path()
    shadows, count = libshadow.find_shadows(Path(torch.location), folders)
    if not count:
        return skip("torch's CUDA libraries do not come from nvidia-* wheels here (a conda or "
                    "source build): nothing to compare")
    shown = f"LD_LIBRARY_PATH={':'.join(folders)}" if folders else "LD_LIBRARY_PATH unset"
    if not shadows:
        return ok(f"none of torch's {count} CUDA libraries has a copy on LD_LIBRARY_PATH", shown)
    evidence = [s.describe() for s in shadows] + [shown]
    differing = [s for s in shadows if s.differs]
    if not differing:
        return info(f"{len(shadows)} of torch's CUDA libraries also on LD_LIBRARY_PATH, same "
                    "versions: harmless until one side changes", *evidence)
    drop = {str(s.other.parent) for s in differing}
    keep = [f for f in folders if f not in drop]
    fix = f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH"
    evidence.append("torch's pip wheel brings every CUDA library it needs: drop the CUDA "
                    "module's lib folders from LD_LIBRARY_PATH before python starts")
    names = ", ".join(s.soname for s in differing)
    source = "source: https://github.com/pytorch/pytorch/issues/91067"
    python = target_env.environment(ctx).python
    if python is None:
        return mode_finding(fail, SHADOWS, f"LD_LIBRARY_PATH has other versions of {names}: "
                            "the loader takes them before torch's own", *evidence, source,
                            here=fix)
    tried = libshadow.import_torch(ctx, python, differing)
    if tried.ran and tried.error:
        return mode_finding(fail, SHADOWS, f"`import torch` fails: {tried.error}", *evidence,
                            source, here=fix)
    if not tried.ran:
        return mode_finding(fail, SHADOWS, f"LD_LIBRARY_PATH has other versions of {names}: "
                            "the loader takes them before torch's own", *evidence,
                            f"`import torch` could not confirm it: {tried.error}", source,
                            here=fix)
    loaded = libshadow.loaded_from_path(tried, differing)
    if loaded:
        return mode_finding(fail, SHADOWS, f"torch loads {', '.join(Path(p).name for p in loaded)} "
                            "from LD_LIBRARY_PATH, not its own: undefined symbols or CUBLAS "
                            "errors follow", *evidence,
                            *(f"mapped by `import torch`: {p}" for p in loaded), source,
                            here=fix)
    return mode_finding(warn, SHADOWS, f"LD_LIBRARY_PATH has other versions of {names}; "
                        "`import torch` took its own now, but ops and libraries that load them "
                        "by name get the others", *evidence, source, here=fix)


# -- cache: file locks, Triton, MIOpen ----------------------------------------------------------

HF_MOVE = {"HF_HUB_CACHE": "/tmp/$USER/huggingface/hub",
           "HUGGINGFACE_HUB_CACHE": "/tmp/$USER/huggingface/hub",
           "HF_DATASETS_CACHE": "/tmp/$USER/huggingface/datasets",
           "HF_HOME": "/tmp/$USER/huggingface"}


def _hf_folders(env) -> list[cachefs.CacheFolder]:
    dirs = hfcache.resolve_dirs(env)
    found = []
    for role, path in dirs.items():
        source = dirs.sources[role]
        variable = source if source in HF_MOVE else "HF_HOME"
        found.append(cachefs.CacheFolder(role, path, variable, source))
    return found


FILELOCK_SOFT_FALLBACK = Version("3.24")  # tox-dev/filelock#480: ENOSYS -> SoftFileLock


def _filelock(ctx: Context) -> Version | None:
    dist = pyenv.find_distribution("filelock", pyenv.search_path(ctx))
    try:
        return Version(dist.version) if dist is not None else None
    except InvalidVersion:
        return None


def lock_consequence(code: int, filelock: Version | None) -> tuple[bool, str]:
    """(fatal, what the job's filelock does with this errno), as filelock's versions differ:
    before 3.24 ENOSYS raised NotImplementedError and every other error counted as
    contention, retried forever; since 3.24 ENOSYS falls back to SoftFileLock and other
    errors raise."""
    label = f"filelock {filelock}" if filelock else "filelock"
    new = filelock is not None and filelock >= FILELOCK_SOFT_FALLBACK
    if code == errno.ENOSYS:
        if new:
            return False, (f"{label} falls back to SoftFileLock: lock files without kernel "
                           "locks, and a job killed while holding one leaves it behind")
        return True, (f"{label} raises 'FileSystem does not appear to support flock; use "
                      "SoftFileLock instead': downloads and load_dataset crash")
    if new:
        return True, (f"{label} raises OSError [Errno {code}] {os.strerror(code)}: downloads "
                      "and load_dataset crash")
    return True, (f"{label} takes it for a lock held elsewhere and retries forever: "
                  "load_dataset and downloads hang")


@check("cache.flock", "File locks in the Hugging Face caches")
def flock(ctx: Context):
    evidence, broken, untested, local_only = [], [], [], []
    folders = _hf_folders(ctx.env)
    for folder in folders:
        test = cachefs.try_folder(ctx, folder.path)
        mount = mounts.mount_for(ctx, folder.path)
        on = f" on {mount.describe()}" if mount is not None else ""
        if not test.created:
            untested.append((folder, test, mount))
            evidence.append(f"{folder.describe()}: not tested, {test.error}{on}")
            continue
        state = test.lock_error() or "flock and lockf work"
        evidence.append(f"{folder.describe()}: {state} (tested in {test.where}){on}")
        if test.flock:
            broken.append((folder, test, mount))
        elif mount is not None and mount.lock_scope() == "node-local":
            local_only.append(mount)
    if broken:
        folder, test, mount = broken[0]
        fatal, consequence = lock_consequence(test.flock, _filelock(ctx))
        where = f" ({mount.fstype})" if mount is not None else ""
        return mode_finding(fail if fatal else warn,
                            "cache.datasets-lock-hang" if folder.role == "datasets cache"
                            else "cache.hub-no-flock",
                            f"flock fails in the {folder.role} {folder.path}{where}, "
                            f"[Errno {test.flock}] {os.strerror(test.flock)}: {consequence}",
                            *evidence, "node-local disk (/tmp) has working flock",
                            "source: https://github.com/huggingface/huggingface_hub/issues/2399",
                            here=f"export {folder.variable}={HF_MOVE[folder.variable]}")
    refused = [(f, m) for f, _, m in untested if m is not None and m.lock_scope() == "none"]
    if refused:
        folder, mount = refused[0]
        fatal, consequence = lock_consequence(errno.ENOSYS, _filelock(ctx))
        return mode_finding(fail if fatal else warn,
                            "cache.datasets-lock-hang" if folder.role == "datasets cache"
                            else "cache.hub-no-flock",
                            f"the {folder.role} {folder.path} is on {mount.fstype} mounted "
                            f"without flock, where flock() fails with ENOSYS: {consequence}",
                            *evidence, here=f"export {folder.variable}={HF_MOVE[folder.variable]}")
    if len(untested) == len(folders):
        stuck = [f for f, t, _ in untested if t.hung]
        if stuck:
            return warn(hung(stuck[0].role, stuck[0].path),
                        f"export HF_HOME={HF_MOVE['HF_HOME']}", *evidence)
        return skip("no cache folder can be written here to test locks (see cache.hf-dirs)",
                    *evidence)
    if local_only:
        return info(f"locks work, but only on this node ({local_only[0].fstype} mounted with "
                    f"{'localflock' if local_only[0].fstype == 'lustre' else 'local locks'}): "
                    "jobs on other nodes do not see them", *evidence)
    return ok("flock works in every Hugging Face cache folder", *evidence)


def _folder_finding(states, fix: str, what: str, source: str, lock_what: str = "", *,
                    unwritable_mode: str, shared_mode: str):
    """The common verdict for compiler caches: unwritable (or, with ``lock_what``, POSIX
    locks failing) fails; another owner or a shared file system warns; None when healthy.
    ``unwritable_mode`` (unwritable, locks failing, another owner) and ``shared_mode``: the
    catalogue modes they report; ``fix``: this node's command ("here:")."""
    evidence = [s.describe() for s in states]
    for state in states:
        if state.test.hung:
            return mode_finding(warn, shared_mode, hung(state.folder.role, state.folder.path),
                                *evidence, source, here=fix)
    for state in states:
        folder = state.folder
        if not state.writable:
            return mode_finding(fail, unwritable_mode, f"the {folder.role} {folder.path} "
                                f"cannot be written: {what}", *evidence, source, here=fix)
        if lock_what and state.test.lockf:
            return mode_finding(fail, unwritable_mode, f"POSIX locks fail in the {folder.role} "
                                f"{folder.path} ({state.test.lock_error()}): {lock_what}",
                                *evidence, source, here=fix)
    for state in states:
        if state.foreign_owner:
            return mode_finding(warn, unwritable_mode, f"the {state.folder.role} "
                                f"{state.folder.path} belongs to uid {state.owner}, not to you "
                                f"(uid {os.geteuid()}): its entries are another user's",
                                *evidence, source, here=fix)
    for state in states:
        if state.mount is not None and state.mount.shared:
            what = "network" if state.mount.kind == "network" else "FUSE"
            return mode_finding(warn, shared_mode, f"the {state.folder.role} "
                                f"{state.folder.path} is on {state.mount.fstype}, a {what} file "
                                "system other nodes may share: ranks race on it", *evidence,
                                source, here=fix)
    return None


@check("cache.triton-dir", "Triton kernel cache folder")
def triton_dir(ctx: Context):
    if target_env.module_folder(ctx, "triton") is None:
        return skip("triton is not installed in the environment")
    state = cachefs.inspect(ctx, cachefs.triton_folder(ctx.env))
    action = fix_actions.activate_exports(ctx, fix_actions.CACHE,
                                          {"TRITON_CACHE_DIR": "/tmp/$USER/triton"})
    finding = _folder_finding([state], "export TRITON_CACHE_DIR=/tmp/$USER/triton",
                              "compiling a Triton kernel fails with PermissionError",
                              "source: https://github.com/triton-lang/triton/issues/2688",
                              unwritable_mode="cache.triton-dir-foreign-owner",
                              shared_mode="cache.triton-on-shared-fs")
    if finding is not None:  # a kernel cache: rebuilt on the node-local disk at no risk
        return replace(finding, action=action)
    return ok(f"{state.folder.path}: writable, yours, node-local", state.describe())


@check("cache.miopen-db", "MIOpen database folders")
def miopen_db(ctx: Context):
    if not ctx.path("/dev/kfd").exists() and not tp.torch_build(ctx).hip:
        return skip("no ROCm here (no /dev/kfd, torch is not a ROCm build): MIOpen is not used")
    states = [cachefs.inspect(ctx, folder) for folder in cachefs.miopen_folders(ctx.env)]
    fix = "export MIOPEN_USER_DB_PATH=/tmp/$USER/miopen MIOPEN_CUSTOM_CACHE_DIR=/tmp/$USER/miopen"
    finding = _folder_finding(states, fix, "MIOpen fails with 'unable to open database file'",
                              "source: https://github.com/ROCm/MIOpen/issues/2214",
                              lock_what="SQLite cannot lock MIOpen's database",
                              unwritable_mode="cache.miopen-db-shared-fs",
                              shared_mode="cache.miopen-db-shared-fs")
    if finding is not None:  # caches of tuning results and kernels: rebuilt at no risk
        return replace(finding, action=fix_actions.activate_exports(
            ctx, fix_actions.CACHE, {"MIOPEN_USER_DB_PATH": "/tmp/$USER/miopen",
                                     "MIOPEN_CUSTOM_CACHE_DIR": "/tmp/$USER/miopen"}))
    return ok("MIOpen's database and kernel cache: writable, yours, node-local",
              *(s.describe() for s in states))

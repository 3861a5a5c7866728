"""The built-ops cache: DeepSpeed wheels with ops precompiled, reused by the next provision
of the same stack.

Building DeepSpeed's ops is the slowest step of ``dsenv provision`` (the default CPU op set
takes ~8 minutes on 2 cores; CUDA ops longer). :func:`provide_ops` keeps the wheel each build
produced, in a folder per key::

    <cache>/deepspeed-0.19.8-<key digest>/entry.json   key, wheel sha256, build host, CPU flags
    <cache>/deepspeed-0.19.8-<key digest>/deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl

The key (:func:`ops_key`) holds everything that changes the wheel's bytes: the deepspeed
release and its sdist hash, the env's torch (version, CUDA/HIP, git build), Python and libc,
the op switches, the architecture variables and accelerator, the toolkit (nvcc/hipcc)
version, the C++ compiler, compiler-flag variables, and for ops compiled with
``-march=native`` the options the compiler expands it into here (dsenv/facts/toolchain/cpu_isa.py).

Where the cache lives (:func:`resolve_dir`): ``--ops-cache DIR``, else ``$DSENV_OPS_CACHE``,
else the site profile's ``ops_cache`` (a shared file system, so every node type's build is
made once per site), else ``$XDG_CACHE_HOME/dsenv/ops-cache`` (``~/.cache/...``); ``none``
turns it off. Concurrent jobs are safe: an entry is looked up, built and written while its
lock is held (dsenv.targetlock: a second job asking for the same key waits, then reuses the
first one's wheel), written in a staging folder and renamed into place (dsenv.staging), and
its wheel is hashed against entry.json each time it is used: a corrupted entry is said so,
rebuilt and replaced. A wheel from the cache is installed like a built one and its
installed_ops verified the same way (build_ops.verified_ops).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from dsenv import __version__, proc, targetlock
from dsenv.facts.node import Node
from dsenv.facts.toolchain import cpu_isa, toolkit
from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.provision import ProvisionError
from dsenv.provision.ops.build import (
    DEFAULT_BUILD_TIMEOUT,
    BuiltOps,
    build_ops,
    ops_build_env,
    switched_on,
    verified_ops,
)
from dsenv.provision.ops.command import CACHE_SCRATCH, wheel_command
from dsenv.provision.shown import Names, as_log, temporary_names
from dsenv.provision.uvcmd import Sources, run_logged
from dsenv.staging import staged_dir

ENV_VARIABLE = "DSENV_OPS_CACHE"
OFF = ("none", "off")
ENTRY_SCHEMA = "dsenv.ops-cache/1"
ENTRY_FILE = "entry.json"
# Ops whose builders add -march=native (DeepSpeed 0.19.8: every op of the CPU accelerator,
# op_builder/cpu/builder.py cxx_args(); async_io and gds, op_builder/async_io.py cxx_args()),
# by op name and by DS_BUILD_* switch.
NATIVE_OPS_ANY_ACCELERATOR = ("async_io", "gds")
NATIVE_SWITCHES_ANY_ACCELERATOR = ("aio", "gds")
# Variables setuptools and torch's extension builder add to the compile and link lines.
COMPILE_VARIABLES = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "NVCC_FLAGS",
                     "NVCC_APPEND_FLAGS", "HIPCC_FLAGS")


@dataclass(frozen=True)
class CacheDir:
    path: Path | None  # None: the cache is off
    source: str  # where it was set: --ops-cache, DSENV_OPS_CACHE, site NAME, default

    def describe(self) -> str:
        return f"{self.path} ({self.source})" if self.path else f"off ({self.source})"


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache")
    return Path(os.path.expanduser(base)) / "dsenv" / "ops-cache"


def resolve_dir(option: str | None = None, site_value: str = "", site_name: str = "",
                env: Mapping[str, str] | None = None) -> CacheDir:
    """The ops cache folder: ``--ops-cache`` > $DSENV_OPS_CACHE > the site's ``ops_cache``
    > the default under the user's cache dir. ``none``/``off`` turns it off."""
    env = os.environ if env is None else env
    for value, source in ((option, "--ops-cache"), (env.get(ENV_VARIABLE), ENV_VARIABLE),
                          (site_value, f"site {site_name}")):
        if value:
            if value.strip().lower() in OFF:
                return CacheDir(None, source)
            expanded = _expand(value, env)
            if "$" in expanded:
                raise ProvisionError(f"ops cache {value!r} ({source}): {expanded} still holds an"
                                     " unset variable: set it, or pass --ops-cache DIR")
            return CacheDir(Path(expanded).absolute(), source)
    return CacheDir(default_dir(env), "default")


def _expand(value: str, env: Mapping[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` from ``env`` (unset ones stay as they are) and a leading ``~``."""
    text = re.sub(r"\$(\w+|\{(\w+)\})",
                  lambda m: env.get(m.group(2) or m.group(1), m.group(0)), value.strip())
    if text == "~" or text.startswith("~/"):
        text = (env.get("HOME") or os.path.expanduser("~")) + text[1:]
    return text


# ----------------------------------------------------------------------------- the key
_READ_ENV = r"""
import ast, importlib.util, json, os, platform, sys
info = {"python": platform.python_version(), "implementation": sys.implementation.cache_tag,
        "machine": platform.machine(), "libc": " ".join(platform.libc_ver())}
spec = importlib.util.find_spec("torch")
if spec and spec.origin:
    try:
        tree = ast.parse(open(os.path.join(os.path.dirname(spec.origin), "version.py")).read())
    except (OSError, SyntaxError):
        tree = ast.Module(body=[], type_ignores=[])
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id in (
                    "__version__", "cuda", "hip", "git_version"):
                try:
                    info["torch_" + target.id.strip("_")] = ast.literal_eval(node.value)
                except ValueError:
                    pass
print("@@dsenv@@" + json.dumps(info))
"""


@dataclass(frozen=True)
class OpsKey:
    parts: dict  # what the wheel's bytes depend on, as JSON values

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()

    @property
    def entry_name(self) -> str:
        version = re.sub(r"[^A-Za-z0-9.+-]", "_", str(self.parts.get("deepspeed", "")))
        return f"deepspeed-{version}-{self.digest[:24]}"


def compiles_native(ops_env: Mapping[str, str], accelerator: str) -> bool:
    """Whether a requested op's builder adds -march=native."""
    on = switched_on(ops_env)
    return bool(on) and (accelerator == "cpu" or any(
        switch in NATIVE_SWITCHES_ANY_ACCELERATOR for switch in on))


def native_ops(ops: list[str] | tuple[str, ...], accelerator: str) -> list[str]:
    """The ops (by name) whose builders added -march=native."""
    return sorted(op for op in ops
                  if accelerator == "cpu" or op in NATIVE_OPS_ANY_ACCELERATOR)


def ops_key(python: str | os.PathLike, ops_env: Mapping[str, str],
            arch_env: Mapping[str, str], requirement: str, sources: Sources,
            env: Mapping[str, str] | None = None,
            native: cpu_isa.NativeIsa | None = None) -> OpsKey:
    """The cache key of the wheel ``build_ops`` would build with these arguments."""
    base = dict(os.environ if env is None else env)
    build_env = ops_build_env(base, Path(python), dict(arch_env))
    result = proc.run([os.fspath(python), "-c", _READ_ENV], timeout=60, env=build_env)
    facts = proc.marked_json(result.stdout, "@@dsenv@@")
    if not result.ok or facts is None:
        raise ProvisionError(f"ops cache: cannot ask {python} about its torch and Python: "
                             f"{result.describe()}")
    name_version = requirement.split("--hash")[0].split(";")[0].strip().split()[0]
    hashes = sorted(set(re.findall(r"--hash[= ]sha256:([0-9a-f]{64})", requirement)))
    accelerator = arch_env.get("DS_ACCELERATOR") or base.get("DS_ACCELERATOR", "")
    ctx = Node(wanted_target="login", env=build_env)
    compiler = toolkit.cxx(ctx)
    parts = {
        "format": 1,
        "deepspeed": name_version.partition("==")[2] or name_version,
        # PyPI serves deepspeed as an sdist only: the lock's hash is the sdist's. Without one
        # (a conda env's unhashed pin) the index that served it stands in for it.
        "sdist_sha256": hashes or f"unhashed from {sources.describe()}",
        **{k: v for k, v in facts.items()},
        "accelerator": accelerator,
        "ops": {k: str(v) for k, v in sorted(ops_env.items())},
        "arch": {k: str(v) for k, v in sorted(arch_env.items())
                 if k not in ("CUDA_HOME", "ROCM_PATH", "DS_ACCELERATOR")},
        "compiler": compiler.how if compiler.found else None,
        "compile_variables": {k: base[k] for k in COMPILE_VARIABLES if base.get(k)},
    }
    if accelerator == "cuda":
        nvcc = toolkit.nvcc(ctx)
        parts["toolkit"] = f"nvcc {nvcc.version}" if nvcc.found else None
    elif accelerator == "rocm":
        hipcc = toolkit.hipcc(ctx)
        parts["toolkit"] = f"hipcc {hipcc.version}" if hipcc.found else None
    if native is not None and compiles_native(ops_env, accelerator):
        parts["cpu"] = {"march": native.march, "options_sha256": native.digest}
    return OpsKey(parts)


def cpu_record(native: cpu_isa.NativeIsa | None, ops: list[str]) -> dict:
    """The manifest's ``ops.cpu_flags``: the ops built with -march=native and the CPU flags
    the compiler enabled for them on the build host ({} when no op is)."""
    if not ops:
        return {}
    if native is None:
        return {"ops": ops, "flags": [], "host": socket.gethostname(),
                "note": "the compiler did not say what -march=native enables here"}
    return {"ops": ops, "host": socket.gethostname(), **native.to_json()}


# ----------------------------------------------------------------------------- entries
class CorruptEntry(Exception):
    """An entry that exists but cannot be trusted; the message says why."""


def sha256_file(path: Path, copy_to: Path | None = None) -> str:
    """sha256 of ``path`` (copied to ``copy_to`` as it is read, when given)."""
    digest = hashlib.sha256()
    out = open(copy_to, "wb") if copy_to else None
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                if out:
                    out.write(block)
    finally:
        if out:
            out.close()
    return digest.hexdigest()


def read_entry(entry: Path, key: OpsKey, copy_to: Path | None = None) -> tuple[dict, Path] | None:
    """(entry.json, the wheel) of a verified entry; None when there is none. The wheel is
    hashed (and copied to ``copy_to``: the bytes installed are the bytes verified).
    :class:`CorruptEntry` when entry.json or the wheel does not match."""
    if not entry.exists():
        return None
    try:
        record = read_json(entry / ENTRY_FILE, "ops cache entry")
    except JsonFileError as exc:
        raise CorruptEntry(str(exc)) from None
    if not isinstance(record, dict) or record.get("schema") != ENTRY_SCHEMA:
        raise CorruptEntry(f"{entry / ENTRY_FILE} is not a {ENTRY_SCHEMA} record")
    if record.get("digest") != key.digest:
        raise CorruptEntry(f"{entry / ENTRY_FILE} is for key {str(record.get('digest'))[:12]}"
                           f"..., not {key.digest[:12]}...")
    wheel = entry / str(record.get("wheel", ""))
    if not record.get("wheel") or not wheel.is_file():
        raise CorruptEntry(f"its wheel {wheel.name or '(none recorded)'} is missing")
    target = copy_to / wheel.name if copy_to else None
    found = sha256_file(wheel, target)
    if found != record.get("sha256"):
        raise CorruptEntry(f"{wheel.name} has sha256 {found[:12]}..., entry.json records "
                           f"{str(record.get('sha256'))[:12]}...")
    return record, (target or wheel)


def write_entry(entry: Path, key: OpsKey, wheel: Path, built: BuiltOps, cpu: dict) -> dict:
    """Store ``wheel`` as the entry of ``key`` (staged beside it, renamed into place; the
    caller holds the entry's lock)."""
    with staged_dir(entry, "dsenv provision (ops cache)") as staging:
        kept = Path(shutil.copy2(wheel, staging / wheel.name))
        record = {"schema": ENTRY_SCHEMA, "digest": key.digest, "key": key.parts,
                  "wheel": kept.name, "sha256": sha256_file(kept),
                  "size": kept.stat().st_size, "ops": list(built.requested),
                  "build_seconds": round(built.seconds, 1), "host": socket.gethostname(),
                  "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "dsenv_version": __version__, "cpu_flags": cpu}
        write_json_atomically(staging / ENTRY_FILE, record, indent=2)
    return record


# ----------------------------------------------------------------------------- provide
def provide_ops(python: str | os.PathLike, ops_env: Mapping[str, str],
                arch_env: Mapping[str, str], *, deepspeed_requirement: str,
                log: str | os.PathLike, cache: CacheDir | None,
                sources: Sources | None = None, compile_bytecode: bool = True,
                env: Mapping[str, str] | None = None, console=None, wait: float | None = None,
                timeout: float = DEFAULT_BUILD_TIMEOUT, say=None) -> BuiltOps:
    """DeepSpeed with ``ops_env``'s ops precompiled in the env of ``python``: the wheel of
    the cache entry for this key when there is a sound one, else :func:`build_ops` (whose
    wheel then fills the entry). Either way installed_ops is verified. ``wait``: seconds to
    wait for another run building the same entry (None: as long as it takes); when they run
    out, this run builds without the cache. ``say``: called with one line for what the cache
    did (waiting, a corrupt entry). The returned BuiltOps carries ``cache`` (dir, key,
    result) and ``cpu`` (:func:`cpu_record`)."""
    python, log = Path(python), as_log(log)
    say = say or (lambda line: None)
    sources = sources or Sources()
    run_env = dict(os.environ if env is None else env)
    accelerator = arch_env.get("DS_ACCELERATOR") or run_env.get("DS_ACCELERATOR", "")
    native = (cpu_isa.native_isa(env=ops_build_env(run_env, python, {}))
              if compiles_native(ops_env, accelerator) else None)
    record: dict = {"source": getattr(cache, "source", "not asked")}

    def done(built: BuiltOps, result: str, cpu: dict | None = None, **more) -> BuiltOps:
        cpu = cpu or cpu_record(native, native_ops(built.requested, accelerator))
        return replace(built, cpu=cpu, cache={**record, "result": result, **more})

    build = dict(deepspeed_requirement=deepspeed_requirement, log=log, sources=sources,
                 compile_bytecode=compile_bytecode, env=env, console=console, timeout=timeout)
    if cache is None or cache.path is None:
        return done(build_ops(python, ops_env, arch_env, **build), "off")
    key = ops_key(python, ops_env, arch_env, deepspeed_requirement, sources, env, native)
    entry = cache.path / key.entry_name
    record.update({"dir": str(cache.path), "key": key.digest, "entry": entry.name})
    lock = targetlock.TargetLock(entry, "dsenv provision (ops cache)")
    try:
        lock.acquire(wait, lambda owner: say("ops cache: " + targetlock.waiting_line(entry,
                                                                                    owner)))
    except targetlock.TargetBusy as exc:  # --wait ran out: build this one ourselves
        say(f"ops cache: {exc}: building without the cache")
        return done(build_ops(python, ops_env, arch_env, **build), "busy: built without it")
    except OSError as exc:  # a read-only or full cache folder: build without it
        say(f"ops cache {cache.path} is not usable ({exc.strerror or exc}): building "
            "without it")
        return done(build_ops(python, ops_env, arch_env, **build), f"unusable: {exc}")
    try:
        with tempfile.TemporaryDirectory(prefix=CACHE_SCRATCH) as scratch:
            try:
                found, why = read_entry(entry, key, copy_to=Path(scratch)), "miss"
            except CorruptEntry as exc:
                found, why = None, f"rebuilt: corrupt entry ({exc})"
                say(f"ops cache: entry {entry.name} is corrupt ({exc}): rebuilding it")
            if found is not None:
                kept, wheel = found
                built = install_wheel(python, wheel, ops_env, log=log, env=env,
                                      compile_bytecode=compile_bytecode, timeout=timeout,
                                      names=temporary_names(scratch, CACHE_SCRATCH))
                return done(replace(built, wheel=entry / wheel.name), "hit",
                            kept.get("cpu_flags"), built_on=kept.get("host"),
                            built_at=kept.get("created"))
            built = build_ops(python, ops_env, arch_env, keep_wheel=scratch, **build)
            if built.wheel is None:
                say("ops cache: uv kept no wheel of this build, so it is not cached")
                return done(built, why + ", not stored")
            built = done(built, why)
            write_entry(entry, key, built.wheel, built, built.cpu)
            return replace(built, wheel=entry / built.wheel.name)
    finally:
        lock.release()


def install_wheel(python: Path, wheel: Path, ops_env: Mapping[str, str], *, log: Path,
                  env: Mapping[str, str] | None = None, compile_bytecode: bool = True,
                  timeout: float = DEFAULT_BUILD_TIMEOUT, names: Names = ()) -> BuiltOps:
    """Reinstall deepspeed from a wheel of the cache and verify its installed_ops against
    ``ops_env`` exactly as after a build (``names``: how the wheel's folder is logged)."""
    command = wheel_command(python, wheel, compile_bytecode=compile_bytecode)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("\n=== dsenv: DeepSpeed ops from the ops cache\n")
    start = os.path.getsize(log)
    started = time.monotonic()
    result = run_logged(command, timeout=timeout, env=ops_build_env(env, python, {}),
                        output=log, names=names)
    seconds = time.monotonic() - started
    what = f"DeepSpeed ops from the ops cache ({wheel.name})"
    if not result.ok:
        raise ProvisionError(f"{what}: uv could not install it: {result.describe()}; full "
                             f"log: {log}")
    return verified_ops(python, ops_env, what=what, log=Path(log), start=start, env=env,
                        seconds=seconds, variables={}, command=command.argv,
                        verb="installed from the ops cache")

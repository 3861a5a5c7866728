"""`--kind container`: a venv with ``--system-site-packages`` on top of a vendor image's Python.

Vendor images (NGC's PyTorch, AMD's ROCm images) bring a torch built for their GPUs and
much of the stack; seed 001 adds the rest with ``python -m venv --system-site-packages`` and
``pip install``. dsenv does the same from a lock, installing only what the image lacks:

* :func:`plan_missing` compares the lock with the distributions the image's interpreter sees
  (first on ``sys.path`` wins, as at import time): a package at the locked version is used
  from the image; anything absent, or at another version, is installed into the venv (where
  it shadows the image's copy). ``keep`` names packages taken from the image whatever their
  version (the image's own torch build, e.g. ``2.13.0a0+nv25.10``).
* The missing ones are installed with ``uv pip install --require-hashes --no-deps``: the
  lock is already a complete, resolved set; ``--no-deps`` stops a second resolution that
  would see neither the image's packages (uv only looks inside the venv, so it would
  reinstall the image's torch and its nvidia-* wheels into the venv) nor the ``keep`` choice;
  hashes are still checked for every file installed.
* :func:`import_check` then imports every module of every locked package in the finished
  environment (a subprocess with a timeout; a crash or hang is one failure, the others are
  still checked), and :func:`missing_shared_libraries` runs ``ldd`` on every shared object of
  the env and says, per missing library, how to fix it (seed 001's ``ln -s`` of
  ``libxgboost.so``, or an ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dsenv import proc

from . import ProvisionError
from .locks import LockedRequirement, read_lock
from .uvcmd import Sources
from .venv import make_venv, run_sync, venv_python


# ----------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class ContainerPlan:
    """What the image provides and what the venv must add, for one lock."""

    present: dict[str, str]  # name -> version: the image has the locked version
    missing: list[str]  # lock lines (requirement + hashes) to install into the venv
    shadowed: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (image, lock)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (image, lock)

    def missing_names(self) -> list[str]:
        return [line.split("==", 1)[0] for line in self.missing]

    def summary(self) -> str:
        """``42 from the image, 12 to install (3 shadow the image's: ...)`` for a plan line."""
        text = f"{len(self.present)} from the image, {len(self.missing)} to install"
        if self.shadowed:
            names = ", ".join(f"{n} {img}->{lock}" for n, (img, lock) in self.shadowed.items())
            text += f" ({len(self.shadowed)} shadow the image's: {names})"
        if self.kept:
            names = ", ".join(f"{n} {img}" for n, (img, _) in self.kept.items())
            text += f"; kept from the image: {names}"
        return text


_DISTRIBUTIONS = r"""
import importlib.metadata as md, json, re
seen = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name:
        seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
print("@@dsenv@@" + json.dumps(seen))
"""


def image_distributions(python: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                        timeout: float = 120.0) -> dict[str, str]:
    """``{normalized name: version}`` of what ``python`` sees (user site left out, ``-s``)."""
    result = proc.run([os.fspath(python), "-s", "-c", _DISTRIBUTIONS], timeout=timeout, env=env)
    payload = _payload(result.stdout)
    if not result.ok or payload is None:
        raise ProvisionError(f"container: cannot list the packages of {python}: "
                             f"{result.describe()}: check that it is the image's Python")
    return payload


def plan_container(lock: str | os.PathLike, base_python: str | os.PathLike, *,
                   keep: Iterable[str] = (), env: Mapping[str, str] | None = None,
                   timeout: float = 120.0) -> ContainerPlan:
    """Split ``lock`` into what ``base_python`` (the image's interpreter) already has at the
    locked version and what must be installed on top (see the module's docstring)."""
    lock = Path(lock)
    entries = read_lock(lock.read_text(), str(lock))
    installed = image_distributions(base_python, env=env, timeout=timeout)
    keep = {canonicalize_name(name) for name in keep}
    present: dict[str, str] = {}
    missing: list[str] = []
    shadowed: dict[str, tuple[str, str]] = {}
    kept: dict[str, tuple[str, str]] = {}
    for entry in entries:
        have = installed.get(entry.name)
        if have is not None and _same_version(have, entry.version):
            present[entry.name] = have
        elif have is not None and entry.name in keep:
            kept[entry.name] = (have, entry.version)
        else:
            missing.append(entry.line())
            if have is not None:
                shadowed[entry.name] = (have, entry.version)
    return ContainerPlan(present, missing, shadowed, kept)


def plan_missing(lock: str | os.PathLike, base_python: str | os.PathLike, *,
                 keep: Iterable[str] = (), env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> tuple[dict[str, str], list[str]]:
    """``(present, missing)``: ``{name: version}`` the image provides at the locked version,
    and the lock lines (with hashes) to install into the venv."""
    plan = plan_container(lock, base_python, keep=keep, env=env, timeout=timeout)
    return plan.present, plan.missing


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def create_container_env(
    prefix: str | os.PathLike,
    lock: str | os.PathLike,
    *,
    base_python: str | os.PathLike,
    keep: Iterable[str] = (),
    find_links: Iterable[str | os.PathLike] = (),
    index_url: str | None = None,
    extra_index_urls: Iterable[str] = (),
    no_index: bool = False,
    compile_bytecode: bool = True,
    offline: bool | None = None,
    env: Mapping[str, str] | None = None,
    log: str | os.PathLike | None = None,
    timeout: float = 3600.0,
) -> ContainerPlan:
    """A relocatable ``--system-site-packages`` venv at ``prefix`` (empty staging folder) on
    ``base_python``, with the lock's packages the image lacks installed (hashes required,
    ``--no-deps``). Returns the plan that was carried out."""
    plan = plan_container(lock, base_python, keep=keep, env=env)
    python = make_venv(prefix, python=base_python, system_site_packages=True, env=env, log=log)
    install_lines(python, plan.missing, sources=Sources.of(find_links, index_url,
                                                           extra_index_urls, no_index),
                  compile_bytecode=compile_bytecode, offline=offline, env=env, log=log,
                  timeout=timeout)
    return plan


def install_lines(python: str | os.PathLike, lines: Sequence[str], *, sources: Sources,
                  compile_bytecode: bool = True, offline: bool | None = None,
                  env: Mapping[str, str] | None = None, log: str | os.PathLike | None = None,
                  timeout: float = 3600.0) -> None:
    """``uv pip install --require-hashes --no-deps`` of lock ``lines`` into ``python``'s env."""
    if not lines:
        return
    with tempfile.TemporaryDirectory(prefix="dsenv-missing-") as scratch:
        reqs = Path(scratch) / "missing.txt"
        reqs.write_text("".join(f"{line}\n" for line in lines))
        base = ["pip", "install", "--require-hashes", "--no-deps", "--python",
                os.fspath(python), "--color", "never", *sources.args()]
        if compile_bytecode:
            base.append("--compile-bytecode")
        run_sync(base, ["-r", str(reqs)], what=f"install {len(lines)} packages the image lacks",
                 sources=sources, offline=offline, env=env, log=log, timeout=timeout)


# ----------------------------------------------------------------------------- imports
_IMPORT_NAMES = r"""
import importlib.metadata as md, json, sys
SKIP = {"test", "tests", "testing", "doc", "docs", "example", "examples", "benchmarks",
        "scripts", "tools", "build"}
def top_levels(dist):
    text = dist.read_text("top_level.txt")
    if text:
        names = [line.strip().replace("/", ".") for line in text.splitlines()]
    else:
        names = []
        for path in dist.files or []:
            parts = path.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(
                    (".dist-info", ".data", ".egg-info", ".pth")):
                continue
            if len(parts) > 1:
                names.append(parts[0])
            elif parts[0].endswith(".py"):
                names.append(parts[0][:-3])
            elif ".so" in parts[0] or parts[0].endswith(".pyd"):
                names.append(parts[0].split(".")[0])
    return sorted({n for n in names
                   if n and n.isidentifier() and not n.startswith("_") and n not in SKIP})
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = top_levels(md.distribution(name))
    except md.PackageNotFoundError:
        out[name] = None
print("@@dsenv@@" + json.dumps(out))
"""


def import_names(python: str | os.PathLike, distributions: Iterable[str], *,
                 env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> dict[str, list[str] | None]:
    """``{distribution: [top-level import names]}`` as ``python``'s environment installed them
    (``top_level.txt``, else the top-level entries of ``RECORD``); None for a distribution
    that is not installed there. Private (``_x``) and test/doc folders are left out."""
    names = sorted(set(distributions))
    result = proc.run([os.fspath(python), "-s", "-c", _IMPORT_NAMES, json.dumps(names)],
                      timeout=timeout, env=env)
    payload = _payload(result.stdout)
    if not result.ok or payload is None:
        raise ProvisionError(f"import check: cannot read package metadata with {python}: "
                             f"{result.describe()}")
    return payload


@dataclass(frozen=True)
class ImportFailure:
    module: str
    error: str  # "ModuleNotFoundError: No module named 'x'", "timed out after 60 s", ...
    distribution: str | None = None

    def __str__(self) -> str:
        owner = f" ({self.distribution})" if self.distribution else ""
        return f"import {self.module}{owner}: {self.error}"


_IMPORTER = r"""
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
for module in json.loads(sys.argv[1]):
    print("@@dsenv@@" + json.dumps({"start": module}), flush=True)
    try:
        importlib.import_module(module)
        error = None
    except BaseException as exc:
        error = (type(exc).__name__ + ": " + str(exc)).strip().splitlines()[0][:300]
    print("@@dsenv@@" + json.dumps({"module": module, "error": error}), flush=True)
"""


def import_check(python: str | os.PathLike, modules: Iterable[str], *,
                 env: Mapping[str, str] | None = None, timeout: float = 300.0,
                 owners: Mapping[str, str] | None = None) -> list[ImportFailure]:
    """Import every module in ``modules`` with ``python`` (one subprocess, run again after the
    module that crashed or hung it); returns the failures, empty when all import.
    ``timeout`` bounds each subprocess; ``owners`` maps modules to distributions for messages.
    """
    todo = list(dict.fromkeys(modules))
    failures: list[ImportFailure] = []
    owners = owners or {}
    while todo:
        result = proc.run([os.fspath(python), "-s", "-c", _IMPORTER, json.dumps(todo)],
                          timeout=timeout, env=env)
        done: set[str] = set()
        current = None
        for line in result.stdout.splitlines():
            if not line.startswith("@@dsenv@@"):
                continue
            record = json.loads(line[len("@@dsenv@@"):])
            if "start" in record:
                current = record["start"]
                continue
            done.add(record["module"])
            current = None
            if record["error"]:
                failures.append(ImportFailure(record["module"], record["error"],
                                              owners.get(record["module"])))
        if result.ok:
            break
        if current is None:  # died before its first import or between two
            if not done:
                raise ProvisionError(f"import check: {python} does not run: "
                                     f"{result.describe()}")
            todo = [m for m in todo if m not in done]
            continue
        how = (f"timed out after {timeout:.0f} s" if result.timed_out
               else f"crashed the interpreter (exit {result.returncode})")
        failures.append(ImportFailure(current, how, owners.get(current)))
        done.add(current)
        todo = [m for m in todo if m not in done]
    return failures


def lock_modules(python: str | os.PathLike, lock: str | os.PathLike, *,
                 env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{import name: distribution}`` for every package of ``lock`` in ``python``'s env; a
    locked distribution that is not installed maps to itself (its import then fails)."""
    lock = Path(lock)
    entries: list[LockedRequirement] = read_lock(lock.read_text(), str(lock))
    names = import_names(python, [e.name for e in entries], env=env)
    modules: dict[str, str] = {}
    for dist, tops in names.items():
        for module in tops if tops is not None else [dist.replace("-", "_")]:
            modules.setdefault(module, dist)
    return modules


def import_check_lock(python: str | os.PathLike, lock: str | os.PathLike, *,
                      env: Mapping[str, str] | None = None,
                      timeout: float = 300.0) -> list[ImportFailure]:
    """:func:`import_check` of every module of every package ``lock`` expects."""
    modules = lock_modules(python, lock, env=env)
    return import_check(python, modules, env=env, timeout=timeout, owners=modules)


# ----------------------------------------------------------------------------- libraries
@dataclass(frozen=True)
class MissingLibrary:
    """A shared object whose dependency the dynamic loader cannot find, with the fix."""

    so_file: Path
    library: str  # the NEEDED name ldd reports "not found", e.g. libxgboost.so
    found: tuple[Path, ...]  # same-named (or other-version) copies elsewhere on this machine
    fix: str  # one shell line (ln -s ..., export LD_LIBRARY_PATH=...) or what to install

    def __str__(self) -> str:
        return f"{self.so_file}: {self.library} not found; fix: {self.fix}"


STANDARD_LIBRARY_DIRS = ("/usr/local/lib", "/usr/local/lib64", "/usr/lib64", "/usr/lib",
                         "/lib64", "/lib", "/usr/lib/x86_64-linux-gnu",
                         "/usr/lib/aarch64-linux-gnu", "/opt/conda/lib")
_LDD_BATCH = 64


def missing_shared_libraries(
    paths: Iterable[str | os.PathLike],
    *,
    search_dirs: Iterable[str | os.PathLike] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> list[MissingLibrary]:
    """Run ``ldd`` on every shared object (``*.so``, ``*.so.N``) under ``paths`` — env prefixes
    (their ``lib/python*/site-packages``) or site-packages folders — and report each library
    the loader cannot find, with a fix line.

    A library that some package of the same trees ships (``libc10.so`` in ``torch/lib``) is
    not reported: the extensions that need it are loaded after that package (``import torch``)
    and find it then; whether they really import is :func:`import_check`'s question. Nor are
    alternative builds of one module when one of them resolves (mpi4py ships
    ``MPI.mpich.*.so`` and ``MPI.openmpi.*.so`` and loads the one whose MPI is present).

    The fix, in order: the same file name exists elsewhere (``search_dirs``, the env's and its
    base interpreter's ``lib``/``lib64``, ``LD_LIBRARY_PATH``, the standard folders) and the
    object's RUNPATH names a folder inside the env -> ``ln -s FOUND RUNPATH_DIR/NAME`` (seed
    001's libxgboost.so); found but no such folder -> ``export LD_LIBRARY_PATH=DIR:...``;
    only another version (``libfoo.so.3`` for ``libfoo.so.2``) -> install the right one;
    nowhere -> install what provides it. ``env``: the environment ldd runs with
    (LD_LIBRARY_PATH included).
    """
    env = dict(env if env is not None else os.environ)
    roots = [Path(p).resolve() for p in paths]
    sites: list[Path] = []
    prefixes: list[Path] = []
    for root in roots:
        found = _site_dirs(root)
        sites += found or [root]
        prefixes.append(root if found else _prefix_of(root))
    shared = [f for site in sites for f in _shared_objects(site)]
    in_tree = {f.name for f in shared}
    not_found = [(so, lib) for so, lib in _ldd_not_found(shared, env, timeout)
                 if lib not in in_tree]
    # Alternative builds of one module (mpi4py's MPI.mpich.*.so and MPI.openmpi.*.so: the
    # package loads whichever MPI ABI is present): fine when one of them resolves.
    broken = {so for so, _ in not_found}
    groups: dict[tuple[Path, str], list[Path]] = {}
    for so in shared:
        groups.setdefault((so.parent, so.name.split(".")[0]), []).append(so)
    alternatives_ok = {so for members in groups.values() if len(members) > 1
                       and any(m not in broken for m in members) for so in members}
    results: list[MissingLibrary] = []
    index = None
    for so_file, library in not_found:
        if so_file in alternatives_ok:
            continue
        if index is None:
            index = _LibraryIndex(_search_dirs(search_dirs, prefixes, env))
        owner = next((p for p in prefixes if p is not None and _inside(so_file, p)), None)
        results.append(_diagnose(so_file, library, index, owner, env, timeout))
    return results


def _site_dirs(root: Path) -> list[Path]:
    if not ((root / "pyvenv.cfg").exists() or (root / "bin" / "python").exists()
            or (root / "conda-meta").is_dir()):
        return []
    found = []
    for lib in ("lib", "lib64"):
        for site in sorted((root / lib).glob("python*/site-packages")):
            if site.resolve() not in [s.resolve() for s in found]:
                found.append(site)
    return found


def _prefix_of(site: Path) -> Path | None:
    """``<prefix>`` of ``<prefix>/lib/pythonX.Y/site-packages``."""
    if site.name == "site-packages" and site.parent.name.startswith("python"):
        return site.parents[2]
    return None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _shared_objects(site: Path) -> list[Path]:
    found = []
    for dirpath, _dirs, files in os.walk(site):
        for name in files:
            if not (name.endswith(".so") or ".so." in name):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                with open(path, "rb") as handle:
                    if handle.read(4) != b"\x7fELF":
                        continue
            except OSError:
                continue
            found.append(path)
    return sorted(found)


def _ldd_not_found(files: list[Path], env: Mapping[str, str],
                   timeout: float) -> list[tuple[Path, str]]:
    missing: list[tuple[Path, str]] = []
    for start in range(0, len(files), _LDD_BATCH):
        batch = files[start:start + _LDD_BATCH]
        result = proc.run(["ldd", *map(str, batch)], timeout=timeout, env=env)
        if result.not_found:
            raise ProvisionError("shared-library check: ldd is not installed: install libc-bin "
                                 "(Debian/Ubuntu) or glibc-common (RHEL)")
        if result.timed_out:
            raise ProvisionError(f"shared-library check: ldd did not finish within {timeout:.0f}"
                                 f" s on {batch[0].parent}: run it by hand to see which file "
                                 "hangs")
        current = batch[0] if len(batch) == 1 else None
        by_name = {str(f): f for f in batch}
        for line in result.stdout.splitlines():
            if not line.startswith(("\t", " ")) and line.endswith(":"):
                current = by_name.get(line[:-1], current)
                continue
            match = re.match(r"\s+(\S+) => not found", line)
            if match and current is not None:
                missing.append((current, match.group(1)))
    return missing


def _search_dirs(extra: Iterable[str | os.PathLike], prefixes: list[Path | None],
                 env: Mapping[str, str]) -> list[Path]:
    dirs: list[Path] = [Path(d) for d in extra]
    for prefix in prefixes:
        if prefix is None:
            continue
        dirs += [prefix / "lib", prefix / "lib64"]
        home = _pyvenv_home(prefix)
        if home is not None:
            dirs += [home.parent / "lib", home.parent / "lib64"]
    dirs += [Path(d) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    if env.get("CONDA_PREFIX"):
        dirs.append(Path(env["CONDA_PREFIX"]) / "lib")
    dirs += [Path(d) for d in STANDARD_LIBRARY_DIRS]
    dirs.append(Path(sys.base_prefix) / "lib")
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d not in unique:
            unique.append(d)
    return unique


def _pyvenv_home(prefix: Path) -> Path | None:
    try:
        text = (prefix / "pyvenv.cfg").read_text()
    except OSError:
        return None
    match = re.search(r"^home\s*=\s*(.+)$", text, re.MULTILINE)
    return Path(match.group(1).strip()) if match else None


class _LibraryIndex:
    """File names of shared libraries in the search folders (and one level below)."""

    def __init__(self, dirs: list[Path]):
        self.by_name: dict[str, list[Path]] = {}
        for top in dirs:
            for folder in [top, *sorted(p for p in _subdirs(top))]:
                try:
                    names = sorted(os.listdir(folder))
                except OSError:
                    continue
                for name in names:
                    if ".so" in name:
                        path = folder / name
                        if path.is_file() and path not in self.by_name.setdefault(name, []):
                            self.by_name[name].append(path)

    def exact(self, name: str) -> list[Path]:
        return list(self.by_name.get(name, []))

    def other_versions(self, name: str) -> list[Path]:
        stem = name.split(".so", 1)[0] + ".so"
        return [p for n, paths in sorted(self.by_name.items())
                if n != name and (n == stem or n.startswith(stem + ".")) for p in paths]


def _subdirs(top: Path) -> list[Path]:
    try:
        return [p for p in top.iterdir() if p.is_dir() and not p.is_symlink()
                and p.name not in ("python3", "site-packages") and not p.name.startswith(
                    ("python", "."))]
    except OSError:
        return []


def _runpath(so_file: Path, env: Mapping[str, str], timeout: float) -> list[Path]:
    result = proc.run(["readelf", "-d", str(so_file)], timeout=timeout, env=env)
    if not result.ok:
        return []
    match = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", result.stdout)
    if not match:
        return []
    origin = str(so_file.parent)
    dirs = []
    for entry in match.group(1).split(":"):
        entry = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        if entry:
            dirs.append(Path(os.path.normpath(entry)))
    return dirs


def _diagnose(so_file: Path, library: str, index: _LibraryIndex, owner: Path | None,
              env: Mapping[str, str], timeout: float) -> MissingLibrary:
    exact = index.exact(library)
    others = index.other_versions(library)
    unversioned = library.endswith(".so")
    source = exact[0] if exact else (others[0] if others and unversioned else None)
    if source is not None:
        runpath = [d for d in _runpath(so_file, env, timeout)
                   if owner is not None and _inside_lexically(d, owner)]
        if runpath:
            target_dir = runpath[0]
            mkdir = "" if target_dir.is_dir() else f"mkdir -p {target_dir} && "
            fix = f"{mkdir}ln -s {source} {target_dir / library}"
        else:
            fix = (f"export LD_LIBRARY_PATH={source.parent}"
                   "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
        return MissingLibrary(so_file, library, tuple(exact or others), fix)
    if others:
        listing = ", ".join(str(p) for p in others[:3])
        return MissingLibrary(so_file, library, tuple(others),
                              f"only other versions exist ({listing}), not {library}: install "
                              f"the package version that provides {library}")
    return MissingLibrary(so_file, library, (),
                          f"{library} is nowhere on this machine: install the package that "
                          f"provides it (`apt-file search {library}`, `dnf provides "
                          f"'*/{library}'`, or `module spider`), or pass its folder")


def _inside_lexically(path: Path, root: Path) -> bool:
    try:
        Path(os.path.normpath(path)).relative_to(Path(os.path.normpath(root)))
        return True
    except ValueError:
        return False


# ----------------------------------------------------------------------------- helpers
def _payload(stdout: str):
    return proc.marked_json(stdout, "@@dsenv@@")


__all__ = [
    "ContainerPlan", "ImportFailure", "MissingLibrary", "create_container_env",
    "image_distributions", "import_check", "import_check_lock", "import_names",
    "install_lines", "lock_modules", "missing_shared_libraries", "plan_container",
    "plan_missing", "venv_python",
]

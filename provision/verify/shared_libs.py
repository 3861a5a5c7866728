"""Shared libraries the dynamic loader cannot find in an environment, each with its fix.

``ldd`` runs on every shared object of the env and each library reported "not found" gets one
fix line: ``ln -s`` of a copy found elsewhere into a RUNPATH folder of the env (as CSCS's
BERT-SQuAD course does for ``libxgboost.so``), an ``LD_LIBRARY_PATH``, or what to install.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dsenv import proc
from dsenv.facts.python.pyenv import parse_pyvenv_cfg
from dsenv.provision import ProvisionError


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
    and find it then; whether they really import is import_check.py's question. Nor are
    alternative builds of one module when one of them resolves (mpi4py ships
    ``MPI.mpich.*.so`` and ``MPI.openmpi.*.so`` and loads the one whose MPI is present).

    The fix, in order: the same file name exists elsewhere (``search_dirs``, the env's and its
    base interpreter's ``lib``/``lib64``, ``LD_LIBRARY_PATH``, the standard folders) and the
    object's RUNPATH names a folder inside the env -> ``ln -s FOUND RUNPATH_DIR/NAME``
    (libxgboost.so in a venv on an NGC image); found but no such folder -> ``export
    LD_LIBRARY_PATH=DIR:...``; only another version (``libfoo.so.3`` for ``libfoo.so.2``)
    -> install the right one; nowhere -> install what provides it. ``env``: the environment
    ldd runs with (LD_LIBRARY_PATH included).
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
    home = parse_pyvenv_cfg(text).get("home")
    return Path(home) if home else None


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

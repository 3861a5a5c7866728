"""The Python environment under test: interpreter kind, prefix symlinks, distributions.

The environment is the job's (:mod:`.target_env`), not the one dsenv runs in. Nothing here
imports the training packages: versions and requirements come from the ``*.dist-info``
metadata on that environment's search path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dsenv.data import load_table
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env

TRAINING_PACKAGES: tuple[str, ...] = tuple(
    load_table("dsenv.envs", "training_stack.toml")["python"]["training_packages"])


@dataclass(frozen=True)
class Interpreter:
    executable: str
    version: str
    prefix: Path
    kind: str  # "conda" | "venv" | "system"
    venv_config: dict[str, str] = field(default_factory=dict)
    conda_prefix_env: str | None = None  # $CONDA_PREFIX, whatever the kind

    @property
    def system_site_packages(self) -> bool:
        value = self.venv_config.get("include-system-site-packages", "false")
        return value.strip().lower() == "true"

    @property
    def base_prefix(self) -> Path | None:
        """The environment a venv was made from (pyvenv.cfg ``home`` is its bin folder)."""
        home = self.venv_config.get("home")
        return Path(home).parent if home else None


def parse_pyvenv_cfg(text: str) -> dict[str, str]:
    """``key = value`` lines of a venv's pyvenv.cfg."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    return values


def interpreter(node: Node) -> Interpreter:
    """The interpreter of the environment under test (:mod:`.target_env`)."""
    env = target_env.environment(node)
    prefix = Path(env.prefix)
    version = env.version or "?"
    executable = env.python or str(prefix / "bin" / "python")
    conda_env = node.env.get("CONDA_PREFIX")
    cfg_path = prefix / "pyvenv.cfg"
    if cfg_path.is_file():
        cfg = parse_pyvenv_cfg(cfg_path.read_text(errors="replace"))
        return Interpreter(executable, version if env.probed else cfg.get("version", version),
                           prefix, "venv", cfg, conda_env)
    if (prefix / "conda-meta").is_dir() or (conda_env and _same_path(conda_env, prefix)):
        return Interpreter(executable, version, prefix, "conda", {}, conda_env)
    return Interpreter(executable, version, prefix, "system", {}, conda_env)


def _same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def symlinked_component(path: Path) -> tuple[Path, Path] | None:
    """(the first symlinked component of ``path``, where it points), or None if none is."""
    path = Path(path).absolute()
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        if current.is_symlink():
            return current, current.resolve()
    return None


def site_dirs(prefix: Path) -> list[Path]:
    """site-packages / dist-packages folders of an environment's prefix."""
    lib = Path(prefix) / "lib"
    found = sorted(lib.glob("python3*/site-packages")) + sorted(lib.glob("python3*/dist-packages"))
    return [p for p in found if p.is_dir()]


def search_path(node: Node) -> list[str]:
    """Where the job's interpreter finds packages: its sys.path (the environment under test,
    probed in its own interpreter; its site-packages when that cannot run here)."""
    return target_env.search_path(node)


# -- distributions and their requirements ------------------------------------------------


def find_distribution(name: str, path: list[str]) -> metadata.Distribution | None:
    """The distribution Python would import for ``name`` (first on ``path``), or None."""
    for dist in metadata.distributions(name=name, path=path):
        return dist
    return None


@dataclass(frozen=True)
class Problem:
    package: str  # the distribution that declares the requirement
    version: str
    requirement: str  # as declared, e.g. "huggingface-hub<2.0,>=1.3.0"
    name: str  # the required distribution
    installed: str | None  # its installed version, None when missing

    def describe(self) -> str:
        if self.installed is None:
            return f"{self.package} {self.version} requires {self.requirement}, which is not installed"
        return (f"{self.package} {self.version} has requirement {self.requirement}, "
                f"but you have {self.name} {self.installed}")


@dataclass(frozen=True)
class RequirementReport:
    checked: tuple[str, ...]  # "name version" of every distribution whose requirements were read
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class Headers:
    """What `pip check` needs of one installed distribution's metadata."""
    name: str
    version: str
    requires: tuple[str, ...]


def read_headers(folder: str) -> Headers | None:
    """Name, Version and Requires-Dist of a .dist-info/.egg-info, from the header block of
    its METADATA/PKG-INFO (a plain line scan: the email parser costs 1 ms a package)."""
    files = [folder] if os.path.isfile(folder) else [os.path.join(folder, "METADATA"),
                                                     os.path.join(folder, "PKG-INFO")]
    for file in files:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        name = version = None
        requires = []
        for line in text.split("\n\n", 1)[0].splitlines():
            key, _, value = line.partition(":")
            if key == "Name":
                name = value.strip()
            elif key == "Version":
                version = value.strip()
            elif key == "Requires-Dist":
                requires.append(value.strip())
        if name is None:
            return None
        if not requires and folder.endswith(".egg-info") and os.path.isdir(folder):
            requires = list(metadata.PathDistribution(Path(folder)).requires or ())
        return Headers(name, version or "?", tuple(requires))
    return None


class MetadataIndex:
    """The first metadata folder of each distribution name along a search path (as
    importlib.metadata finds them), each read once."""

    def __init__(self, path: list[str]):
        self.folders: dict[str, str] = {}
        for entry in path:
            try:
                names = sorted(os.listdir(entry))
            except OSError:
                continue
            for name in names:
                if name.endswith((".dist-info", ".egg-info")):
                    key = canonicalize_name(name.rsplit(".", 1)[0].split("-")[0])
                    self.folders.setdefault(key, os.path.join(entry, name))
        self._read: dict[str, Headers | None] = {}

    def get(self, name: str) -> Headers | None:
        key = canonicalize_name(name)
        if key not in self._read:
            folder = self.folders.get(key)
            self._read[key] = read_headers(folder) if folder else None
        return self._read[key]


def _skipped_by_extra(line: str) -> bool:
    """`x; extra == "dev"` (and-ed with anything): false without extras, known unparsed."""
    marker = line.partition(";")[2]
    return "extra" in marker and " or " not in marker and \
        re.search(r"\bextra\s*==", marker) is not None


def check_requirements(path: list[str], roots: tuple[str, ...] = TRAINING_PACKAGES,
                       python_version: str | None = None) -> RequirementReport:
    """What `pip check` would say about ``roots`` and their direct requirements, on ``path``.

    Markers are evaluated for the environment's Python (``python_version``, "3.11.7"; default
    this interpreter) with no extra requested, so requirements that belong to extras nobody
    asked for are ignored (pip check does the same).
    """
    index = MetadataIndex(path)
    env = {"extra": ""}
    if python_version:
        env.update(python_full_version=python_version,
                   python_version=".".join(python_version.split(".")[:2]))
    parsed: dict[str, list[Requirement]] = {}

    def requirements(dist: Headers) -> list[Requirement]:
        key = canonicalize_name(dist.name)
        if key not in parsed:
            found = []
            for line in dist.requires:
                if _skipped_by_extra(line):
                    continue
                try:
                    req = Requirement(line)
                except InvalidRequirement:
                    continue
                if req.marker is None or req.marker.evaluate(env):
                    found.append(req)
            parsed[key] = found
        return parsed[key]

    to_check: dict[str, Headers] = {}
    for root in roots:
        dist = index.get(root)
        if dist is None:
            continue
        to_check.setdefault(canonicalize_name(root), dist)
        for req in requirements(dist):
            dep = index.get(req.name)
            if dep is not None:
                to_check.setdefault(canonicalize_name(req.name), dep)

    problems = []
    for dist in to_check.values():
        for req in requirements(dist):
            dep = index.get(req.name)
            if dep is None:
                problems.append(Problem(dist.name, dist.version, str(req), req.name, None))
                continue
            try:
                good = req.specifier.contains(Version(dep.version), prereleases=True)
            except InvalidVersion:
                good = True  # pip check cannot judge a non-PEP 440 version either
            if not good:
                problems.append(Problem(dist.name, dist.version, str(req), req.name,
                                        dep.version))
    checked = tuple(f"{d.name} {d.version}" for d in to_check.values())
    return RequirementReport(checked, tuple(problems))


def pip_install_command(executable: str, problems: tuple[Problem, ...]) -> str:
    """One pip command that satisfies every problem (specifiers of one package merged)."""
    wanted: dict[str, SpecifierSet] = {}
    for problem in problems:
        req = Requirement(problem.requirement)
        key = canonicalize_name(req.name)
        wanted[key] = wanted.get(key, SpecifierSet()) & req.specifier
    args = " ".join(f"'{name}{spec}'" if str(spec) else name for name, spec in wanted.items())
    return f"{executable} -m pip install {args}"


@probe
def requirement_report(node: Node) -> RequirementReport:
    return check_requirements(search_path(node),
                              python_version=target_env.environment(node).version)


def shadowed_packages(interp: Interpreter, names: tuple[str, ...] = TRAINING_PACKAGES
                      ) -> list[tuple[str, str, str]]:
    """(name, venv version, base version) of training packages a venv with system site
    packages installs again over the base environment's own copy."""
    base = interp.base_prefix
    if interp.kind != "venv" or not interp.system_site_packages or base is None:
        return []
    venv_path = [str(p) for p in site_dirs(interp.prefix)]
    base_path = [str(p) for p in site_dirs(base)]
    found = []
    for name in names:
        mine = find_distribution(name, venv_path) if venv_path else None
        theirs = find_distribution(name, base_path) if base_path else None
        if mine is not None and theirs is not None and mine.version != theirs.version:
            found.append((name, mine.version, theirs.version))
    return found

"""The Python environment: interpreter kind, prefix symlinks, installed distributions.

Nothing here imports the training packages: versions and requirements come from the
``*.dist-info`` metadata on the search path, which tests point at a generated site dir.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dsenv.data import load_table

from .context import Context, probe

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


def is_real_prefix(ctx: Context) -> bool:
    return Path(ctx.python_prefix) == Path(sys.prefix)


def interpreter(ctx: Context) -> Interpreter:
    prefix = Path(ctx.python_prefix)
    version = ".".join(map(str, sys.version_info[:3]))
    executable = sys.executable if is_real_prefix(ctx) else str(prefix / "bin" / "python")
    conda_env = ctx.env.get("CONDA_PREFIX")
    cfg_path = prefix / "pyvenv.cfg"
    if cfg_path.is_file():
        cfg = parse_pyvenv_cfg(cfg_path.read_text(errors="replace"))
        return Interpreter(executable, cfg.get("version", version), prefix, "venv", cfg, conda_env)
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


def search_path(ctx: Context) -> list[str]:
    """Where the interpreter finds packages: sys.path for the running prefix, else its site dirs."""
    if is_real_prefix(ctx):
        return [p for p in sys.path if p]
    return [str(p) for p in site_dirs(ctx.python_prefix)]


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


def check_requirements(path: list[str], roots: tuple[str, ...] = TRAINING_PACKAGES
                       ) -> RequirementReport:
    """What `pip check` would say about ``roots`` and their direct requirements, on ``path``.

    Markers are evaluated for this interpreter with no extra requested, so requirements that
    belong to extras nobody asked for are ignored (pip check does the same).
    """
    cache: dict[str, metadata.Distribution | None] = {}

    def lookup(name: str) -> metadata.Distribution | None:
        key = canonicalize_name(name)
        if key not in cache:
            cache[key] = find_distribution(key, path)
        return cache[key]

    def requirements(dist: metadata.Distribution) -> list[Requirement]:
        found = []
        for line in dist.requires or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                found.append(req)
        return found

    to_check: dict[str, metadata.Distribution] = {}
    for root in roots:
        dist = lookup(root)
        if dist is None:
            continue
        to_check.setdefault(canonicalize_name(root), dist)
        for req in requirements(dist):
            dep = lookup(req.name)
            if dep is not None:
                to_check.setdefault(canonicalize_name(req.name), dep)

    problems = []
    for dist in to_check.values():
        owner, owner_version = dist.metadata["Name"], dist.version
        for req in requirements(dist):
            dep = lookup(req.name)
            if dep is None:
                problems.append(Problem(owner, owner_version, str(req), req.name, None))
                continue
            try:
                good = req.specifier.contains(Version(dep.version), prereleases=True)
            except InvalidVersion:
                good = True  # pip check cannot judge a non-PEP 440 version either
            if not good:
                problems.append(Problem(owner, owner_version, str(req), req.name, dep.version))
    checked = tuple(f"{d.metadata['Name']} {d.version}" for d in to_check.values())
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
def requirement_report(ctx: Context) -> RequirementReport:
    return check_requirements(search_path(ctx))


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

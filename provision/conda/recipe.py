"""``--kind conda``: conda-lock recipes (envs/conda/*.yml) locked with the real conda-lock, and
environments installed from the conda-lock.yml with every hash checked.

This module: the recipes and the conda-lock.yml they are locked into (read here); locking is
conda_locking.py's, installing conda_install.py's (with conda_pip.py for the lock's pip
packages and conda_rattler.py, the linking subprocess).

Locking needs a conda-style solver (micromamba, mamba or conda); installing does not: the
conda packages are downloaded here, checked against the lock's sha256 and md5, and linked
by py-rattler (in a subprocess: its interpreter sometimes crashes at exit), then the lock's
pip packages go in through ``uv pip install --require-hashes --no-deps``.

Absolute paths: conda packages carry a placeholder prefix that the installer replaces with
the environment's path while it links (text files, binaries, entry-point shebangs), and pip
writes the interpreter's path into every console script. An environment built in a staging
folder and renamed afterwards would point into the staging folder. ``install_conda(...,
final_prefix=TARGET)`` builds in the staging folder but writes TARGET into every file
(rattler's ``alternative_target_prefix``; pip scripts' shebangs rewritten), so the
staging rename of ``dsenv provision`` works::

    with staged_dir(target) as tmp:
        install_conda(lockfile, tmp, final_prefix=target)
"""

from __future__ import annotations

import importlib.util
import re
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dsenv.provision import ProvisionError

PLATFORM = "linux-64"
RECIPES_DIR = Path(__file__).resolve().parents[2] / "envs" / "conda"
LOCK_SUFFIX = ".conda-lock.yml"
RATTLER_MARK = "@@dsenv-rattler@@"  # conda_rattler.py's answer line starts with it


def available_recipes(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """Stack names that have a recipe (``envs/conda/NAME.yml``)."""
    return sorted(p.stem for p in Path(recipes_dir).glob("*.yml")
                  if not p.name.endswith(LOCK_SUFFIX))


def recipe_path(stack: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """``envs/conda/STACK.yml``, or a ProvisionError naming the stacks that have one."""
    path = Path(recipes_dir) / f"{stack}.yml"
    if not path.is_file():
        known = ", ".join(available_recipes(recipes_dir)) or "none"
        raise ProvisionError(f"no conda recipe for stack {stack!r} ({path} missing): "
                             f"use one of {known}, or write {path} (an environment.yml)")
    return path


def lock_path(stack: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """Where the committed lock of a stack lives: ``envs/conda/STACK.conda-lock.yml``."""
    return Path(recipes_dir) / f"{stack}{LOCK_SUFFIX}"


def recipe_cuda(recipe: Path) -> str | None:
    """The CUDA version a recipe pins with ``cuda-version X.Y`` (what ``__cuda`` must offer
    while locking), or None for a recipe without CUDA."""
    for line in Path(recipe).read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s*-\s*[\"']?cuda-version\s*[=<>~!]*\s*(\d+\.\d+)", line)
        if match:
            return match.group(1)
    return None


def require_module(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ProvisionError(f"{what} is not installed in this Python ({sys.executable}): "
                             "pip install 'dsenv[provision]'")


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split()).rstrip(".:; ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def display_url(url: str) -> str:
    """``url`` without user:password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    return urllib.parse.urlunsplit(parts)


# --------------------------------------------------------------------------- the lock file
@dataclass(frozen=True)
class LockedPackage:
    """One ``package:`` entry of a conda-lock.yml."""

    name: str
    version: str
    manager: str  # "conda" or "pip"
    platform: str
    url: str
    sha256: str | None
    md5: str | None
    category: str = "main"
    optional: bool = False

    @property
    def file_name(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[-1])

    @property
    def spec(self) -> str:
        return f"{self.name}={self.version}"


@dataclass(frozen=True)
class CondaLock:
    path: Path
    platforms: tuple[str, ...]
    channels: tuple[str, ...]
    packages: tuple[LockedPackage, ...]

    def select(self, platform: str, extras: Sequence[str] = ()) -> list[LockedPackage]:
        """The packages to install on ``platform``: the main category (what conda-lock
        installs by default) plus the ``extras`` categories."""
        return [p for p in self.packages if p.platform == platform
                and (not p.optional or p.category in extras)]


def read_conda_lock(path: Path) -> CondaLock:
    """Parse a conda-lock.yml (version 1); ProvisionError with one line when it is not."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProvisionError(f"conda lock {path} not found: make it with `dsenv lock --kind "
                             "conda --stack NAME` (on a machine with micromamba or conda) "
                             "and commit it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError(f"conda lock {path}: cannot read ({exc})") from None
    return parse_lock_text(text, path)


def parse_lock_text(text: str, path: Path) -> CondaLock:
    require_module("yaml", "PyYAML (a conda-lock requirement)")
    import yaml  # yaml: kept off dsenv --help

    def bad(why: str) -> ProvisionError:
        return ProvisionError(f"conda lock {path}: {why}: regenerate it with `dsenv lock "
                              "--kind conda --stack NAME`")

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise bad(f"not valid YAML{where}") from None
    if not isinstance(data, dict) or "package" not in data:
        raise bad("not a conda-lock.yml (no package list)")
    if data.get("version") != 1:
        raise bad(f"conda-lock.yml version {data.get('version')!r}, expected 1")
    meta = data.get("metadata") or {}
    packages = []
    for i, entry in enumerate(data.get("package") or []):
        try:
            hashes = entry.get("hash") or {}
            packages.append(LockedPackage(
                name=str(entry["name"]), version=str(entry["version"]),
                manager=str(entry["manager"]), platform=str(entry["platform"]),
                url=str(entry["url"]), sha256=hashes.get("sha256") or None,
                md5=hashes.get("md5") or None, category=str(entry.get("category") or "main"),
                optional=bool(entry.get("optional", False))))
        except (KeyError, TypeError, AttributeError):
            raise bad(f"package entry {i + 1} lacks name/version/manager/platform/url") from None
    channels = tuple(c.get("url", "") if isinstance(c, dict) else str(c)
                     for c in meta.get("channels") or [])
    return CondaLock(path=path, platforms=tuple(meta.get("platforms") or ()),
                     channels=channels, packages=tuple(packages))

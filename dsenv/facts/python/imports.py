"""What the job will import, beside what the metadata says.

For each training package: every copy on the environment's ``sys.path`` (a package folder,
its ``*.dist-info``/``*.egg-info`` metadata, or both), where each ``sys.path`` folder comes
from (PYTHONPATH, a .pth file, the user site, the environment's or its base's
site-packages), the copy ``import`` loads (the target interpreter's ``find_spec``), the
version that copy really is, and conda's own record of the package. Files only: nothing is
imported here or in the environment.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path

from packaging.utils import canonicalize_name

from dsenv.facts.node import Node, probe
from dsenv.facts.python.pyfiles import read_assignments
from dsenv.facts.python.target_env import PythonEnv, environment

# conda package names whose pip distribution is called otherwise
CONDA_NAMES = {"pytorch": "torch", "pytorch-gpu": "torch", "pytorch-cpu": "torch"}
# Files that state a package's own version (read with ast, never run).
VERSION_FILES = {"torch": ("version.py", "__version__"),
                 "deepspeed": ("git_version_info_installed.py", "version")}
ORIGIN_WORDS = {"PYTHONPATH": "PYTHONPATH", "pth": ".pth file", "user": "user site",
                "env": "the environment's site-packages", "base": "the base interpreter's "
                "site-packages", "stdlib": "the standard library", "hook": "an import hook",
                "other": "sys.path"}


@dataclass(frozen=True)
class Dist:
    path: str  # the .dist-info / .egg-info
    version: str
    installer: str | None = None  # pip, uv, conda (the INSTALLER file)
    editable: bool = False  # `pip install -e`: the package lives elsewhere (direct_url.json)

    def describe(self) -> str:
        by = f", installed by {self.installer}" if self.installer else ""
        return f"{self.version} ({self.path}{by})"


@dataclass(frozen=True)
class Copy:
    entry: str  # the sys.path folder
    origin: str  # a key of ORIGIN_WORDS
    detail: str  # the .pth file, or ""
    module: str | None  # the package folder or module file in it; None: metadata only
    dists: tuple[Dist, ...] = ()

    @property
    def where(self) -> str:
        words = ORIGIN_WORDS[self.origin]
        return f"{words} {self.detail}" if self.detail else words


@dataclass(frozen=True)
class PackageView:
    name: str  # distribution name, canonical
    module: str  # import name
    copies: tuple[Copy, ...]  # sys.path order
    imported: Copy | None  # the copy `import` loads
    imported_version: str | None
    conda_version: str | None = None

    @property
    def metadata_first(self) -> Dist | None:
        """The metadata importlib.metadata and pip read: the first on the path."""
        return next((d for c in self.copies for d in c.dists), None)

    def others(self) -> list[Copy]:
        return [c for c in self.copies if c is not self.imported and c.module]


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def pth_entries(folders: list[str]) -> dict[str, str]:
    """{real folder: .pth file that adds it} for the path lines of .pth files in ``folders``
    (``import`` lines run code: what they add cannot be known without running them)."""
    found: dict[str, str] = {}
    for folder in folders:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            pth = os.path.join(folder, name)
            try:
                lines = Path(pth).read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                    continue
                target = os.path.join(folder, line)
                if os.path.isdir(target):
                    found.setdefault(_real(target), pth)
    return found


def _under(path: str, root: Path | None) -> bool:
    if root is None:
        return False
    base = _real(str(root)).rstrip("/") + "/"
    return _real(path).startswith(base)


def _site_folder(path: str) -> bool:
    return Path(path).name in ("site-packages", "dist-packages")


def classify(env: PythonEnv, node: Node) -> dict[str, tuple[str, str]]:
    """{sys.path entry: (origin, detail)} for the environment's path."""
    pythonpath = {_real(p) for p in node.env.get("PYTHONPATH", "").split(os.pathsep) if p}
    sites = [p for p in env.path if _site_folder(p) or (env.user_site and _real(p) ==
                                                         _real(env.user_site))]
    pth = pth_entries(sites)
    user = _real(env.user_site) if env.user_site else None
    runs = env.sys_prefix or env.prefix
    base = env.base_prefix if env.base_prefix and not _under(str(env.base_prefix), runs) \
        else None
    out = {}
    for entry in env.path:
        real = _real(entry)
        if real in pythonpath:
            out[entry] = ("PYTHONPATH", "")
        elif real in pth:
            out[entry] = ("pth", pth[real])
        elif user and real == user:
            out[entry] = ("user", "")
        elif _site_folder(entry) and (_under(entry, env.prefix) or _under(entry, runs)):
            out[entry] = ("env", "")
        elif _site_folder(entry) and _under(entry, base):
            out[entry] = ("base", "")
        elif "site-packages" not in entry and Path(entry).name.startswith(("python3", "lib-dyn")):
            out[entry] = ("stdlib", "")
        else:
            out[entry] = ("other", "")
    return out


def _metadata_index(entry: str) -> dict[str, list[str]]:
    """{canonical name: [metadata folder, ...]} of one sys.path folder."""
    index: dict[str, list[str]] = {}
    try:
        names = sorted(os.listdir(entry))
    except OSError:
        return index
    for name in names:
        if name.endswith((".dist-info", ".egg-info")):
            stem = name.rsplit(".", 1)[0]
            index.setdefault(canonicalize_name(stem.split("-")[0]), []).append(
                os.path.join(entry, name))
    return index


def read_dist(path: str) -> Dist:
    if os.path.isfile(path):  # a single-file PKG-INFO style .egg-info
        text = Path(path).read_text(errors="replace")
        version = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                        if line.startswith("Version:")), "?")
        return Dist(path, version)
    dist = metadata.PathDistribution(Path(path))
    installer = (dist.read_text("INSTALLER") or "").strip() or None
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        editable = bool(direct.get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        editable = False
    return Dist(path, dist.version or "?", installer, editable)


def conda_records(prefix: Path) -> dict[str, str]:
    """{pip name: version} from a conda prefix's conda-meta/NAME-VERSION-BUILD.json files."""
    found: dict[str, str] = {}
    try:
        names = os.listdir(prefix / "conda-meta")
    except OSError:
        return found
    for name in names:
        if name.endswith(".json") and name.count("-") >= 2:
            package, version, _build = name[:-5].rsplit("-", 2)
            package = canonicalize_name(package)
            found.setdefault(CONDA_NAMES.get(package, package), version)
    return found


def own_version(module_path: str, module: str) -> str | None:
    """The version a package folder states about itself (torch/version.py, DeepSpeed's
    recorded build, else a literal __version__ in __init__.py), read with ast."""
    folder = Path(module_path)
    if not folder.is_dir():
        return None
    filename, variable = VERSION_FILES.get(module, ("__init__.py", "__version__"))
    source = folder / filename
    if not source.is_file():
        return None
    try:
        value = read_assignments(source).get(variable)
    except (OSError, SyntaxError, ValueError):
        return None
    return value if isinstance(value, str) and value else None


def _module_at(module: str, entry: str) -> str | None:
    try:
        spec = PathFinder.find_spec(module, [entry])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return spec.origin


def view(node: Node, name: str) -> PackageView:
    """Every copy of distribution ``name`` on the environment's path, and the one imported."""
    env = environment(node)
    origins = classify(env, node)
    key = canonicalize_name(name)
    module = name.replace("-", "_")
    indexes = _indexes(node)
    copies = []
    for entry in env.path:
        found = _module_at(module, entry)
        dists = tuple(read_dist(p) for p in indexes.get(entry, {}).get(key, ()))
        if found or dists:
            origin, detail = origins.get(entry, ("other", ""))
            copies.append(Copy(entry, origin, detail, found, dists))
    spot = env.modules.get(module)
    imported = next((c for c in copies if c.module), None)
    if spot is not None and spot.folder is not None:
        where = _real(str(spot.locations[0] if spot.locations else spot.origin))
        match = next((c for c in copies if c.module and _real(c.module) == where), None)
        if match is None:  # an import hook (an editable install) serves it from elsewhere
            match = Copy(str(spot.entry), "hook", "", str(spot.folder))
            copies.insert(0, match)
        imported = match
    version = None
    if imported is not None:
        version = own_version(imported.module, module) if imported.module else None
        if version is None and len(imported.dists) == 1:
            version = imported.dists[0].version
        editable = [d for c in copies for d in c.dists if d.editable]
        if version is None and len(editable) == 1:  # `pip install -e`: metadata elsewhere
            version = editable[0].version
    conda = conda_records(env.prefix).get(key) if (env.prefix / "conda-meta").is_dir() else None
    return PackageView(key, module, tuple(copies), imported, version, conda)


@probe
def _indexes(node: Node) -> dict[str, dict[str, list[str]]]:
    """Each sys.path folder's metadata, listed once per doctor run."""
    return {entry: _metadata_index(entry) for entry in environment(node).path}

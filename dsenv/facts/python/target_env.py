"""The Python environment under test: the one the job will run, not the one dsenv runs in.

Chosen in this order: ``--env PREFIX|PYTHON``; the activated environment (DSENV_ENV, which
dsenv's activate script sets, VIRTUAL_ENV, CONDA_PREFIX: the one whose bin/ comes first on
PATH); the ``python3`` first on PATH; dsenv's own interpreter. Facts about it come from its
files and from ONE small probe run by its own interpreter, as the job would run it (its
PYTHONPATH, user site and .pth files honoured), with a timeout: ``sys.path``, the user
site, and where each package of interest WOULD be imported from (``importlib.util.find_spec``
of top-level names: nothing is imported, torch least of all). When the interpreter cannot
run here, the environment is read from its files only (its site-packages).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

from dsenv import proc
from dsenv.data import load_table
from dsenv.errors import UsageError
from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe

# Top-level modules whose import location the probe reports: the training packages (their
# import names), mpi4py and ninja.
_TRAINING = load_table("dsenv.envs", "training_stack.toml")["python"]["training_packages"]
PROBED_MODULES: tuple[str, ...] = tuple(dict.fromkeys(
    [name.replace("-", "_") for name in _TRAINING] + ["mpi4py", "ninja"]))
MARK = "DSENV-ENV "
# How deep the environment's folders are statted in a child before this process reads them
# (mounts.require_files): a prefix down to bin/python3, pyvenv.cfg and lib/python3.X; a site
# folder down to each package's and dist-info's files (METADATA, __init__.py, version.py).
PREFIX_DEPTH = SITE_DEPTH = 2
# Runs in the target interpreter: stdlib only, Python 3.6+, nothing of the packages imported.
PROBE_SCRIPT = """\
import json, os, sys
from importlib.util import find_spec
try:
    import site
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
except Exception:
    user = None
mods = {}
for name in sys.argv[1:]:
    try:
        spec = find_spec(name)
    except Exception as exc:
        mods[name] = {"error": "%s: %s" % (type(exc).__name__, exc)}
        continue
    if spec is not None:
        mods[name] = {"origin": spec.origin,
                      "locations": list(spec.submodule_search_locations or [])}
path = sys.path[1:] if sys.path and sys.path[0] == "" else sys.path
print(__MARK__ + json.dumps({
    "executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
    "implementation": sys.implementation.name, "abiflags": getattr(sys, "abiflags", ""),
    "prefix": sys.prefix, "base_prefix": getattr(sys, "base_prefix", sys.prefix),
    "path": path, "user_site": user, "modules": mods,
    "preloaded": sorted(m for m in ("torch", "deepspeed") if m in sys.modules)}))
""".replace("__MARK__", repr(MARK))

SOURCES = {  # how the environment was chosen -> why, for the report ({} is chosen_by)
    "option": "{}",
    "prefix": "given: {}",
    "DSENV_ENV": "activated by its dsenv activate script or module ({})",
    "VIRTUAL_ENV": "activated venv ({})",
    "CONDA_PREFIX": "activated conda env ({})",
    "PATH": "{} (no environment activated)",
    "dsenv": "dsenv's own interpreter (no environment activated, no python3 on PATH)",
}


@dataclass(frozen=True)
class ModuleSpot:
    """Where ``import NAME`` would load a top-level module from."""
    name: str
    origin: str | None  # the module file (a package's __init__.py); None for a namespace
    locations: tuple[str, ...] = ()  # a package's folders

    @property
    def folder(self) -> Path | None:
        """The package folder, or the folder holding a single-file module."""
        if self.locations:
            return Path(self.locations[0])
        return Path(self.origin).parent if self.origin else None

    @property
    def entry(self) -> str | None:
        """The sys.path folder it comes from."""
        if self.locations:
            return str(Path(self.locations[0]).parent)
        return str(Path(self.origin).parent) if self.origin else None


@dataclass(frozen=True)
class PythonEnv:
    python: str | None  # the interpreter the job runs, as found (None: none in the prefix)
    prefix: Path
    source: str  # a key of SOURCES
    chosen_by: str  # "--env /x", "VIRTUAL_ENV=/x", "python3 on PATH: /usr/bin/python3"
    version: str | None = None  # "3.11.7"
    implementation: str = "cpython"
    abiflags: str = ""
    base_prefix: Path | None = None
    path: tuple[str, ...] = ()  # sys.path as the job sees it (the script's folder left out)
    user_site: str | None = None  # the user site folder when it is enabled
    modules: dict[str, ModuleSpot] = field(default_factory=dict)
    executable: str | None = None  # sys.executable as the interpreter reports it
    sys_prefix: Path | None = None  # sys.prefix as the interpreter reports it
    probed: bool = False  # the interpreter ran the probe
    problem: str = ""  # why it did not
    preloaded: tuple[str, ...] = ()  # heavy modules a .pth file imports at every start

    @property
    def own(self) -> bool:
        """The interpreter dsenv itself runs in."""
        return bool(self.executable) and _same(self.executable, sys.executable) and \
            _same(self.sys_prefix or self.prefix, sys.prefix)

    @property
    def why(self) -> str:
        return SOURCES[self.source].format(self.chosen_by)

    def describe(self) -> str:
        """One line for the report's header."""
        what = f"Python {self.version}" if self.version else "Python ?"
        if self.own and self.source != "dsenv":
            what += ", dsenv's own"
        line = f"{self.prefix} ({what}) — {self.why}"
        if not self.probed:
            line += f"; read from its files only ({self.problem})"
        return line

    def to_json(self) -> dict:
        return {"prefix": str(self.prefix), "python": self.python,
                "executable": self.executable, "version": self.version,
                "source": self.source, "chosen_by": self.chosen_by, "probed": self.probed,
                "problem": self.problem or None, "own": self.own}


def _same(a, b) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, TypeError):
        return False


def interpreter_in(prefix: Path) -> str | None:
    """The python of an environment prefix (bin/python3, bin/python), if there is one."""
    for name in ("python3", "python"):
        candidate = Path(prefix) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def looks_like_env(prefix: Path) -> bool:
    prefix = Path(prefix)
    return (interpreter_in(prefix) is not None or (prefix / "conda-meta").is_dir()
            or (prefix / "pyvenv.cfg").is_file() or any((prefix / "lib").glob("python3*")))


def _from_option(value: str, node: Node) -> tuple[str | None, Path | None, str, str]:
    path = Path(os.path.expanduser(value))
    if os.sep not in value and not path.exists():
        found = node.which(value)  # --env python3.12: the one on PATH
        if found:
            return found, None, "option", f"--env {value} ({found})"
    # A prefix on a file system that stopped answering (a Lustre storage target down): its
    # python and pyvenv.cfg are statted in a child first, never in this process.
    mounts.require_files(node, path, PREFIX_DEPTH, "the environment (--env)")
    if path.is_dir():
        if not looks_like_env(path):
            raise UsageError(f"--env {value}: not a Python environment (no bin/python, "
                             "lib/pythonX.Y, pyvenv.cfg or conda-meta/ there); give an "
                             "environment prefix or a Python executable")
        return interpreter_in(path), path.absolute(), "option", f"--env {value}"
    if path.is_file():
        if not os.access(path, os.X_OK):
            raise UsageError(f"--env {value}: not executable; give a Python executable or an "
                             "environment prefix")
        return str(path.absolute()), None, "option", f"--env {value}"
    raise UsageError(f"--env {value}: no such file or folder; give an environment prefix "
                     "(a venv, a conda env, a `dsenv provision` env) or a Python executable")


def _activated(node: Node) -> tuple[str, Path] | None:
    """(variable, prefix) of the activated environment: the one whose bin/ is first on
    PATH when several are set (a venv activated inside a conda env wins)."""
    found = []
    for var in ("DSENV_ENV", "VIRTUAL_ENV", "CONDA_PREFIX"):
        value = node.env.get(var)
        if value:
            mounts.require_files(node, value, PREFIX_DEPTH, f"the activated environment ({var})")
        if value and Path(value).is_dir():
            found.append((var, Path(value)))
    if not found:
        return None
    path = [os.path.realpath(p) for p in node.env.get("PATH", "").split(os.pathsep) if p]

    def rank(item):
        bindir = os.path.realpath(item[1] / "bin")
        return path.index(bindir) if bindir in path else len(path)

    return min(found, key=rank)  # min is stable: DSENV_ENV, VIRTUAL_ENV, CONDA_PREFIX on ties


def choose(node: Node) -> tuple[str | None, Path | None, str, str]:
    """(python, prefix, source, chosen_by); prefix None: the interpreter will say."""
    if node.python_prefix is not None:
        prefix = Path(node.python_prefix)
        mounts.require_files(node, prefix, PREFIX_DEPTH, "the environment")
        return interpreter_in(prefix), prefix, "prefix", str(prefix)
    if node.environment:
        return _from_option(node.environment, node)
    active = _activated(node)
    if active is not None:
        var, prefix = active
        module = node.env.get("DSENV_MODULE") if var == "DSENV_ENV" else None
        return (interpreter_in(prefix), prefix, var,  # module: its dsenv modulefile's name
                f"{var}={prefix}" + (f", module {module}" if module else ""))
    for name in ("python3", "python") if node.env.get("PATH") else ():
        found = node.which(name)
        if found:
            return found, None, "PATH", f"{name} first on PATH: {found}"
    return sys.executable, Path(sys.prefix), "dsenv", sys.executable


def probe_timeout(node: Node) -> float:
    return node.probe_timeout


def parse_probe(data: dict) -> dict:
    """The probe's JSON -> PythonEnv fields (raises KeyError/TypeError on a foreign line)."""
    modules = {}
    for name, spot in (data.get("modules") or {}).items():
        if isinstance(spot, dict) and "error" not in spot:
            modules[name] = ModuleSpot(name, spot.get("origin"),
                                       tuple(spot.get("locations") or ()))
    return {"executable": data["executable"], "version": data["version"],
            "implementation": data.get("implementation", "cpython"),
            "abiflags": data.get("abiflags", ""), "sys_prefix": Path(data["prefix"]),
            "base_prefix": Path(data.get("base_prefix") or data["prefix"]),
            "path": tuple(p for p in data["path"] if isinstance(p, str) and p),
            "user_site": data.get("user_site"), "modules": modules,
            "preloaded": tuple(data.get("preloaded") or ())}


def run_probe(node: Node, python: str) -> tuple[dict | None, str]:
    """(fields, "") from the interpreter, or (None, why it gave none)."""
    result = node.run([python, "-c", PROBE_SCRIPT, *PROBED_MODULES], timeout=probe_timeout(node))
    data = proc.marked_json(result.stdout, MARK)
    if not isinstance(data, dict):
        return None, result.describe() if not result.ok else "its probe printed no result"
    try:
        return parse_probe(data), ""
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"its probe printed an unexpected result ({exc})"


def _version_from_files(prefix: Path) -> str | None:
    cfg = prefix / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() in ("version_info", "version"):
                return value.strip()
    folders = sorted(p.name for p in (prefix / "lib").glob("python3.*") if p.is_dir())
    return folders[0].removeprefix("python") if folders else None


def files_only(node: Node, prefix: Path) -> tuple[tuple[str, ...], dict[str, ModuleSpot]]:
    """sys.path and module locations as far as files tell: PYTHONPATH, then the prefix's
    site-packages (no .pth lines, user site or import hooks: those need the interpreter)."""
    extra = [p for p in node.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = tuple(extra + [str(p) for p in site_folders(prefix)])
    require_path(node, path)
    modules = {}
    for name in PROBED_MODULES:
        try:
            spec = PathFinder.find_spec(name, list(path))
        except (ImportError, ValueError):
            spec = None
        if spec is not None and (spec.origin or spec.submodule_search_locations):
            origin = spec.origin if spec.origin not in (None, "namespace") else None
            modules[name] = ModuleSpot(name, origin,
                                       tuple(spec.submodule_search_locations or ()))
    return path, modules


def site_folders(prefix: Path) -> list[Path]:
    """The prefix's lib/python3.X/site-packages (and dist-packages) folders, by their names."""
    lib = Path(prefix) / "lib"
    sites = sorted(lib.glob("python3*/site-packages")) + sorted(lib.glob("python3*/dist-packages"))
    return [p for p in sites if p.is_dir()]


def require_path(node: Node, path) -> None:
    """Every folder of the environment's search path statted in a child (mounts.require_files)
    before this process reads packages there (their metadata, their ELF files, find_spec), or
    NoAnswer: one dead storage target hangs a read of whichever file has objects on it."""
    for entry in path:
        mounts.require_files(node, entry, SITE_DEPTH, "the environment's packages in")


@probe
def environment(node: Node) -> PythonEnv:
    """The environment under test, probed once per doctor run."""
    python, prefix, source, chosen_by = choose(node)
    if prefix is not None:
        # Its site folders are walked while its interpreter starts: on a dead storage target
        # both wait a deadline, one after the other they would outlast the checks' own.
        mounts.walk_folders(node, site_folders(prefix), SITE_DEPTH, wait=False)
    fields, problem = (None, f"no python in {prefix}/bin") if python is None else \
        run_probe(node, python)
    if fields is not None:
        require_path(node, fields["path"])
        return PythonEnv(python, prefix if prefix is not None else fields["sys_prefix"], source,
                         chosen_by, probed=True, **fields)
    if prefix is None:  # an interpreter that does not run: its prefix by the usual layout
        prefix = Path(python).absolute().parent.parent
    path, modules = files_only(node, prefix)
    return PythonEnv(python, prefix, source, chosen_by, version=_version_from_files(prefix),
                     path=path, modules=modules, problem=problem)


def search_path(node: Node) -> list[str]:
    """Where the job's interpreter looks for packages (sys.path, the script's folder aside)."""
    return list(environment(node).path)


def module_folder(node: Node, name: str) -> Path | None:
    """The folder ``import NAME`` would load a package from in the environment under test."""
    env = environment(node)
    spot = env.modules.get(name)
    if spot is not None:
        return Path(spot.locations[0]) if spot.locations else None
    if name in PROBED_MODULES:
        return None  # probed and not found
    spec = PathFinder.find_spec(name, list(env.path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def python_tag(node: Node) -> str:
    """'py311' (plus abiflags) of the environment's interpreter, as torch's JIT folders use."""
    env = environment(node)
    major_minor = (env.version or "").split(".")[:2]
    if len(major_minor) == 2:
        return f"py{major_minor[0]}{major_minor[1]}{env.abiflags}"
    return f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"


def header_line(node: Node) -> str:
    """``environment PREFIX (Python X.Y.Z) — why it was chosen`` for the report's header."""
    try:
        return "environment " + environment(node).describe()
    except mounts.NoAnswer as exc:
        return f"environment not read: {exc} (its file system stopped answering)"
    except Exception as exc:  # noqa: BLE001 - the header never breaks the report
        return f"environment unknown ({type(exc).__name__}: {exc})"


def report_section(node: Node) -> dict | None:
    """The ``environment`` object of the JSON report."""
    try:
        return environment(node).to_json()
    except Exception:  # noqa: BLE001 - python.interpreter reports what went wrong
        return None

"""``--kind conda``: conda-lock recipes (envs/conda/*.yml) locked with the real conda-lock, and
environments installed from the conda-lock.yml with every hash checked.

Locking needs a conda-style solver (micromamba, mamba or conda); installing does not: the
conda packages are downloaded here, checked against the lock's sha256 and md5, and linked
by py-rattler (in a subprocess: its interpreter sometimes crashes at exit), then the lock's
pip packages go in through ``uv pip install --require-hashes --no-deps``.

Absolute paths: conda packages carry a placeholder prefix that the installer replaces with
the environment's path while it links (text files, binaries, entry-point shebangs), and pip
writes the interpreter's path into every console script. An environment built in a staging
folder and renamed afterwards would point into the staging folder. ``install_conda(...,
final_prefix=TARGET)`` builds in the staging folder but writes TARGET into every file
(rattler's ``alternative_target_prefix``; pip scripts' shebangs rewritten), so the lead's
staging rename works::

    with staged_dir(target) as tmp:
        install_conda(lockfile, tmp, final_prefix=target)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dsenv.proc import CommandResult, run, which

from . import ProvisionError
from .uvcmd import run_uv, uv_binary, uv_error

PLATFORM = "linux-64"
CONDA_EXECUTABLES = ("micromamba", "mamba", "conda")
LOCK_TIMEOUT = 1800.0  # a conda-forge solve of a CUDA PyTorch stack takes minutes
INSTALL_TIMEOUT = 3600.0  # linking several GB of CUDA libraries, then the pip part
READ_TIMEOUT = 60.0  # seconds a download may stall before it is abandoned
DOWNLOAD_THREADS = 4
RECIPES_DIR = Path(__file__).resolve().parent.parent / "envs" / "conda"
LOCK_SUFFIX = ".conda-lock.yml"
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- recipes


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


# --------------------------------------------------------------------------- locking


def find_conda_exe(conda_exe: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The conda-style executable conda-lock solves with: ``conda_exe`` (a path or a name on
    PATH), else ``$MAMBA_EXE`` / ``$CONDA_EXE``, else micromamba, mamba or conda on PATH."""
    env = os.environ if env is None else env
    if conda_exe:
        found = conda_exe if os.sep in conda_exe else which(conda_exe, env)
        if found and os.path.isfile(found) and os.access(found, os.X_OK):
            return str(Path(found).absolute())
        raise ProvisionError(f"conda executable {conda_exe!r} not found or not executable: "
                             "pass the path of a micromamba, mamba or conda (--conda PATH)")
    for var in ("MAMBA_EXE", "CONDA_EXE"):
        value = env.get(var)
        if value and os.path.isfile(value) and os.access(value, os.X_OK):
            return value
    for name in CONDA_EXECUTABLES:
        found = which(name, env)
        if found:
            return found
    raise ProvisionError(
        "locking a conda recipe needs micromamba, mamba or conda, and none is on PATH (nor "
        "CONDA_EXE/MAMBA_EXE): install micromamba (https://mamba.readthedocs.io, a single "
        "binary) and pass --conda PATH, or generate the lock on a machine that has conda "
        "(`dsenv lock --kind conda --stack NAME`) and commit it")


def _require_module(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ProvisionError(f"{what} is not installed in this Python ({sys.executable}): "
                             "pip install 'dsenv[provision]'")


def lock_conda(
    recipe: Path,
    out: Path,
    *,
    platforms: Sequence[str] = (PLATFORM,),
    conda_exe: str | None = None,
    channels_override: Sequence[str] | None = None,
    cuda: str | None = "auto",
    virtual_packages: Path | None = None,
    pypi_to_conda_lookup: str | Path | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = LOCK_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Lock ``recipe`` (an environment.yml) with the real conda-lock into ``out`` (a
    conda-lock.yml, version 1), written beside ``out`` and renamed into place.

    ``cuda``: the ``__cuda`` version the solve assumes: ``"auto"`` takes the recipe's
    ``cuda-version`` pin (``--with-cuda X.Y``), and a recipe without one locks
    ``--without-cuda`` (no CUDA builds of anything); a string forces ``--with-cuda``; None
    forces ``--without-cuda``. ``virtual_packages`` (conda-lock's virtual-packages.yml, e.g.
    an older ``__glibc`` for the cluster) overrides both. ``pypi_to_conda_lookup``: a local
    PyPI-to-conda name mapping (JSON or YAML) instead of the one conda-lock downloads from
    GitHub for a recipe with a pip section.
    """
    recipe, out = Path(recipe), Path(out)
    env = dict(os.environ if env is None else env)
    if not recipe.is_file():
        raise ProvisionError(f"conda recipe {recipe} not found: pass an environment.yml "
                             f"(recipes: {RECIPES_DIR})")
    _require_module("conda_lock", "conda-lock")
    exe = find_conda_exe(conda_exe, env)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.yml")
    tmp.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "conda_lock", "lock", "--file", str(recipe.absolute()),
            "--conda", exe, "--lockfile", str(tmp.absolute()), "--kind", "lock"]
    for platform in platforms:
        argv += ["--platform", platform]
    for channel in channels_override or ():
        argv += ["--channel", channel]
    if virtual_packages is not None:
        if not Path(virtual_packages).is_file():
            raise ProvisionError(f"virtual packages file {virtual_packages} not found: pass "
                                 "a conda-lock virtual-packages.yml")
        argv += ["--virtual-package-spec", str(Path(virtual_packages).absolute())]
    else:
        version = recipe_cuda(recipe) if cuda == "auto" else cuda
        argv += ["--with-cuda", version] if version else ["--without-cuda"]
    if pypi_to_conda_lookup is not None:
        argv += ["--pypi_to_conda_lookup_file", str(pypi_to_conda_lookup)]
    argv += list(extra_args)
    try:
        # conda-lock picks up a ./virtual-packages.yml silently: run where there is none, so
        # only `virtual_packages` changes the virtual packages.
        with tempfile.TemporaryDirectory(prefix="dsenv-conda-lock-") as cwd:
            result = run(argv, timeout=timeout, env=env, cwd=cwd)
        if result.timed_out:
            raise ProvisionError(f"conda-lock did not finish locking {recipe.name} within "
                                 f"{timeout:.0f} s (killed): retry with a longer timeout, or "
                                 "use micromamba (the fastest solver) via --conda")
        if not result.ok or not tmp.is_file():
            raise ProvisionError(f"conda-lock could not lock {recipe.name} for "
                                 f"{','.join(platforms)} with {Path(exe).name}: "
                                 f"{_conda_lock_failure(result)}: fix the recipe's specs or "
                                 "channels (the solver's message says which package)")
        text = tmp.read_text(encoding="utf-8")
        # The header's "conda-lock lock --lockfile NAME" hints name the file being written.
        text = "\n".join(line.replace(tmp.name, out.name) if line.startswith("#") else line
                         for line in text.split("\n"))
        lock = _parse_lock_text(text, out)
        missing = [p for p in platforms if p not in lock.platforms]
        if missing:
            raise ProvisionError(f"conda-lock wrote {out.name} without platform(s) "
                                 f"{', '.join(missing)}: rerun the lock")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _conda_lock_failure(result: CommandResult) -> str:
    """What conda-lock's output says went wrong, as one line (the solver's explanation tree
    flattened)."""
    raw = (result.stderr + "\n" + result.stdout).splitlines()
    for i, line in enumerate(raw):
        if line.startswith("Could not lock the environment"):
            message = []
            for follow in raw[i + 1:]:
                if not follow.strip() or follow.lstrip().startswith(
                        ("Command:", "STDOUT", "STDERR", "{", "Traceback")):
                    break
                message.append(follow.strip(" \u2500\u2502\u2514\u251c"))
            if message:
                return _one_line(" ".join(message))
    lines = [line.strip() for line in raw if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception)\b", line):
            return _one_line(line)
    return _one_line(lines[-1]) if lines else result.describe()


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split()).rstrip(".:; ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    return _parse_lock_text(text, path)


def _parse_lock_text(text: str, path: Path) -> CondaLock:
    _require_module("yaml", "PyYAML (a conda-lock requirement)")
    import yaml

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


# --------------------------------------------------------------------------- installing


@dataclass(frozen=True)
class InstallReport:
    prefix: Path  # where the files were written (the staging folder)
    final_prefix: Path  # the path written into them
    platform: str
    conda: tuple[str, ...]  # "name=version" of each conda package linked
    pip: tuple[str, ...]  # "name=version" of each pip package installed
    downloaded: int  # conda archives fetched now
    reused: int  # conda archives already in the cache with the locked hashes
    seconds: float


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Verified conda archives, reused by later installs: ``$DSENV_CONDA_PKGS``, else
    ``$XDG_CACHE_HOME/dsenv/conda-pkgs`` (``~/.cache/dsenv/conda-pkgs``)."""
    env = os.environ if env is None else env
    if env.get("DSENV_CONDA_PKGS"):
        return Path(env["DSENV_CONDA_PKGS"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsenv" / "conda-pkgs"


def install_conda(
    lockfile: Path,
    prefix: Path,
    *,
    platform: str = PLATFORM,
    final_prefix: Path | None = None,
    cache_dir: Path | None = None,
    extras: Sequence[str] = (),
    timeout: float = INSTALL_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> InstallReport:
    """Install a conda-lock.yml into the empty (or new) folder ``prefix``.

    Every conda archive is downloaded (or taken from ``cache_dir``) and its sha256 and md5
    compared with the lock before anything is linked; a mismatch is a ProvisionError naming
    the package. rattler then links the checked archives, writing ``final_prefix`` (default:
    ``prefix``; its real path, symlinks resolved) into the files that embed the environment's
    path; the lock's pip packages follow through uv with ``--require-hashes --no-deps``.
    Only the lock's main category is installed, plus the categories named in ``extras``;
    packages' post-link scripts are not run.
    """
    start = time.monotonic()
    # Real paths go into the files: seed 003's environment, reached through the /home
    # symlink, could not be activated on compute nodes where that link does not exist.
    lockfile, prefix = Path(lockfile), Path(prefix).resolve()
    final = Path(final_prefix).resolve() if final_prefix is not None else prefix
    env = dict(os.environ if env is None else env)
    lock = read_conda_lock(lockfile)
    if platform not in lock.platforms:
        raise ProvisionError(f"conda lock {lockfile} has no packages for {platform} (it was "
                             f"made for {', '.join(lock.platforms) or 'no platform'}): "
                             f"relock with `dsenv lock --kind conda` for {platform}")
    selected = lock.select(platform, extras)
    conda_pkgs = [p for p in selected if p.manager == "conda"]
    pip_pkgs = [p for p in selected if p.manager == "pip"]
    other = sorted({p.manager for p in selected} - {"conda", "pip"})
    if other:
        raise ProvisionError(f"conda lock {lockfile}: unknown package manager(s) "
                             f"{', '.join(other)}: regenerate it with conda-lock 2 or newer")
    if not conda_pkgs:
        raise ProvisionError(f"conda lock {lockfile} lists no conda packages for {platform}: "
                             "regenerate it")
    for pkg in selected:
        if pkg.manager == "conda" and not (pkg.sha256 or pkg.md5):
            raise ProvisionError(f"conda lock {lockfile}: {pkg.spec} has no sha256 or md5, so "
                                 "it cannot be checked: regenerate the lock with conda-lock")
        if pkg.manager == "pip" and not pkg.sha256:
            raise ProvisionError(f"conda lock {lockfile}: pip package {pkg.spec} has no "
                                 "sha256, so it cannot be installed with --require-hashes: "
                                 "lock it from an index that publishes hashes (PyPI does)")
    if prefix.exists() and any(prefix.iterdir()):
        raise ProvisionError(f"conda prefix {prefix} is not empty: install_conda builds a "
                             "fresh environment; pass a new or empty (staging) folder")
    _require_module("rattler", "py-rattler")

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(env)
    cache.mkdir(parents=True, exist_ok=True)
    local, downloaded = _fetch_all(conda_pkgs, cache, env)

    prefix.mkdir(parents=True, exist_ok=True)
    extract_dir = prefix / ".dsenv-extract"  # same filesystem: rattler hardlinks from it
    job = {
        "lockfile": str(lockfile.absolute()), "platform": platform, "prefix": str(prefix),
        "final_prefix": str(final) if final != prefix else None,
        "extract_dir": str(extract_dir),
        "files": {p.url: str(local[p.url]) for p in conda_pkgs},
    }
    try:
        _run_rattler_install(job, timeout, env)
    finally:
        shutil.rmtree(extract_dir, ignore_errors=True)
    _restore_record_urls(prefix, {p.file_name: p.url for p in conda_pkgs})

    if pip_pkgs:
        remaining = max(60.0, timeout - (time.monotonic() - start))
        _pip_install(pip_pkgs, prefix, remaining, env)
        if final != prefix:
            _relocate_scripts(prefix, final)
    return InstallReport(
        prefix=prefix, final_prefix=final, platform=platform,
        conda=tuple(p.spec for p in conda_pkgs), pip=tuple(p.spec for p in pip_pkgs),
        downloaded=downloaded, reused=len(conda_pkgs) - downloaded,
        seconds=time.monotonic() - start)


def _display_url(url: str) -> str:
    """``url`` without user:password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    return urllib.parse.urlunsplit(parts)


def _expand(url: str, env: Mapping[str, str]) -> str:
    """conda-lock writes credentials as ``${VAR}`` placeholders: fill them from ``env``."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: env.get(m.group(1) or m.group(2), m.group(0)), url)


def _hashes(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def _mismatch(pkg: LockedPackage, sha256: str, md5: str) -> str | None:
    if pkg.sha256 and pkg.sha256.lower() != sha256:
        return f"sha256 {sha256[:16]}... differs from the lock's {pkg.sha256[:16]}..."
    if pkg.md5 and pkg.md5.lower() != md5:
        return f"md5 {md5} differs from the lock's {pkg.md5}"
    return None


def _fetch_all(pkgs: Sequence[LockedPackage], cache: Path,
               env: Mapping[str, str]) -> tuple[dict[str, Path], int]:
    """Every archive in ``cache``, checked against the lock: {lock url: path}, downloads."""
    results: dict[str, tuple[Path, bool] | ProvisionError] = {}

    def one(pkg: LockedPackage) -> None:
        try:
            results[pkg.url] = _fetch_verified(pkg, cache, env)
        except ProvisionError as exc:
            results[pkg.url] = exc

    with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
        list(pool.map(one, pkgs))
    for pkg in pkgs:  # the first failure in lock order, so the message is stable
        if isinstance(results[pkg.url], ProvisionError):
            raise results[pkg.url]
    local = {url: res[0] for url, res in results.items()}
    return local, sum(1 for res in results.values() if res[1])


def _fetch_verified(pkg: LockedPackage, cache: Path,
                    env: Mapping[str, str]) -> tuple[Path, bool]:
    """(path of the checked archive in ``cache``, whether it was downloaded now)."""
    name = pkg.file_name
    if not name or "/" in name or name in (".", ".."):
        raise ProvisionError(f"conda lock: {pkg.spec} has an unusable url "
                             f"{_display_url(pkg.url)}: regenerate the lock")
    key = pkg.sha256 or pkg.md5
    target = cache / key[:2] / key / name  # one folder per locked hash: no two builds collide
    if target.is_file() and _mismatch(pkg, *_hashes(target)) is None:
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{name}.part-{os.getpid()}-{threading.get_ident()}")
    url = _expand(pkg.url, env)
    shown = _display_url(pkg.url)
    sha, md5 = hashlib.sha256(), hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as response, \
                open(part, "wb") as out:
            while chunk := response.read(_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise ProvisionError(f"cannot download conda package {pkg.spec} from {shown} "
                             f"({reason}): check the network and HTTPS_PROXY, or fill the "
                             f"cache {cache} on a node that can reach the channel") from None
    problem = _mismatch(pkg, sha.hexdigest(), md5.hexdigest())
    if problem:
        part.unlink(missing_ok=True)
        raise ProvisionError(f"conda package {pkg.spec} ({shown}): {problem}: the file "
                             "changed since the lock was made (or the mirror serves another "
                             "build); nothing was installed; relock (`dsenv lock --kind "
                             "conda`) only if the channel really replaced it")
    os.replace(part, target)
    return target, True


def _run_rattler_install(job: dict, timeout: float, env: Mapping[str, str]) -> None:
    result = run([sys.executable, "-m", "dsenv.provision.conda", "--rattler-install"],
                 timeout=timeout, env=env, input_text=json.dumps(job))
    if result.timed_out:
        raise ProvisionError(f"linking the conda packages into {job['prefix']} did not "
                             f"finish within {timeout:.0f} s (killed): retry with a longer "
                             "timeout, on a faster file system")
    answer = _last_json(result.stdout)
    if not result.ok or not answer.get("ok"):
        why = answer.get("error") or result.describe()
        raise ProvisionError(f"rattler could not install the conda packages into "
                             f"{job['prefix']}: {_one_line(why)}: check free space and "
                             "permissions there, or regenerate the lock")


def _last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return {}


def _restore_record_urls(prefix: Path, urls: Mapping[str, str]) -> None:
    """rattler linked from the checked local copies, extracted in a folder that is gone now:
    conda-meta should name where each package really comes from (the lock's url) and no
    path of the staging folder."""
    for record in (prefix / "conda-meta").glob("*.json"):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        original = urls.get(data.get("fn", ""))
        if original and (data.get("url") != original or "extracted_package_dir" in data):
            data["url"] = original
            data.pop("extracted_package_dir", None)  # both optional in conda and rattler
            data.pop("link", None)
            tmp = record.with_name(f".{record.name}.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, record)


def _pip_install(pkgs: Sequence[LockedPackage], prefix: Path, timeout: float,
                 env: Mapping[str, str]) -> None:
    python = prefix / "bin" / "python"
    if not python.exists():
        raise ProvisionError(f"the lock has pip packages but its conda part installed no "
                             f"Python ({python} missing): add python to the recipe and relock")
    uv_binary()  # a missing uv is one clear line before anything runs
    with tempfile.TemporaryDirectory(prefix="dsenv-conda-pip-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{p.name} @ {p.url} --hash=sha256:{p.sha256}\n"
                                        for p in pkgs), encoding="utf-8")
        result = run_uv(["pip", "install", "--require-hashes", "--no-deps",
                         "--python", str(python), "-r", str(requirements)],
                        timeout=timeout, env=env)
    if result.timed_out:
        raise ProvisionError(f"uv pip install of the lock's {len(pkgs)} pip packages did not "
                             f"finish within {timeout:.0f} s (killed): retry with a longer "
                             "timeout")
    if not result.ok:
        raise ProvisionError(_uv_failure(result, pkgs))


def _uv_failure(result: CommandResult, pkgs: Sequence[LockedPackage]) -> str:
    text = result.stderr + "\n" + result.stdout
    mismatch = re.search(r"Hash mismatch for `([^`@ ]+)", text)
    if mismatch:
        name = mismatch.group(1)
        pkg = next((p for p in pkgs if p.name.lower() == name.lower()), None)
        computed = re.search(r"Computed:\s*(sha256:[0-9a-f]+)", text)
        got = f" (got {computed.group(1)[:23]}...)" if computed else ""
        where = f"{pkg.spec} ({_display_url(pkg.url)})" if pkg else name
        return (f"pip package {where}: sha256 differs from the lock's{got}: the file changed "
                "since the lock was made; relock (`dsenv lock --kind conda`) only if the "
                "index really replaced it")
    return (uv_error(result, "uv could not install the lock's pip packages")
            + ": check the index is reachable (HTTPS_PROXY) and the lock is current")


def _relocate_scripts(prefix: Path, final: Path) -> None:
    """pip writes its interpreter's path into console scripts: point them at ``final``."""
    old, new = str(prefix).encode(), str(final).encode()
    bindir = prefix / "bin"
    if not bindir.is_dir():
        return
    for script in bindir.iterdir():
        if script.is_symlink() or not script.is_file() or script.stat().st_size > _CHUNK:
            continue
        data = script.read_bytes()
        if not data.startswith(b"#!") or old not in data:
            continue
        tmp = script.with_name(f".{script.name}.tmp")
        tmp.write_bytes(data.replace(old, new))
        shutil.copymode(script, tmp)
        os.replace(tmp, script)  # a new inode: never edits a file hardlinked from a cache


# --------------------------------------------------------------------------- rattler worker


def _rattler_install_main() -> None:
    """``python -m dsenv.provision.conda --rattler-install`` < job.json: link the checked
    local archives into the prefix; one JSON line out; ends with os._exit."""
    code = 1
    try:
        import asyncio

        from rattler import LockFile, Subdir, install

        job = json.loads(sys.stdin.read())
        lock = LockFile.from_path(job["lockfile"])
        environment = lock.default_environment()
        if environment is None:
            raise RuntimeError("the lock file has no default environment")
        platform = next((p for p in environment.platforms() if p.name == job["platform"]),
                        None)
        if platform is None:
            raise RuntimeError(f"the lock file has no {job['platform']} packages")
        files = job["files"]
        by_name = {url.rsplit("/", 1)[-1]: path for url, path in files.items()}
        records = []
        for record in environment.conda_repodata_records_for_platform(platform) or []:
            path = files.get(record.url) or by_name.get(record.file_name)
            if path is None:
                continue  # not selected (an optional category)
            record.url = Path(path).as_uri()
            records.append(record)
        if len(records) != len(files):
            found = {r.file_name for r in records}
            lost = sorted(set(by_name) - found)
            raise RuntimeError(f"rattler did not find {', '.join(lost)} in the lock file")
        asyncio.run(install(
            records, target_prefix=job["prefix"], cache_dir=Path(job["extract_dir"]),
            platform=Subdir(job["platform"]), show_progress=False,
            execute_link_scripts=False, alternative_target_prefix=job["final_prefix"]))
        print(json.dumps({"ok": True, "installed": sorted(r.file_name for r in records)}))
        code = 0
    except BaseException as exc:  # the parent reads the reason from the JSON line
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__" and sys.argv[1:] == ["--rattler-install"]:
    _rattler_install_main()

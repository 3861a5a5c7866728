"""Which MPI is on PATH, how it was built, what Slurm's srun offers, and what mpi4py loads.

Parsers are pure functions (text in, data out) fed recorded real outputs in the tests:
``mpirun --version`` of Open MPI / MPICH (Hydra) / Intel MPI, ``ompi_info`` (plain and
``--parsable``), ``srun --mpi=list`` (Slurm 17-23 formats), ``ldconfig -p`` and ``ldd``.
Every command runs once per doctor run (``@probe``) and through ``ctx.run``.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .context import Context, probe

# -- the MPI behind mpirun / mpiexec ------------------------------------------------------------

ABI = {"openmpi": "openmpi", "mpich": "mpich", "intelmpi": "mpich", "craympich": "mpich",
       "mvapich": "mpich"}
FAMILY_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intelmpi": "Intel MPI",
                "craympich": "Cray MPICH", "mvapich": "MVAPICH"}


@dataclass(frozen=True)
class MpiInstall:
    family: str  # openmpi | mpich | intelmpi | craympich | mvapich | unknown
    version: str | None
    launcher: str | None = None  # path of the mpirun/mpiexec that answered
    prefix: str | None = None  # install prefix the launcher belongs to (realpath)
    evidence: tuple[str, ...] = ()

    @property
    def abi(self) -> str | None:
        return ABI.get(self.family)

    @property
    def major(self) -> int | None:
        match = re.match(r"(\d+)", self.version or "")
        return int(match.group(1)) if match else None

    def describe(self) -> str:
        name = FAMILY_NAMES.get(self.family, self.family)
        return f"{name} {self.version or '(version unknown)'}"


_OMPI = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\S+)")
_INTEL = re.compile(r"Intel\(R\) MPI Library.*?Version\s+(\d+(?:\.\d+)*(?:\s+Update\s+\d+)?)")
_HYDRA = re.compile(r"^\s*Version:\s*(\S+)", re.MULTILINE)


def parse_launcher_version(text: str) -> tuple[str, str | None] | None:
    """(family, version) from `mpirun --version` / `mpiexec --version`, or None."""
    if match := _OMPI.search(text):
        return "openmpi", match.group(1)
    if match := _INTEL.search(text):
        return "intelmpi", match.group(1)
    if "HYDRA build details" in text:
        match = _HYDRA.search(text)
        family = "mvapich" if "mvapich" in text.lower() else "mpich"
        return family, match.group(1) if match else None
    return None


_CRAY_VERSION = re.compile(r"/mpich/(\d+(?:\.\d+)+)")


def cray_mpich(env) -> tuple[str | None, str] | None:
    """(version, evidence) when the cray-mpich module is loaded (CRAY_MPICH_DIR & co)."""
    for name in ("CRAY_MPICH_DIR", "CRAY_MPICH_BASEDIR", "CRAY_MPICH_PREFIX", "CRAY_MPICH_VERSION"):
        value = env.get(name)
        if value:
            version = env.get("CRAY_MPICH_VERSION")
            match = _CRAY_VERSION.search(env.get("CRAY_MPICH_DIR", "") or value)
            return version or (match.group(1) if match else None), f"{name}={value}"
    return None


def install_prefix(launcher: str) -> str:
    """/usr/bin/mpirun -> /usr (through symlinks: Debian's alternatives, module wrappers)."""
    return str(Path(os.path.realpath(launcher)).parent.parent)


@probe
def mpi_install(ctx: Context) -> MpiInstall | None:
    """The MPI that provides mpirun (else mpiexec) on PATH; Cray MPICH from its module env."""
    cray = cray_mpich(ctx.env)
    for name in ("mpirun", "mpiexec"):
        path = ctx.which(name)
        if not path:
            continue
        result = ctx.run([path, "--version"])
        parsed = parse_launcher_version(result.stdout + "\n" + result.stderr)
        if parsed:
            family, version = parsed
            evidence = (f"{path} --version: {family} {version}",)
            return MpiInstall(family, version, path, install_prefix(path), evidence)
        if cray is None:
            return MpiInstall("unknown", None, path, install_prefix(path), (result.describe(),))
    if cray:
        version, evidence = cray
        return MpiInstall("craympich", version, None, None, (evidence,))
    return None


# -- ompi_info ------------------------------------------------------------------------------------

PMIX_NON_CLIENTS = frozenset({"isolated", "flux", "s1", "s2", "cray"})


@dataclass(frozen=True)
class OmpiInfo:
    version: str | None
    prefix: str | None
    components: dict[str, frozenset[str]] = field(default_factory=dict)
    configure: str = ""

    def has(self, framework: str, component: str) -> bool:
        return component in self.components.get(framework, frozenset())

    @property
    def major(self) -> int | None:
        match = re.match(r"(\d+)", self.version or "")
        return int(match.group(1)) if match else None

    @property
    def slurm_components(self) -> list[str]:
        return [f"{fw}:slurm" for fw in ("ess", "plm", "ras") if self.has(fw, "slurm")]

    @property
    def pmix_clients(self) -> list[str]:
        """pmix components that talk to an external PMIx server such as Slurm's (ext3x, ...)."""
        return sorted(self.components.get("pmix", frozenset()) - PMIX_NON_CLIENTS)

    @property
    def pmix_builtin(self) -> str | None:
        """Open MPI 5 has no pmix framework: PMIx is linked in; configure says which."""
        if (self.major or 0) < 5:
            return None
        match = re.search(r"--with-pmix(?:=(\S+?))?'", self.configure)
        return (match.group(1) or "yes") if match else "internal"


_PLAIN_MCA = re.compile(r"^\s*MCA\s+([\w-]+):\s+([\w-]+)\s+\(", re.MULTILINE)
_PARSABLE_MCA = re.compile(r"^mca:([\w-]+):([\w-]+):version:", re.MULTILINE)


def parse_ompi_info(text: str) -> OmpiInfo:
    """Plain `ompi_info` or `ompi_info --parsable` -> version, prefix, MCA components."""
    components: dict[str, set[str]] = {}
    for framework, name in _PLAIN_MCA.findall(text) + _PARSABLE_MCA.findall(text):
        components.setdefault(framework, set()).add(name)
    version = prefix = None
    configure = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("ompi:version:full:"):
            version = stripped.split(":", 3)[3]
        elif stripped.startswith("Open MPI:") and version is None:
            version = stripped.split(":", 1)[1].strip()
        elif stripped.startswith("path:prefix:"):
            prefix = stripped.split(":", 2)[2]
        elif stripped.startswith("Prefix:") and prefix is None:
            prefix = stripped.split(":", 1)[1].strip()
        elif stripped.startswith(("config:cli:", "Configure command line:")):
            configure = stripped.split(":", 2 if stripped.startswith("config") else 1)[-1]
    return OmpiInfo(version, prefix, {k: frozenset(v) for k, v in components.items()}, configure)


def ompi_info_path(ctx: Context) -> str | None:
    """The ompi_info that belongs to the mpirun on PATH (same folder), else the one on PATH."""
    mpirun = ctx.which("mpirun") or ctx.which("mpiexec")
    if mpirun:
        sibling = Path(mpirun).parent / "ompi_info"
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return str(sibling)
        return None  # mpirun is not Open MPI's (or it has no ompi_info): don't mix installs
    return ctx.which("ompi_info")


@probe
def ompi_info(ctx: Context) -> tuple[OmpiInfo | None, str]:
    """(parsed ompi_info --parsable, how it ended) for the Open MPI that owns mpirun."""
    path = ompi_info_path(ctx)
    if path is None:
        return None, "no ompi_info next to mpirun"
    result = ctx.run([path, "--parsable"])
    if not result.ok:
        return None, result.describe()
    return parse_ompi_info(result.stdout), f"`{path} --parsable`"


# -- Slurm: srun --mpi=list, slurm.conf, the pmix plugin's library ------------------------------


@dataclass(frozen=True)
class SrunPlugins:
    plugins: tuple[str, ...]  # as listed: pmix, pmix_v3, pmi2, none, cray_shasta, openmpi
    pmix_versions: tuple[str, ...] = ()  # "specific pmix plugin versions available: pmix_v4"

    @property
    def kinds(self) -> set[str]:
        return {normalize_plugin(p) for p in self.plugins + self.pmix_versions}


def normalize_plugin(name: str) -> str:
    """pmix_v3 -> pmix; 'openmpi' (Slurm < 20) behaves as none."""
    name = name.strip().lower()
    if name.startswith("pmix"):
        return "pmix"
    return "none" if name == "openmpi" else name


def parse_srun_mpi_list(text: str) -> SrunPlugins:
    """Both formats: 'MPI plugin types are...\\n\\tpmix' and 'srun: MPI types are...\\nsrun: pmi2'."""
    plugins: list[str] = []
    versions: list[str] = []
    listing = False
    for raw in text.splitlines():
        line = re.sub(r"^\s*srun:\s*", "", raw).strip()
        if not line:
            continue
        if re.search(r"MPI (plugin )?types are", line):
            listing = True
            continue
        if line.lower().startswith("specific pmix plugin versions available:"):
            versions += [v.strip() for v in line.split(":", 1)[1].replace(",", " ").split()]
            listing = False
            continue
        if listing and re.fullmatch(r"[\w.-]+", line):
            plugins.append(line)
        elif listing:
            listing = False
    return SrunPlugins(tuple(plugins), tuple(versions))


@probe
def srun_mpi_list(ctx: Context) -> tuple[SrunPlugins | None, str]:
    srun = ctx.which("srun")
    if not srun:
        return None, "srun not found on PATH"
    result = ctx.run([srun, "--mpi=list"])
    parsed = parse_srun_mpi_list(result.stdout + "\n" + result.stderr)
    if not parsed.plugins:
        return None, result.describe()
    return parsed, f"`{srun} --mpi=list`"


def slurm_conf_path(ctx: Context) -> Path | None:
    configured = ctx.env.get("SLURM_CONF")
    candidates = [ctx.path(configured)] if configured else []
    candidates += [ctx.path("/etc/slurm/slurm.conf"), ctx.path("/etc/slurm-llnl/slurm.conf")]
    return next((c for c in candidates if c.is_file()), None)


def parse_slurm_conf(text: str) -> dict[str, str]:
    """key=value pairs of slurm.conf (case-insensitive keys, lower-cased), comments dropped."""
    values = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep and key.lower() not in values:
                values[key.lower()] = value
    return values


def slurm_conf(ctx: Context) -> tuple[dict[str, str], str | None]:
    path = slurm_conf_path(ctx)
    if path is None:
        return {}, None
    try:
        return parse_slurm_conf(path.read_text(errors="replace")), str(path)
    except OSError:
        return {}, None


def srun_mpi_type(ctx: Context) -> tuple[str, str]:
    """(plugin srun will use, where that came from): SLURM_MPI_TYPE, else MpiDefault."""
    if ctx.env.get("SLURM_MPI_TYPE"):
        return ctx.env["SLURM_MPI_TYPE"], "SLURM_MPI_TYPE"
    conf, where = slurm_conf(ctx)
    if conf.get("mpidefault"):
        return conf["mpidefault"], f"MpiDefault in {where}"
    return "none", "Slurm's default (MpiDefault unset)" + (f" in {where}" if where else "")


PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
               "/usr/lib64/slurm", "/usr/lib/slurm", "/usr/local/lib/slurm",
               "/opt/slurm/lib/slurm", "/opt/slurm/lib64/slurm")


def pmix_plugin_files(ctx: Context) -> list[Path]:
    conf, _ = slurm_conf(ctx)
    folders = [ctx.path(d) for d in conf.get("plugindir", "").split(":") if d]
    srun = ctx.which("srun")
    if srun:
        prefix = Path(os.path.realpath(srun)).parent.parent
        folders += [prefix / "lib" / "slurm", prefix / "lib64" / "slurm"]
    folders += [ctx.path(d) for d in PLUGIN_DIRS]
    files: list[Path] = []
    for folder in folders:
        if folder.is_dir():
            files += sorted(p for p in folder.glob("mpi_pmix*.so") if p not in files)
    return files


_PATH_STRING = re.compile(rb"\x00(/[\x21-\x7e]*lib[\x21-\x7e]*)\x00")
_LIBPMIX_STRING = re.compile(rb"libpmix\.so(?:\.\d+)*")


def pmix_library_wanted(plugin_bytes: bytes) -> tuple[list[str], list[str]]:
    """(library folders, library names) compiled into Slurm's mpi_pmix plugin (it dlopens them)."""
    names = sorted({m.decode() for m in _LIBPMIX_STRING.findall(plugin_bytes)})
    folders = sorted({m.decode() for m in _PATH_STRING.findall(plugin_bytes)
                      if b"pmix" in m.lower() or m.endswith((b"/lib", b"/lib64"))})
    return folders, names


@dataclass(frozen=True)
class PmixLibrary:
    found: str | None  # the file that would be loaded
    wanted: tuple[str, ...]  # what was looked for
    plugin: str | None = None


def find_pmix_library(ctx: Context) -> PmixLibrary:
    """Can Slurm's pmix plugin load its PMIx library? (srun lists pmix even when it cannot)."""
    plugins = pmix_plugin_files(ctx)
    for plugin in plugins:
        try:
            data = plugin.read_bytes()
        except OSError:
            continue
        folders, names = pmix_library_wanted(data)
        names = names or ["libpmix.so"]
        if folders:
            wanted = [str(Path(f) / n) for f in folders for n in names if "/" not in n]
            for candidate in wanted:
                if ctx.path(candidate).exists():
                    return PmixLibrary(candidate, tuple(wanted), str(plugin))
            return PmixLibrary(None, tuple(wanted), str(plugin))
        found = find_library(ctx, names)
        return PmixLibrary(found, tuple(names), str(plugin))
    found = find_library(ctx, ["libpmix.so", "libpmix.so.2"])
    return PmixLibrary(found, ("libpmix.so", "libpmix.so.2"))


# -- the dynamic linker's view: ldconfig -p, LD_LIBRARY_PATH, ldd -------------------------------

_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", re.MULTILINE)


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    cache: dict[str, list[str]] = {}
    for name, _flags, path in _LDCONFIG_LINE.findall(text):
        cache.setdefault(name, []).append(path)
    return cache


@probe
def ldconfig_cache(ctx: Context) -> dict[str, list[str]]:
    exe = ctx.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if exe is None:
        return {}
    result = ctx.run([exe, "-p"])
    return parse_ldconfig(result.stdout) if result.ok else {}


DEFAULT_LIB_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


def find_library(ctx: Context, names) -> str | None:
    """Where the dynamic linker would find the first of ``names`` (LD_LIBRARY_PATH, cache, dirs)."""
    folders = [d for d in ctx.env.get("LD_LIBRARY_PATH", "").split(":") if d]
    cache = ldconfig_cache(ctx)
    for name in names:
        for folder in folders:
            if (Path(folder) / name).is_file():
                return str(Path(folder) / name)
        if cache.get(name):
            return cache[name][0]
        for folder in DEFAULT_LIB_DIRS:
            if ctx.path(folder).joinpath(name).is_file():
                return f"{folder}/{name}"
    return None


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|\S+)", re.MULTILINE)


def parse_ldd(text: str) -> dict[str, str | None]:
    """{'libmpi.so.40': '/lib/x86_64-linux-gnu/libmpi.so.40', 'libmpi.so.12': None}."""
    return {name: None if target == "not found" else target
            for name, target in _LDD_LINE.findall(text)}


def libmpi_abi(path: str) -> str | None:
    """'openmpi' or 'mpich' from the library itself (the test mpi4py's _mpiabi.py applies)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None  # a linker script such as the MPICH wheel's libmpi.so
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return "openmpi" if data.find(b"ompi_mpi_comm_self") >= 0 else "mpich"
    except (OSError, ValueError):
        return None


# -- mpi4py ---------------------------------------------------------------------------------------

_VARIANT = re.compile(r"^MPI(?:\.(\w+))?\.(?:cpython|pypy|abi3|so)")
DEFAULT_LIBMPI_NAMES = ("libmpi.so", "libmpi.so.12", "libmpi.so.40")


@dataclass(frozen=True)
class Mpi4py:
    location: str
    version: str | None
    variants: dict[str, str]  # abi ("" for a classic single build) -> extension file
    abi: str | None = None  # the variant that will load
    how: str = ""
    libmpi: str | None = None  # the libmpi.so that will be loaded
    problem: str = ""

    @property
    def multi_abi(self) -> bool:
        return "" not in self.variants


def extension_variants(folder: Path) -> dict[str, str]:
    variants = {}
    for path in sorted(folder.glob("MPI*.so")) + sorted(folder.glob("MPI*.pyd")):
        match = _VARIANT.match(path.name)
        if match:
            variants.setdefault(match.group(1) or "", str(path))
    return variants


def load_mpiabi_rules(folder: Path):
    """mpi4py's own _mpiabi.py, executed standalone (stdlib only; nothing of MPI is loaded)."""
    source = folder / "_mpiabi.py"
    if not source.is_file():
        return None, DEFAULT_LIBMPI_NAMES
    text = source.read_text(errors="replace")
    versions = re.findall(r'libname\("mpi",\s*(\d+)\)', text)
    names = ("libmpi.so", *(f"libmpi.so.{v}" for v in versions)) if versions else DEFAULT_LIBMPI_NAMES
    spec = importlib.util.spec_from_file_location("_dsenv_mpi4py_mpiabi", source)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - an unexpected mpi4py: fall back to the names only
        return None, names
    return module, names


def _mpi4py_version(folder: Path) -> str | None:
    from importlib import metadata

    try:
        return metadata.version("mpi4py")
    except metadata.PackageNotFoundError:
        init = folder / "__init__.py"
        match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init.read_text(errors="replace")) \
            if init.is_file() else None
        return match.group(1) if match else None


def select_libmpi(ctx: Context, search_path: list[str], names) -> tuple[str | None, str | None]:
    """The first loadable libmpi along mpi4py's search (entries: folder, file or '' = system)."""
    for entry in search_path:
        entry = os.path.expanduser(entry)
        if entry and not os.path.isdir(entry):
            candidates = [entry]
        elif entry:
            candidates = [os.path.join(entry, n) for n in names]
        else:
            candidates = [p for p in (find_library(ctx, [n]) for n in names) if p]
        for candidate in candidates:
            abi = libmpi_abi(candidate) if os.path.isfile(candidate) else None
            if abi:
                return candidate, abi
    return None, None


@probe
def mpi4py_info(ctx: Context) -> Mpi4py | None:
    try:
        spec = importlib.util.find_spec("mpi4py")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    variants = extension_variants(folder)
    version = _mpi4py_version(folder)
    if not variants:
        return Mpi4py(str(folder), version, {}, problem="no MPI extension module in the package")
    if "" in variants:  # classic build: one MPI.*.so linked to the libmpi it was built with
        libmpi, how = _ldd_libmpi(ctx, variants[""])
        abi = libmpi_abi(libmpi) if libmpi else None
        return Mpi4py(str(folder), version, variants, abi, how, libmpi)
    rules, names = load_mpiabi_rules(folder)
    chosen = ctx.env.get("MPI4PY_MPIABI")
    if chosen:
        abi = rules._get_mpiabi_from_string(chosen) if rules else chosen.lower()
        if abi not in variants:
            return Mpi4py(str(folder), version, variants, abi, f"MPI4PY_MPIABI={chosen}",
                          problem=f"MPI4PY_MPIABI={chosen} names no installed variant")
        libmpi, how = _ldd_libmpi(ctx, variants[abi])
        return Mpi4py(str(folder), version, variants, abi, f"MPI4PY_MPIABI={chosen}; {how}", libmpi)
    if ctx.env.get("MPI4PY_LIBMPI"):
        search, origin = ctx.env["MPI4PY_LIBMPI"].split(os.pathsep), "MPI4PY_LIBMPI"
    else:
        search = (rules._dlopen_rpath() if rules else []) or [""]
        origin = "mpi4py's library search (" + ", ".join(e or "system" for e in search) + ")"
    libmpi, abi = select_libmpi(ctx, search, names)
    if libmpi is None:
        return Mpi4py(str(folder), version, variants, None, origin,
                      problem="no libmpi found along " + origin)
    return Mpi4py(str(folder), version, variants, abi, f"{origin} finds {libmpi}", libmpi)


def _ldd_libmpi(ctx: Context, extension: str) -> tuple[str | None, str]:
    result = ctx.run(["ldd", extension])
    libs = parse_ldd(result.stdout)
    for name, target in libs.items():
        if re.match(r"lib(mpi|mpich|mpi_cray)[\w-]*\.so", name) and "mpifh" not in name:
            return target, f"ldd: {name} => {target or 'not found'}"
    return None, "ldd shows no libmpi" if result.ok else result.describe()


# -- a real 2-rank launch (`dsenv doctor --probe`) ------------------------------------------

RANK_MARK = "DSENV-MPI-RANK "
PROBE_RANKS = 2
# The first line that explains a failed launch, in the order a user should read them.
LAUNCH_ERRORS = (
    "OMPI was not built with SLURM's PMI support",
    "can not load PMIx library",
    "unsupported PMI version",
    "No module named 'mpi4py'",
    "has detected an attempt to run as root",
    "There are not enough slots available",
    "Unable to create step",
    "error while loading shared libraries",
)


@dataclass(frozen=True)
class LaunchProbe:
    outcome: str  # ok | singletons | crash | hung | wrong-size
    ranks: tuple[dict, ...]  # what each rank printed
    command: str
    detail: str = ""


def rank_printer_code() -> str:
    return (Path(__file__).with_name("mpi_rank_printer.py")).read_text()


def probe_command(launcher: str, launcher_path: str, python: str, plugin: str | None) -> list[str]:
    """Start PROBE_RANKS ranks of the rank printer the way the job will start its ranks."""
    code = rank_printer_code()
    if launcher == "srun":
        # --overlap: the doctor itself may already run as a step of this allocation
        return [launcher_path, f"--ntasks={PROBE_RANKS}", "--overlap", f"--mpi={plugin}",
                python, "-c", code]
    return [launcher_path, "-np", str(PROBE_RANKS), python, "-c", code]


def classify_launch(returncode: int | None, stdout: str, stderr: str, timed_out: bool,
                    expected: int = PROBE_RANKS) -> tuple[str, tuple[dict, ...], str]:
    """(outcome, ranks, detail) from what a real launch of the rank printer left behind."""
    ranks = rank_lines(stdout)
    if timed_out:
        return "hung", ranks, f"{len(ranks)} of {expected} ranks answered before the timeout"
    if returncode != 0 or not ranks:
        return "crash", ranks, _first_error(stderr + "\n" + stdout, returncode)
    sizes = sorted({r.get("size") for r in ranks})
    if sizes == [1] and len(ranks) > 1:
        return "singletons", ranks, f"{len(ranks)} processes each saw rank 0 of 1"
    if sizes != [expected] or sorted(r.get("rank") for r in ranks) != list(range(expected)):
        return "wrong-size", ranks, "ranks/sizes seen: " + ", ".join(
            f"{r.get('rank')}/{r.get('size')}" for r in ranks)
    return "ok", ranks, f"ranks 0..{expected - 1} of {expected} answered"


_RANK_LINE = re.compile(re.escape(RANK_MARK) + r"(\{[^{}\n]*\})")


def rank_lines(stdout: str) -> tuple[dict, ...]:
    """Every rank's JSON, also when two ranks' lines were written into one (MPICH does)."""
    found = []
    for match in _RANK_LINE.finditer(stdout):
        try:
            found.append(json.loads(match.group(1)))
        except json.JSONDecodeError:
            continue
    return tuple(found)


def _first_error(text: str, returncode: int | None) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for known in LAUNCH_ERRORS:
        for line in lines:
            if known in line:
                return f"rc {returncode}: {line}"
    telling = [line for line in lines if not set(line) <= set("-*=")]
    return f"rc {returncode}: " + (telling[-1] if telling else "no output")

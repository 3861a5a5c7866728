"""``dsenv provision openmpi``: an Open MPI that Slurm can launch, built by EasyBuild.

    --version --toolchain --pmix   -> OpenMpiBuild   (envs/openmpi.toml; the system's PMIx
                                                      found; the source in --sourcepath; eb,
                                                      Lmod and --env checked: before any write)
    OpenMpiBuild -> easyconfig (plain EasyBuild syntax) + the eb command
    --dry-run: print both, write nothing
    else: <installpath>/dsenv/<module>.eb and .log, eb (timeout, output into the log); a failed
          eb leaves no software folder or module file of this build behind; the built
          ompi_info is judged by the doctor's mpi.ompi-support check; the `module use` /
          `module load` lines are printed and, with --env, written into that environment's
          activate script and manifest.

Stock EasyBuild OpenMPI easyconfigs need a compiler toolchain and ~35 modules, and leave Slurm
out; this one builds with the system compiler and the system's PMIx (the one Slurm's
mpi_pmix plugin loads): 21.6 min on 2 busy cores here (bench/RESULTS.md).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dsenv.doctor.probes.context import Context, Options
from dsenv.doctor.probes.ompi_verdict import ompi_support
from dsenv.doctor.probes.result import Status

from . import ProvisionError

DATA = ("dsenv.envs", "openmpi.toml")
AS_ROOT_VARIABLE = "EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES"
WORK_DIR = "dsenv"  # inside --installpath: the generated easyconfigs and eb's output
MODULES_SUBDIR = ("modules", "all")  # EasyBuild's default module install path and suffix
BLOCK_BEGIN = "# >>> dsenv provision openmpi >>>"
BLOCK_END = "# <<< dsenv provision openmpi <<<"
MANIFEST_KEY = "openmpi_module"
EASYCONFIG_BEGIN = "----- easyconfig {path} -----"
EASYCONFIG_END = "----- end of easyconfig -----"
_TOOLCHAIN_SPEC = re.compile(r"([A-Za-z][\w-]*)/(\d[\w.+-]*)")
# PMIx/4.2.6 or PMIx/4.2.6-GCCcore-13.2.0 (EasyBuild's module name: version-toolchain-version)
_PMIX_MODULE = re.compile(r"PMIx/(\d[\w.]*)(?:-([A-Za-z][\w-]*)-(\d[\w.]*))?")
_OPTION = re.compile(r"--(with|without|enable|disable)-([\w-]+)(?:=(.*))?")


def table() -> dict:
    from dsenv.data import load_table

    return load_table(*DATA)


# ----------------------------------------------------------------------------- the choices
@dataclass(frozen=True)
class Toolchain:
    name: str  # SYSTEM, GCC
    version: str  # "" for SYSTEM
    title: str
    configopts: tuple[str, ...]

    @property
    def is_system(self) -> bool:
        return self.name == "SYSTEM"

    def easyconfig(self) -> str:
        return "SYSTEM" if self.is_system else repr({"name": self.name, "version": self.version})

    def module_part(self) -> str:
        """What EasyBuild's default module naming puts between version and versionsuffix."""
        return "" if self.is_system else f"-{self.name}-{self.version}"

    def describe(self) -> str:
        spec = "SYSTEM" if self.is_system else f"{self.name}/{self.version}"
        return f"{spec} ({self.title})"


def parse_toolchain(spec: str) -> Toolchain:
    known = table()["toolchains"]
    if spec.upper() == "SYSTEM":
        entry = known["SYSTEM"]
        return Toolchain("SYSTEM", "", entry["title"], tuple(entry["configopts"]))
    match = _TOOLCHAIN_SPEC.fullmatch(spec)
    compilers = sorted(name for name in known if name != "SYSTEM")
    if not match:
        raise ProvisionError(f"--toolchain {spec}: expected SYSTEM or NAME/VERSION of an "
                             f"EasyBuild compiler toolchain (e.g. {compilers[0]}/13.2.0)")
    name, version = match.groups()
    if name not in compilers:
        raise ProvisionError(f"--toolchain {spec}: dsenv builds Open MPI with SYSTEM or "
                             f"{', '.join(c + '/VERSION' for c in compilers)} (envs/openmpi.toml "
                             "[toolchains])")
    entry = known[name]
    return Toolchain(name, version, entry["title"], tuple(entry["configopts"]))


@dataclass(frozen=True)
class Pmix:
    kind: str  # system | eb | internal
    title: str
    configopts: tuple[str, ...]
    check: str  # which sanity line of the series: external | internal
    directory: str = ""  # system: the PMIx install prefix
    found_by: str = ""  # system: how the directory was found
    version: str = ""
    module: str = ""  # eb: PMIx/4.2.6-GCCcore-13.2.0
    dependency: tuple = ()  # eb: ('PMIx', '4.2.6', '', ('GCCcore', '13.2.0'))

    def describe(self) -> str:
        if self.kind == "system":
            version = f"PMIx {self.version}, " if self.version else ""
            return f"system: {self.directory} ({version}{self.found_by})"
        if self.kind == "eb":
            return f"EasyBuild module {self.module} (a dependency of the easyconfig)"
        return f"internal ({self.title})"


def find_system_pmix(env=None, candidates=None) -> tuple[str, str, str] | None:
    """(prefix, version, how) of the system's PMIx: `pkg-config pmix`, else the first of
    ``candidates`` (default: envs/openmpi.toml) holding include/pmix.h; None when neither."""
    from dsenv import proc

    env = dict(os.environ if env is None else env)
    if proc.which("pkg-config", env):
        prefix = proc.run(["pkg-config", "--variable=prefix", "pmix"], timeout=10, env=env)
        if prefix.ok and prefix.stdout.strip():
            folder = prefix.stdout.strip()
            if (Path(folder) / "include" / "pmix.h").is_file():
                version = proc.run(["pkg-config", "--modversion", "pmix"], timeout=10, env=env)
                return folder, version.stdout.strip() if version.ok else "", "pkg-config pmix"
    if candidates is None:
        candidates = table()["pmix"]["system"]["candidates"]
    for folder in candidates:
        if (Path(folder) / "include" / "pmix.h").is_file():
            return str(folder), _pmix_header_version(Path(folder)), "include/pmix.h found"
    return None


def _pmix_header_version(folder: Path) -> str:
    try:
        text = (folder / "include" / "pmix_version.h").read_text(errors="replace")
    except OSError:
        return ""
    parts = [re.search(rf"#define PMIX_VERSION_{part}\s+(\d+)L?", text)
             for part in ("MAJOR", "MINOR", "RELEASE")]
    return ".".join(m.group(1) for m in parts) if all(parts) else ""


def parse_pmix(spec: str, toolchain: Toolchain, env=None) -> Pmix:
    choices = table()["pmix"]
    kind, _, rest = spec.partition(":")
    if kind not in choices:
        raise ProvisionError(f"--pmix {spec}: expected system, system:DIR, "
                             "eb:PMIx/VERSION[-TOOLCHAIN-VERSION] or internal")
    entry = choices[kind]
    opts = tuple(entry["configopts"])
    if kind == "internal":
        if rest:
            raise ProvisionError(f"--pmix {spec}: internal takes no argument")
        return Pmix(kind, entry["title"], opts, entry["check"])
    if kind == "system":
        if rest:
            folder = Path(rest).expanduser().absolute()
            if not (folder / "include" / "pmix.h").is_file():
                raise ProvisionError(f"--pmix {spec}: {folder}/include/pmix.h does not exist: "
                                     "pass the prefix of a PMIx installation (the folder "
                                     "holding include/ and lib/)")
            found = (str(folder), _pmix_header_version(folder), "--pmix system:DIR")
        else:
            found = find_system_pmix(env)
            if found is None:
                raise ProvisionError(
                    "--pmix system: no PMIx found (`pkg-config pmix` has no answer and no "
                    "known folder holds include/pmix.h): install the PMIx development files "
                    "your Slurm uses (Debian/Ubuntu: `apt-get install libpmix-dev`, RHEL: "
                    "`dnf install pmix-devel`), or pass --pmix system:DIR or --pmix internal")
        folder, version, how = found
        opts = tuple(opt.format(pmix_dir=folder) for opt in opts)
        return Pmix(kind, entry["title"], opts, entry["check"], directory=folder,
                    found_by=how, version=version)
    match = _PMIX_MODULE.fullmatch(rest)
    if not match:
        raise ProvisionError(f"--pmix {spec}: expected eb:PMIx/VERSION or "
                             "eb:PMIx/VERSION-TOOLCHAIN-VERSION (an EasyBuild module name, "
                             "e.g. eb:PMIx/4.2.6-GCCcore-13.2.0)")
    if toolchain.is_system:
        raise ProvisionError(f"--pmix {spec} needs a compiler toolchain (e.g. --toolchain "
                             "GCC/13.2.0): EasyBuild PMIx modules are built with one; with "
                             "--toolchain SYSTEM use --pmix system or --pmix internal")
    version, tc_name, tc_version = match.groups()
    dependency = ("PMIx", version, "", (tc_name, tc_version)) if tc_name else ("PMIx", version)
    return Pmix(kind, entry["title"], opts, entry["check"], version=version, module=rest,
                dependency=dependency)


def contradictions(configopts) -> list[str]:
    """Configure options given twice with different meanings (--with-x=a and --with-x=b,
    --enable-x and --disable-x), one line each."""
    seen: dict[str, str] = {}
    found = []
    for opt in configopts:
        match = _OPTION.fullmatch(opt)
        if not match:
            continue
        verb, feature, value = match.groups()
        kind = "with" if verb in ("with", "without") else "enable"
        meaning = (f"{value}" if value is not None else "yes") if verb in ("with", "enable") \
            else "no"
        key = f"{kind}-{feature}"
        if key in seen and seen[key] != meaning:
            found.append(f"--{key}: {seen[key]} and {meaning}")
        seen.setdefault(key, meaning)
    return found


@dataclass(frozen=True)
class Source:
    file: str
    sha256: str
    urls: tuple[str, ...]
    get: str


def source_dirs(folder: Path, name: str) -> list[Path]:
    """Where eb looks for a source file in one source path folder (easyblock.obtain_file)."""
    return [folder / name[0].lower() / name, folder / name, folder]


def find_source(sources: list[Source], paths: list[Path], name: str):
    """(the source to use, where it was found or None): the first listed source present in
    ``paths``; the first listed one (eb downloads it) when none is."""
    for source in sources:
        for folder in paths:
            for where in source_dirs(folder, name):
                if (where / source.file).is_file():
                    return source, where / source.file
    return sources[0], None


# ----------------------------------------------------------------------------- the build
@dataclass
class Lmod:
    tool: str  # EasyBuild's --modules-tool name
    command: str  # LMOD_CMD ("" when the site configured another modules tool)

    @property
    def init(self) -> Path | None:
        """Lmod's sh init (defines `module`), for shells without it."""
        if not self.command:
            return None
        path = Path(self.command).parent.parent / "init" / "profile"
        return path if path.is_file() else None


def find_modules_tool(env) -> Lmod | None:
    """The modules tool eb will use: the site's EASYBUILD_MODULES_TOOL when it is not Lmod,
    else Lmod through $LMOD_CMD, `lmod` on PATH, or the usual install folders."""
    from dsenv import proc

    configured = env.get("EASYBUILD_MODULES_TOOL", "")
    if configured and configured != "Lmod":
        return Lmod(configured, "")
    for path in (env.get("LMOD_CMD", ""), proc.which("lmod", env) or "",
                 *table()["lmod"]["commands"]):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return Lmod("Lmod", path)
    return None


@dataclass
class OpenMpiBuild:
    version: str
    series: dict
    toolchain: Toolchain
    pmix: Pmix
    sources: list[Source]
    source: Source
    source_found: Path | None
    sourcepaths: list[Path]
    installpath: Path
    eb: str | None
    modules_tool: Lmod | None
    env_prefix: Path | None = None
    jobs: int | None = None
    robot: bool = False
    robot_paths: str = ""
    rebuild: bool = False
    timeout_min: float = 240.0
    notes: list[str] = field(default_factory=list)

    # -- names EasyBuild will use (default module naming scheme) --
    @property
    def versionsuffix(self) -> str:
        return table()["versionsuffix"]

    @property
    def module_version(self) -> str:
        return f"{self.version}{self.toolchain.module_part()}{self.versionsuffix}"

    @property
    def module_name(self) -> str:
        return f"{table()['name']}/{self.module_version}"

    @property
    def modulepath(self) -> Path:
        return self.installpath.joinpath(*MODULES_SUBDIR)

    def module_files(self) -> list[Path]:
        """The module file eb writes: .lua for Lmod, no extension for Tcl modules tools."""
        base = self.modulepath / self.module_name
        return [base.with_name(base.name + ".lua"), base]

    @property
    def software_dir(self) -> Path:
        return self.installpath / "software" / table()["name"] / self.module_version

    @property
    def easyconfig_path(self) -> Path:
        return self.installpath / WORK_DIR / f"{self.module_name.replace('/', '-')}.eb"

    @property
    def log_path(self) -> Path:
        return self.easyconfig_path.with_suffix(".log")

    # -- what goes into the easyconfig --
    def configopts(self) -> list[str]:
        return [*self.series["configopts"], *self.toolchain.configopts, *self.pmix.configopts]

    def sanity_commands(self) -> list[str]:
        return [*self.series["sanity_commands"], self.series["pmix_check"][self.pmix.check]]

    def easyconfig(self) -> str:
        data = table()
        lines = [
            f"# Written by `dsenv provision openmpi`: Open MPI {self.version} that Slurm can "
            "launch directly",
            "# (srun --mpi=pmix) and whose mpirun reads the allocation.",
            f"# PMIx: {self.pmix.describe()}",
            "",
            f"easyblock = {data['easyblock']!r}",
            "",
            f"name = {data['name']!r}",
            f"version = {self.version!r}",
            f"versionsuffix = {self.versionsuffix!r}",
            "",
            f"homepage = {data['homepage']!r}",
            f"description = {data['description']!r}",
            "",
            f"toolchain = {self.toolchain.easyconfig()}",
            "",
            f"source_urls = {list(self.source.urls)!r}",
            f"sources = [{self.source.file!r}]",
            f"checksums = [{{{self.source.file!r}: {self.source.sha256!r}}}]",
            "",
        ]
        if self.pmix.dependency:
            lines += [f"dependencies = [{self.pmix.dependency!r}]", ""]
        lines += [f"configopts = {' '.join(self.configopts())!r}", "",
                  "sanity_check_paths = {",
                  f"    'files': {list(self.series['sanity_files'])!r},",
                  "    'dirs': [],",
                  "}",
                  "sanity_check_commands = ["]
        lines += [f"    {command!r}," for command in self.sanity_commands()]
        lines += ["]", "", f"moduleclass = {data['moduleclass']!r}", ""]
        return "\n".join(lines)

    # -- the eb run --
    def eb_env(self) -> dict[str, str]:
        """The variables dsenv sets for eb (on top of the caller's environment)."""
        env = {}
        if self.modules_tool and self.modules_tool.command:
            env["EASYBUILD_MODULES_TOOL"] = "Lmod"
            env["LMOD_CMD"] = self.modules_tool.command
        return env

    def eb_command(self) -> list[str]:
        command = [self.eb or "eb", str(self.easyconfig_path),
                   f"--installpath={self.installpath}"]
        if self.sourcepaths:
            command.append("--sourcepath=" + os.pathsep.join(map(str, self.sourcepaths)))
        if self.robot:
            command.append("--robot")
        if self.robot_paths:
            command.append(f"--robot-paths={self.robot_paths}")
        if self.jobs:
            command.append(f"--parallel={self.jobs}")
        if self.rebuild:
            command.append("--rebuild")
        return command

    def module_lines(self) -> list[str]:
        return [f"module use {shlex.quote(str(self.modulepath))}",
                f"module load {self.module_name}"]

    def header(self) -> list[str]:
        where = (f"found at {self.source_found}" if self.source_found else
                 "not in the source path: eb downloads it from "
                 + ", ".join(self.source.urls))
        tool = self.modules_tool
        lines = [f"dsenv provision openmpi: Open MPI {self.version} for Slurm + PMIx, built by "
                 "EasyBuild",
                 f"  module     {self.module_name} (module use {self.modulepath})",
                 f"  toolchain  {self.toolchain.describe()}",
                 f"  pmix       {self.pmix.describe()}",
                 f"  source     {self.source.file} {where}",
                 f"  eb         {self.eb or 'not found'}; modules tool "
                 + (f"{tool.tool} {tool.command}".rstrip() if tool else "not found")]
        if self.env_prefix:
            lines.append(f"  env        {self.env_prefix} (activate and manifest get the "
                         "module lines)")
        lines += [f"  note       {note}" for note in self.notes]
        return lines

    def render(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.eb_env().items()))
        command = " ".join(shlex.quote(part) for part in self.eb_command())
        return "\n".join([
            *self.header(), "",
            EASYCONFIG_BEGIN.format(path=self.easyconfig_path),
            self.easyconfig().rstrip("\n"),
            EASYCONFIG_END, "",
            f"eb command (output to {self.log_path}, timeout {self.timeout_min:g} min):",
            "$ " + (env + " " if env else "") + command, "",
            "then: " + "; ".join(self.module_lines())])


def make_build(args, env=None) -> OpenMpiBuild:
    """Every choice resolved and checked; nothing written (one line on bad input)."""
    from dsenv import proc

    from .command import resolve_prefix

    env = dict(os.environ if env is None else env)
    data = table()
    dry_run = bool(args.ompi_dry_run or getattr(args, "dry_run", False))
    version = args.ompi_version or data["default_version"]
    if version not in data["versions"]:
        raise ProvisionError(f"--version {version}: dsenv knows Open MPI "
                             f"{', '.join(data['versions'])} (envs/openmpi.toml [versions])")
    entry = data["versions"][version]
    series = data["series"][entry["series"]]
    toolchain = parse_toolchain(args.toolchain or data["default_toolchain"])
    pmix = parse_pmix(args.pmix or data["default_pmix"], toolchain, env)
    configopts = [*series["configopts"], *toolchain.configopts, *pmix.configopts]
    clashes = contradictions(configopts)
    if clashes:
        raise ProvisionError("envs/openmpi.toml gives contradictory configure options: "
                             + "; ".join(clashes))
    # eb's own defaults: $EASYBUILD_INSTALLPATH / $EASYBUILD_SOURCEPATH, else under
    # $EASYBUILD_PREFIX, else ~/.local/easybuild
    eb_prefix = env.get("EASYBUILD_PREFIX") or os.path.join(env.get("HOME", "~"), ".local",
                                                            "easybuild")
    installpath = resolve_prefix(args.installpath or env.get("EASYBUILD_INSTALLPATH")
                                 or eb_prefix)
    sources = [Source(s["file"], s["sha256"], tuple(s["urls"]), s["get"])
               for s in entry["sources"]]
    sourcepaths = [Path(p).expanduser().absolute()
                   for p in (args.sourcepath or "").split(os.pathsep) if p]
    for folder in sourcepaths:
        if not folder.is_dir():
            raise ProvisionError(f"--sourcepath {folder}: no such folder")
    searched = sourcepaths or [Path(p).expanduser() for p in
                               (env.get("EASYBUILD_SOURCEPATH")
                                or os.path.join(eb_prefix, "sources")).split(os.pathsep) if p]
    source, found = find_source(sources, searched, data["name"])
    eb = args.eb or proc.which("eb", env)
    if eb and not (os.path.isfile(eb) and os.access(eb, os.X_OK)):
        raise ProvisionError(f"--eb {eb}: not an executable file")
    tool = find_modules_tool(env)
    env_prefix = None
    if args.env_prefix:
        env_prefix = Path(args.env_prefix).expanduser().absolute()
        from .activation import ACTIVATE_NAME
        from .manifest import MANIFEST_NAME

        missing = [name for name in (ACTIVATE_NAME, MANIFEST_NAME)
                   if not (env_prefix / name).is_file()]
        if missing:
            raise ProvisionError(f"--env {env_prefix}: no {' or '.join(missing)} there: pass "
                                 "an environment made by `dsenv provision` (its prefix)")
    build = OpenMpiBuild(
        version=version, series=series, toolchain=toolchain, pmix=pmix, sources=sources,
        source=source, source_found=found, sourcepaths=sourcepaths, installpath=installpath,
        eb=eb, modules_tool=tool, env_prefix=env_prefix, jobs=args.jobs, robot=args.robot,
        robot_paths=args.robot_paths or "", rebuild=args.rebuild,
        timeout_min=args.timeout or data["default_timeout_min"])

    problems = []
    if found is None and sourcepaths:
        names = " or ".join(s.file for s in sources)
        ways = "; ".join(f"{s.file}: {s.get}" for s in sources)
        problems.append(f"--sourcepath {os.pathsep.join(map(str, sourcepaths))} has no "
                        f"{names} (eb looks in DIR, DIR/{data['name']} and "
                        f"DIR/{data['name'][0].lower()}/{data['name']}): get it on a machine "
                        f"with internet ({ways}) and copy it there")
    if eb is None:
        problems.append("no `eb` on PATH: install EasyBuild (`pip install easybuild`, or "
                        "`module load EasyBuild`), or pass --eb EXE")
    if tool is None:
        problems.append("no Lmod for EasyBuild's modules (no $LMOD_CMD, no lmod in "
                        + ", ".join(data["lmod"]["commands"][:2]) + "): install Lmod "
                        "(Debian/Ubuntu: `apt-get install lmod`, RHEL: `dnf install Lmod`), "
                        "set LMOD_CMD to its libexec/lmod, or set EASYBUILD_MODULES_TOOL to "
                        "the site's modules tool")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not env.get(AS_ROOT_VARIABLE):
        problems.append(f"running as root, which EasyBuild refuses: build as a normal user, "
                        f"or export {AS_ROOT_VARIABLE}=1 (containers, test machines)")
    if dry_run:
        build.notes += problems
    elif problems:
        raise ProvisionError(problems[0])
    if found is None and not sourcepaths:
        build.notes.append(f"no {source.file} in eb's source path ("
                           f"{os.pathsep.join(map(str, searched))}): eb downloads it, which "
                           "needs internet (offline nodes: --sourcepath DIR)")
    return build


# ----------------------------------------------------------------------------- carrying out
def _eb_error(log: Path) -> str:
    """The last line of eb's output that says what failed."""
    from dsenv.redact import Redactor

    try:
        with open(log, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            tail = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for pattern in ("ERROR:", "FAILED:", "Error:"):
        hits = [line.strip() for line in tail if pattern in line]
        if hits:
            return Redactor(os.environ).scrub(hits[-1])[:400]
    return ""


def _scaffolding(build: OpenMpiBuild) -> list[Path]:
    """The folders eb creates on the way to this build's software folder and module file,
    deepest first (installpath/software/OpenMPI, installpath/software/.locks, modules/all...)."""
    folders = {build.installpath / "software" / ".locks"}
    # eb also links the module under modules/<moduleclass>/ (modules/mpi/OpenMPI/...)
    by_class = build.installpath / MODULES_SUBDIR[0] / table()["moduleclass"] / build.module_name
    for path in (build.software_dir, build.module_files()[0], by_class):
        folders.update(p for p in path.parents if build.installpath in (p, *p.parents))
    return sorted(folders, key=lambda p: len(p.parts), reverse=True)


def run_eb(build: OpenMpiBuild, argv: list[str]) -> float:
    """Write the easyconfig, run eb into the log; on failure remove this build's leftovers
    and raise ProvisionError naming the log. Returns eb's wall time in seconds."""
    from dsenv import proc

    new_folders = [p for p in _scaffolding(build) if not p.exists()]
    leftovers = [p for p in (build.software_dir, *build.module_files())
                 if not (p.exists() or p.is_symlink())]
    work = build.easyconfig_path.parent
    work.mkdir(parents=True, exist_ok=True)
    temp = build.easyconfig_path.with_name(f".{build.easyconfig_path.name}.tmp-{os.getpid()}")
    temp.write_text(build.easyconfig(), encoding="utf-8")
    os.replace(temp, build.easyconfig_path)
    # eb's console output wraps at 80 columns when it is not a terminal: wide enough that
    # its error lines stay whole in the log
    env = {**os.environ, "COLUMNS": "250", **build.eb_env()}
    command = build.eb_command()
    build.log_path.write_text(
        f"# dsenv provision openmpi {' '.join(shlex.quote(a) for a in argv[3:])}\n"
        f"# {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n"
        "$ " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(build.eb_env().items()))
        + " " + " ".join(shlex.quote(part) for part in command) + "\n", encoding="utf-8")
    started = time.monotonic()
    result = proc.run(command, timeout=build.timeout_min * 60, env=env,
                      cwd=str(work), output=build.log_path)
    seconds = time.monotonic() - started
    if result.ok:
        return seconds
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for folder in new_folders:  # deepest first; the installpath keeps the dsenv/ folder
        try:
            folder.rmdir()
        except OSError:
            pass
    if result.timed_out:
        how = f"did not finish within {build.timeout_min:g} min (stopped; --timeout MIN)"
    elif result.not_found:
        how = f"could not be started ({result.stderr.strip() or 'not found'})"
    else:
        how = f"exited {result.returncode}"
    detail = _eb_error(build.log_path)
    raise ProvisionError(f"eb {how}" + (f": {detail.rstrip('.')}" if detail else "")
                         + f"; full output in {build.log_path}")


def installed_module(build: OpenMpiBuild) -> Path | None:
    return next((p for p in build.module_files() if p.is_file()), None)


def judge_install(build: OpenMpiBuild):
    """The mpi.ompi-support verdict on the built Open MPI (its bin first on PATH, as
    `module load` puts it), for a compute node about to run `srun --mpi=pmix`."""

    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(build.software_dir / "bin"), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(build.software_dir / "lib"), env.get("LD_LIBRARY_PATH", "")) if p)
    ctx = Context(options=Options(target="compute", launcher="srun", probe_timeout=60),
                  env=env)
    return ompi_support(ctx)


def module_block(build: OpenMpiBuild) -> str:
    """The activate script's lines that load the module (replaced on every record)."""
    module_use, module_load = build.module_lines()
    lines = [BLOCK_BEGIN,
             f"# Open MPI for Slurm + PMIx built by EasyBuild (`dsenv provision openmpi`): "
             f"{build.module_name}.",
             "# Batch shells started without a login profile have no `module`: Lmod's own "
             "init defines it."]
    init = build.modules_tool.init if build.modules_tool else None
    if init:
        quoted = shlex.quote(str(init))
        lines += ["if ! command -v module >/dev/null 2>&1 && [ -r " + quoted + " ]; then",
                  f"    . {quoted} >/dev/null",
                  "fi"]
    shown = module_load.replace("'", "")
    lines += ["if command -v module >/dev/null 2>&1; then",
              f"    {module_use}",
              f"    {module_load} || echo \"dsenv activate: \\`{shown}\\` failed\" >&2",
              "else",
              f"    echo \"dsenv activate: no module command: {build.module_name} not "
              "loaded\" >&2",
              "fi",
              BLOCK_END]
    return "\n".join(lines) + "\n"


def with_block(text: str, block: str) -> str:
    """``text`` with its dsenv openmpi block replaced by ``block`` (appended when absent)."""
    pattern = re.compile(re.escape(BLOCK_BEGIN) + r".*?" + re.escape(BLOCK_END) + r"\n?",
                         re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block


def record_in_env(build: OpenMpiBuild, verdict, argv: list[str]) -> None:
    """The module lines into <env>/activate and <env>/dsenv-env.json, each written to a
    temporary file and renamed into place."""
    from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically

    from .activation import ACTIVATE_NAME
    from .manifest import manifest_path, redact_command

    prefix = build.env_prefix
    activate = prefix / ACTIVATE_NAME
    try:
        manifest = read_json(manifest_path(prefix), "environment manifest")
    except JsonFileError as exc:
        raise ProvisionError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise ProvisionError(f"{manifest_path(prefix)}: not a dsenv manifest (not an object)")
    manifest[MANIFEST_KEY] = {
        "module": build.module_name, "modulepath": str(build.modulepath),
        "easyconfig": str(build.easyconfig_path), "software": str(build.software_dir),
        "toolchain": build.toolchain.describe(), "pmix": build.pmix.describe(),
        "ompi_support": f"{verdict.status.value}: {verdict.summary}",
        "command": redact_command(list(argv)),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    text = with_block(activate.read_text(encoding="utf-8"), module_block(build))
    temp = activate.with_name(f".{ACTIVATE_NAME}.tmp-{os.getpid()}")
    temp.write_text(text, encoding="utf-8")
    temp.chmod(activate.stat().st_mode & 0o777)
    write_json_atomically(manifest_path(prefix), manifest, indent=2)
    os.replace(temp, activate)


def provision_openmpi(build: OpenMpiBuild, argv: list[str]) -> int:
    existing = installed_module(build)
    if existing and not build.rebuild:
        print(f"{build.module_name} is already installed ({existing}); --rebuild builds it "
              "again")
    else:
        print(f"building {build.module_name} with eb (output: {build.log_path}) ...",
              flush=True)
        seconds = run_eb(build, argv)
        if installed_module(build) is None:
            raise ProvisionError(f"eb finished but wrote no module file at "
                                 f"{build.module_files()[0]}: does the site's EasyBuild "
                                 "configuration set another module naming scheme or modules "
                                 f"path? (see {build.log_path})")
        print(f"eb built {build.module_name} in {seconds:.0f} s")
    verdict = judge_install(build)
    print(f"doctor mpi.ompi-support: {verdict.status.value}: {verdict.summary}")
    for line in verdict.evidence:
        print(f"  {line}")
    if verdict.status is not Status.OK:
        raise ProvisionError(f"{build.module_name} is installed but the doctor judges it "
                             f"{verdict.status.value}: {verdict.summary}"
                             + (f" ({verdict.fix})" if verdict.fix else ""))
    if build.env_prefix:
        record_in_env(build, verdict, argv)
        print(f"recorded in {build.env_prefix}/activate and dsenv-env.json: "
              f"`. {build.env_prefix}/activate` loads {build.module_name}")
    print("load it with:")
    for line in build.module_lines():
        print(f"    {line}")
    entries = ", ".join(f'"{line.removeprefix("module ").removeprefix("load ")}"'
                        for line in build.module_lines())
    print(f"site profile (envs/sites/<site>.toml): modules = [{entries}]")
    return 0

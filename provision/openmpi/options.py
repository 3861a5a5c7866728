"""The choices of ``dsenv provision openmpi``, each parsed and checked against
envs/openmpi.toml: the compiler toolchain, the PMIx (the system's, an EasyBuild module, or the
bundled one), the source tarball in eb's source path, and the modules tool eb writes for."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv import proc
from dsenv.data import load_table
from dsenv.provision import ProvisionError

DATA = ("dsenv.envs", "openmpi.toml")
_TOOLCHAIN_SPEC = re.compile(r"([A-Za-z][\w-]*)/(\d[\w.+-]*)")
# PMIx/4.2.6 or PMIx/4.2.6-GCCcore-13.2.0 (EasyBuild's module name: version-toolchain-version)
_PMIX_MODULE = re.compile(r"PMIx/(\d[\w.]*)(?:-([A-Za-z][\w-]*)-(\d[\w.]*))?")
_OPTION = re.compile(r"--(with|without|enable|disable)-([\w-]+)(?:=(.*))?")


def table() -> dict:
    """envs/openmpi.toml: the versions, toolchains, PMIx choices and easyconfig pieces."""
    return load_table(*DATA)


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
    configured = env.get("EASYBUILD_MODULES_TOOL", "")
    if configured and configured != "Lmod":
        return Lmod(configured, "")
    for path in (env.get("LMOD_CMD", ""), proc.which("lmod", env) or "",
                 *table()["lmod"]["commands"]):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return Lmod("Lmod", path)
    return None

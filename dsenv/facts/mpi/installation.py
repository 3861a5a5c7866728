"""Which MPI provides mpirun (or mpiexec) on PATH, and how Open MPI was built (ompi_info).

Parsers are pure functions (text in, data out) fed recorded real outputs in the tests:
``mpirun --version`` of Open MPI / MPICH (Hydra) / Intel MPI and ``ompi_info`` (plain and
``--parsable``). Every command runs once per doctor run (``@probe``) and through ``node.run``.
What Slurm's srun offers is :mod:`.slurm`, the dynamic linker's view :mod:`.sharedlibs`,
mpi4py :mod:`.mpi4py_abi`, the real 2-rank launch :mod:`.mpi_launch_probe`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.facts import cmdcache
from dsenv.facts.node import Node, probe

# -- the MPI behind mpirun / mpiexec ------------------------------------------------------------

ABI = {"openmpi": "openmpi", "mpich": "mpich", "intelmpi": "mpich", "craympich": "mpich",
       "mvapich": "mpich"}
# The one reason every check gives when no MPI is found (the screen folds them as one).
NO_MPI = "no MPI on PATH"
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
def mpi_install(node: Node) -> MpiInstall | None:
    """The MPI that provides mpirun (else mpiexec) on PATH; Cray MPICH from its module env."""
    cray = cray_mpich(node.env)
    for name in ("mpirun", "mpiexec"):
        path = node.which(name)
        if not path:
            continue
        result = node.run([path, "--version"])
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


def ompi_info_path(node: Node) -> str | None:
    """The ompi_info that belongs to the mpirun on PATH (same folder), else the one on PATH."""
    mpirun = node.which("mpirun") or node.which("mpiexec")
    if mpirun:
        sibling = Path(mpirun).parent / "ompi_info"
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return str(sibling)
        return None  # mpirun is not Open MPI's (or it has no ompi_info): don't mix installs
    return node.which("ompi_info")


@probe
def ompi_info(node: Node) -> tuple[OmpiInfo | None, str]:
    """(parsed ompi_info --parsable, how it ended) for the Open MPI that owns mpirun."""
    path = ompi_info_path(node)
    if path is None:
        return None, "no ompi_info next to mpirun"
    result, cached = cmdcache.cached_run(
        node, [path, "--parsable"], watch=[os.path.realpath(path)], more_watch=_ompi_folders,
        variables=("OPAL_PREFIX", "LD_LIBRARY_PATH", "OMPI_MCA_*"))
    if not result.ok:
        return None, result.describe()
    return parse_ompi_info(result.stdout), f"`{path} --parsable`" + (" (cached)" if cached
                                                                     else "")


def _ompi_folders(stdout: str) -> list[str]:
    """Where an Open MPI install keeps what ompi_info reports: its lib folders (the MCA
    components, Debian's multiarch layout too) and its etc/."""
    prefix = parse_ompi_info(stdout).prefix
    if not prefix:
        return []
    root = Path(prefix)
    found = [root / "lib", root / "lib64", root / "etc", root / "lib" / "openmpi",
             *root.glob("lib/*/openmpi/lib/openmpi*")]
    return [str(p) for p in found]

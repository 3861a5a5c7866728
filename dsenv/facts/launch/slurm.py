"""What Slurm's srun offers MPI: ``srun --mpi=list``, slurm.conf's MpiDefault, and whether
the pmix plugin can load the PMIx library it was built against.

Parsers are pure functions fed recorded real outputs in the tests (``srun --mpi=list`` of
Slurm 17-23, slurm.conf files, mpi_pmix.so plugins).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node, probe
from dsenv.facts.python.sharedlibs import find_library


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
def srun_mpi_list(node: Node) -> tuple[SrunPlugins | None, str]:
    srun = node.which("srun")
    if not srun:
        return None, "srun not found on PATH"
    result = node.run([srun, "--mpi=list"])
    parsed = parse_srun_mpi_list(result.stdout + "\n" + result.stderr)
    if not parsed.plugins:
        return None, result.describe()
    return parsed, f"`{srun} --mpi=list`"


def slurm_conf_path(node: Node) -> Path | None:
    configured = node.env.get("SLURM_CONF")
    candidates = [node.path(configured)] if configured else []
    candidates += [node.path("/etc/slurm/slurm.conf"), node.path("/etc/slurm-llnl/slurm.conf")]
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


def slurm_conf(node: Node) -> tuple[dict[str, str], str | None]:
    path = slurm_conf_path(node)
    if path is None:
        return {}, None
    try:
        return parse_slurm_conf(path.read_text(errors="replace")), str(path)
    except OSError:
        return {}, None


def srun_mpi_type(node: Node) -> tuple[str, str]:
    """(plugin srun will use, where that came from): SLURM_MPI_TYPE, else MpiDefault."""
    if node.env.get("SLURM_MPI_TYPE"):
        return node.env["SLURM_MPI_TYPE"], "SLURM_MPI_TYPE"
    conf, where = slurm_conf(node)
    if conf.get("mpidefault"):
        return conf["mpidefault"], f"MpiDefault in {where}"
    return "none", "Slurm's default (MpiDefault unset)" + (f" in {where}" if where else "")


PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
               "/usr/lib64/slurm", "/usr/lib/slurm", "/usr/local/lib/slurm",
               "/opt/slurm/lib/slurm", "/opt/slurm/lib64/slurm")


def pmix_plugin_files(node: Node) -> list[Path]:
    conf, _ = slurm_conf(node)
    folders = [node.path(d) for d in conf.get("plugindir", "").split(":") if d]
    srun = node.which("srun")
    if srun:
        prefix = Path(os.path.realpath(srun)).parent.parent
        folders += [prefix / "lib" / "slurm", prefix / "lib64" / "slurm"]
    folders += [node.path(d) for d in PLUGIN_DIRS]
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


def find_pmix_library(node: Node) -> PmixLibrary:
    """Can Slurm's pmix plugin load its PMIx library? (srun lists pmix even when it cannot)."""
    plugins = pmix_plugin_files(node)
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
                if node.path(candidate).exists():
                    return PmixLibrary(candidate, tuple(wanted), str(plugin))
            return PmixLibrary(None, tuple(wanted), str(plugin))
        found = find_library(node, names)
        return PmixLibrary(found, tuple(names), str(plugin))
    found = find_library(node, ["libpmix.so", "libpmix.so.2"])
    return PmixLibrary(found, ("libpmix.so", "libpmix.so.2"))

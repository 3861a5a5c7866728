"""Site profiles: what a cluster needs around a DeepSpeed environment (envs/sites/*.toml).

A profile names the cluster's defaults (GPU arch, environment kind, stack), the modules to
load, the container runtime and image, the launcher, the Hugging Face cache and offline
policy, and the NCCL/RCCL/libfabric variables its network needs. Each TOML file documents
every field with the public source it comes from. ``dsenv.envs.sites`` is a package (not a
module beside the folder) so the TOML files install with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

from dsenv.data import load_table
from dsenv.envs.launchers import LAUNCHERS
from dsenv.envs.stacks import load_stacks
from dsenv.envs.targets import resolve_arch
from dsenv.errors import UsageError
from dsenv.redact import is_secret_name

KINDS = ("venv", "container", "conda")
CONTAINER_RUNTIMES = ("singularity", "apptainer", "sarus", "podman", "docker")
BUSBW_SCOPES = ("intra_node", "inter_node")  # all ranks on one node | ranks on several nodes
MODULE_SUBCOMMANDS = ("load", "swap", "switch", "unload", "use", "purge", "restore")
DEFAULT_SITE = "generic"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Container:
    runtime: str  # singularity | apptainer | sarus | podman | docker
    image: str
    binds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Site:
    name: str
    title: str
    sources: tuple[str, ...]
    vendor: str  # "nvidia" | "amd" | "" (any)
    default_arch: str  # an --arch spec, "" when the user must say
    default_kind: str  # venv | container | conda
    default_stack: str  # a stacks.toml name, "" to choose from the target
    modules: tuple[str, ...] = ()  # `module <entry>`; a bare name means `module load <name>`
    launcher: str = ""
    # #SBATCH --account/--partition/--time of the job scripts `dsenv launch` writes ("" = none:
    # Slurm's defaults, and launch says so); --account/--partition/--time override them
    account: str = ""
    partition: str = ""
    time: str = ""
    srun_mpi: str = ""  # srun --mpi=<plugin> for srun-launched steps
    hf_home: str = ""  # "" = leave HF_HOME as the user has it
    offline_on_compute: bool = True
    env_root: str = ""  # where environments should live ("" = anywhere)
    # where `dsenv provision` keeps built DeepSpeed wheels (provision/ops/cache.py): a shared
    # file system lets every job of the site reuse one build ("" = ~/.cache/dsenv/ops-cache)
    ops_cache: str = ""
    # where `dsenv provision` writes each environment's Lmod modulefile (a MODULEPATH folder;
    # "" = none unless --modulefile asks)
    modulefiles: str = ""
    env: dict[str, str] = field(default_factory=dict)  # NCCL/RCCL/FI/MIOPEN variables
    container: Container | None = None
    # all-reduce bus bandwidth (GB/s) a healthy job reaches: `dsenv doctor --distributed`
    expect_busbw_gbps: dict[str, float] = field(default_factory=dict)

    def module_commands(self) -> list[list[str]]:
        """The modules as argument lists for `module`: ['load', 'cuda/12.6'], ['swap', ...]."""
        commands = []
        for entry in self.modules:
            words = entry.split()
            if words and words[0] not in MODULE_SUBCOMMANDS:
                words = ["load", *words]
            commands.append(words)
        return commands


def site_names() -> list[str]:
    """Every profile shipped in envs/sites/ (file names without .toml), sorted."""
    folder = resources.files(__name__)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _problems(name: str, raw: dict) -> list[str]:
    found = []
    if raw.get("name") != name:
        found.append(f"name = {raw.get('name')!r}, but the file is {name}.toml")
    if raw.get("default_kind") not in KINDS:
        found.append(f"default_kind {raw.get('default_kind')!r} is not one of {', '.join(KINDS)}")
    if raw.get("launcher", "") not in ("", *LAUNCHERS):
        found.append(f"launcher {raw.get('launcher')!r} is not one of {', '.join(LAUNCHERS)}")
    stack = raw.get("default_stack", "")
    stacks = load_stacks()
    if stack and stack not in stacks:
        found.append(f"default_stack {stack!r} is not in envs/stacks.toml")
    elif stack and raw.get("vendor") and stacks[stack].vendor != raw["vendor"]:
        found.append(f"default_stack {stack} is built for {stacks[stack].vendor}, the site "
                     f"is {raw['vendor']}")
    if raw.get("default_arch"):
        try:
            target = resolve_arch(raw["default_arch"])
        except UsageError as exc:
            found.append(f"default_arch: {exc}")
        else:
            if raw.get("vendor") and target.vendor != raw["vendor"]:
                found.append(f"default_arch {raw['default_arch']} is {target.vendor}, the site "
                             f"is {raw['vendor']}")
    for key, value in (raw.get("env") or {}).items():
        if not _ENV_NAME.fullmatch(key):
            found.append(f"[env] {key!r} is not a variable name")
        elif is_secret_name(key):
            found.append(f"[env] {key} looks like a credential: site profiles never carry "
                         "secrets")
        if not isinstance(value, str):
            found.append(f"[env] {key} must be a string")
    for key in ("account", "partition", "time"):
        if not isinstance(raw.get(key, ""), str):
            found.append(f"{key} must be a string (#SBATCH --{key} of `dsenv launch`)")
    if not isinstance(raw.get("ops_cache", ""), str):
        found.append("ops_cache must be a folder path (a string)")
    if not isinstance(raw.get("modulefiles", ""), str):
        found.append("modulefiles must be a folder path (a string)")
    busbw = raw.get("expect_busbw_gbps") or {}
    if not isinstance(busbw, dict):
        found.append("expect_busbw_gbps must be a table (intra_node = GB/s, inter_node = GB/s)")
        busbw = {}
    for key, value in busbw.items():
        if key not in BUSBW_SCOPES:
            found.append(f"[expect_busbw_gbps] {key!r} is not one of {', '.join(BUSBW_SCOPES)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            found.append(f"[expect_busbw_gbps] {key} must be a number of GB/s above 0")
    container = raw.get("container")
    if raw.get("default_kind") == "container" and not container:
        found.append("default_kind is container but there is no [container] table")
    if container and container.get("runtime") not in CONTAINER_RUNTIMES:
        found.append(f"[container] runtime {container.get('runtime')!r} is not one of "
                     f"{', '.join(CONTAINER_RUNTIMES)}")
    return found


def load_site(name: str | None = None) -> Site:
    """The profile ``name`` (default: generic). UsageError for an unknown or broken one."""
    name = name or DEFAULT_SITE
    names = site_names()
    if name not in names:
        raise UsageError(f"--site {name}: unknown site; known sites: {', '.join(names)} "
                             "(or add envs/sites/<name>.toml)")
    raw = load_table(__name__, f"{name}.toml")
    problems = _problems(name, raw)
    if problems:
        raise UsageError(f"envs/sites/{name}.toml is broken: " + "; ".join(problems))
    container = raw.get("container")
    return Site(
        name=raw["name"], title=raw.get("title", name), sources=tuple(raw.get("sources", ())),
        vendor=raw.get("vendor", ""), default_arch=raw.get("default_arch", ""),
        default_kind=raw["default_kind"], default_stack=raw.get("default_stack", ""),
        modules=tuple(raw.get("modules", ())), launcher=raw.get("launcher", ""),
        account=raw.get("account", ""), partition=raw.get("partition", ""),
        time=raw.get("time", ""),
        srun_mpi=raw.get("srun_mpi", ""), hf_home=raw.get("hf_home", ""),
        offline_on_compute=bool(raw.get("offline_on_compute", True)),
        env_root=raw.get("env_root", ""), ops_cache=raw.get("ops_cache", ""),
        modulefiles=raw.get("modulefiles", ""),
        env=dict(raw.get("env") or {}),
        expect_busbw_gbps={k: float(v) for k, v in (raw.get("expect_busbw_gbps") or {}).items()},
        container=Container(container["runtime"], container.get("image", ""),
                            tuple(container.get("binds", ()))) if container else None)

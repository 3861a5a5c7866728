"""What activating an environment sets, described once: the activate script (activation.py,
POSIX sh) and the environment's modulefile (modulefile.py, Lmod Lua) are both rendered from
the one list :func:`environment_settings` returns, so they cannot drift apart.

A list of :class:`Group` s, in order, each with its comment lines and its settings:

    Module(words)          `module <words>` of the site profile (sh: only where `module`
                           exists; Lua: depends_on / swap / unload / MODULEPATH)
    SetVar(name, value)    keep=True: a value the user already exported wins; expand=True:
                           the site's ${NAME}/${NAME:-default} expansions, resolved when the
                           environment is activated or the module loaded
    Prepend(name, path)    a folder first on PATH
    Unset(name)            PYTHONHOME (the module restores it when unloaded)
    SourceHooks(folder)    every *.sh in it (a conda env's etc/conda/activate.d)
    Rehash()               the shell forgets the commands it found before (sh only; Lmod
                           rehashes by itself)

A group with ``in_slurm_job`` applies only inside a Slurm job (SLURM_JOB_ID set).
Variable names with secret-looking names are refused: neither file carries credentials.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.envs.launchers import OFFLINE_VARIABLES
from dsenv.envs.sites import Site
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target
from dsenv.provision import ProvisionError
from dsenv.redact import is_secret_name

EXTENSIONS_DIR = "torch_extensions"
# A ${NAME}, ${NAME:-default} or $NAME expansion: the only shell syntax site values may use.
EXPANSION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+])([^}$`\\\"]*))?\}"
                       r"|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Module:
    words: tuple[str, ...]  # ("load", "cuda/12.6"), ("swap", "A", "B"), ("use", DIR)


@dataclass(frozen=True)
class SetVar:
    name: str
    value: str
    keep: bool = False  # a value the user already exported wins
    expand: bool = False  # ${NAME} expansions in the value are resolved on activation
    note: str = ""  # a comment line before it


@dataclass(frozen=True)
class Prepend:
    name: str
    path: str


@dataclass(frozen=True)
class Unset:
    name: str


@dataclass(frozen=True)
class SourceHooks:
    folder: str
    note: str = ""


@dataclass(frozen=True)
class Rehash:
    pass


Setting = Module | SetVar | Prepend | Unset | SourceHooks | Rehash


@dataclass(frozen=True)
class Group:
    comment: tuple[str, ...]
    settings: tuple[Setting, ...]
    in_slurm_job: bool = False  # only inside a Slurm job (SLURM_JOB_ID set)

    @property
    def modules(self) -> bool:
        return any(isinstance(s, Module) for s in self.settings)


def expansions(value: str):
    """(literal text, (name, operator, word) or None) pieces of a site value, in order."""
    position = 0
    for match in EXPANSION.finditer(value):
        name = match.group(1) or match.group(4)
        yield value[position:match.start()], (name, match.group(2) or "", match.group(3) or "")
        position = match.end()
    yield value[position:], None


def check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ProvisionError(f"activate script: {name!r} is not a variable name")
    if is_secret_name(name):
        raise ProvisionError(f"activate script: refusing to write {name}: it looks like a "
                             "credential, and activate scripts never carry secrets")


def detect_kind(env_dir: Path) -> str:
    """'venv' (pyvenv.cfg), 'conda' (conda-meta/), else 'prefix' (a bin/ folder to put on
    PATH)."""
    env_dir = Path(env_dir)
    if (env_dir / "pyvenv.cfg").is_file():
        return "venv"
    if (env_dir / "conda-meta").is_dir():
        return "conda"
    return "prefix"


def environment_settings(env_dir: Path, site: Site, target: Target, stack: Stack | None,
                         compute_offline: bool = True, *, kind: str | None = None,
                         extra: tuple[Group, ...] = ()) -> list[Group]:
    """Everything activating ``env_dir`` sets, in order (see the module docstring).

    ``kind``: "venv", "conda" or "prefix" (default: detected from ``env_dir``);
    ``compute_offline``: the Hugging Face offline variables inside Slurm jobs (when the site
    profile also asks for it); ``extra``: groups appended (the CUDA toolkit from wheels).
    """
    env_dir = Path(env_dir).absolute()
    kind = kind or detect_kind(env_dir)
    groups = []
    commands = site.module_commands()
    if commands:
        groups.append(Group(
            (f"Modules of site {site.name} ({', '.join(site.sources) or 'site profile'}),"
             " only where `module` exists (not inside a container).",),
            tuple(Module(tuple(words)) for words in commands)))
    bindir = str(env_dir / "bin")
    if kind == "venv":
        # what bin/activate does, with the path written out: uv's relocatable bin/activate
        # finds its folder through BASH_SOURCE/realpath, which sh (dash) does not have
        own: tuple[Setting, ...] = (SetVar("VIRTUAL_ENV", str(env_dir)), Prepend("PATH", bindir),
                                    Unset("PYTHONHOME"), Rehash())
    elif kind == "conda":
        own = (SetVar("CONDA_PREFIX", str(env_dir)), SetVar("CONDA_DEFAULT_ENV", str(env_dir)),
               Prepend("PATH", bindir),
               SourceHooks(str(env_dir / "etc" / "conda" / "activate.d"),
                           note="packages' activation hooks (cuda-nvcc sets CUDA_HOME, ...)"))
    elif kind == "prefix":
        own = (Prepend("PATH", bindir),)
    else:
        raise ProvisionError(f"activate script: unknown environment kind {kind!r}")
    groups.append(Group((f"The environment ({kind}).",),
                        (*own, SetVar("DSENV_ENV", str(env_dir)))))

    ops: list[Setting] = [SetVar("TORCH_EXTENSIONS_DIR", str(env_dir / EXTENSIONS_DIR))]
    for name, value in target.arch_env().items():
        ops.append(SetVar(name, value, keep=True, note="JIT builds for the archs this "
                          "environment was provisioned for."))
    if target.vendor == "cpu":
        ops.append(SetVar("DS_ACCELERATOR", "cpu", note="CPU stack: DeepSpeed's CPU "
                          "accelerator, chosen without its warning."))
    groups.append(Group(("DeepSpeed's JIT-compiled ops live inside the environment: compiled "
                         "once, reused", "by every job that activates it."), tuple(ops)))

    if site.hf_home:
        groups.append(Group((f"Hugging Face cache of site {site.name} (kept if HF_HOME is "
                             "already set).",),
                            (SetVar("HF_HOME", site.hf_home, keep=True, expand=True),)))
    if compute_offline and site.offline_on_compute:
        groups.append(Group(
            ("Compute nodes of this site have no internet: inside a Slurm job (SLURM_JOB_ID",
             "set) the Hugging Face libraries stay offline instead of hanging on retries; on",
             "the login node they may download (`dsenv fetch` runs there). A job not run by",
             "Slurm is treated as a login session."),
            tuple(SetVar(v, "1") for v in OFFLINE_VARIABLES), in_slurm_job=True))
    if site.env:
        for name in site.env:
            check_name(name)
        groups.append(Group((f"Network and runtime variables of site {site.name} (kept when "
                             "already set).",),
                            tuple(SetVar(name, value, keep=True, expand=True)
                                  for name, value in site.env.items())))
    for group in extra:
        for setting in group.settings:
            if isinstance(setting, SetVar):
                check_name(setting.name)
        groups.append(group)
    return groups

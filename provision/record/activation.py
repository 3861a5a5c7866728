"""The environment's activate script: ``. <env>/activate`` in sh, dash, bash or zsh.

In order: the site's modules (only where a ``module`` command exists: not inside a
container), the environment itself (venv ``bin/activate``, or a conda prefix with its
``etc/conda/activate.d`` hooks), TORCH_EXTENSIONS_DIR inside the environment (JIT-built ops
shared by every job that uses it), the target's TORCH_CUDA_ARCH_LIST / PYTORCH_ROCM_ARCH,
DS_ACCELERATOR=cpu for CPU stacks, HF_HOME, Hugging Face offline mode on compute nodes, and
the site's NCCL/RCCL/libfabric/MIOpen variables.

Variables the user already exported are left alone (export your own value before sourcing
to override one), except the environment's own paths. Values from the site profile may
expand other variables (``${SCRATCH}``, ``${SLURM_NODEID}``, ``${X:-default}``) when the
script is sourced; nothing else in them is interpreted by the shell. The script never
carries credentials: site profiles cannot name one (dsenv.envs.sites) and variables with
secret-looking names are refused here too.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from dsenv import __version__
from dsenv.envs.launchers import OFFLINE_VARIABLES
from dsenv.envs.sites import Site
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target
from dsenv.provision import ProvisionError
from dsenv.redact import is_secret_name
from dsenv.staging import write_file_atomically

ACTIVATE_NAME = "activate"
EXTENSIONS_DIR = "torch_extensions"
# A ${NAME}, ${NAME:-default} or $NAME expansion: the only shell syntax site values may use.
_EXPANSION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?[-=+][^}$`\\\"]*)?\}"
                        r"|\$[A-Za-z_][A-Za-z0-9_]*")


def sh_value(value: str) -> str:
    """``value`` in double quotes for sh: variable expansions kept, everything else literal
    (no command substitution, no backslash or quote tricks)."""
    out, position = [], 0
    for match in _EXPANSION.finditer(value):
        out.append(_literal(value[position:match.start()]))
        out.append(match.group())
        position = match.end()
    out.append(_literal(value[position:]))
    return '"' + "".join(out) + '"'


def _literal(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def detect_kind(env_dir: Path) -> str:
    """'venv' (pyvenv.cfg), 'conda' (conda-meta/), else 'prefix' (a bin/ folder to put on
    PATH)."""
    env_dir = Path(env_dir)
    if (env_dir / "pyvenv.cfg").is_file():
        return "venv"
    if (env_dir / "conda-meta").is_dir():
        return "conda"
    return "prefix"


def _export_default(name: str, value: str) -> str:
    return f'[ -n "${{{name}+x}}" ] || export {name}={value}'


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ProvisionError(f"activate script: {name!r} is not a variable name")
    if is_secret_name(name):
        raise ProvisionError(f"activate script: refusing to write {name}: it looks like a "
                             "credential, and activate scripts never carry secrets")


def render_activation(env_dir: Path, site: Site, target: Target, stack: Stack | None,
                      compute_offline: bool = True, *, kind: str | None = None) -> str:
    """The text of ``<env_dir>/activate`` (POSIX sh; see the module docstring).

    ``kind``: "venv", "conda" or "prefix" (default: detected from ``env_dir``; a container
    environment is a venv inside the image). ``compute_offline``: set the Hugging Face
    offline variables inside Slurm jobs (when the site profile also asks for it).
    """
    env_dir = Path(env_dir).absolute()
    prefix = shlex.quote(str(env_dir))
    kind = kind or detect_kind(env_dir)
    stack_text = f"stack {stack.name} (torch {stack.torch_version})" if stack else "no stack"
    lines = [
        f"# dsenv environment {env_dir}",
        f"# Written by dsenv {__version__}: site {site.name}, {stack_text}, target "
        f"{target.describe()}.",
        f"# Source it, do not run it: `. {prefix}/{ACTIVATE_NAME}` (sh, dash, bash, zsh).",
        "# `dsenv provision ... --force` rewrites this file. It holds no credentials.",
        "",
    ]
    commands = site.module_commands()
    if commands:
        lines += [f"# Modules of site {site.name} ({', '.join(site.sources) or 'site profile'}),"
                  " only where `module` exists (not inside a container).",
                  "if command -v module >/dev/null 2>&1; then"]
        for words in commands:
            command = "module " + " ".join(shlex.quote(w) for w in words)
            shown = command.replace("'", "")
            lines.append(f"    {command} || echo \"dsenv activate: \\`{shown}\\` failed\" >&2")
        lines += ["fi", ""]

    lines.append(f"# The environment ({kind}).")
    if kind == "venv":
        # what bin/activate does, with the path written out: uv's relocatable bin/activate
        # finds its folder through BASH_SOURCE/realpath, which sh (dash) does not have
        lines += [f"export VIRTUAL_ENV={prefix}",
                  f'export PATH={shlex.quote(str(env_dir / "bin"))}:"$PATH"',
                  "unset PYTHONHOME",
                  "hash -r 2>/dev/null || true"]
    elif kind == "conda":
        lines += [f"export CONDA_PREFIX={prefix}",
                  f"export CONDA_DEFAULT_ENV={prefix}",
                  f'export PATH={shlex.quote(str(env_dir / "bin"))}:"$PATH"',
                  "# packages' activation hooks (cuda-nvcc sets CUDA_HOME, ...)",
                  f"for _dsenv_hook in {prefix}/etc/conda/activate.d/*.sh; do",
                  '    [ -r "$_dsenv_hook" ] && . "$_dsenv_hook"',
                  "done",
                  "unset _dsenv_hook"]
    elif kind == "prefix":
        lines.append(f'export PATH={shlex.quote(str(env_dir / "bin"))}:"$PATH"')
    else:
        raise ProvisionError(f"activate script: unknown environment kind {kind!r}")
    lines += [f"export DSENV_ENV={prefix}", ""]

    lines += ["# DeepSpeed's JIT-compiled ops live inside the environment: compiled once, reused",
              "# by every job that sources this file.",
              f"export TORCH_EXTENSIONS_DIR={shlex.quote(str(env_dir / EXTENSIONS_DIR))}"]
    for name, value in target.arch_env().items():
        lines.append("# JIT builds for the archs this environment was provisioned for.")
        lines.append(_export_default(name, shlex.quote(value)))
    if target.vendor == "cpu":
        lines += ["# CPU stack: DeepSpeed's CPU accelerator, chosen without its warning.",
                  "export DS_ACCELERATOR=cpu"]
    lines.append("")

    if site.hf_home:
        lines += [f"# Hugging Face cache of site {site.name} (kept if HF_HOME is already set).",
                  _export_default("HF_HOME", sh_value(site.hf_home)), ""]
    if compute_offline and site.offline_on_compute:
        lines += [
            "# Compute nodes of this site have no internet: inside a Slurm job (SLURM_JOB_ID",
            "# set) the Hugging Face libraries stay offline instead of hanging on retries; on",
            "# the login node they may download (`dsenv fetch` runs there). A job not run by",
            "# Slurm is treated as a login session.",
            'if [ -n "${SLURM_JOB_ID:-}" ]; then',
            "    export " + " ".join(f"{v}=1" for v in OFFLINE_VARIABLES),
            "fi", ""]
    if site.env:
        lines.append(f"# Network and runtime variables of site {site.name} (kept when already "
                     "set).")
        for name, value in site.env.items():
            _check_name(name)
            lines.append(_export_default(name, sh_value(value)))
        lines.append("")
    return "\n".join(lines)


def write_activation(env_dir: Path, site: Site, target: Target, stack: Stack | None,
                     compute_offline: bool = True, *, kind: str | None = None) -> Path:
    """Write ``<env_dir>/activate`` (atomically: temporary file, then rename)."""
    env_dir = Path(env_dir)
    text = render_activation(env_dir, site, target, stack, compute_offline, kind=kind)
    return write_file_atomically(env_dir / ACTIVATE_NAME, text)

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

What it sets is described once, in settings.py; the environment's modulefile
(modulefile.py) renders the same description for Lmod.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from dsenv import __version__
from dsenv.envs.sites import Site
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target
from dsenv.provision import ProvisionError
from dsenv.provision.record.settings import (
    EXPANSION,
    EXTENSIONS_DIR,
    Group,
    Module,
    Prepend,
    Rehash,
    Setting,
    SetVar,
    SourceHooks,
    Unset,
    detect_kind,
    environment_settings,
)
from dsenv.staging import write_file_atomically

ACTIVATE_NAME = "activate"
__all__ = ["ACTIVATE_NAME", "EXTENSIONS_DIR", "detect_kind", "render_activation", "sh_value",
           "sh_lines", "write_activation"]


def sh_value(value: str) -> str:
    """``value`` in double quotes for sh: variable expansions kept, everything else literal
    (no command substitution, no backslash or quote tricks)."""
    out, position = [], 0
    for match in EXPANSION.finditer(value):
        out.append(_literal(value[position:match.start()]))
        out.append(match.group())
        position = match.end()
    out.append(_literal(value[position:]))
    return '"' + "".join(out) + '"'


def _literal(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def _export_default(name: str, value: str) -> str:
    return f'[ -n "${{{name}+x}}" ] || export {name}={value}'


def _set(setting: SetVar) -> str:
    value = sh_value(setting.value) if setting.expand else shlex.quote(setting.value)
    return _export_default(setting.name, value) if setting.keep \
        else f"export {setting.name}={value}"


def sh_lines(groups: list[Group]) -> list[str]:
    """The settings (settings.py) as POSIX sh lines, each group followed by a blank line."""
    lines: list[str] = []
    for group in groups:
        lines += [f"# {line}" for line in group.comment]
        if group.modules:
            lines.append("if command -v module >/dev/null 2>&1; then")
        elif group.in_slurm_job:
            lines.append('if [ -n "${SLURM_JOB_ID:-}" ]; then')
        indent = "    " if group.modules or group.in_slurm_job else ""
        plain = [s for s in group.settings if isinstance(s, SetVar) and not (
            s.keep or s.expand or s.note)]
        if group.in_slurm_job and plain == list(group.settings):  # one line: export A=1 B=1
            lines += [indent + "export " + " ".join(f"{s.name}={shlex.quote(s.value)}"
                                                    for s in plain), "fi", ""]
            continue
        for setting in group.settings:
            if getattr(setting, "note", ""):
                lines.append(f"{indent}# {setting.note}")
            lines += [indent + line for line in _sh(setting)]
        if group.modules or group.in_slurm_job:
            lines.append("fi")
        lines.append("")
    return lines


def _sh(setting: Setting) -> list[str]:
    if isinstance(setting, Module):
        command = "module " + " ".join(shlex.quote(w) for w in setting.words)
        shown = command.replace("'", "")
        return [f"{command} || echo \"dsenv activate: \\`{shown}\\` failed\" >&2"]
    if isinstance(setting, SetVar):
        return [_set(setting)]
    if isinstance(setting, Prepend):
        return [f'export {setting.name}={shlex.quote(setting.path)}:"${setting.name}"']
    if isinstance(setting, Unset):
        return [f"unset {setting.name}"]
    if isinstance(setting, Rehash):
        return ["hash -r 2>/dev/null || true"]
    if isinstance(setting, SourceHooks):
        return [f"for _dsenv_hook in {shlex.quote(setting.folder)}/*.sh; do",
                '    [ -r "$_dsenv_hook" ] && . "$_dsenv_hook"',
                "done",
                "unset _dsenv_hook"]
    raise ProvisionError(f"activate script: unknown setting {setting!r}")


def render_activation(env_dir: Path, site: Site, target: Target, stack: Stack | None,
                      compute_offline: bool = True, *, kind: str | None = None,
                      extra: tuple[Group, ...] = ()) -> str:
    """The text of ``<env_dir>/activate`` (POSIX sh; see the module docstring): the settings
    of :func:`~dsenv.provision.record.settings.environment_settings`, which the modulefile
    renders too.

    ``kind``: "venv", "conda" or "prefix" (default: detected from ``env_dir``; a container
    environment is a venv inside the image). ``compute_offline``: set the Hugging Face
    offline variables inside Slurm jobs (when the site profile also asks for it).
    ``extra``: more groups (the CUDA toolkit installed from wheels).
    """
    env_dir = Path(env_dir).absolute()
    prefix = shlex.quote(str(env_dir))
    groups = environment_settings(env_dir, site, target, stack, compute_offline, kind=kind,
                                  extra=extra)
    stack_text = f"stack {stack.name} (torch {stack.torch_version})" if stack else "no stack"
    lines = [
        f"# dsenv environment {env_dir}",
        f"# Written by dsenv {__version__}: site {site.name}, {stack_text}, target "
        f"{target.describe()}.",
        f"# Source it, do not run it: `. {prefix}/{ACTIVATE_NAME}` (sh, dash, bash, zsh).",
        "# `dsenv provision ... --force` rewrites this file. It holds no credentials.",
        "",
    ]
    return "\n".join(lines + sh_lines(groups))


def write_activation(env_dir: Path, site: Site, target: Target, stack: Stack | None,
                     compute_offline: bool = True, *, kind: str | None = None,
                     extra: tuple[Group, ...] = ()) -> Path:
    """Write ``<env_dir>/activate`` (atomically: temporary file, then rename)."""
    env_dir = Path(env_dir)
    text = render_activation(env_dir, site, target, stack, compute_offline, kind=kind,
                             extra=extra)
    return write_file_atomically(env_dir / ACTIVATE_NAME, text)

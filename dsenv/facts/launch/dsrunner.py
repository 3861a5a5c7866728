"""What DeepSpeed's launcher (``deepspeed`` / ``python -m deepspeed.launcher.runner``) will do
on this node: the hostfile it reads, and which variables its pdsh runner carries to the
other hosts.

The rules are DeepSpeed's own, read as files from the DeepSpeed in the environment under test
(launcher/runner.py's EXPORT_ENVS, the accelerator's ``export_envs()``), never imported; the
constants below are copies from deepspeed/launcher/runner.py of DeepSpeed 0.19.8 for when no
DeepSpeed is found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.pyfiles import read_assignments

# deepspeed/launcher/runner.py (0.19.8): DLTS_HOSTFILE, the --hostfile default.
DEFAULT_HOSTFILE = "/job/hostfile"
# runner.py EXPORT_ENVS (0.19.8): prefixes of the variables the pdsh runner exports remotely.
EXPORT_ENVS = ("MLFLOW", "PYTHON", "MV2", "UCX")
# accelerator/cuda_accelerator.py export_envs() (0.19.8); cpu, xpu, hpu, mps export none.
ACCELERATOR_EXPORTS = {"cuda": ("NCCL",), "cpu": (), "xpu": (), "hpu": (), "mps": ()}
# runner.py: DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env"), read
# from DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), '.'] in that order.
ENV_FILE_NAME = ".deepspeed_env"
# runner.py _parse_hostfile: a host, whitespace, slots=N; '#' comments and blank lines skipped.
HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


# -- the hostfile ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hostfile:
    path: Path
    source: str  # how the path was chosen
    exists: bool = False
    hosts: dict[str, int] = field(default_factory=dict)  # host -> slots, in file order
    error: str | None = None  # the runner's own complaint, when it would refuse the file


def parse_hostfile(text: str) -> tuple[dict[str, int], str | None]:
    """(hosts, error) as DeepSpeed's ``_parse_hostfile`` reads the file."""
    hosts: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        match = HOSTFILE_LINE.search(line)
        if not match:
            return hosts, f"Hostfile contains a bad entry: {line}"
        if match.group(1) in hosts:
            return hosts, f"Hostfile contains multiple entries for {match.group(1)}"
        hosts[match.group(1)] = int(match.group(2))
    if not hosts:
        return hosts, "Hostfile is empty or not formatted correctly"
    return hosts, None


def hostfile_choice(ctx: Node) -> tuple[Path, str]:
    """The hostfile the job's runner reads: $DSENV_HOSTFILE (what `dsenv launch` writes),
    else DeepSpeed's default /job/hostfile."""
    if ctx.env.get("DSENV_HOSTFILE"):
        return Path(ctx.env["DSENV_HOSTFILE"]), f"DSENV_HOSTFILE={ctx.env['DSENV_HOSTFILE']}"
    return ctx.path(DEFAULT_HOSTFILE), f"DeepSpeed's default --hostfile {DEFAULT_HOSTFILE}"


@probe
def hostfile(ctx: Node) -> Hostfile:
    path, source = hostfile_choice(ctx)
    mounts.require_files(ctx, path, 0, "the hostfile")
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return Hostfile(path, source)
    except OSError as exc:
        return Hostfile(path, source, True, error=f"cannot be read: {exc.strerror or exc}")
    hosts, error = parse_hostfile(text)
    return Hostfile(path, source, True, hosts, error)


# -- which variables reach the other hosts -----------------------------------------------------


@dataclass(frozen=True)
class ExportRules:
    prefixes: tuple[str, ...]  # EXPORT_ENVS + the accelerator's
    env_file: str  # the .deepspeed_env file name
    source: str


def export_envs_of(path: Path) -> tuple[str, ...] | None:
    """The list literal an accelerator's ``export_envs()`` returns, read with ``ast``."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "export_envs":
            for statement in node.body:
                if isinstance(statement, ast.Return) and statement.value is not None:
                    try:
                        return tuple(ast.literal_eval(statement.value))
                    except (ValueError, TypeError):
                        return None
    return None


def _deepspeed_folder(ctx: Node) -> Path | None:
    try:
        return target_env.module_folder(ctx, "deepspeed")
    except Exception:  # the environment probe failed (reported by python.*): copied rules
        return None


@probe
def export_rules(ctx: Node) -> ExportRules:
    accelerator = (ctx.env.get("DS_ACCELERATOR") or "cuda").strip().lower()
    prefixes, accel = EXPORT_ENVS, ACCELERATOR_EXPORTS.get(accelerator, ())
    source = "DeepSpeed 0.19.8's rules (no DeepSpeed found in the environment)"
    folder = _deepspeed_folder(ctx)
    if folder is not None:
        runner = folder / "launcher" / "runner.py"
        try:
            found = read_assignments(runner).get("EXPORT_ENVS")
        except (OSError, SyntaxError, ValueError):
            found = None
        if isinstance(found, list) and all(isinstance(p, str) for p in found):
            prefixes, source = tuple(found), str(runner)
        read = export_envs_of(folder / "accelerator" / f"{accelerator}_accelerator.py")
        accel = read if read is not None else accel
    name = ctx.env.get("DS_ENV_FILE") or ENV_FILE_NAME
    return ExportRules(tuple(prefixes) + tuple(accel), name,
                       f"{source}; accelerator {accelerator}")


@dataclass(frozen=True)
class EnvFile:
    path: Path
    values: dict[str, str]
    bad_lines: tuple[int, ...] = ()  # lines without '=': the runner's split raises ValueError


def parse_env_file(text: str) -> tuple[dict[str, str], tuple[int, ...]]:
    """As the runner reads it: every line ``key, val = line.split('=', maxsplit=1)``."""
    values, bad = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if "=" not in line:
            bad.append(number)
            continue
        key, value = line.split("=", 1)
        values[key] = value
    return values, tuple(bad)


def env_files(ctx: Node, cwd: Path) -> list[EnvFile]:
    """The .deepspeed_env files the runner reads: in ~ (HOME), then in the launch folder."""
    name = export_rules(ctx).env_file
    folders = ([Path(ctx.env["HOME"])] if ctx.env.get("HOME") else []) + [cwd]
    found, seen = [], set()
    for folder in folders:
        path = folder / name
        mounts.require_files(ctx, path, 0, "the runner's environment file")
        try:
            key = path.resolve()
            if key in seen or not path.is_file():
                continue
            seen.add(key)
            values, bad = parse_env_file(path.read_text(errors="replace"))
        except OSError:
            continue
        found.append(EnvFile(path, values, bad))
    return found

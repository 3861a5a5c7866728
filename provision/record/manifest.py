"""The environment's manifest, ``<env>/dsenv-env.json`` (schema ``dsenv.env/1``).

Written at the end of ``dsenv provision``: which lock the environment was installed from
(name, path, sha256, and the ``name==version`` pins it held), the kind, site, stack and
target, the ops asked for and the ops DeepSpeed reports as installed, the versions of
python/torch/deepspeed/transformers, the command line (secrets masked), host, date and dsenv
version. ``dsenv doctor`` reads it back (python.env-drift) and :func:`drift` says what has
changed since.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from dsenv import __version__
from dsenv.facts.python.deepspeed_info import read_deepspeed
from dsenv.facts.python.pyenv import parse_pyvenv_cfg
from dsenv.facts.python.pyenv import site_dirs as prefix_site_dirs
from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.provision import ProvisionError
from dsenv.redact import MASK, Redactor, is_secret_name
from dsenv.versions import same_version

SCHEMA = "dsenv.env/1"
MANIFEST_NAME = "dsenv-env.json"
VERSION_PACKAGES = ("torch", "deepspeed", "transformers")
# `name==version` (with extras and a marker allowed) at the start of a requirements line, as
# `uv pip compile` / `pip-compile` write them; hash continuation lines start with spaces.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_lock(text: str) -> dict[str, str]:
    """{canonical name: version} of the ``name==version`` pins of a lock/requirements file."""
    pins = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def redact_command(argv: list[str], env=None) -> list[str]:
    """The command line with secrets masked: values of secret-named environment variables
    wherever they appear, ``NAME=value`` / ``--name=value`` with a secret-looking name, and
    the argument after a secret-looking ``--option``."""
    redactor = Redactor(os.environ if env is None else env)
    out: list[str] = []
    mask_next = False
    for arg in argv:
        arg = str(arg)
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, sep, _ = arg.partition("=")
        if sep and is_secret_name(name.lstrip("-")):
            out.append(f"{name}={MASK}")
            continue
        if arg.startswith("--") and not sep and is_secret_name(arg[2:]):
            mask_next = True
        out.append(redactor.scrub(arg))
    return out


@dataclass
class EnvManifest:
    env_dir: str
    kind: str  # venv | container | conda
    site: str
    stack: str  # stacks.toml name
    torch: str  # the stack's torch requirement ("torch==2.13.0+cpu")
    target: dict  # Target.to_json()
    lock: dict  # {"file": name, "path": absolute path, "sha256": hex}
    packages: dict[str, str]  # the lock's pins at provisioning, canonical names
    ops: dict  # {"mode": "auto", "requested": [...], "installed": [...], "omitted": {...}}
    versions: dict[str, str | None]  # python, torch, deepspeed, transformers as installed
    command: list[str]  # redacted
    host: str
    created: str  # UTC ISO 8601
    dsenv_version: str = __version__
    schema: str = SCHEMA
    extra: dict = field(default_factory=dict)  # optional fields later versions may add

    def to_json(self) -> dict:
        data = asdict(self)
        if not data["extra"]:
            data.pop("extra")
        return data

    @classmethod
    def from_json(cls, data: dict) -> EnvManifest:
        known = {f for f in cls.__dataclass_fields__}
        missing = sorted(known - {"extra", "dsenv_version", "schema"} - set(data))
        if missing:
            raise ProvisionError(f"manifest lacks {', '.join(missing)}")
        values = {k: v for k, v in data.items() if k in known}
        values["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**values)


def manifest_path(env_dir: Path) -> Path:
    return Path(env_dir) / MANIFEST_NAME


def write_manifest(env_dir: Path, *, kind: str, site: str, stack, target, lock_file: Path,
                   ops_mode: str, ops_requested, ops_installed, versions: dict,
                   command: list[str], ops_omitted: dict | None = None, env=None,
                   host: str | None = None, created: str | None = None,
                   ops_extra: dict | None = None, recorded_as: Path | None = None,
                   lock_extra: dict | None = None) -> EnvManifest:
    """Write ``<env_dir>/dsenv-env.json`` atomically and return what was written.

    ``stack``: a :class:`~dsenv.envs.stacks.Stack` (or its name); ``target``: a
    :class:`~dsenv.envs.targets.Target` (or its JSON); ``lock_file``: the lock the
    environment was installed from (hashed and its pins recorded); ``ops_installed``: the
    ops DeepSpeed reports as installed (``installed_ops`` keys that are true, or a list);
    ``command``: the argv, redacted here with ``env`` (default os.environ); ``ops_extra``:
    more records under ``ops`` (``cpu_flags``: the CPU flags the ops were compiled for, read
    by the doctor's deepspeed.cpu-flags; ``cache``: what the ops cache did).
    ``recorded_as``: the folder recorded as ``env_dir`` when ``env_dir`` is a staging folder
    renamed to it later; ``lock_extra``: more under ``lock`` (its final ``path`` ...).
    """
    lock_file = Path(lock_file).absolute()
    try:
        lock_text = lock_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProvisionError(f"manifest: cannot read the lock {lock_file}: {exc}") from None
    if isinstance(ops_installed, dict):
        ops_installed = [name for name, built in ops_installed.items() if built]
    manifest = EnvManifest(
        env_dir=str(Path(recorded_as or env_dir).absolute()), kind=kind, site=site,
        stack=getattr(stack, "name", stack),
        torch=getattr(stack, "torch_requirement", ""),
        target=target.to_json() if hasattr(target, "to_json") else dict(target),
        lock={"file": lock_file.name, "path": str(lock_file), "sha256": sha256_text(lock_text),
              **(lock_extra or {})},
        packages=parse_lock(lock_text),
        ops={"mode": ops_mode, "requested": sorted(ops_requested),
             "installed": sorted(ops_installed), "omitted": dict(ops_omitted or {}),
             **{k: v for k, v in (ops_extra or {}).items() if v}},
        versions=dict(versions), command=redact_command(list(command), env),
        host=host or socket.gethostname(),
        created=created or datetime.now(timezone.utc).isoformat(timespec="seconds"))
    write_json_atomically(manifest_path(env_dir), manifest.to_json(), indent=2)
    return manifest


def required_cpu_flags(manifest: EnvManifest) -> tuple[list[str], dict]:
    """(the CPU flags the env's precompiled ops were compiled for, their whole record)
    from ``ops.cpu_flags``; ([], {}) when no op was compiled with -march=native."""
    record = manifest.ops.get("cpu_flags") or {}
    return [str(flag) for flag in record.get("flags") or ()], dict(record)


def read_manifest(env_dir: Path) -> EnvManifest | None:
    """The manifest of ``env_dir``; None when there is none (not provisioned by dsenv)."""
    path = manifest_path(env_dir)
    if not path.is_file():
        return None
    try:
        data = read_json(path, "environment manifest")
    except JsonFileError as exc:
        raise ProvisionError(str(exc)) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise ProvisionError(f"{path}: schema {schema!r}, expected {SCHEMA!r}")
    try:
        return EnvManifest.from_json(data)
    except (ProvisionError, TypeError) as exc:
        raise ProvisionError(f"{path}: {exc}") from None


# -- what is installed --------------------------------------------------------------------
def site_dirs(env_dir: Path) -> list[str]:
    """site-packages folders of an environment prefix (venv, conda, container venv)."""
    return [str(p) for p in prefix_site_dirs(Path(env_dir))]


def installed_versions(path: list[str]) -> dict[str, str]:
    """{canonical name: version} of the distributions on ``path`` (the first one found of
    each name wins, as for imports), read from their dist-info metadata."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=list(path)):
        name = dist.metadata["Name"]
        if name and canonical(name) not in found:
            found[canonical(name)] = dist.version
    return found


def env_versions(env_dir: Path) -> dict[str, str | None]:
    """python (pyvenv.cfg or lib/pythonX.Y) and torch/deepspeed/transformers of an env."""
    env_dir = Path(env_dir)
    python = None
    cfg = env_dir / "pyvenv.cfg"
    if cfg.is_file():
        values = parse_pyvenv_cfg(cfg.read_text(errors="replace"))
        python = values.get("version_info") or values.get("version")
    if python is None:
        folders = sorted((env_dir / "lib").glob("python3*"))
        python = folders[0].name.removeprefix("python") if folders else None
    if python is None and Path(sys.prefix) == env_dir:
        python = ".".join(map(str, sys.version_info[:3]))
    installed = installed_versions(site_dirs(env_dir))
    return {"python": python, **{name: installed.get(name) for name in VERSION_PACKAGES}}


def installed_ops_in(path: list[str]) -> dict[str, bool] | None:
    """DeepSpeed's installed_ops as recorded by its setup.py (None: no DeepSpeed on path)."""
    ds = read_deepspeed(list(path))
    return None if ds is None else dict(ds.installed_ops)


# -- drift ------------------------------------------------------------------------------
def drift(env_dir_or_manifest, installed: dict[str, str], lock_text: str | None,
          installed_ops=None) -> list[str]:
    """What differs from the environment as provisioned, one line each.

    - packages whose installed version differs from the lock, or that are missing
      (``installed``: name -> version; names are compared canonically);
    - the lock file changed since provisioning (its sha256; ``lock_text`` None: the pins
      recorded in the manifest are used and the hash is not checked);
    - DeepSpeed's installed ops differ from those recorded (``installed_ops``: its
      installed_ops dict or a list; None with an env folder: read from the env's DeepSpeed).
    Packages installed but not in the lock are not drift (pip, the editable dsenv, ...).
    """
    if isinstance(env_dir_or_manifest, EnvManifest):
        manifest, env_dir = env_dir_or_manifest, None
    else:
        env_dir = Path(env_dir_or_manifest)
        manifest = read_manifest(env_dir)
        if manifest is None:
            raise ProvisionError(f"{env_dir}: no {MANIFEST_NAME} (not provisioned by dsenv)")
    found = []
    pins = manifest.packages
    if lock_text is not None:
        now = sha256_text(lock_text)
        if now != manifest.lock.get("sha256"):
            found.append(f"lock {manifest.lock.get('file')} changed since provisioning "
                         f"(sha256 {manifest.lock.get('sha256', '?')[:12]}... then, "
                         f"{now[:12]}... now)")
            pins = parse_lock(lock_text)
    have = {canonical(k): v for k, v in installed.items()}
    for name, version in sorted(pins.items()):
        current = have.get(canonical(name))
        if current is None:
            found.append(f"{name}: not installed (lock has {version})")
        elif not same_version(current, version):
            found.append(f"{name}: {current} installed, lock has {version}")
    if installed_ops is None and env_dir is not None:
        installed_ops = installed_ops_in(site_dirs(env_dir))
    if installed_ops is not None:
        if isinstance(installed_ops, dict):
            built = {name for name, on in installed_ops.items() if on}
        else:
            built = set(installed_ops)
        recorded = set(manifest.ops.get("installed", ()))
        if built != recorded:
            parts = []
            if recorded - built:
                parts.append("no longer precompiled: " + ", ".join(sorted(recorded - built)))
            if built - recorded:
                parts.append("precompiled but not recorded: " + ", ".join(sorted(built - recorded)))
            found.append("DeepSpeed ops " + "; ".join(parts) + " (a reinstall of deepspeed "
                         "replaced the provisioned build)")
    return found

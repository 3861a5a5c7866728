"""What decides whether a job works on this host, as one flat table a rank can send to rank 0.

``dsenv doctor --distributed`` compares these between ranks and hosts (doctor/
distributed_fingerprint.py): package versions and builds, the environment prefix, the
precompiled DeepSpeed ops, the variables NCCL, gloo, Hugging Face, OpenMP and the
rendezvous read, /dev/shm, the locked-memory limit, the offline Hugging Face cache, the GPU
model and driver, and whether the interface NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names
exists here.

Cheap by design (it runs on every rank before the rendezvous): versions from package
metadata (importlib.metadata, never an import of transformers or DeepSpeed), the torch
build from torch/version.py, the ops from DeepSpeed's install record, the GPU from
/proc/driver/nvidia (no CUDA initialisation). Values are cut at MAX_VALUE_CHARS and the
variables at MAX_VARIABLES, so one rank's table stays a few KiB whatever its environment.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import psutil

from dsenv.facts.comm.fabric import NCCL_WHEELS, parse_nccl_list
from dsenv.facts.gpu.inventory import VISIBILITY_NAMES
from dsenv.facts.host.hfcache import is_true, resolve_dirs
from dsenv.facts.python.deepspeed_info import read_deepspeed
from dsenv.facts.python.torch_info import read_torch_build
from dsenv.redact import MASK, is_secret_name

VERSION_PACKAGES = ("dsenv", "torch", "deepspeed", "transformers")
VARIABLE_PREFIXES = ("NCCL_", "GLOO_", "HF_", "OMP_", "MASTER_")
# The interface variables and the syntax each library reads them with: NCCL takes a list
# with `^` (exclude) and `=` (exact), otherwise prefixes (NCCL docs, env.html#nccl-socket-
# ifname); gloo (torch ProcessGroupGloo) takes exact names separated by commas.
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
MAX_VALUE_CHARS = 160
MAX_VARIABLES = 48


def _cut(value: str) -> str:
    return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS - 3] + "..."


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def variables(env: Mapping[str, str]) -> dict[str, str]:
    """The job-deciding variables that are set, secrets masked (HF_TOKEN: '***')."""
    names = sorted(n for n in env if n.startswith(VARIABLE_PREFIXES) or n in VISIBILITY_NAMES)
    found = {f"${n}": MASK if is_secret_name(n) else _cut(env[n]) for n in names[:MAX_VARIABLES]}
    if len(names) > MAX_VARIABLES:
        found["$..."] = f"{len(names) - MAX_VARIABLES} more variables not compared"
    return found


def shm_size(root: Path = Path("/")) -> str:
    try:
        stats = os.statvfs(root / "dev/shm")
    except OSError:
        return "missing"
    return f"{stats.f_blocks * stats.f_frsize // (1 << 20)} MiB"


def memlock_limit() -> str:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"


def offline_assets(env: Mapping[str, str]) -> str:
    """'hub cache /x: 3 entries' (models--*, datasets--* folders), and the offline switch."""
    hub = resolve_dirs(env).hub
    offline = "offline" if is_true(env.get("HF_HUB_OFFLINE")) else "online"
    try:
        entries = sum(1 for e in os.scandir(hub) if e.name.startswith(("models--",
                                                                       "datasets--")))
    except OSError:
        return f"{offline}, hub cache {hub} missing"
    return f"{offline}, hub cache {hub}: {entries} entries"


def interface_states() -> dict[str, bool]:
    """{interface: up} of this host (its network namespace)."""
    try:
        return {name: stats.isup for name, stats in psutil.net_if_stats().items()}
    except OSError:
        return {}


def selected_interfaces(variable: str, value: str, names) -> tuple[list[str], list[str]]:
    """(interfaces of ``names`` that ``variable=value`` selects, names it asks for that are
    missing). NCCL's list syntax for NCCL_*, gloo's exact names otherwise."""
    names = sorted(names)
    if variable.startswith("NCCL"):
        wanted = parse_nccl_list(value)
        return wanted.selected(names), ([] if wanted.exclude else wanted.unmatched(names))
    wanted = [p.strip() for p in value.split(",") if p.strip()]
    return [n for n in wanted if n in names], [n for n in wanted if n not in names]


def interface_verdict(variable: str, value: str, states: Mapping[str, bool]) -> str:
    """What ``variable=value`` selects here: 'hsn0 (up)', or what is missing."""
    chosen, missing = selected_interfaces(variable, value, states)
    if missing and variable.startswith("GLOO"):
        return f"{', '.join(missing)} missing here"
    if not chosen:
        return "matches no interface here"
    return ", ".join(f"{name} ({'up' if states[name] else 'down'})" for name in chosen)


def gpu_facts(root: Path = Path("/")) -> dict[str, str]:
    """NVIDIA GPU models and driver from /proc/driver/nvidia (no CUDA initialisation); the
    amdgpu driver version from sysfs. Nothing on a host without a GPU driver."""
    facts = {}
    models = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    models.append(line.partition(":")[2].strip())
        except OSError:
            continue
    if models:
        facts["gpu"] = ", ".join(f"{models.count(m)} x {m}" for m in sorted(set(models)))
    for key, path in (("gpu driver", "sys/module/nvidia/version"),
                      ("gpu driver", "sys/module/amdgpu/version")):
        try:
            facts[key] = _cut((root / path).read_text().strip())
            break
        except OSError:
            continue
    return facts


def environment_fingerprint(env: Mapping[str, str], prefix: str | None = None,
                            path: list[str] | None = None, root: Path = Path("/")
                            ) -> dict[str, str]:
    """This process's fingerprint: {fact: value}, every value a short string.

    ``path``: where packages are found (default sys.path, the running interpreter's: a
    rank's own environment is the one under test)."""
    path = list(sys.path if path is None else path)
    facts = {name: package_version(name) for name in VERSION_PACKAGES}
    build = read_torch_build(path)
    if build.installed:
        facts["torch"] = build.describe().removeprefix("torch ")
    nccl = [f"{wheel} {package_version(wheel)}" for wheel in NCCL_WHEELS
            if package_version(wheel) != "not installed"]
    facts["nccl"] = ", ".join(nccl) or "no NCCL wheel"
    ds = read_deepspeed(path)
    if ds is not None:
        facts["deepspeed ops"] = _cut(", ".join(ds.precompiled) or "none precompiled")
    facts["python"] = sys.version.split()[0]
    facts["prefix"] = _cut(prefix or sys.prefix)
    facts["/dev/shm"] = shm_size(root)
    facts["memlock"] = memlock_limit()
    facts["hf assets"] = _cut(offline_assets(env))
    facts.update(gpu_facts(root))
    states = None
    for variable in INTERFACE_VARIABLES:
        if env.get(variable, "").strip():
            states = interface_states() if states is None else states
            facts[f"{variable} here"] = _cut(interface_verdict(variable, env[variable], states))
    facts.update(variables(env))
    return facts

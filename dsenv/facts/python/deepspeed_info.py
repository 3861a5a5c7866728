"""DeepSpeed and torch as installed, read from files: no ``import deepspeed``/``import torch``.

DeepSpeed's setup.py records what it built in ``deepspeed/git_version_info_installed.py``
(installed_ops, accelerator_name, torch_info: the torch/CUDA/HIP the ops were built
against), plain assignments read with ``ast`` (:mod:`.pyfiles`); the installed torch is the
torch area's :func:`.torch_info.torch_build`. Which ops are *compatible* is DeepSpeed's own
knowledge: older DeepSpeed records it at install (compatible_ops); otherwise only its op
builders know, which import torch (~2-5 s): they are asked with --verbose, in one
subprocess of the environment's interpreter, and the answer is cached on disk under a
fingerprint of everything it depends on. Everything here is about the environment under
test (:mod:`.target_env`), the job's.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc
from dsenv.facts.cmdcache import cache_dir
from dsenv.facts.gpu import inventory as gpu_probes
from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe
from dsenv.facts.python import pyenv, target_env, torch_info
from dsenv.facts.python.pyfiles import package_dir, read_assignments
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.jsonfiles import write_json_atomically
from dsenv.versions import major_minor

UNKNOWN_VERSION = "0.0"  # what DeepSpeed writes into torch_info when it built no ops
CACHE_FILE = "deepspeed-ops.json"
JSON_MARK = "DSENV-JSON "


@dataclass(frozen=True)
class DeepSpeedInstall:
    version: str
    folder: Path
    installed_ops: dict[str, bool] = field(default_factory=dict)
    accelerator_name: str = ""  # the accelerator the ops were built for
    torch_info: dict[str, object] = field(default_factory=dict)
    info_file: Path | None = None  # git_version_info_installed.py, None for a source checkout
    compatible_ops: dict[str, bool] | None = None  # recorded at install (older DeepSpeed)

    @property
    def precompiled(self) -> list[str]:
        return sorted(name for name, built in self.installed_ops.items() if built)

    def built_against(self) -> str:
        info = self.torch_info
        parts = [f"torch {info.get('version', '?')}"]
        for key, label in (("cuda_version", "CUDA"), ("hip_version", "HIP")):
            value = str(info.get(key, UNKNOWN_VERSION))
            if value != UNKNOWN_VERSION:
                parts.append(f"{label} {value}")
        return ", ".join(parts)


def read_deepspeed(path: list[str], folder: Path | None = None) -> DeepSpeedInstall | None:
    """The DeepSpeed in ``folder`` (default: the one ``path`` would import), from files."""
    folder = folder or package_dir("deepspeed", path)
    if folder is None:
        return None
    info_file = folder / "git_version_info_installed.py"
    try:
        values = read_assignments(info_file) if info_file.is_file() else {}
    except (OSError, SyntaxError, ValueError):
        values = {}
    version = values.get("version")
    if not isinstance(version, str) or not version:
        dist = pyenv.find_distribution("deepspeed", path)
        version = dist.version if dist is not None else "?"
    compatible = values.get("compatible_ops")
    return DeepSpeedInstall(version, folder, dict(values.get("installed_ops", {}) or {}),
                            str(values.get("accelerator_name", "")),
                            dict(values.get("torch_info", {}) or {}),
                            info_file if info_file.is_file() else None,
                            dict(compatible) if isinstance(compatible, dict) else None)


def build_mismatches(ds: DeepSpeedInstall, torch: TorchBuild) -> list[str]:
    """Why DeepSpeed's precompiled ops will refuse to load with this torch.

    The same comparisons as DeepSpeed's OpBuilder.validate_torch_version and
    validate_torch_op_version (major.minor; "0.0" means not recorded)."""
    if not ds.precompiled:
        return []
    info = ds.torch_info
    found = []
    built_torch = str(info.get("version", UNKNOWN_VERSION))
    if built_torch != UNKNOWN_VERSION and built_torch != major_minor(torch.version):
        found.append(f"ops built against torch {built_torch}, installed torch is "
                     f"{major_minor(torch.version)} ({torch.version})")
    built_cuda = str(info.get("cuda_version", UNKNOWN_VERSION))
    if torch.cuda and built_cuda != UNKNOWN_VERSION and built_cuda != major_minor(torch.cuda):
        found.append(f"ops built against CUDA {built_cuda}, torch uses CUDA {major_minor(torch.cuda)}")
    built_hip = str(info.get("hip_version", UNKNOWN_VERSION))
    if torch.hip and built_hip != UNKNOWN_VERSION and built_hip != major_minor(torch.hip):
        found.append(f"ops built against HIP {built_hip}, torch uses HIP {major_minor(torch.hip)}")
    return found


def deepspeed_of(node: Node) -> DeepSpeedInstall | None:
    """The DeepSpeed the environment under test imports (target_env: its own interpreter
    says where), read from its files."""
    folder = target_env.module_folder(node, "deepspeed")
    return read_deepspeed(pyenv.search_path(node), folder) if folder is not None else None


def op_switches(folder: Path) -> dict[str, list[str]]:
    """{DS_BUILD_X: [op names]}: the switches a build of the DeepSpeed in ``folder`` takes,
    read with ``ast`` from its op builders (ops/op_builder/**.py: each class's BUILD_VAR and
    NAME)."""
    switches: dict[str, list[str]] = {}
    for source in sorted((Path(folder) / "ops" / "op_builder").rglob("*.py")):
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
        except (OSError, SyntaxError, ValueError):
            continue
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            values = {n.targets[0].id: n.value.value for n in cls.body
                      if isinstance(n, ast.Assign) and len(n.targets) == 1
                      and isinstance(n.targets[0], ast.Name)
                      and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
            if "BUILD_VAR" in values and "NAME" in values:
                names = switches.setdefault(values["BUILD_VAR"], [])
                if values["NAME"] not in names:
                    names.append(values["NAME"])
    return switches


@probe
def installs(node: Node) -> tuple[DeepSpeedInstall | None, TorchBuild]:
    """The DeepSpeed the job will import, and the torch build every area shares."""
    return deepspeed_of(node), torch_info.torch_build(node)


def supported_accelerators(ds: DeepSpeedInstall) -> list[str] | None:
    """DeepSpeed's SUPPORTED_ACCELERATOR_LIST, read from its real_accelerator.py."""
    source = ds.folder / "accelerator" / "real_accelerator.py"
    if not source.is_file():
        return None
    value = read_assignments(source).get("SUPPORTED_ACCELERATOR_LIST")
    return list(value) if isinstance(value, (list, tuple)) else None


# -- the accelerator DeepSpeed will pick -------------------------------------------------


def visible_gpus(node: Node) -> list | None:
    """The GPU area's inventory (None when that probe failed: the gpu area reports why)."""
    try:
        return list(gpu_probes.visible_gpus(node))
    except Exception:
        return None


@dataclass(frozen=True)
class AcceleratorChoice:
    name: str
    how: str  # "DS_ACCELERATOR" | "auto detect"


def expected_accelerator(node: Node, torch: TorchBuild, gpus: list | None
                         ) -> AcceleratorChoice:
    """What deepspeed.accelerator.get_accelerator() will choose, for the cases that matter
    on clusters: an explicit DS_ACCELERATOR, else cuda (ROCm torch included) when torch is
    a GPU build and GPUs are visible, else cpu with DeepSpeed's warning."""
    chosen = node.env.get("DS_ACCELERATOR")
    if chosen is not None:
        return AcceleratorChoice(chosen, "DS_ACCELERATOR")
    if torch.gpu_build and gpus:
        return AcceleratorChoice("cuda", "auto detect")
    return AcceleratorChoice("cpu", "auto detect")


# -- JIT build cache ----------------------------------------------------------------------


def jit_build_root(node: Node, torch: TorchBuild) -> Path:
    """torch.utils.cpp_extension's build folder for JIT ops (TORCH_EXTENSIONS_DIR as is,
    else <cache>/torch_extensions/py<XY>_<cpu|cuNNN|rocmNNN>)."""
    explicit = node.env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit)
    cache = node.env.get("XDG_CACHE_HOME") or os.path.join(node.env.get("HOME", "~"), ".cache")
    if torch.hip:
        accel = "rocm" + torch.hip.replace(".", "")
    elif torch.cuda:
        accel = "cu" + torch.cuda.replace(".", "")
    else:
        accel = "cpu"
    py = target_env.python_tag(node)  # the job's interpreter's, not dsenv's
    return Path(os.path.expanduser(cache)) / "torch_extensions" / f"{py}_{accel}"


def jit_cached(root: Path, op: str) -> bool:
    return (root / op / f"{op}.so").is_file()


# -- op compatibility: one subprocess, cached on disk -------------------------------------

COMPAT_SCRIPT = """
import json
try:
    from deepspeed.ops.op_builder.all_ops import ALL_OPS, accelerator_name
    try:
        from deepspeed.ops.op_builder.builder import probe_is_compatible
    except ImportError:
        def probe_is_compatible(builder, verbose=False):
            return builder.is_compatible(verbose)
    ops = {}
    for name, builder in ALL_OPS.items():
        try:
            ops[name] = bool(probe_is_compatible(builder, False))
        except Exception:
            ops[name] = False
    result = {"accelerator": accelerator_name, "compatible": ops}
except Exception as exc:
    result = {"error": f"{type(exc).__name__}: {exc}"}
print(__MARK__ + json.dumps(result))
""".replace("__MARK__", repr(JSON_MARK))


def _mtime(path: Path | str | None) -> float | None:
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


def fingerprint(node: Node, ds: DeepSpeedInstall, torch: TorchBuild,
                python: str) -> str:
    """Everything DeepSpeed's is_compatible() answers depend on, hashed."""
    parts = {
        "python": python,
        "deepspeed": ds.version,
        "deepspeed_info_mtime": _mtime(ds.info_file or ds.folder / "__init__.py"),
        "torch": torch.version,
        "torch_version_mtime": _mtime(torch.version_file),
        "env": {k: node.env.get(k) for k in ("DS_ACCELERATOR", "CUDA_HOME", "CUDA_PATH",
                                            "ROCM_PATH", "ROCM_HOME")},
        "which": {name: node.which(name) for name in ("nvcc", "hipcc", "c++", "ninja")},
        "ld_so_cache_mtime": _mtime(node.path("/etc/ld.so.cache")),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Compatibility:
    compatible: dict[str, bool]
    accelerator: str | None
    from_cache: bool
    error: str | None = None
    source: str = "builders"  # "recorded" | "cache" | "builders" | "not asked"

    @property
    def known(self) -> bool:
        return bool(self.compatible) and self.error is None


CACHE_ENTRIES = 16  # answers kept, one per environment/toolkit fingerprint
NOT_ASKED = ("not asked: DeepSpeed {version} records none at install, and asking its op "
             "builders imports torch (~2 s); `dsenv doctor --verbose` asks once and caches "
             "the answer")


def parse_compat_output(stdout: str) -> dict | None:
    return proc.marked_json(stdout, JSON_MARK)


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "fingerprint" in data and "result" in data:  # one answer, as dsenv 0.1 wrote it
        return {str(data["fingerprint"]): data["result"]}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def probe_compatibility(node: Node, ds: DeepSpeedInstall, torch: TorchBuild,
                        ask: bool | None = None) -> Compatibility:
    """Which ops DeepSpeed deems compatible here: as recorded at install (DeepSpeed up to
    0.14 writes compatible_ops), else a cached answer, else (``ask``, default: the node's ``thorough``)
    DeepSpeed's op builders asked in the environment's interpreter (imports torch: seconds)
    and the answer cached; else not known."""
    if ds.compatible_ops:
        return Compatibility(ds.compatible_ops, ds.accelerator_name or None, False,
                             source="recorded")
    python = target_env.environment(node).python
    if python is None or not os.path.exists(python):
        return Compatibility({}, None, False, "the environment has no interpreter here to "
                             "ask DeepSpeed", source="not asked")
    key = fingerprint(node, ds, torch, python)
    path = cache_dir(node.env) / CACHE_FILE
    readable = mounts.files_answer(node, path)  # a hung file server: not read, not written
    entries = _read_cache(path) if readable else {}
    cached = entries.get(key)
    if isinstance(cached, dict) and isinstance(cached.get("compatible"), dict):
        return Compatibility(cached["compatible"], cached.get("accelerator"), True,
                             source="cache")
    if not (node.thorough if ask is None else ask):
        return Compatibility({}, None, False, source="not asked")
    run = node.run([python, "-c", COMPAT_SCRIPT], timeout=max(30.0, node.probe_timeout))
    result = parse_compat_output(run.stdout) if run.ok else None
    if result is None or "error" in result:
        reason = result["error"] if result else run.describe()
        return Compatibility({}, None, False, reason)
    entries = {k: v for k, v in list(entries.items())[-(CACHE_ENTRIES - 1):] if k != key}
    try:
        if readable:
            write_json_atomically(path, {"entries": {**entries, key: result}})
    except OSError:
        pass  # an unwritable cache only costs the next run the same seconds
    return Compatibility(result["compatible"], result.get("accelerator"), False)


@probe
def op_compatibility(node: Node) -> Compatibility:
    ds, torch = installs(node)
    if ds is None:
        return Compatibility({}, None, False, "DeepSpeed is not installed", source="not asked")
    return probe_compatibility(node, ds, torch)

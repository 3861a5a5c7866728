"""Build toolchain for DeepSpeed's JIT ops: nvcc/hipcc, the C++ compiler, ninja.

Tools are looked up the way torch.utils.cpp_extension does (CUDA_HOME/CUDA_PATH, then nvcc
on PATH, then /usr/local/cuda; ROCM_HOME/ROCM_PATH, then hipcc on PATH, then /opt/rocm),
and what each CUDA toolkit can build comes from envs/cuda_toolkits.toml.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsenv.data import load_table
from dsenv.envs import archs
from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe
from dsenv.facts.python import pyenv, target_env
from dsenv.facts.python.pyfiles import read_assignments
from dsenv.versions import version_tuple


@dataclass(frozen=True)
class Tool:
    name: str
    path: str | None  # None: not found
    version: str | None = None
    how: str = ""  # where it was found, or why it failed
    home: str | None = None  # the toolkit root (CUDA_HOME / ROCM_PATH equivalent)

    @property
    def found(self) -> bool:
        return self.path is not None

    @property
    def major(self) -> int | None:
        match = re.match(r"\d+", self.version or "")
        return int(match.group()) if match else None


def parse_nvcc_version(text: str) -> str | None:
    """'13.0.88' from 'Cuda compilation tools, release 13.0, V13.0.88'."""
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", text)
    if match:
        return match.group(2)
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else None


def parse_hip_version(text: str) -> str | None:
    """'3.10.20465' from 'HIP version  : 3.10.20465-f9876b8d' (hipcc/hipconfig)."""
    match = re.search(r"HIP version\s*:\s*(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def parse_first_version(text: str) -> str | None:
    """'12.2.0' from 'g++ (Debian 12.2.0-14+deb12u1) 12.2.0' or '1.11.1' from ninja."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    found = re.findall(r"\d+\.\d+(?:\.\d+)?", first)
    return found[-1] if found else None


def home_binary(node: Node, var: str, binary: str) -> Path | None:
    """``$var/bin/binary`` when it is a file (a toolkit root such as CUDA_HOME), else None;
    its bin folder is statted in a child first on a mount that can hang (a module's toolkit on
    an NFS server or a Lustre target that went down), else mounts.NoAnswer."""
    home = node.env.get(var)
    if not home:
        return None
    mounts.require_files(node, Path(home) / "bin", 1, f"the toolkit ({var})")
    path = Path(home) / "bin" / binary
    return path if path.is_file() else None


def _locate(node: Node, binary: str, home_vars: tuple[str, ...], default_home: str):
    """(path, home, how) the way torch.utils.cpp_extension finds CUDA_HOME / ROCM_HOME."""
    for var in home_vars:
        if node.env.get(var):
            home = node.env[var]
            path = home_binary(node, var, binary)
            return (str(path) if path else None), home, f"{var}={home}"
    on_path = node.which(binary)
    if on_path:
        home = str(Path(os.path.realpath(on_path)).parent.parent)
        return on_path, home, "PATH"
    path = node.path(default_home) / "bin" / binary
    if path.is_file():
        return str(path), str(node.path(default_home)), f"default {default_home}"
    return None, None, f"no {'/'.join(home_vars)}, not on PATH, no {default_home}"


def _versioned(node: Node, name: str, home_vars, default_home, parser) -> Tool:
    path, home, how = _locate(node, name, home_vars, default_home)
    if path is None:
        return Tool(name, None, how=how, home=home)
    result = node.run([path, "--version"])
    version = parser(result.stdout) if result.ok else None
    return Tool(name, path, version, how if result.ok else result.describe(), home)


@probe
def nvcc(node: Node) -> Tool:
    """The nvcc a job of the environment under test compiles with: CUDA_HOME/CUDA_PATH,
    else a toolkit installed into that environment from NVIDIA's wheels (its dsenv activate
    script sets CUDA_HOME there), else PATH, else /usr/local/cuda."""
    if not any(node.env.get(v) for v in ("CUDA_HOME", "CUDA_PATH")):
        local = env_local_toolkit(node)
        if local is not None:
            result = node.run([str(local / "bin" / "nvcc"), "--version"])
            version = parse_nvcc_version(result.stdout) if result.ok else None
            how = (f"the environment's own CUDA toolkit from NVIDIA's wheels ({local}; its "
                   "activate script sets CUDA_HOME there)")
            return Tool("nvcc", str(local / "bin" / "nvcc"), version,
                        how if result.ok else result.describe(), str(local))
    return _versioned(node, "nvcc", ("CUDA_HOME", "CUDA_PATH"), "/usr/local/cuda",
                      parse_nvcc_version)


# NVIDIA's CUDA 13 wheels share one tree; `dsenv provision` installs nvcc there when the
# node's nvcc cannot build the stack's ops (provision/ops/cuda.py)
ENV_TOOLKIT_ROOTS = ("nvidia/cu13",)


def env_local_toolkit(node: Node) -> Path | None:
    """The toolkit root inside the environment under test (``site-packages/nvidia/cu13``
    with a bin/nvcc), None when it has none."""
    prefix = Path(target_env.environment(node).prefix)
    for site in sorted(prefix.glob("lib/python3*/site-packages")):
        for root in ENV_TOOLKIT_ROOTS:
            if (site / root / "bin" / "nvcc").is_file():
                return site / root
    return None


@probe
def hipcc(node: Node) -> Tool:
    return _versioned(node, "hipcc", ("ROCM_HOME", "ROCM_PATH"), "/opt/rocm", parse_hip_version)


@probe
def cxx(node: Node) -> Tool:
    """The C++ compiler torch's extension builder runs: $CXX, else c++ (g++ as a fallback)."""
    names = [node.env["CXX"]] if node.env.get("CXX") else ["c++", "g++"]
    for name in names:
        path = node.which(name)
        if path:
            result = node.run([path, "--version"])
            if result.ok and result.stdout.strip():
                return Tool(name, path, parse_first_version(result.stdout),
                            result.stdout.strip().splitlines()[0])
            if result.ok:  # a compiler names itself: this one is a stub or broken
                return Tool(name, None, how=f"`{path} --version` printed nothing")
            return Tool(name, None, how=result.describe())
    return Tool(names[0], None, how=f"{' / '.join(names)} not on PATH")


@probe
def ninja(node: Node) -> Tool:
    """ninja must be runnable from PATH: torch checks with `ninja --version` before a JIT build.

    The `ninja` Python package of the environment under test (its version read from metadata,
    no subprocess) installs the binary into the environment's bin/, which is only on PATH
    while the environment is active.
    """
    on_path = node.which("ninja")
    dist = pyenv.find_distribution("ninja", pyenv.search_path(node))
    if dist is not None:
        binary = next((f for f in dist.files or () if f.name == "ninja" and "bin" in f.parts),
                      None)
        shipped = str(dist.locate_file(binary)) if binary else None
        return Tool("ninja", on_path, dist.version,
                    f"python package ninja {dist.version}" + (f" ({shipped})" if shipped else ""))
    if on_path is None:
        return Tool("ninja", None, how="not on PATH and no `ninja` Python package")
    result = node.run([on_path, "--version"])
    return Tool("ninja", on_path if result.ok else None, parse_first_version(result.stdout),
                "PATH" if result.ok else result.describe())


# -- what a CUDA toolkit can do (envs/cuda_toolkits.toml) ----------------------------------
def _table() -> dict:
    return load_table("dsenv.envs", "cuda_toolkits.toml")


@dataclass(frozen=True)
class ToolkitRow:
    version: str
    min_driver: str
    min_arch: str
    max_arch: str


def toolkit_row(cuda_version: str) -> ToolkitRow | None:
    """The table row for a CUDA version ('12.4.131' -> the '12.4' row; '12.7' -> '12.6')."""
    wanted = version_tuple(cuda_version)[:2]
    rows = [r for r in _table()["toolkit"] if version_tuple(r["version"]) <= wanted
            and version_tuple(r["version"])[0] == wanted[0]]
    if not rows:
        return None
    row = max(rows, key=lambda r: version_tuple(r["version"]))
    return ToolkitRow(row["version"], row["min_driver"], row["min_arch"], row["max_arch"])


def major_min_driver(cuda_version: str) -> str | None:
    major = version_tuple(cuda_version)[0]
    return next((r["min_driver"] for r in _table()["major"] if r["major"] == major), None)


def can_build(row: ToolkitRow, arch: str) -> bool:
    cap = archs.cuda_capability(arch)
    return cap is not None and (archs.cuda_capability(row.min_arch) <= cap
                                <= archs.cuda_capability(row.max_arch))


def toolkits_for(arch: str) -> list[str]:
    """Table versions whose nvcc can build ``arch`` ('7.0' -> ['11.0', ..., '12.9'])."""
    return [r["version"] for r in _table()["toolkit"]
            if can_build(ToolkitRow(r["version"], r["min_driver"], r["min_arch"], r["max_arch"]),
                         arch)]


def torch_index_for(driver: str | None, arch_list: list[str]) -> str:
    """The newest PyTorch CUDA wheel index the driver and every GPU arch support."""
    choices = []
    for entry in _table()["torch_index"]:
        row = toolkit_row(entry["cuda"])
        if row is None or not all(can_build(row, a) for a in arch_list if a):
            continue
        if driver and version_tuple(driver) < version_tuple(row.min_driver):
            continue
        choices.append(entry)
    best = max(choices, key=lambda e: version_tuple(e["cuda"]), default=_table()["torch_index"][0])
    return best["url"]


def rocm_index() -> str:
    return _table()["rocm_index"]["url"]


GENERATION_ALIASES = {"Ada": "Ada Lovelace"}  # TORCH_CUDA_ARCH_LIST spells it "Ada"


def parse_arch_list(value: str) -> tuple[list[str], list[str]]:
    """TORCH_CUDA_ARCH_LIST ('7.0;8.0+PTX', 'Volta Ampere', '9.0a') -> (archs, entries not
    understood); an arch- or family-specific variant counts as its GPU's arch (9.0a: 9.0)."""
    found, unknown = [], []
    for token in re.split(r"[;\s,]+", value.strip()):
        if not token:
            continue
        bare = token.removesuffix("+PTX")
        variant = re.fullmatch(r"(\d+\.\d+)[af]", bare)  # 9.0a, 12.0f: built for 9.0, 12.0 GPUs
        bare = variant.group(1) if variant else bare
        try:
            found.append(archs.normalize_arch(bare))
            continue
        except ValueError:
            pass
        generation = GENERATION_ALIASES.get(bare, bare)
        named = sorted({m.arch for m in archs.MODELS
                        if m.vendor == "nvidia" and m.generation.lower() == generation.lower()})
        if named:
            found.extend(named)
        else:
            unknown.append(token)
    return found, unknown


# torch/utils/cpp_extension.py _get_cuda_arch_flags (torch 2.13): the names it expands, by
# plain string replacement, before splitting the list on ';' (spaces first become ';').
TORCH_NAMED_ARCHES = (("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
                      ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"),
                      ("Volta+Tegra", "7.2"), ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"),
                      ("Ampere+Tegra", "8.7"), ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"),
                      ("Hopper", "9.0+PTX"), ("Blackwell+Tegra", "11.0"),
                      ("Blackwell", "10.0;10.3;12.0;12.1+PTX"))
ARCH_ENTRY = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")


def arch_list_code(value: str) -> tuple[list[str], list[str]]:
    """TORCH_CUDA_ARCH_LIST -> (the device code a build with it holds, as torch names it:
    'sm_80', 'sm_90a', 'compute_90' for a +PTX entry; the entries not understood).

    Read as torch's extension builder reads it (names expanded, ' ' and ';' separate); the
    commas some users write are taken as separators too. DeepSpeed's op builders read the
    same numbers (their own parser's refusals are toolkit.arch-support's)."""
    text = value.strip().replace(" ", ";").replace(",", ";")
    for name, expansion in TORCH_NAMED_ARCHES:
        text = text.replace(name, expansion)
    code, unknown = [], []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        match = ARCH_ENTRY.fullmatch(entry)
        if not match:
            unknown.append(entry)
            continue
        major, minor, variant, ptx = match.groups()
        code.append(f"sm_{major}{minor}{variant}")
        if ptx:
            code.append(f"compute_{major}{minor}")
    return list(dict.fromkeys(code)), unknown


def gcc_minimum_of_torch(location: str | None, cuda: str | None) -> tuple[int, ...] | None:
    """The oldest g++ the torch at ``location`` builds extensions with, as torch says it: its
    CUDA_GCC_VERSIONS row for ``cuda`` (major.minor), else MINIMUM_GCC_VERSION, read from
    torch/utils/cpp_extension.py without importing torch; None when the file or value is
    not there (a torch too old or too new to say)."""
    if not location:
        return None
    try:
        values = read_assignments(Path(location) / "utils" / "cpp_extension.py")
    except (OSError, SyntaxError, ValueError):
        return None
    rows = values.get("CUDA_GCC_VERSIONS")
    key = ".".join((cuda or "").split(".")[:2])
    if isinstance(rows, dict) and key in rows:
        return tuple(rows[key][0])
    minimum = values.get("MINIMUM_GCC_VERSION")
    return tuple(minimum) if isinstance(minimum, tuple) else None

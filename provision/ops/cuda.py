"""The CUDA toolkit DeepSpeed's ops compile with, and what the env's NVIDIA wheels add to it.

Three facts decide a CUDA op build:

* **Which nvcc.** DeepSpeed refuses an nvcc whose CUDA major differs from torch's
  (op_builder/builder.py ``assert_no_cuda_mismatch``), and each toolkit builds a span of
  archs (CUDA 13 dropped sm_50–sm_72). When the node's nvcc cannot build the stack's ops (or
  there is none), :func:`toolkit_choice` takes the stack's toolkit from NVIDIA's wheels
  (envs/cuda_toolkits.toml ``[[toolkit_wheels]]``): they unpack into the env's
  ``site-packages/nvidia/cu13`` as a toolkit root (bin/nvcc, include, lib, nvvm), which
  CUDA_HOME then names (build, activate script, manifest). ``--no-toolkit-wheels`` keeps the
  refusal.
* **Which headers and libraries.** torch's ATen/cuda headers include cusparse.h, cublas_v2.h
  and friends; a toolkit module with nvcc but without the math libraries' headers fails with
  ``fatal error: cusparse.h: No such file or directory``. The env's own NVIDIA wheels carry
  them (``nvidia/cu13/include`` for CUDA 13, ``nvidia/<lib>/include`` for the cu12 wheels):
  :func:`build_variables` appends those folders to CPATH (gcc and nvcc's host preprocessing
  search it after every -I, so the toolkit's own headers still win), and puts link names for
  the wheels' libraries (``libcurand.so`` for ``-lcurand``) and, without a driver, a
  ``libcuda.so`` stub (:func:`driver_stub`) on LIBRARY_PATH. CUDA_HOME is named explicitly:
  torch guesses it from ``which nvcc``, wrong for a wrapper script (:func:`nvcc_home`).
* **What was built.** :func:`verify_op_archs` reads each op's shared object
  (dsenv/facts/toolchain/fatbin.py) and fails the build when an op lacks a requested arch or holds
  another one; the manifest records ``ops.archs`` per op for the doctor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc
from dsenv.data import load_table
from dsenv.envs.stacks import Stack
from dsenv.envs.targets import Target, sm_name
from dsenv.facts.toolchain import fatbin
from dsenv.facts.toolchain import toolkit as tk
from dsenv.provision import ProvisionError
from dsenv.provision.record.settings import Group, Prepend, SetVar
from dsenv.provision.shown import Command
from dsenv.provision.uvcmd import Sources, run_logged, uv_command
from dsenv.versions import major_minor, version_tuple

INSTALL_TIMEOUT = 1800.0


# -- the toolkit wheels (envs/cuda_toolkits.toml [[toolkit_wheels]]) -----------------------
@dataclass(frozen=True)
class ToolkitWheels:
    cuda: str  # "13.0"
    requirements: tuple[str, ...]  # what `uv pip install` gets; () when NVIDIA has none
    root: str  # the toolkit root inside site-packages ("nvidia/cu13")
    source: str
    missing: str = ""  # why there are no such wheels (requirements empty)


def toolkit_wheels(cuda: str) -> ToolkitWheels | None:
    """The row for a stack's CUDA version ("13.0", "12.8"); None when the table has none."""
    for row in load_table("dsenv.envs", "cuda_toolkits.toml").get("toolkit_wheels", ()):
        if major_minor(row["cuda"]) == major_minor(cuda):
            return ToolkitWheels(row["cuda"], tuple(row.get("requirements", ())),
                                 row.get("root", ""), row["source"], row.get("missing", ""))
    return None


@dataclass(frozen=True)
class ToolkitChoice:
    """Where the ops' nvcc comes from: the node's (``node``), NVIDIA's wheels into the env
    (``wheels``), or nowhere (``refused``, with the reason)."""

    kind: str  # "node" | "wheels" | "refused" | "none" (no CUDA op is compiled)
    cuda: str = ""  # the toolkit's CUDA version
    reason: str = ""  # why the node's nvcc does not do (wheels, refused)
    wheels: ToolkitWheels | None = None
    home: str = ""  # the toolkit root the build's CUDA_HOME names (the node's; wheels: set
    # once installed)
    why_not: str = ""  # refused: why NVIDIA's wheels do not help

    def note(self) -> str:
        if self.kind == "node":
            return (f"ops compile with this node's nvcc {self.cuda}"
                    + (f" (CUDA_HOME={self.home})" if self.home else ""))
        if self.kind == "wheels":
            return (f"ops compile with CUDA {self.cuda}'s nvcc from NVIDIA's wheels "
                    f"({', '.join(self.wheels.requirements)}) installed into the env, "
                    f"CUDA_HOME set there: {self.reason}")
        return ""

    def to_json(self) -> dict:
        data = {"source": self.kind, "cuda": self.cuda}
        if self.home:
            data["home"] = self.home
        if self.reason:
            data["reason"] = self.reason
        if self.wheels is not None:
            data["wheels"] = list(self.wheels.requirements)
        return data


def node_problem(node_version: str | None, stack: Stack, target: Target) -> str | None:
    """Why the node's nvcc cannot compile this stack's ops for the target (None: it can)."""
    if not node_version:
        return "no nvcc on this node (CUDA_HOME, PATH, /usr/local/cuda)"
    if version_tuple(node_version)[0] != stack.toolkit_major:
        return (f"this node's nvcc {node_version} is CUDA {version_tuple(node_version)[0]}, "
                f"torch {stack.torch_version} is built with CUDA {stack.toolkit} and DeepSpeed "
                "refuses a different major (builder.py assert_no_cuda_mismatch)")
    row = tk.toolkit_row(node_version)
    if row is None:
        return f"this node's nvcc {node_version} is not in envs/cuda_toolkits.toml"
    cannot = [a for a in target.archs if not tk.can_build(row, a)]
    if cannot:
        return (f"this node's nvcc {node_version} cannot build "
                f"{', '.join(map(sm_name, cannot))} (it builds {sm_name(row.min_arch)} to "
                f"{sm_name(row.max_arch)})")
    return None


def toolkit_choice(stack: Stack, target: Target, node_version: str | None, *,
                   allow_wheels: bool = True) -> ToolkitChoice:
    """Which nvcc compiles the stack's CUDA ops for the target (see the module docstring)."""
    if target.vendor != "nvidia" or not stack.toolkit:
        return ToolkitChoice("none")
    problem = node_problem(node_version, stack, target)
    if problem is None:
        return ToolkitChoice("node", node_version or "")
    wheels = toolkit_wheels(stack.toolkit)
    row = tk.toolkit_row(stack.toolkit)
    why_not = None
    if row is not None and not all(tk.can_build(row, a) for a in target.archs):
        why_not = f"CUDA {stack.toolkit} cannot build them either"
    elif not allow_wheels:
        why_not = (f"--no-toolkit-wheels: not installing CUDA {stack.toolkit}'s nvcc from "
                   "NVIDIA's wheels")
    elif wheels is None or not wheels.requirements:
        why = wheels.missing if wheels else "envs/cuda_toolkits.toml names no wheels for it"
        why_not = f"no CUDA {stack.toolkit} nvcc from wheels: {why}"
    if why_not:
        return ToolkitChoice("refused", stack.toolkit, f"{problem}; {why_not}", why_not=why_not)
    return ToolkitChoice("wheels", stack.toolkit, problem, wheels)


def refusal_fix(choice: ToolkitChoice) -> str:
    """The way out of a refused toolkit, for the one-line error."""
    major = version_tuple(choice.cuda)[0] if choice.cuda else "?"
    return (f"load a CUDA {major}.x module that builds these archs (e.g. `module load "
            f"cuda/{choice.cuda}`), or pass --ops none (ops JIT-compile on the compute node)")


def install_toolkit_wheels(python: str | os.PathLike, wheels: ToolkitWheels, *,
                           sources: Sources, log: str | os.PathLike,
                           timeout: float = INSTALL_TIMEOUT) -> Path:
    """Install the toolkit wheels into the env of ``python``; return the toolkit root
    (CUDA_HOME). ProvisionError when uv fails (offline without the wheels cached: one line
    saying so)."""
    result = run_logged(toolkit_command(python, wheels, sources), timeout=timeout, output=log)
    if not result.ok:
        offline = " (offline: the wheels are not in uv's cache or --find-links)" \
            if sources.no_index else ""
        raise ProvisionError(f"CUDA {wheels.cuda} toolkit from NVIDIA's wheels: `uv pip "
                             f"install {' '.join(wheels.requirements)}` failed{offline}: "
                             f"{result.describe()}; see {log}")
    home = site_packages(python) / wheels.root
    link_toolkit_root(home)
    if not (home / "bin" / "nvcc").is_file():
        raise ProvisionError(f"CUDA {wheels.cuda} toolkit from NVIDIA's wheels: no bin/nvcc in "
                             f"{home} after installing {', '.join(wheels.requirements)}")
    return home


def toolkit_command(python: str | os.PathLike, wheels: ToolkitWheels,
                    sources: Sources) -> Command:
    """The ``uv pip install`` of the toolkit wheels (the plan shows it, the build runs it)."""
    return uv_command(["pip", "install", "--python", os.fspath(python), "--color", "never",
                       *sources.args(), *wheels.requirements])


def link_toolkit_root(home: Path) -> None:
    """What torch's extension builder expects of CUDA_HOME and the wheels lack: ``lib64``
    (it links ``-L$CUDA_HOME/lib64 -lcudart``) and the unversioned ``libcudart.so``."""
    if (home / "lib").is_dir() and not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    for library in sorted((home / "lib").glob("libcudart.so.*")):
        plain = home / "lib" / "libcudart.so"
        if not plain.exists():
            plain.symlink_to(library.name)
        break


def nvcc_home(nvcc: str | os.PathLike, timeout: float = 30) -> Path | None:
    """The toolkit root of an nvcc on PATH, as nvcc itself reports it (``_HERE_`` of
    ``nvcc --dryrun``). torch takes CUDA_HOME as the parent of ``which nvcc``'s folder, which
    is wrong for a wrapper script (``/usr/local/bin/nvcc`` -> ``exec
    /usr/local/cuda-13.0/bin/nvcc``: torch would link ``-L/usr/local/lib64 -lcudart`` and
    fail with "cannot find -lcudart"), so the build names CUDA_HOME explicitly."""
    result = proc.run([os.fspath(nvcc), "--dryrun", "-E", "-x", "cu", os.devnull], timeout=timeout)
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        if line.startswith("#$ _HERE_="):
            return Path(line.split("=", 1)[1].strip()).parent
    return None


# -- what the env's NVIDIA wheels add to any toolkit ---------------------------------------
def site_packages(python: str | os.PathLike) -> Path:
    """The env's site-packages (``<env>/lib/pythonX.Y/site-packages``), found on disk."""
    env = Path(python).parent.parent
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise ProvisionError(f"no lib/python3*/site-packages under {env}")
    return found[0]


def wheel_dirs(site: Path, kind: str) -> list[Path]:
    """The ``include`` (or ``lib``) folders of the env's NVIDIA wheels: nvidia/cu13/<kind>
    (CUDA 13 wheels share one tree) and nvidia/<library>/<kind> (cu12 wheels)."""
    root = site / "nvidia"
    if not root.is_dir():
        return []
    return [folder for folder in sorted(root.glob(f"*/{kind}")) if folder.is_dir()]


LINKS_DIR = "lib/dsenv-cuda-links"  # inside the env: link names for the wheels' libraries


def link_names(site: Path, folder: Path) -> Path | None:
    """``folder`` (created) with ``libX.so`` -> ``.../nvidia/*/lib/libX.so.N`` for each wheel
    library that has only its versioned name. The linker wants ``libcurand.so`` for
    DeepSpeed's ``-lcurand`` (transformer ops); the wheels ship ``libcurand.so.10`` alone,
    and a toolkit module without the math libraries fails with "cannot find -lcurand".
    Links are relative, so they survive the env's rename. None when nothing needs one."""
    wanted = {}
    for lib_dir in wheel_dirs(site, "lib"):
        for library in sorted(lib_dir.glob("lib*.so.*")):
            plain = library.name.split(".so.", 1)[0] + ".so"
            if not (lib_dir / plain).exists():
                wanted.setdefault(plain, library)
    if not wanted:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for plain, library in wanted.items():
        link = folder / plain
        if not link.is_symlink() and not link.exists():
            link.symlink_to(os.path.relpath(library, folder))
    return folder


DRIVER_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


def driver_stub(cuda_home: str | os.PathLike | None, folder: Path,
                base: Mapping[str, str]) -> Path | None:
    """A folder holding ``libcuda.so`` for the linker, or None when the node has one.

    DeepSpeed's async_io and gds ops link ``-lcuda``, the driver library, which a node
    without a GPU driver (a login node, this build machine) lacks: "cannot find -lcuda".
    Toolkits ship a link stub in ``lib64/stubs``; when there is none either (a trimmed
    module, NVIDIA's wheels), an empty shared object with the driver's soname
    (``libcuda.so.1``) is made here: the op records ``NEEDED libcuda.so.1`` and the real
    driver provides the symbols at run time, as with NVIDIA's stub."""
    if cuda_home:
        stubs = Path(cuda_home) / "lib64" / "stubs"
        if (stubs / "libcuda.so").exists():
            return stubs
    if any(Path(d, "libcuda.so").exists() for d in DRIVER_FOLDERS):
        return None
    stub = folder / "libcuda.so"
    if stub.exists():
        return folder
    compiler = base.get("CC") or proc.which("cc") or proc.which("gcc")
    if compiler is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "libcuda-stub.c"
    source.write_text("/* link stub for -lcuda (dsenv provision): the driver provides the "
                      "symbols at run time */\n")
    result = proc.run([compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                       str(stub), str(source)], timeout=120)
    source.unlink(missing_ok=True)
    return folder if result.ok else None


def build_variables(python: str | os.PathLike, base: Mapping[str, str] | None = None,
                    cuda_home: str | os.PathLike | None = None) -> dict[str, str]:
    """CPATH / LIBRARY_PATH (and CUDA_HOME when given) for a CUDA op build in the env of
    ``python``: the env's NVIDIA wheel folders appended to what ``base`` already has (the
    libraries through :func:`link_names`)."""
    base = dict(os.environ if base is None else base)
    site = site_packages(python)
    folder = Path(python).parent.parent / LINKS_DIR
    links = link_names(site, folder)
    stubs = driver_stub(cuda_home, folder, base)
    out: dict[str, str] = {}
    for variable, kind in (("CPATH", "include"), ("LIBRARY_PATH", "lib")):
        extra = [str(d) for d in wheel_dirs(site, kind)]
        if kind == "lib":
            extra = [str(d) for d in dict.fromkeys((links, stubs)) if d is not None]
        have = [p for p in base.get(variable, "").split(os.pathsep) if p]
        joined = have + [d for d in extra if d not in have]
        if joined and joined != have:
            out[variable] = os.pathsep.join(joined)
    if cuda_home:
        out["CUDA_HOME"] = os.fspath(cuda_home)
    return out


# -- proof by artefacts ---------------------------------------------------------------------
@dataclass
class OpArchs:
    """Per op: the device code its shared object holds; what was wrong with it."""

    code: dict[str, fatbin.DeviceCode] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, dict]:
        return {op: code.to_json() for op, code in sorted(self.code.items())}

    def describe(self) -> list[str]:
        """["fused_adam: sm_80, sm_90", ...] (CPU ops left out)."""
        return [f"{op}: {code.describe()}" for op, code in sorted(self.code.items())
                if code.elf or code.ptx]


def check_op_archs(package: Path, ops: Iterable[str], archs: Iterable[str],
                   gpu_ops: Iterable[str], expected: Mapping[str, Iterable[str]] | None = None,
                   modules: Mapping[str, str] | None = None) -> OpArchs:
    """Read every built op's shared object in an installed deepspeed package folder.
    ``gpu_ops``: the ops that must hold device code for exactly ``archs`` (or for
    ``expected[op]``, where a builder's filter_ccs narrows the list). ``modules``: each op's
    extension module name, for the ops that live outside deepspeed/ops."""
    libraries = fatbin.op_libraries(package, dict(modules or {}))
    result = OpArchs()
    wanted = list(archs)
    gpu = set(gpu_ops)
    for op in ops:
        library = libraries.get(op)
        if library is None:
            if op in gpu:
                result.problems.append(f"{op}: no shared object under {package / 'ops'}")
            continue
        try:
            code = fatbin.read_device_code(library)
        except fatbin.FatbinError as exc:
            result.problems.append(f"{op}: {exc}")
            continue
        result.code[op] = code
        if op not in gpu:
            continue
        missing, unexpected = fatbin.compare(code, list((expected or {}).get(op, wanted)))
        if missing:
            result.problems.append(f"{op} lacks {', '.join(map(sm_name, missing))} "
                                   f"(holds {code.describe()})")
        if unexpected:
            result.problems.append(f"{op} holds unexpected {', '.join(map(sm_name, unexpected))}"
                                   f" (holds {code.describe()})")
    return result


def verify_op_archs(python: str | os.PathLike, ops: Iterable[str], target: Target,
                    gpu_ops: Iterable[str], expected: Mapping[str, Iterable[str]] | None = None,
                    log: str | os.PathLike | None = None,
                    modules: Mapping[str, str] | None = None) -> OpArchs:
    """:func:`check_op_archs` for the env of ``python``; ProvisionError naming each op whose
    device code differs from the requested archs."""
    result = check_op_archs(site_packages(python) / "deepspeed", ops, target.archs, gpu_ops,
                            expected, modules)
    if log is not None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write("=== dsenv: device code per op (.nv_fatbin): "
                         + "; ".join(result.describe()) + "\n")
    if result.problems:
        raise ProvisionError(
            f"DeepSpeed ops: the built shared objects do not hold the requested archs "
            f"({', '.join(map(sm_name, target.archs))}): {'; '.join(result.problems)}"
            + (f"; full log: {log}" if log else ""))
    return result


def cuobjdump_listing(cuobjdump: str, library: str | os.PathLike, timeout: float = 60) -> str:
    """``cuobjdump --list-elf --list-ptx LIBRARY``'s output (the cross-check the fixtures
    record); ProvisionError when it fails."""
    result = proc.run([cuobjdump, "--list-elf", "--list-ptx", os.fspath(library)],
                      timeout=timeout)
    if not result.ok:
        raise ProvisionError(f"cuobjdump on {library}: {result.describe()}")
    return result.stdout


# -- one CUDA op build, start to end (provision/build.py) ------------------------------------
@dataclass
class CudaBuild:
    """The toolkit of one env's op build: its variables, and what the ops were found to hold."""

    choice: ToolkitChoice
    env: dict[str, str]  # the build's environment (os.environ + CUDA_HOME, CPATH, ...)
    home: str = ""  # CUDA_HOME of the build ("" when no CUDA op is compiled)
    archs: OpArchs | None = None

    def verify(self, python: str | os.PathLike, ops: Iterable[str], target: Target, report,
               log: str | os.PathLike | None = None) -> None:
        """Each built GPU op holds exactly the target's archs (those its builder keeps:
        ``report`` is provision/ops/builders.py's OpsReport); ProvisionError otherwise."""
        if self.choice.kind == "none":
            return
        ops = list(ops)
        # kernels are required of ops compiled from .cu sources, not of a CUDA builder's
        # host-code ops (async_io, gds, dc: their objects hold no device code)
        gpu = [op for op in ops if op in report.ops and report.ops[op].gpu
               and report.ops[op].device_sources]
        expected = {op: report.ops[op].kept_archs or target.archs for op in gpu}
        modules = {op: report.ops[op].module for op in ops
                   if op in report.ops and report.ops[op].module}
        self.archs = verify_op_archs(python, ops, target, gpu, expected, log, modules)

    def settings(self, staging: Path, prefix: Path) -> tuple[Group, ...]:
        """What activate and the modulefile set for a toolkit in the env: CUDA_HOME, bin/."""
        if self.choice.kind != "wheels" or not self.home:
            return ()
        home = self.home.replace(str(staging), str(prefix))
        return (Group((f"CUDA {self.choice.cuda} toolkit from NVIDIA's wheels, installed by "
                       f"dsenv provision ({self.choice.reason}): DeepSpeed's JIT builds use "
                       "its nvcc.",),
                      (SetVar("CUDA_HOME", home), Prepend("PATH", f"{home}/bin"))),)

    def manifest(self, staging: Path, prefix: Path) -> dict:
        """``ops.toolkit`` and ``ops.archs`` (per op: elf and ptx archs) for the manifest."""
        if self.choice.kind == "none":
            return {}
        record = self.choice.to_json()
        if self.home:
            record["home"] = self.home.replace(str(staging), str(prefix))
        return {"toolkit": record, "archs": self.archs.to_json() if self.archs else {}}


def prepare_cuda_build(choice: ToolkitChoice | None, python: str | os.PathLike, *,
                       sources: Sources, log: str | os.PathLike,
                       base: Mapping[str, str] | None = None) -> CudaBuild:
    """Install the toolkit wheels when the plan chose them; the build's environment with
    CUDA_HOME and the env's NVIDIA include/lib folders (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    if choice is None or choice.kind in ("none", "refused"):
        return CudaBuild(choice or ToolkitChoice("none"), env)
    if choice.kind == "wheels":
        home = str(install_toolkit_wheels(python, choice.wheels, sources=sources, log=log))
        env["PATH"] = os.pathsep.join([str(Path(home) / "bin"), env.get("PATH", "")])
    else:
        home = choice.home
    env.update(build_variables(python, env, home or None))
    return CudaBuild(choice, env, home)

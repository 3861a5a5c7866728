"""The dynamic loader and linker family, read by structure.

Four shapes, whatever program printed them and whatever library they name:

- ``libcudart.so.12: cannot open shared object file`` (ld.so, dlopen, ctypes, ImportError,
  ``error while loading shared libraries``, ``Could not load dynamic library 'X'``,
  ``Couldn't open CUDA library X``,
  nvidia-container-cli's ``load library failed: X``);
- ``undefined symbol: cublasLtGetStatusString, version libcublasLt.so.11`` (and the library
  that asked for it, when the line names it);
- ``version `GLIBCXX_3.4.30' not found (required by X)``;
- ``ld: cannot find -lcurand`` (a link step: it wants the unversioned libcurand.so).

The library is mapped to what provides it (libraries.toml: CUDA runtime, cuBLAS, cuDNN,
NCCL, the driver's libcuda and NVML, rdma-core, libaio, MPI, ROCm, libstdc++...), and the
row links the finding to the catalogue mode it is (Finding.mode): by its kind, and by the
shape of the message where the same library has several causes (an executable that cannot
start, or a loader that itself says to set LD_LIBRARY_PATH: its folder is off the run-time
path; an extension module's import: built for another release; an undefined C++ symbol with
the std::string ABI tag: the other _GLIBCXX_USE_CXX11_ABI). With ``--here``, look_here()
says whether this node and environment have it: LD_LIBRARY_PATH, the ldconfig cache
(dsenv/facts/python/sharedlibs.py), the environment's site-packages (the nvidia/* wheels and
torch/lib), LIBRARY_PATH and CUDA_HOME for links.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dsenv.data import load_table
from dsenv.doctor.explain import loader_words
from dsenv.doctor.explain.loader_words import LIB, LINK, MISSING, NOT_DEFINED, UNDEFINED, VERSION
from dsenv.facts.python import sharedlibs, target_env, torch_info, torch_symbols


@dataclass(frozen=True)
class Finding:
    kind: str  # missing, undefined-symbol, symbol-version, link
    library: str  # the file name wanted (libcudart.so.12, libcurand.so, libstdc++.so.6)
    text: str  # the matched text
    row: dict | None  # libraries.toml row, None when the library is not in the table
    symbol: str = ""
    version: str = ""  # soname version (12), or the symbol version (GLIBCXX_3.4.30)
    required_by: str = ""
    where: str = ""  # the folder the message names, if any
    shape: str = ""  # program, path, extension, torch, abi, unversioned: what the message's shape adds
    program: str = ""  # the executable that could not start ("error while loading ...")
    extension: str = ""  # the extension module that needs the library, when a path names it

    @property
    def id(self) -> str:
        return f"loader.{self.kind}"

    @property
    def mode(self) -> str:
        """The catalogue mode this finding is: its library's row in libraries.toml links a
        kind (missing) or a kind in a shape (missing.program) to a mode; the shaped link
        comes first, then the plain kind; "" when the row links none."""
        modes = (self.row or {}).get("modes", {})
        keys = ([f"{self.kind}.{self.shape}"] if self.shape else []) + [self.kind]
        return next((modes[k] for k in keys if k in modes), "")

    @property
    def benign(self) -> bool:
        return bool(self.row and self.row.get("benign"))

    @property
    def title(self) -> str:
        name = self.row["name"] if self.row else "a library not in dsenv's table"
        return {"missing": f"{self.library} cannot be loaded: {name}",
                "undefined-symbol": f"{self.symbol} is missing from the loaded {name}",
                "symbol-version": f"{self.version} is missing from the loaded {self.library}",
                "link": f"the linker cannot find {self.library}: {name}"}[self.kind]

    def describe(self) -> str:
        parts = [f"library {self.library}"]
        if self.version:
            parts.append(f"version {self.version}")
        if self.symbol:
            parts.append(f"symbol {self.symbol}")
        if self.required_by:
            parts.append(f"required by {self.required_by}")
        if self.program:
            parts.append(f"program {self.program}")
        if self.extension:
            parts.append(f"extension {self.extension}")
        if self.shape:
            parts.append(f"shape {self.shape}")
        return ", ".join(parts)

    @property
    def cause(self) -> str:
        provider = f" It is provided by {self.row['provider']}." if self.row else ""
        if self.row and self.row.get("benign"):
            provider += f" Usually harmless: {self.row['benign']}"
        if self.kind == "missing":
            who = {"program": f" {self.program or 'The program'} was linked against it when "
                              f"it was built, so it exists somewhere: its folder is not on the "
                              f"run-time path.",
                   "path": " The program that loads it says to put its folder on "
                           "LD_LIBRARY_PATH: it looks there, not in a fixed place.",
                   "extension": " A prebuilt extension module asks for it: the soname names "
                                "the release it was built for."}.get(self.shape, "")
            return (f"The dynamic loader found no {self.library} in LD_LIBRARY_PATH, the "
                    f"ldconfig cache, the default folders or the RUNPATH of the library that "
                    f"needs it.{who}{provider}" + (
                        f" A build for another CUDA release asks for another soname major "
                        f"(here {self.version})." if self.row and self.row["wheel"]
                        and self.version else ""))
        if self.kind == "link":
            return (f"A build step (a JIT or pip-built extension) links with -l"
                    f"{self.library[3:].split('.so')[0]}: ld looks for the unversioned "
                    f"{self.library} in -L folders and LIBRARY_PATH, not in LD_LIBRARY_PATH, "
                    f"and runtime packages and pip wheels ship only the versioned file."
                    f"{provider}")
        if self.kind == "symbol-version":
            return (f"{self.required_by or 'A binary'} was built against a newer "
                    f"{self.library} than the one loaded first"
                    f"{' (' + self.where + ')' if self.where else ''}: it lacks "
                    f"{self.version}.{provider}")
        return (f"{self.required_by or 'A binary'} was built against another release of "
                f"{self.row['name'] if self.row else 'the library'} than the one loaded: "
                f"{self.symbol} is not in it. Usually a second copy on LD_LIBRARY_PATH "
                f"shadows the one the package ships, or the package was built for another "
                f"release.{provider}")

    @property
    def fix(self) -> str:
        if self.row is None:
            return (f"Find which package ships {self.library} for this system and make its "
                    f"folder visible to the job (LD_LIBRARY_PATH for loading, LIBRARY_PATH "
                    f"for linking).")
        cu = self.version.split(".")[0] if self.version[:1].isdigit() else "12"
        pkg = re.sub(r"^lib|\.so.*$", "", self.library).lower()
        return self.row["fix"].replace("{cu}", cu).replace("{pkg}", pkg)

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.row["source"],) if self.row else ()


@cache
def table() -> tuple[dict, ...]:
    rows = load_table("dsenv.doctor.explain", "libraries.toml")["lib"]
    return tuple(dict(r, _match=re.compile(r["match"]), _symbols=re.compile(r["symbols"]))
                 for r in rows)


def library_row(name: str) -> dict | None:
    return next((r for r in table() if r["_match"].search(name)), None)


def symbol_row(symbol: str) -> dict | None:
    return next((r for r in table() if r["_symbols"].search(symbol)), None)


def soname_version(name: str) -> str:
    """'12' for libcudart.so.12, '12.1.105' for libcudart.so.12.1.105, '' for libaio.so."""
    return name.split(".so.", 1)[1] if ".so." in name else ""


# The shape of a "cannot open shared object file" line says who wanted the library:
# - an executable that cannot start ("prog: error while loading shared libraries: X"):
#   it was linked against X on a machine (or with a path) that had it, so X exists but the
#   run-time loader path (LD_LIBRARY_PATH, ld.so.conf, RUNPATH) lacks its folder;
# - an extension module being imported ("ImportError: X", TensorFlow's NotFoundError):
#   a prebuilt binary whose dependency names the release it was built for (libcudart.so.10.1,
#   libmpi.so.12), so the installed release differs;
# - anything else (ctypes/dlopen by name, a framework's own loader): the library is simply
#   not installed where the loader looks.
PROGRAM = re.compile(r"(?:(?P<prog>[^\s:]+): )?error while loading shared libraries:\s*$")
EXTENSION = re.compile(r"\b(?:ImportError|NotFoundError)\b")
# - a loader that itself says the library is to be found through LD_LIBRARY_PATH (Paddle's
#   dynamic_loader: "Please specify its path correctly ... set environment variable
#   LD_LIBRARY_PATH", "Please try to add the lib path to LD_LIBRARY_PATH", "set
#   LD_LIBRARY_PATH by `export ...`"): its folder is not on the run-time path. A bare
#   "LD_LIBRARY_PATH: <value>" (TensorFlow's dso_loader prints the value) is no such hint.
PATH_HINT = re.compile(r"\b(?:set|add|adding)\b[^\n.;]{0,60}?\bLD_LIBRARY_PATH\b(?!:)")
# Paddle's dynamic_loader.cc words its error "Failed to find dynamic library: %s ( %s ) \n Please
# specify its path ... set environment variable LD_LIBRARY_PATH" (from 2.0: "The third-party
# dynamic library (%s) that Paddle depends on is not configured correctly ... set
# LD_LIBRARY_PATH by `export ...`"): its opening says the same where a log keeps one line.
PATH_LOADER = re.compile(r"Failed to find dynamic library:|that Paddle depends on is not "
                         r"configured correctly")
# The CUDA release a torch build names (2.1.0+cu121, "CUDA Version: 12.2", cuda 11.8).
TORCH_CUDA = re.compile(r"\+cu(?P<cu>1[0-3])\d\b|\bCUDA(?: Version| version)?:? (?P<v>1[0-3])\.\d",
                        re.IGNORECASE)
# Libraries whose soname major is the CUDA major (libcudart.so.11.0 ships with every 11.x).
CUDA_MAJOR_SONAME = re.compile(r"^lib(?:cudart|cublas(?:Lt)?|nvrtc)\.so\.(?P<cu>\d+)")
# An undefined C++ symbol with a std::string ABI tag: the new ABI mangles `__cxx11` (or the
# tag B5cxx11), the old one `Ss` (torch_symbols.abi_of). torch's pip wheels were built with
# the old ABI up to 2.6 and the new one from 2.7, so a missing `__cxx11` symbol is the ABI
# whatever the torch, but an `Ss` one is what a matching build against a torch <= 2.6 asks
# for too: there it means "another torch release" (mmdetection#3991's mmcv), and the ABI only
# where the text names a new-ABI torch.
NEW_ABI_TORCH = re.compile(r"\btorch(?:==|-| |/| version:? ?)v?(?:2\.(?:[7-9]|\d\d)|[3-9]\.)\d*",
                           re.IGNORECASE)


def _abi_shape(sym: str, text: str) -> str:
    abi = torch_symbols.abi_of(sym)  # the std::string form the symbol asks for
    if abi == "new" or (abi == "old" and NEW_ABI_TORCH.search(text)):
        return "abi"
    return ""


# torch's own libraries (site-packages/torch/lib/*, torch/_C) missing one of torch's own symbols
# (c10, at, torch, caffe2, the TH* C libraries of torch <= 1.x): one torch install's libraries
# are built together, so the loader resolved part of them from another install (a leftover
# /usr/local/lib/libc10.so, an older torch/lib on LD_LIBRARY_PATH, two installs mixed).
TORCH_OWN_LIB = re.compile(r"[/\\]torch[/\\](?:lib[/\\]|_C[.\w-]*\.so)")
TORCH_OWN_SYMBOL = re.compile(r"^(?:_Z(?:TI|TV|TS)?N?[KVR]*(?:3c10|2at|5torch|6caffe2|\d+TH)"
                              r"|TH[A-Z]*_?[A-Za-z])")
# An undefined symbol with no symbol version, asked for by a module outside torch/lib and the
# nvidia/* wheels (cpu_adam.so: curandCreateGenerator): the module was never linked against
# the library; a versioned one (", version libcurand.so.10") was, and another release loaded.
PROVIDED = re.compile(r"[/\\](?:torch[/\\]lib|nvidia[/\\]\w+[/\\]lib)[/\\]")


def _undefined_shape(sym: str, ver: str, by: str, text: str, row: dict | None) -> str:
    if TORCH_OWN_LIB.search(by) and TORCH_OWN_SYMBOL.match(sym):
        return "own"
    abi = _abi_shape(sym, text)
    if abi:
        return abi
    # only where the library's row says what an unlinked module is (the CUDA toolkit libraries)
    # ... and not when the module named is that library itself (a dlsym into an older copy:
    # cuDNN asking CUDA 8's libnvrtc.so for nvrtcGetCUBIN)
    if not ver and not PROVIDED.search(by) and "undefined-symbol.unlinked" in (row or {}).get(
            "modes", {}) and not (row and row["_match"].match(re.split(r"[/\\]", by)[-1])):
        return "unlinked"
    return ""
# A compiled module named by its path: site-packages/<pkg>/..., torch_extensions/<build>/<op>.
EXT_PATH = re.compile(r"(?:torch_extensions/[^/\s]+/(?P<op>[\w-]+)/|(?:site|dist)-packages/"
                      r"(?P<pkg>[\w.-]+?)(?:/|\.cpython|\.so))")


def _line_before(text: str, start: int) -> str:
    return text[text.rfind("\n", 0, start) + 1:start]


def _missing_shape(text: str, start: int, lib: str, around: str = "") -> tuple[str, str]:
    """(shape, program) of a missing library from the words before it on its line, or the
    hint the same message gives after it (the traceback's frames: the message's, else the
    lines ``around`` it)."""
    before = _line_before(text, start)
    prog = PROGRAM.search(before)
    if prog:
        return "program", prog.group("prog") or ""
    if PATH_LOADER.search(before) or PATH_HINT.search(text, start, start + 600):
        return "path", ""
    if _torch_imports_it(f"{around}\n{text[:start]}"):
        return "torch", ""
    wanted = CUDA_MAJOR_SONAME.match(lib)
    torch_cuda = TORCH_CUDA.search(text)
    if wanted and torch_cuda and (torch_cuda.group("cu") or torch_cuda.group("v")) != \
            wanted.group("cu"):
        return "extension", ""  # built for another CUDA major than the one installed
    if EXTENSION.search(before):
        return "extension", ""
    # The development name without a soname version (libcuda.so): a dlopen by that name,
    # which a driver or runtime package does not install (it ships libcuda.so.1).
    return ("unversioned" if lib.endswith(".so") else ""), ""


# - torch's own import (_load_global_deps, `from torch._C import *`): its pip wheels take those
#   libraries from the nvidia-* wheels they require, so one missing is an install without them,
#   not an extension built elsewhere (a conda build, its conda-bld path, links its own packages).
FRAME = re.compile(r'File "(?P<path>[^"\n]+)", line \d+, in (?P<func>\S+)')


def _torch_imports_it(frames_text: str) -> bool:
    """True when the last frame of ``frames_text`` (ctypes' own left out) is torch/__init__.py."""
    frames = [m for m in FRAME.finditer(frames_text[-3000:])
              if not re.search(r"[/\\]ctypes[/\\]__init__\.py$", m["path"])]
    return bool(frames) and bool(re.search(r"[/\\]torch[/\\]__init__\.py$", frames[-1]["path"])) \
        and "conda-bld" not in frames[-1]["path"]


def _extension(path: str) -> str:
    """The extension a path names: its torch_extensions op, its site-packages package, or
    the module a bare CPython extension file is (flash_attn_2_cuda.cpython-310-...so)."""
    m = EXT_PATH.search(path)
    if m:
        return m.group("op") or m.group("pkg")
    name = Path(path).name
    return name.split(".cpython")[0] if ".cpython" in name else ""


DEPENDENCY = re.compile(r"\b" + LIB + r"(?:'|\"|:|,)?\s*(?:: )?cannot open shared object file")


def _loads_what_is_missing(text: str, match: re.Match, lib: str) -> bool:
    """True when ``lib`` is the library being loaded and the rest of its line names the
    dependency that is missing ("Could not load library libcudnn_cnn_infer.so.8. Error:
    libcuda.so: cannot open shared object file"): that one is the finding."""
    rest = text[match.end():].split("\n", 1)[0]
    dependency = DEPENDENCY.search(rest)
    return bool(dependency) and dependency.group(1) != lib


def parse(text: str, around: str = "") -> list[Finding]:
    """The loader and linker errors in ``text``, each library once."""
    found: dict[tuple[str, str], Finding] = {}
    for m in MISSING.finditer(text):
        lib = loader_words.linux_name(next(g for g in m.groups()[1:] if g).rstrip("."))
        if _loads_what_is_missing(text, m, lib):
            continue
        shape, program = _missing_shape(text, m.start(), lib, around)
        found.setdefault(("missing", lib), Finding(
            "missing", lib, m.group(0), library_row(lib), version=soname_version(lib),
            where=m.group("path") or "", shape=shape, program=program))
    for m in VERSION.finditer(text):
        lib = Path(m.group("lib")).name if m.group("lib") else "libstdc++.so.6" \
            if m.group("ver").startswith(("GLIBCXX", "CXXABI")) else "libc.so.6"
        found.setdefault(("symbol-version", lib), Finding(
            "symbol-version", lib, m.group(0), library_row(lib), version=m.group("ver"),
            required_by=(m.group("by") or "").strip(), where=m.group("lib") or "",
            extension=_extension(m.group("by") or "")))
    for m in (*UNDEFINED.finditer(text), *NOT_DEFINED.finditer(text)):
        sym, ver = m.group("sym"), m.group("ver") or ""
        row = library_row(ver) if ver.startswith("lib") else None
        row = row or symbol_row(sym)
        lib = ver if ver.startswith("lib") else f"the library exporting {sym}"
        by = m.group("by") or ""
        shape = _undefined_shape(sym, ver, by, text, row)
        if shape == "own":  # torch 1.x's TH* symbols have no row of their own
            row = library_row("libtorch.so")
        found.setdefault(("undefined-symbol", sym), Finding(
            "undefined-symbol", lib, m.group(0), row, symbol=sym, version=ver,
            required_by=by, shape=shape, extension=_extension(by)))
    for m in LINK.finditer(text):
        lib = f"lib{m.group('name')}.so"
        found.setdefault(("link", lib), Finding("link", lib, m.group(0), library_row(lib)))
    return list(found.values())


# -- --here: does this node and environment have it? -------------------------------------

def _site_folders(node) -> list[Path]:
    """The environment's import path (the job's interpreter, its files when it cannot run)."""
    try:
        return [Path(p) for p in target_env.search_path(node) if p.endswith("-packages")]
    except Exception:  # an unreadable environment: the other places still answer
        return []


def _glob(folder: Path, stem: str) -> list[Path]:
    try:
        return sorted(p for p in folder.glob(stem + "*") if p.is_file() or p.is_symlink())
    except OSError:
        return []


def look_here(finding: Finding, node) -> list[str]:
    """Lines saying where (and whether) this node and environment have the library."""
    if finding.kind == "undefined-symbol" and torch_symbols.TORCH_SYMBOL.match(finding.symbol):
        return _torch_here(finding.symbol, node)
    stem = finding.library.split(".so", 1)[0] + ".so"
    lines = []
    env = node.env
    places = [("LD_LIBRARY_PATH", d) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    if finding.kind == "link":
        places = [("LIBRARY_PATH", d) for d in env.get("LIBRARY_PATH", "").split(":") if d]
        cuda = env.get("CUDA_HOME") or env.get("CUDA_PATH")
        if cuda:
            places += [("CUDA_HOME", f"{cuda}/lib64"), ("CUDA_HOME", f"{cuda}/lib")]
    for label, folder in places:
        for path in _glob(Path(folder), stem):
            lines.append(f"{label}: {path}")
    cache_hits = {n: p for n, p in sharedlibs.ldconfig_cache(node).items() if n.startswith(stem)}
    for name, paths in sorted(cache_hits.items()):
        lines.append(f"ldconfig cache: {name} => {paths[0]}")
    for site in _site_folders(node):
        for lib_dir in [*sorted(site.glob("nvidia/*/lib")), site / "torch" / "lib"]:
            for path in _glob(lib_dir, stem):
                lines.append(f"environment ({site}): {path}")
    lines += _container_lines(finding, node, stem)
    if finding.kind == "link" and not any(Path(x.split(": ", 1)[1].split(" => ")[-1]).name
                                          == stem for x in lines):
        lines.append(f"no unversioned {stem} in LIBRARY_PATH, CUDA_HOME or the ldconfig "
                     f"cache: the link step cannot succeed here")
    elif finding.kind == "missing" and not any(finding.library in x for x in lines):
        lines.append(f"{finding.library} is not found here either (LD_LIBRARY_PATH, ldconfig "
                     f"cache, the environment's site-packages)")
    if finding.kind == "symbol-version":
        for x in list(lines):
            path = x.split(": ", 1)[1].split(" => ")[-1]
            has = has_version(path, finding.version)
            if has is not None:
                lines.append(f"{path} {'has' if has else 'lacks'} {finding.version}")
    return lines or [f"{finding.library}: nothing found here"]


def _torch_here(symbol: str, node) -> list[str]:
    """Whether this environment's torch defines a c10/at/torch symbol, and which std::string
    ABI the symbol and torch use (read from torch's libraries, torch_symbols)."""
    torch = torch_info.torch_build(node)
    if not torch.installed or not torch.location:
        return ["torch is not installed in this environment: nothing to compare the symbol with"]
    prefix_lib = Path(target_env.environment(node).prefix) / "lib"
    exports = torch_symbols.torch_exports(node, Path(torch.location) / "lib", prefix_lib)
    if not exports.names.strip(b"\0"):
        return [f"no symbols could be read from torch {torch.version}'s libraries"]
    if exports.defines(symbol):
        return [f"torch {torch.version} here defines {symbol}: the job loaded another torch "
                "than this environment's (another environment, or LD_LIBRARY_PATH)"]
    asked = torch_symbols.abi_of(symbol)
    line = f"torch {torch.version} here does not define it"
    if asked and exports.abi and asked != exports.abi:
        return [f"{line}: the symbol is the {asked} C++ string ABI's, torch's is the "
                f"{exports.abi} one: this node shows loader.ext-cxx11-abi-mismatch"]
    same = f", the same string ABI ({exports.abi})" if asked and asked == exports.abi else ""
    return [f"{line}{same}: the extension was built against another torch release: this node "
            "shows loader.ext-built-for-other-torch"]


def _container_lines(finding: Finding, node, stem: str) -> list[str]:
    """Inside Apptainer/Singularity, --nv (--rocm) binds the host's driver libraries into
    /.singularity.d/libs; inside Docker they come only with --gpus (the NVIDIA toolkit). Only
    for the driver's own libraries (a row's from_host): libaio or libGL come from the image."""
    if not (finding.row or {}).get("from_host"):
        return []
    libs = node.path("/.singularity.d/libs")
    if node.env.get("APPTAINER_CONTAINER") or node.env.get("SINGULARITY_CONTAINER") \
            or node.path("/.singularity.d").is_dir():
        bound = _glob(libs, stem) if libs.is_dir() else []
        if bound:
            return [f"container bind (/.singularity.d/libs): {p}" for p in bound]
        return [f"inside an Apptainer/Singularity container, /.singularity.d/libs has no "
                f"{stem}*: the host's driver libraries are bound only with --nv (--rocm)"]
    if node.path("/.dockerenv").exists():
        return [f"inside a Docker container: {finding.library} comes from the host only when "
                f"it runs with --gpus (nvidia-container-toolkit) or the image installs it"]
    return []


def has_version(path: str, version: str) -> bool | None:
    """Whether the library file carries the symbol version string (GLIBCXX_3.4.30)."""
    try:
        with open(os.path.realpath(path), "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(version.encode() + b"\0") >= 0
    except (OSError, ValueError):
        return None

"""The Python packages of the job's environment read by structure: which one is missing, and
what a binary part could not load (which release of a package another one requires is read
by the build family, families/build.py; which torch xFormers was built for, by the GPU family).

- transformers' backend checks and ``No module named 'X'`` name a package that is absent from
  the interpreter the job runs (only packages of the training stack: a module of the user's
  own code that is not on the path is the code's matter);
- bitsandbytes names the library it could not load (its CUDA binary, or a CUDA runtime library
  that binary needs);
- a build that cannot import torch inside pip's or uv's isolated build environment;
- a name NumPy removed (1.24's aliases, 2.0's expired names) that a package still uses, and
  an extension built against a newer NumPy C API than the installed NumPy's;
- setuptools/pip older than the interpreter (Python 3.12 removed pkgutil.ImpImporter), and
  setuptools newer than the code importing pkg_resources (70.x stopped exporting
  ``packaging`` there, 82 removed pkg_resources): which file imports what;
- one package of the stack calling another as another release has it: a submodule of an
  installed package that is not there (``No module named 'triton.ops'``: the package is
  importable, the module moved or is not added yet), and a keyword a package's own frame
  passes to a callee that refuses it;
- pip refusing a pinned torch build (``torch==2.1.2+cu118``) whose release it did find, without
  the label: a local version label is only on PyTorch's own index, which pip did not read;
- pip refusing the release a requirement names because its Requires-Python excludes this
  interpreter (pip's "Ignored the following versions that require a different python version").
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.stack_api import api_readings

FAMILY = "python"

# transformers' backend checks (requires_backends) and its flash-attention check.
# transformers' own check of accelerate before device_map/low_cpu_mem_usage (absent, or older
# than the release it names: is_accelerate_available takes a minimum); bitsandbytes' hint with
# the same words is its own (its thread's cause was no visible GPU).
BACKEND = re.compile(r"requires the (?P<name>[\w-]+) library but it was not found in your "
                     r"environment|the package (?P<pkg>\w+) seems to be not installed"
                     r"|`device_map` requires (?P<acc>Accelerate): `pip install '?accelerate"
                     # tokenizers' conversion of a slow (sentencepiece) tokenizer to a fast one
                     r"|You need to have (?P<conv>sentencepiece) installed to convert a slow"
                     # transformers >= 4.40's wording, and 5.x's (sentencepiece or tiktoken)
                     r"|If it's based on (?P<conv2>sentencepiece), make sure you have sentencepiece "
                     r"installed|You need to have (?P<conv3>sentencepiece) or tiktoken installed")
NO_MODULE = re.compile(r"No module named '(?P<name>[\w]+)(?:\.[\w.]+)?'")
# Import names of the training stack whose absence is the environment's, not the code's
# (mpi4py: DeepSpeed's MPI discovery has its own mode, launch.ds-mpi-discovery-fallback;
# torch: a bare "No module named 'torch'" is mostly a package's build in pip's isolated
# environment, whose own lines, when the message has them, name env.build-without-torch).
STACK = frozenset({
    "deepspeed", "transformers", "datasets", "accelerate", "tokenizers", "peft",
    "trl", "safetensors", "huggingface_hub", "sentencepiece", "google", "flash_attn",
    "bitsandbytes", "xformers", "triton", "evaluate", "einops", "torchvision", "torchaudio",
    "apex", "mamba_ssm", "causal_conv1d", "liger_kernel", "megatron", "tensorboard"})
# What a CUDA package's setup.py imports before it builds (flash-attn, causal-conv1d and
# mamba-ssm import packaging first, then torch), built where pip or uv isolate the build.
BUILD_IMPORTS = frozenset({"torch", "packaging"})
ISOLATED_BUILD = re.compile(r"pip-(?:install|build-env)-\w+|get_requires_for_build_wheel|Getting "
                            r"requirements to build wheel|doesn't declare it as a build dependency")
# bitsandbytes' loader: the library it could not load (its own binary, or the CUDA runtime
# library that binary needs), or the binary its CUDA version asked for.
BITSANDBYTES = re.compile(r"Could not load bitsandbytes native library: (?P<lib>[\w.+-]+)"
                          r"|Required library version not found: (?P<binary>libbitsandbytes_\w+"
                          r"\.so)|Could not find the bitsandbytes CUDA binary at \S*?"
                          r"(?P<asked>libbitsandbytes_cuda\w+\.(?:so|dll))"
                          # bitsandbytes >= 0.46's wording of the same
                          r"|Configured CUDA binary not found at \S*?"
                          r"(?P<configured>libbitsandbytes_cuda\w+\.(?:so|dll|dylib))")
# OpenMMLab packages (mmdet, mmseg, mmpose) check the installed mmcv against the range their
# release supports, at import
MMCV_RANGE = re.compile(r"\bMMCV==(?P<found>\S+) is used but incompatible\. Please install "
                        r"(?P<pkg>mmcv(?:-full)?)\s*(?P<wants>>=[^\n]*?)\.?$", re.M)


# A name NumPy removed that a package (or the code) still uses: 1.24 removed the aliases of
# the builtins (np.float, np.int, ...: "`np.float` was a deprecated alias"), 2.0 the names its
# migration guide lists ("`np.float_` was removed in the NumPy 2.0 release").
NUMPY_ALIASES = frozenset({"float", "int", "bool", "object", "complex", "str", "long", "unicode"})
NUMPY2_REMOVED = frozenset({
    "float_", "complex_", "string_", "unicode_", "round_", "NaN", "Inf", "Infinity", "NINF",
    "PINF", "NZERO", "PZERO", "infty", "product", "cumproduct", "alltrue", "sometrue", "asfarray",
    "find_common_type", "msort", "longfloat", "singlecomplex", "cfloat", "longcomplex",
    "clongfloat", "int0", "uint0", "bool8", "object0", "mat", "BUFSIZE"})
# NumPy 2.4 expired more 2.0 deprecations (its release notes)
NUMPY24_REMOVED = frozenset({"in1d", "trapz"})
# (quotes as a forum or a terminal rendered them: typographic quotes, `np.int` made a link)
NUMPY_GONE = re.compile(r"`\[?np\.(?P<name>\w+)(?:\]\([^)\s]*\))?` (?:was a deprecated alias|was "
                        r"removed in the NumPy (?P<release>2\.0) release)|module ['‘]numpy['’] has no "
                        r"attribute ['‘](?P<attr>\w+)['’]|cannot import name ['‘](?P<imp>\w+)['’] "
                        r"from ['‘]numpy['’]")
# NumPy's own check at an extension's import: the C API the binary was compiled against is
# newer than the installed NumPy's (NumPy 2's ABI break has its own words: env.numpy2-abi).
NUMPY_API = re.compile(r"compiled against (?:the )?API version (?:0x)?(?P<built>[0-9a-fA-F]+) but "
                       r"this version of numpy is (?:0x)?(?P<have>[0-9a-fA-F]+)")
# Python 3.12 removed pkgutil.ImpImporter, which setuptools' pkg_resources (before 66.1) and the
# pip that vendors it (before 23.1) touch at import: the tools are older than the interpreter.
IMP_IMPORTER = re.compile(r"module 'pkgutil' has no attribute 'ImpImporter'")
# torch <= 2.1's extension builder (and older code: CLIP) runs `from pkg_resources import
# packaging`: setuptools 70.0-70.3 does not export the name; setuptools >= 82 has no
# pkg_resources for any importer (tensorboard < 2.21, old setup.py files), nor has a venv
# without setuptools. The importing file is the traceback frame over the import statement.
PKG_RESOURCES_NAME = re.compile(r"cannot import name '(?P<name>\w+)' from 'pkg_resources'")
PKG_RESOURCES_GONE = re.compile(r"No module named 'pkg_resources'(?!\w)")
IMPORTING_FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+[^\n]*\n\s*(?:from pkg_resources '
                             r'import \w+|import pkg_resources)\b')


def _numpy_name(message: str) -> tuple[str, str] | None:
    """The removed NumPy name and the release that removed it."""
    for m in NUMPY_GONE.finditer(message):
        name = m["name"] or m["attr"] or m["imp"]
        if m["release"] or name in NUMPY2_REMOVED:
            return m.group(0), f"np.{name} (removed in NumPy 2.0)"
        if name in NUMPY24_REMOVED:
            return m.group(0), f"np.{name} (removed in NumPy 2.4)"
        if name in NUMPY_ALIASES:
            return m.group(0), f"np.{name} (removed in NumPy 1.24)"
    return None

# A submodule of a package of the stack that is not there while the package is: the module
# moved or was removed (triton 3.2's triton.ops that bitsandbytes < 0.45.1 imports,
# huggingface_hub 0.25's utils._errors) or is not added yet (huggingface_hub.errors before
# 0.23): the importing package and the imported one are from releases that do not go together.
# Not: google (a namespace: google.protobuf is protobuf missing), apex (pip's unrelated "apex"
# package), megatron (a source tree on the path), deepspeed.ops (ops built on first use).
# torch's own submodules too (torch._custom_ops that torchvision 0.16+ imports, accelerate's
# torch.distributed.checkpoint.format_utils of torch 2.3, torch.nn.attention of 2.3, torch._six
# that 2.0 removed): the torch installed is older or newer than the importer was built for.
# Not torch._C (the compiled core: torch imported from its source tree or a broken install, or
# torch._C._distributed_c10d of a torch built without distributed), and not "...; 'x' is not a
# package" (a file of the user's named like the package shadows it), nor a core package every
# torch has (torch.nn alone: a broken install or a folder named torch), nor a class imported
# as a module (torch.nn.Module: the code's error).
SUBMODULE = re.compile(r"No module named [`'‘](?P<root>\w+)\.(?P<sub>[\w.]+)['’`]"
                       r"(?P<shadow>; [`'‘][\w.]+['’`] is not a package)?")
NOT_MOVED = frozenset({"google", "apex", "megatron"})
TORCH_CORE = frozenset({"_C", "nn", "utils", "autograd", "cuda", "optim", "distributed"})
HUB = "huggingface_hub"


def moved_module(message: str, stack: frozenset[str]) -> Reading | None:
    for m in SUBMODULE.finditer(message):
        root, sub = m["root"], m["sub"]
        if root not in stack | {HUB, "torch"} or root in NOT_MOVED or m["shadow"] \
                or (root == "deepspeed" and sub.startswith("ops")) \
                or (root == "torch" and (sub in TORCH_CORE or sub.split(".")[0] == "_C"
                                         or sub.split(".")[-1][:1].isupper())):
            continue
        mode = "hf.hub-version-api-removed" if root == HUB else \
            "hf.transformers-too-old-for-model" if root == "transformers" and sub.startswith(
                "models.") else "env.package-version-mismatch"  # a model the release lacks
        return reading(FAMILY, mode, m.group(0), package=root, module=f"{root}.{sub}",
                       importer=_frame_package(message[:m.start()]))
    return None


# The innermost traceback frame above an exception: a file in an installed package
# (site-packages, dist-packages) names the package whose code made the failing call.
FRAME = re.compile(r"""File "?(?P<path>[^"\n]*?[/\\](?:site|dist)-packages[/\\](?P<pkg>\w+)"""
                   r"""[/\\][^"\n:]*?\.py)"?(?:, line |:)\d+""")
# Packages of the training stack whose own frames calling another's API with a keyword that
# API refuses means two releases apart (a wrapper such as huggingface_hub's deprecation
# decorator only forwards).
CALLERS = frozenset({
    "transformers", "accelerate", "trl", "peft", "deepspeed", "diffusers", "datasets",
    "optimum", "unsloth", "lightning", "pytorch_lightning", "llamafactory", "axolotl", "swift",
    "sentence_transformers", "vllm", "bitsandbytes"})
REFUSED = re.compile(r"TypeError: (?P<callee>[\w.]*\w)\(\) got an unexpected keyword argument "
                     r"[`'‘](?P<kw>\w+)['’`]")
SUPER_INIT = re.compile(r"\bsuper\([^)]*\)\.__init__\(")


def _frame_package(before: str) -> str:
    frames = list(FRAME.finditer(before))
    return frames[-1]["pkg"] if frames else ""


def refused_keyword(message: str) -> Reading | None:
    """A keyword the innermost frame, in an installed package of the stack, passes itself
    (written in the source line the traceback shows, or a ``super().__init__(`` of a class
    built on another package's) and the callee refuses. Not when the frame forwards the
    caller's ``**kwargs`` (the user's argument), nor when the frame is the user's code."""
    for m in REFUSED.finditer(message):
        before = message[:m.start()]
        frames = list(FRAME.finditer(before))
        if not frames:
            continue
        frame = frames[-1]
        source = before[frame.end():]
        if frame["pkg"] not in CALLERS or FRAME.search(source):
            continue
        literal = re.search(rf"\b{m['kw']}\s*=", source)
        parent = SUPER_INIT.search(source) and m["callee"].endswith("__init__")
        if literal or parent:
            return reading(FAMILY, "env.package-version-mismatch", m.group(0),
                           caller=frame["pkg"], api=m["callee"], keyword=m["kw"])
    return None


# pip on a pinned build of the torch family: a local version label (+cu118, +cpu, +rocm5.7) is
# never on PyPI (PEP 440 forbids uploading one), so such builds are only on PyTorch's index,
# download.pytorch.org/whl/<label>. When the versions pip saw hold the release itself and no
# labelled build at all, pip read PyPI or a mirror only (no index given, a mirror as the only
# index, torch_stable.html passed as an index) and the release has wheels for this interpreter.
# Not when labelled builds are listed (PyTorch's index was read; the release has no build of
# that label there, pytorch/pytorch#54172), nor when the release is not listed ("from versions:
# none", or only other releases: the interpreter or the platform has no wheel of it).
LOCAL_PIN = re.compile(r"satisfies the requirement (?P<pkg>torch|torchvision|torchaudio|torchtext"
                       r"|xformers)==(?P<release>\d+(?:\.\d+)+)\+(?P<label>cu\d+|cpu|rocm[\d.]*\d"
                       r"|xpu)\b[^\n]*?\(from versions: (?P<versions>[^)\n]*)\)")
INDEX = "https://download.pytorch.org/whl/"


def _label_names(label: str) -> str:
    if label.startswith("cu"):
        return f"CUDA {label[2:-1]}.{label[-1]}"
    if label.startswith("rocm"):
        return f"ROCm {label[4:]}"
    return {"cpu": "CPU only", "xpu": "Intel XPU"}[label]


def local_pin(message: str) -> Reading | None:
    for m in LOCAL_PIN.finditer(message):
        listed = [v.strip() for v in m["versions"].split(",")]
        if m["release"] in listed and not any("+" in v for v in listed):
            return reading(FAMILY, "env.torch-local-version-needs-pytorch-index", m.group(0),
                           package=m["pkg"], release=m["release"], label=m["label"],
                           build_for=_label_names(m["label"]), index=INDEX + m["label"])
    return None


# pip (>= 21.2) lists the releases it skipped for their Requires-Python, of every package it
# looked at (the line names no package), before the requirement it could not satisfy. The
# requirement's own release (==X, >=X, ~=X) in that list, and not among the versions pip did
# find, is the interpreter outside what that release supports. Not when the list holds only
# other releases ("from versions: none" of a torch on PyPy or 32-bit Python beside an older
# package's skipped releases: no wheel, pytorch/pytorch#97865).
IGNORED = re.compile(r"Ignored the following versions that require a different python version:"
                     r"(?P<entries>[^\n]*(?:\n[ \t]+[^\n]*)*)")
ENTRY = re.compile(r"(?P<release>\d[\w.!+]*) Requires-Python (?P<spec>[^;\n]+)")
WANTED = re.compile(r"satisfies the requirement (?P<pkg>[A-Za-z0-9][\w.-]*)(?:\[[^\]]*\])?\s*"
                    r"(?P<spec>(?:[=~!<>]=?=?\s*[\w.*+!]+\s*,?\s*)+)(?:[^\n]*?\(from versions: "
                    r"(?P<versions>[^)\n]*)\))?")
INTERPRETER = re.compile(r"\b[Pp]ython ?(?P<v>3\.\d{1,2}(?:\.\d+)?)\b|-cp3(?P<cp>\d{1,2})-")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:2])


def _python_side(spec: str, interpreter: str) -> str:
    """Whether the interpreter is older or newer than the range: certain when the range has one
    side only, or when the text shows the interpreter."""
    low = re.findall(r">=?\s*(3\.\d+)", spec)
    high = re.findall(r"<=?\s*(\d(?:\.\d+)?)", spec)
    if interpreter:
        if low and _key(interpreter) < _key(low[0]):
            return "older"
        if high and _key(interpreter) >= _key(high[0]):
            return "newer"
    elif low and not high:
        return "older"
    elif high and not low:
        return "newer"
    return ""


# torch's wheels are per CPython minor and it has no sdist: a pin with no wheel for this
# interpreter is missing from pip's list, which holds only releases built for it
TORCH_PIN = re.compile(r"satisfies the requirement (?P<pkg>torch|torchvision|torchaudio)\s*(?:==|~=)"
                       r"\s*(?P<pin>\d+\.\d+(?:\.\d+)?)(?:\+\w+)?[^\n]*?\(from versions: "
                       r"(?P<versions>\d[^)\n]*)\)")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def torch_pin(message: str) -> Reading | None:
    m = TORCH_PIN.search(message)
    if not m:
        return None
    offered = sorted({_release(v) for v in m["versions"].split(",") if v.strip()})
    pin = _release(m["pin"])
    if not offered or pin[:2] in {o[:2] for o in offered}:
        return None  # the pin's release is offered: another cause (a local version label)
    side = "newer" if offered[0] > pin else "older" if offered[-1] < pin else ""
    if not side:
        return None
    shown = INTERPRETER.search(message)
    return reading(FAMILY, "env.torch-pin-not-built-for-interpreter", m.group(0)[:160],
                   package=m["pkg"], pin=m["pin"],
                   offered=f"{'.'.join(map(str, offered[0]))} to {'.'.join(map(str, offered[-1]))}",
                   python_is=f"{side} than {m['pkg']} {m['pin']} has wheels for",
                   **({"interpreter": shown["v"] or f"3.{shown['cp']}"} if shown else {}))


def requires_python(message: str, around: str = "") -> Reading | None:
    """``message`` is pip's ignored line or its requirement line; ``around``, the lines near it,
    holds the other one (pip prints them one after the other)."""
    if not (IGNORED.search(message) or WANTED.search(message)):
        return None
    text = f"{message}\n{around}"
    for ignored in IGNORED.finditer(text):
        skipped = {m["release"]: m["spec"].strip() for m in ENTRY.finditer(ignored["entries"])}
        for want in WANTED.finditer(text):
            named = re.findall(r"(?:===?|>=|~=)\s*([\w.!+]+)", want["spec"])
            found = {v.strip() for v in (want["versions"] or "").split(",")}
            release = next((v for v in named if v in skipped and v not in found), None)
            if release is None:
                continue
            shown = INTERPRETER.search(text)
            interpreter = (shown["v"] or f"3.{shown['cp']}") if shown else ""
            return reading(FAMILY, "env.python-outside-requires-python", want.group(0)[:200],
                           package=want["pkg"], release=release,
                           requires_python=skipped[release], interpreter=interpreter,
                           python_is=_python_side(skipped[release], interpreter))
    return None


def pkg_resources_import(message: str, around: str = "") -> Reading | None:
    """A pkg_resources import the environment's setuptools cannot serve, and the file that
    runs it (the traceback frame over the import statement, in the message or around it)."""
    hit = PKG_RESOURCES_NAME.search(message) or PKG_RESOURCES_GONE.search(message)
    if hit is None:
        return None
    statement = IMPORTING_FRAME.search(f"{message}\n{around}")
    importer = statement["file"] if statement else ""
    if importer.replace("\\", "/").endswith("torch/utils/cpp_extension.py"):
        importer = f"{importer} (torch's extension builder: torch 2.1 or older)"
    gone = hit.re is PKG_RESOURCES_GONE
    setuptools = ("82 or later, or none (no pkg_resources)" if gone else
                  "70.0-70.3 (no pkg_resources.packaging)" if hit["name"] == "packaging" else
                  f"a release without pkg_resources.{hit['name']}")
    return reading(FAMILY, "env.pkg-resources-unavailable", hit.group(0), importer=importer,
                   setuptools=setuptools)


def read(message: str, around: str = "") -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    absent = BACKEND.search(message)
    module = NO_MODULE.search(message)
    if module and module["name"] in BUILD_IMPORTS and ISOLATED_BUILD.search(f"{message}\n{around}"):
        found.append(reading(FAMILY, "env.build-without-torch", module.group(0),
                             package=module["name"], built_in="an isolated build environment"))
    elif moved := moved_module(message, STACK):
        found.append(moved)
    elif absent or (module and module["name"] in STACK):
        name = (absent["name"] or absent["pkg"] or absent["conv"] or absent["conv2"]
                or absent["conv3"] or absent["acc"].lower()) if absent \
            else module["name"]
        found.append(reading(FAMILY, "env.package-missing", (absent or module).group(0),
                             package=name))
    if gone := _numpy_name(message):
        found.append(reading(FAMILY, "env.numpy-name-removed", gone[0], name=gone[1]))
    if imp := IMP_IMPORTER.search(message):
        found.append(reading(FAMILY, "env.setuptools-too-old-for-python", imp.group(0),
                             removed="pkgutil.ImpImporter (Python 3.12)",
                             importer="pkg_resources" if "pkg_resources" in message else ""))
    # the C API line above a NumPy failure (numpy.core.multiarray's ImportError, torch's
    # "Numpy is not available") is its cause; above another failure it is only a warning
    api = NUMPY_API.search(message) or (NUMPY_API.search(around)
                                        if re.search(r"numpy", message, re.I) else None)
    if api and int(api["built"], 16) > int(api["have"], 16):
        found.append(reading(FAMILY, "env.numpy-older-than-build", api.group(0),
                             built_for=f"NumPy C API 0x{api['built'].lower()}",
                             installed=f"NumPy C API 0x{api['have'].lower()}"))
    if pkg := pkg_resources_import(message, around):
        found.append(pkg)
    if refused := refused_keyword(message):
        found.append(refused)
    if pin := local_pin(message) or torch_pin(message):
        found.append(pin)
    elif outside := requires_python(message, around):
        found.append(outside)
    bnb = BITSANDBYTES.search(message)
    if bnb:
        found.append(reading(FAMILY, "loader.bitsandbytes-cuda-binary", bnb.group(0),
                             library=bnb["lib"] or bnb["binary"] or bnb["asked"]
                             or bnb["configured"]))
    found += api_readings(message)
    if mmcv := MMCV_RANGE.search(message):
        found.append(reading(FAMILY, "env.package-version-mismatch", mmcv.group(0),
                             requires=f"{mmcv['pkg']}{mmcv['wants']}",
                             found=f"mmcv {mmcv['found']}"))
    return found

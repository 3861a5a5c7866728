"""The Python packages of the job's environment read by structure: which one is missing, and
what a binary part could not load (which release of a package another one requires is read
by the build family, families/build.py; which torch xFormers was built for, by the GPU family).

- transformers' backend checks and ``No module named 'X'`` name a package that is absent from
  the interpreter the job runs (only packages of the training stack: a module of the user's
  own code that is not on the path is the code's matter);
- bitsandbytes names the library it could not load (its CUDA binary, or a CUDA runtime library
  that binary needs);
- a build that cannot import torch inside pip's or uv's isolated build environment;
- a name NumPy removed (1.24's aliases, 2.0's expired names) that a package still uses;
- setuptools/pip older than the interpreter (Python 3.12 removed pkgutil.ImpImporter).
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "python"

# transformers' backend checks (requires_backends) and its flash-attention check.
# transformers' own check of accelerate before device_map/low_cpu_mem_usage (absent, or older
# than the release it names: is_accelerate_available takes a minimum); bitsandbytes' hint with
# the same words is its own (its thread's cause was no visible GPU).
BACKEND = re.compile(r"requires the (?P<name>[\w-]+) library but it was not found in your "
                     r"environment|the package (?P<pkg>\w+) seems to be not installed"
                     r"|`device_map` requires (?P<acc>Accelerate): `pip install '?accelerate")
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
# A package setup.py that imports torch, built where pip or uv isolate the build.
ISOLATED_BUILD = re.compile(r"pip-(?:install|build-env)-\w+|get_requires_for_build_wheel|Getting "
                            r"requirements to build wheel|doesn't declare it as a build dependency")
# bitsandbytes' loader: the library it could not load (its own binary, or the CUDA runtime
# library that binary needs), or the binary its CUDA version asked for.
BITSANDBYTES = re.compile(r"Could not load bitsandbytes native library: (?P<lib>[\w.+-]+)"
                          r"|Required library version not found: (?P<binary>libbitsandbytes_\w+"
                          r"\.so)")


# A name NumPy removed that a package (or the code) still uses: 1.24 removed the aliases of
# the builtins (np.float, np.int, ...: "`np.float` was a deprecated alias"), 2.0 the names its
# migration guide lists ("`np.float_` was removed in the NumPy 2.0 release").
NUMPY_ALIASES = frozenset({"float", "int", "bool", "object", "complex", "str", "long", "unicode"})
NUMPY2_REMOVED = frozenset({
    "float_", "complex_", "string_", "unicode_", "round_", "NaN", "Inf", "Infinity", "NINF",
    "PINF", "NZERO", "PZERO", "infty", "product", "cumproduct", "alltrue", "sometrue", "asfarray",
    "find_common_type", "msort", "longfloat", "singlecomplex", "cfloat", "longcomplex",
    "clongfloat", "int0", "uint0", "bool8", "object0", "mat"})
# (quotes as a forum or a terminal rendered them: typographic quotes, `np.int` made a link)
NUMPY_GONE = re.compile(r"`\[?np\.(?P<name>\w+)(?:\]\([^)\s]*\))?` (?:was a deprecated alias|was "
                        r"removed in the NumPy (?P<release>2\.0) release)|module ['‘]numpy['’] has no "
                        r"attribute ['‘](?P<attr>\w+)['’]")
# Python 3.12 removed pkgutil.ImpImporter, which setuptools' pkg_resources (before 66.1) and the
# pip that vendors it (before 23.1) touch at import: the tools are older than the interpreter.
IMP_IMPORTER = re.compile(r"module 'pkgutil' has no attribute 'ImpImporter'")


def _numpy_name(message: str) -> tuple[str, str] | None:
    """The removed NumPy name and the release that removed it."""
    for m in NUMPY_GONE.finditer(message):
        name = m["name"] or m["attr"]
        if m["release"] or name in NUMPY2_REMOVED:
            return m.group(0), f"np.{name} (removed in NumPy 2.0)"
        if name in NUMPY_ALIASES:
            return m.group(0), f"np.{name} (removed in NumPy 1.24)"
    return None


def read(message: str) -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    absent = BACKEND.search(message)
    module = NO_MODULE.search(message)
    if module and module["name"] == "torch" and ISOLATED_BUILD.search(message):
        found.append(reading(FAMILY, "env.build-without-torch", module.group(0),
                             package="torch", built_in="an isolated build environment"))
    elif absent or (module and module["name"] in STACK):
        name = (absent["name"] or absent["pkg"] or absent["acc"].lower()) if absent \
            else module["name"]
        found.append(reading(FAMILY, "env.package-missing", (absent or module).group(0),
                             package=name))
    if gone := _numpy_name(message):
        found.append(reading(FAMILY, "env.numpy-name-removed", gone[0], name=gone[1]))
    if imp := IMP_IMPORTER.search(message):
        found.append(reading(FAMILY, "env.setuptools-too-old-for-python", imp.group(0),
                             removed="pkgutil.ImpImporter (Python 3.12)",
                             importer="pkg_resources" if "pkg_resources" in message else ""))
    bnb = BITSANDBYTES.search(message)
    if bnb:
        found.append(reading(FAMILY, "loader.bitsandbytes-cuda-binary", bnb.group(0),
                             library=bnb["lib"] or bnb["binary"]))
    return found

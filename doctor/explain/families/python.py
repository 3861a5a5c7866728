"""The Python packages of the job's environment read by structure: which one is missing, and
what a binary part could not load (which release of a package another one requires is read
by the build family, families/build.py; which torch xFormers was built for, by the GPU family).

- transformers' backend checks and ``No module named 'X'`` name a package that is absent from
  the interpreter the job runs (only packages of the training stack: a module of the user's
  own code that is not on the path is the code's matter);
- bitsandbytes names the library it could not load (its CUDA binary, or a CUDA runtime library
  that binary needs);
- a build that cannot import torch inside pip's or uv's isolated build environment.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "python"

# transformers' backend checks (requires_backends) and its flash-attention check.
BACKEND = re.compile(r"requires the (?P<name>[\w-]+) library but it was not found in your "
                     r"environment|the package (?P<pkg>\w+) seems to be not installed")
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
        name = absent["name"] or absent["pkg"] if absent else module["name"]
        found.append(reading(FAMILY, "env.package-missing", (absent or module).group(0),
                             package=name))
    bnb = BITSANDBYTES.search(message)
    if bnb:
        found.append(reading(FAMILY, "loader.bitsandbytes-cuda-binary", bnb.group(0),
                             library=bnb["lib"] or bnb["binary"]))
    return found

"""The uv commands that put DeepSpeed with precompiled ops into an environment, one function
each, called by the plan (to show them) and by the build (to run them):

    DS_ACCELERATOR=cpu DS_BUILD_CPU_ADAM=1 DS_BUILD_OPS=0 ... MAX_JOBS=2 \\
        uv pip install --python ENV/bin/python --no-build-isolation --reinstall --no-deps \\
        --no-cache --color never -v ... --require-hashes -r /tmp/dsenv-ops-XXXXXXXX/deepspeed.txt

(:func:`build_command`, see build.py for why each option) and the install of a wheel from the
ops cache (:func:`wheel_command`, cache.py). The build's temporary folder holds the lock's
deepspeed line with its hashes (``deepspeed.txt``) and, when the ops cache keeps the wheel,
uv's cache of this build alone (``uv-cache``); it is shown as ``/tmp/dsenv-ops-XXXXXXXX``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dsenv.provision.shown import Command
from dsenv.provision.uvcmd import Sources, uv_command

BUILD_SCRATCH = "dsenv-ops-"  # the temporary folder of build_ops
CACHE_SCRATCH = "dsenv-ops-cache-"  # the temporary folder a cached wheel is copied into


def requirement_file(scratch: Path) -> Path:
    """The requirements file with the deepspeed line and its hashes, in the build's folder."""
    return scratch / "deepspeed.txt"


def build_command(python: str | os.PathLike, requirement: str, *, sources: Sources,
                  compile_bytecode: bool, scratch: Path, keep_wheel: bool,
                  variables: Mapping[str, str]) -> Command:
    """The ``uv pip install`` of :func:`~dsenv.provision.ops.build.build_ops`: ``requirement``
    is the lock's deepspeed line (with ``--hash``: installed from :func:`requirement_file`,
    hashes required) or a plain ``deepspeed==X``; ``keep_wheel``: uv's cache of this build
    alone in ``scratch`` (the ops cache keeps its wheel) instead of ``--no-cache``;
    ``variables``: DS_BUILD_*, the arch variables, DS_ACCELERATOR, MAX_JOBS."""
    caching = ["--cache-dir", str(scratch / "uv-cache")] if keep_wheel else ["--no-cache"]
    args = ["pip", "install", "--python", os.fspath(python), "--no-build-isolation",
            "--reinstall", "--no-deps", *caching, "--color", "never", "-v", *sources.args()]
    if compile_bytecode:
        args.append("--compile-bytecode")
    if "--hash" in requirement:
        args += ["--require-hashes", "-r", str(requirement_file(scratch))]
    else:
        args.append(requirement.strip())
    return uv_command(args, variables)


def wheel_command(python: str | os.PathLike, wheel: Path, *,
                  compile_bytecode: bool) -> Command:
    """The ``uv pip install`` of a wheel from the ops cache (cache.py's install_wheel)."""
    return uv_command(["pip", "install", "--python", os.fspath(python), "--reinstall",
                       "--no-deps", "--no-index", "--color", "never", str(wheel),
                       *(["--compile-bytecode"] if compile_bytecode else [])])

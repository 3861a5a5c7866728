"""``dsenv lock --kind conda``: a recipe (envs/conda/STACK.yml, an environment.yml) locked
with the real conda-lock into envs/conda/STACK.conda-lock.yml.

Locking needs a conda-style solver (micromamba, mamba or conda); installing does not
(conda_install.py).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsenv.proc import CommandResult, run, which
from dsenv.provision import ProvisionError
from dsenv.provision.conda.recipe import (
    PLATFORM,
    RECIPES_DIR,
    one_line,
    parse_lock_text,
    recipe_cuda,
    require_module,
)
from dsenv.staging import write_file_atomically

CONDA_EXECUTABLES = ("micromamba", "mamba", "conda")
LOCK_TIMEOUT = 1800.0  # a conda-forge solve of a CUDA PyTorch stack takes minutes


def find_conda_exe(conda_exe: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The conda-style executable conda-lock solves with: ``conda_exe`` (a path or a name on
    PATH), else ``$MAMBA_EXE`` / ``$CONDA_EXE``, else micromamba, mamba or conda on PATH."""
    env = os.environ if env is None else env
    if conda_exe:
        found = conda_exe if os.sep in conda_exe else which(conda_exe, env)
        if found and os.path.isfile(found) and os.access(found, os.X_OK):
            return str(Path(found).absolute())
        raise ProvisionError(f"conda executable {conda_exe!r} not found or not executable: "
                             "pass the path of a micromamba, mamba or conda (--conda PATH)")
    for var in ("MAMBA_EXE", "CONDA_EXE"):
        value = env.get(var)
        if value and os.path.isfile(value) and os.access(value, os.X_OK):
            return value
    for name in CONDA_EXECUTABLES:
        found = which(name, env)
        if found:
            return found
    raise ProvisionError(
        "locking a conda recipe needs micromamba, mamba or conda, and none is on PATH (nor "
        "CONDA_EXE/MAMBA_EXE): install micromamba (https://mamba.readthedocs.io, a single "
        "binary) and pass --conda PATH, or generate the lock on a machine that has conda "
        "(`dsenv lock --kind conda --stack NAME`) and commit it")


def lock_conda(
    recipe: Path,
    out: Path,
    *,
    platforms: Sequence[str] = (PLATFORM,),
    conda_exe: str | None = None,
    channels_override: Sequence[str] | None = None,
    cuda: str | None = "auto",
    virtual_packages: Path | None = None,
    pypi_to_conda_lookup: str | Path | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = LOCK_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Lock ``recipe`` (an environment.yml) with the real conda-lock into ``out`` (a
    conda-lock.yml, version 1), written beside ``out`` and renamed into place.

    ``cuda``: the ``__cuda`` version the solve assumes: ``"auto"`` takes the recipe's
    ``cuda-version`` pin (``--with-cuda X.Y``), and a recipe without one locks
    ``--without-cuda`` (no CUDA builds of anything); a string forces ``--with-cuda``; None
    forces ``--without-cuda``. ``virtual_packages`` (conda-lock's virtual-packages.yml, e.g.
    an older ``__glibc`` for the cluster) overrides both. ``pypi_to_conda_lookup``: a local
    PyPI-to-conda name mapping (JSON or YAML) instead of the one conda-lock downloads from
    GitHub for a recipe with a pip section.
    """
    recipe, out = Path(recipe), Path(out)
    env = dict(os.environ if env is None else env)
    if not recipe.is_file():
        raise ProvisionError(f"conda recipe {recipe} not found: pass an environment.yml "
                             f"(recipes: {RECIPES_DIR})")
    require_module("conda_lock", "conda-lock")
    exe = find_conda_exe(conda_exe, env)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.yml")
    tmp.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "conda_lock", "lock", "--file", str(recipe.absolute()),
            "--conda", exe, "--lockfile", str(tmp.absolute()), "--kind", "lock"]
    for platform in platforms:
        argv += ["--platform", platform]
    for channel in channels_override or ():
        argv += ["--channel", channel]
    if virtual_packages is not None:
        if not Path(virtual_packages).is_file():
            raise ProvisionError(f"virtual packages file {virtual_packages} not found: pass "
                                 "a conda-lock virtual-packages.yml")
        argv += ["--virtual-package-spec", str(Path(virtual_packages).absolute())]
    else:
        version = recipe_cuda(recipe) if cuda == "auto" else cuda
        argv += ["--with-cuda", version] if version else ["--without-cuda"]
    if pypi_to_conda_lookup is not None:
        argv += ["--pypi_to_conda_lookup_file", str(pypi_to_conda_lookup)]
    argv += list(extra_args)
    try:
        # conda-lock picks up a ./virtual-packages.yml silently: run where there is none, so
        # only `virtual_packages` changes the virtual packages.
        with tempfile.TemporaryDirectory(prefix="dsenv-conda-lock-") as cwd:
            result = run(argv, timeout=timeout, env=env, cwd=cwd)
        if result.timed_out:
            raise ProvisionError(f"conda-lock did not finish locking {recipe.name} within "
                                 f"{timeout:.0f} s (killed): retry with a longer timeout, or "
                                 "use micromamba (the fastest solver) via --conda")
        if not result.ok or not tmp.is_file():
            raise ProvisionError(f"conda-lock could not lock {recipe.name} for "
                                 f"{','.join(platforms)} with {Path(exe).name}: "
                                 f"{_conda_lock_failure(result)}: fix the recipe's specs or "
                                 "channels (the solver's message says which package)")
        text = tmp.read_text(encoding="utf-8")
        # The header's "conda-lock lock --lockfile NAME" hints name the file being written.
        text = "\n".join(line.replace(tmp.name, out.name) if line.startswith("#") else line
                         for line in text.split("\n"))
        lock = parse_lock_text(text, out)
        missing = [p for p in platforms if p not in lock.platforms]
        if missing:
            raise ProvisionError(f"conda-lock wrote {out.name} without platform(s) "
                                 f"{', '.join(missing)}: rerun the lock")
        write_file_atomically(out, text)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _conda_lock_failure(result: CommandResult) -> str:
    """What conda-lock's output says went wrong, as one line (the solver's explanation tree
    flattened)."""
    raw = (result.stderr + "\n" + result.stdout).splitlines()
    for i, line in enumerate(raw):
        if line.startswith("Could not lock the environment"):
            message = []
            for follow in raw[i + 1:]:
                if not follow.strip() or follow.lstrip().startswith(
                        ("Command:", "STDOUT", "STDERR", "{", "Traceback")):
                    break
                message.append(follow.strip(" \u2500\u2502\u2514\u251c"))
            if message:
                return one_line(" ".join(message))
    lines = [line.strip() for line in raw if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception)\b", line):
            return one_line(line)
    return one_line(lines[-1]) if lines else result.describe()

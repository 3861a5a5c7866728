"""Where an environment goes on disk: ``--prefix`` made absolute with its symlinks resolved,
the site's default when none is given, and the free space it needs there."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from dsenv.envs.sites import Site
from dsenv.envs.stacks import Stack
from dsenv.facts.host import mounts
from dsenv.facts.node import Node
from dsenv.provision import ProvisionError

# Disk an environment of each vendor's stack takes once installed, with headroom for the op
# build (measured here: the CPU stack's venv is ~1.5 GB; CUDA and ROCm torch wheels with their
# libraries are 5-15 GB installed).
NEEDED_GIB = {"cpu": 3, "nvidia": 12, "amd": 20}


def resolve_prefix(text: str) -> Path:
    """The absolute prefix with every symlink on the way resolved: an environment reached
    through a symlink (a /home that links to the real storage) cannot be activated on
    compute nodes that see only the real path."""
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    parent = path.parent.resolve()  # strict=False: a missing parent is created later
    return parent / path.name


def check_absent(prefix: Path, force: bool, why: str = "") -> None:
    """ProvisionError unless ``prefix`` is free or ``force`` replaces it."""
    if (prefix.exists() or prefix.is_symlink()) and not force:
        raise ProvisionError(f"{prefix} already exists{why}: pass --force to replace it (the "
                             "new environment is built beside it and swapped in only when "
                             "complete), or choose another --prefix")


def out_of_space_message(prefix: Path, stack: Stack, step: str) -> str:
    """One line for ENOSPC: where, during what, and how much to free."""
    found = mounts.mount_for(Node(wanted_target="login"), prefix.parent)
    mount = Path(found.point if found else "/")
    free = shutil.disk_usage(mount).free / 2**30
    needed = max(1, math.ceil(NEEDED_GIB.get(stack.vendor, 12) - free))
    return (f"no space left on {mount} while {step}: free {needed} GiB or choose another "
            "--prefix (nothing was changed at the prefix)")


def default_prefix(site: Site, kind: str, stack: Stack) -> str:
    """``<site env root or ./dsenv-envs>/<stack>-<kind>``."""
    root = os.path.expandvars(site.env_root) if site.env_root else "dsenv-envs"
    return os.path.join(root, f"{stack.name}-{kind}")


def free_space_check(prefix: Path, stack: Stack) -> str:
    """``"120 GiB free (needs ~3 GiB)"``, or ProvisionError when the file system of
    ``prefix`` has less room than a ``stack`` environment takes."""
    needed = NEEDED_GIB.get(stack.vendor, 12)
    probe = mounts.nearest_existing(prefix.parent) or Path("/")
    free = shutil.disk_usage(probe).free / 2**30
    if free < needed:
        raise ProvisionError(
            f"no space for the environment: {free:.1f} GiB free on the file system of "
            f"{probe}, a {stack.name} environment needs about {needed} GiB: free some space "
            "or pass --prefix on another file system")
    return f"{free:.0f} GiB free (needs ~{needed} GiB)"

"""What the op-build path imports from setuptools' pkg_resources, and whether the environment
under test can import it.

Every DeepSpeed op build (JIT or precompiled) imports torch.utils.cpp_extension. torch 2.1
and older import ``packaging`` from ``pkg_resources`` there; setuptools 70.x stopped exporting
that name and setuptools 82 removed pkg_resources, so a build dies at that import. The
statements are read from the files themselves (no table of releases to keep) and run, alone,
in the environment's own interpreter: its answer is the fact. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.pyenv import find_distribution
from dsenv.facts.python.torch_info import torch_build

# ``from pkg_resources import packaging  # type: ignore[attr-defined]`` (torch <= 2.1) and
# ``import pkg_resources``, at any indentation: a module-level import in a try block counts.
PKG_RESOURCES_IMPORT = re.compile(
    r"^[ \t]*(from[ \t]+pkg_resources(?:\.[\w.]+)?[ \t]+import[ \t]+[\w, \t]+"
    r"|import[ \t]+pkg_resources(?:\.[\w.]+)?)[ \t]*(?:#.*)?$", re.MULTILINE)

# The op-build path's modules, inside the torch package, whose imports run at every build.
BUILDER_FILES = ("utils/cpp_extension.py",)


@dataclass(frozen=True)
class BuildImports:
    torch_version: str | None  # None: no torch in the environment
    builder: Path | None  # the first builder file that imports pkg_resources
    statements: tuple[str, ...]  # its pkg_resources import statements, as written
    setuptools: str | None  # the setuptools version on the environment's path (None: none)
    error: str | None = None  # the last line the interpreter printed for them (None: imported)
    asked: bool = False  # the statements were run in the environment's interpreter
    not_asked: str = ""  # why they were not, when they were not


def pkg_resources_imports(text: str) -> tuple[str, ...]:
    """The pkg_resources import statements in a module's source, each stripped of its
    comment."""
    return tuple(re.sub(r"\s*#.*$", "", m.group(1)).strip()
                 for m in PKG_RESOURCES_IMPORT.finditer(text))


def _setuptools_version(node: Node) -> str | None:
    dist = find_distribution("setuptools", list(target_env.environment(node).path))
    return dist.version if dist is not None else None


@probe
def build_imports(node: Node) -> BuildImports:
    """torch's builder files' pkg_resources imports, and what the job's interpreter says when
    it runs them."""
    build = torch_build(node)
    if not build.installed or build.location is None:
        return BuildImports(None, None, (), _setuptools_version(node))
    for name in BUILDER_FILES:
        path = Path(build.location) / name
        try:
            statements = pkg_resources_imports(path.read_text(errors="replace"))
        except OSError:
            continue
        if statements:
            break
    else:
        return BuildImports(build.version, None, (), _setuptools_version(node))
    found = BuildImports(build.version, path, statements, _setuptools_version(node))
    python = target_env.environment(node).python
    if python is None:
        return replace(found, not_asked="the environment has no interpreter that runs here")
    # the statements alone, with warnings off: pkg_resources' deprecation notice is not an answer
    result = node.run([python, "-W", "ignore", "-c", "\n".join(statements)])
    if result.timed_out or result.not_found:
        return replace(found, not_asked=result.describe())
    if result.ok:
        return replace(found, asked=True)
    tail = (result.stderr or result.stdout).strip().splitlines()
    return replace(found, asked=True, error=tail[-1] if tail else result.describe())


"""Installed Python packages read as files: found on a search path and parsed with ``ast``,
never imported (importing torch or DeepSpeed costs seconds and can crash)."""

from __future__ import annotations

import ast
from importlib.machinery import PathFinder
from pathlib import Path


def parse_assignments(text: str, filename: str = "<text>") -> dict[str, object]:
    """Top-level ``name = <literal>`` and ``name: T = <literal>`` assignments of Python source;
    a literal may name an earlier one (torch's ``CUDA_GCC_VERSIONS`` holds
    ``MINIMUM_GCC_VERSION``).

    Raises SyntaxError (or ValueError, for null bytes) when the source does not parse."""
    tree = ast.parse(text, filename)
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        try:
            literal = ast.literal_eval(_EarlierLiterals(values).visit(value))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                values[target.id] = literal
    return values


class _EarlierLiterals(ast.NodeTransformer):
    """Replaces a name already read as a literal by that literal."""

    def __init__(self, values: dict[str, object]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.values:
            return ast.parse(repr(self.values[node.id]), mode="eval").body
        return node


def read_assignments(path: Path) -> dict[str, object]:
    """:func:`parse_assignments` of a file, without running it."""
    return parse_assignments(Path(path).read_text(errors="replace"), str(path))


def package_dir(name: str, path: list[str]) -> Path | None:
    """Where a top-level package lives on ``path``, found without importing it."""
    spec = PathFinder.find_spec(name, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])

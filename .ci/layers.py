"""The layer contract: each layer of dsenv imports only from the layers below it.

import-linter cannot see this tree (its folders install as ``dsenv.*`` through setup.py's
``package_dir``, which grimp does not follow), so this script reads the source with ``ast``,
inside functions too, and fails on:

- an import that crosses a layer upward (``dsenv.envs`` importing ``dsenv.provision``);
- an import placed inside a function without a comment, on its line or the line above,
  naming the heavy module it keeps off the fast path (torch, deepspeed, ...).

The contract lives in pyproject.toml under [tool.dsenv.layers]. Usage:
``python .ci/layers.py [ROOT]``; exit 0 when the tree keeps it, 1 with one line a breach.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Source folders and the package each installs as (setup.py's package_dir).
FOLDERS = {"dsenv": "dsenv", "envs": "dsenv.envs", "doctor": "dsenv.doctor",
           "provision": "dsenv.provision", "workloads": "dsenv.workloads"}


@dataclass(frozen=True)
class Breach:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Contract:
    layers: tuple[tuple[str, ...], ...]  # top first; each layer a tuple of module prefixes
    heavy: tuple[str, ...]

    @classmethod
    def read(cls, root: Path) -> Contract:
        table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["dsenv"]["layers"]
        return cls(tuple(tuple(layer) for layer in table["order"]), tuple(table["heavy"]))

    def layer_of(self, module: str) -> tuple[int, str]:
        """(height, prefix): the layer whose longest prefix matches; higher numbers sit above."""
        best = (-1, "")
        for index, layer in enumerate(self.layers):
            for prefix in layer:
                if (module == prefix or module.startswith(prefix + ".")) \
                        and len(prefix) > len(best[1]):
                    best = (len(self.layers) - index, prefix)
        return best


def module_name(path: Path, root: Path) -> str | None:
    rel = path.relative_to(root)
    package = FOLDERS.get(rel.parts[0])
    if package is None:
        return None
    parts = list(rel.with_suffix("").parts[1:])
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        if not is_package:
            parts = parts[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    # `from pkg import name`: name may be a submodule; the longest matching prefix decides
    return [f"{base}.{alias.name}" for alias in node.names]


def check_file(path: Path, root: Path, contract: Contract) -> list[Breach]:
    module = module_name(path, root)
    if module is None:
        return []
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    height, prefix = contract.layer_of(module)
    rel = str(path.relative_to(root))
    breaches = []
    deferred = {id(n) for fn in ast.walk(tree)
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for target in imported(node, module, path.name == "__init__.py"):
            if not target.startswith("dsenv"):
                continue
            other, other_prefix = contract.layer_of(target)
            if other > height:
                breaches.append(Breach(rel, node.lineno, f"{module} ({prefix}) imports "
                                       f"{target} ({other_prefix}), a layer above it"))
        if id(node) in deferred and not _justified(lines, node.lineno, contract.heavy):
            breaches.append(Breach(rel, node.lineno, "import inside a function without a "
                                   "comment naming the heavy module it keeps off the fast "
                                   f"path ({', '.join(contract.heavy)}): "
                                   f"{lines[node.lineno - 1].strip()}"))
    return breaches


def _justified(lines: list[str], lineno: int, heavy: tuple[str, ...]) -> bool:
    """A comment on the import's line or the line above names a heavy module."""
    nearby = [lines[lineno - 1]] + ([lines[lineno - 2]] if lineno >= 2 else [])
    comments = [line.split("#", 1)[1] for line in nearby if "#" in line]
    return any(name in comment for comment in comments for name in heavy)


def check_tree(root: Path) -> list[Breach]:
    contract = Contract.read(root)
    breaches = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            breaches.extend(check_file(path, root, contract))
    return breaches


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent)
    breaches = check_tree(root)
    for breach in breaches:
        print(breach)
    if breaches:
        print(f"layer contract: {len(breaches)} breach(es) (see pyproject.toml "
              "[tool.dsenv.layers])")
        return 1
    print("layer contract: kept")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

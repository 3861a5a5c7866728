"""Where the job's shell finds the launcher scripts (deepspeed, torchrun, accelerate): the
environment's own copy (its bin, or the user base's bin for a --user install), the file the
node's PATH resolves for the name, and the interpreter that file's first line runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env

NAMES = ("deepspeed", "torchrun", "accelerate")


@dataclass(frozen=True)
class Launcher:
    name: str
    own: Path | None  # the environment's script, when it has one
    on_path: Path | None  # what PATH resolves for the name, None when nothing
    runs: str  # the interpreter the resolved script starts (its #! line), "" when unknown

    @property
    def is_own(self) -> bool:
        return self.own is not None and self.on_path is not None and _same(self.own,
                                                                          self.on_path)


@probe
def launchers(node: Node) -> list[Launcher]:
    env = target_env.environment(node)
    folders = [env.prefix / "bin"]
    if env.user_site:  # ~/.local/lib/pythonX.Y/site-packages -> ~/.local/bin
        folders.append(Path(env.user_site).parents[2] / "bin")
    found = []
    for name in NAMES:
        own = next((folder / name for folder in folders if _executable(folder / name)), None)
        resolved = node.which(name)
        on_path = Path(resolved) if resolved else None
        found.append(Launcher(name, own, on_path, _shebang(on_path) if on_path else ""))
    return found


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _shebang(path: Path) -> str:
    """The interpreter of a script: its #! line, or the one pip's relocatable launcher execs
    (``'''exec' "/env/bin/python" "$0" "$@"``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    if not head or not head[0].startswith("#!"):
        return ""
    for line in head[1:3]:
        if line.startswith("'''exec' "):
            return line.split()[1].strip('"')
    return head[0][2:].strip()


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b

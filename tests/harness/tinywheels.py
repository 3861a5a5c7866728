"""Two tiny projects built here with ``pip wheel``, served from a folder, and the environments
`dsenv provision` makes from their lock: what the fast provision tests install.

Nothing reaches a package index: uv gets the folder as --find-links with --no-index.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dsenv.provision.uvcmd import Sources
from tests.harness.cli import dsenv

TINY_PROJECTS = {
    "dsenv-tiny-a": ("dsenvtinya", "", 'def main():\n    import sys\n    print("tiny-a ok", '
                     'sys.prefix)\n'),
    "dsenv-tiny-b": ("dsenvtinyb", '"dsenv-tiny-a==1.0"', "import dsenvtinya  # noqa\n"),
}


def _write_project(folder: Path, name: str, module: str, deps: str, code: str) -> None:
    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(code)
    scripts = (f'[project.scripts]\n{name} = "{module}:main"\n' if "def main" in code else "")
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "1.0"
        dependencies = [{deps}]
        """) + scripts)


def build_tiny_wheels(src: Path, out: Path) -> Path:
    """dsenv_tiny_a-1.0 (console script ``dsenv-tiny-a``) and dsenv_tiny_b-1.0 (requires
    dsenv-tiny-a), their projects written under ``src``, built with ``pip wheel`` into
    ``out``; returns ``out``."""
    folders = []
    for name, (module, deps, code) in TINY_PROJECTS.items():
        folder = src / name
        _write_project(folder, name, module, deps, code)
        folders.append(str(folder))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out), *folders], check=True, timeout=300,
                   env={**os.environ, "PIP_NO_INPUT": "1"})
    assert len(list(out.glob("*.whl"))) == 2
    return out


def offline(wheels: Path) -> Sources:
    """Packages from the ``wheels`` folder only (--no-index --find-links)."""
    return Sources.of([wheels], no_index=True)


def wheel_hash(folder: Path, name: str) -> str:
    wheel = next(folder.glob(f"{name.replace('-', '_')}-*.whl"))
    return "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()


def provision_tiny(prefix: Path, lock: Path, wheels: Path, *extra: str):
    """`dsenv provision --arch cpu --ops none` of ``lock`` from the ``wheels`` folder."""
    return dsenv("provision", "--arch", "cpu", "--ops", "none", "--lock", str(lock),
                 "--no-index", "--find-links", str(wheels), "--prefix", str(prefix), *extra)

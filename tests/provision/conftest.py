"""Fixtures for the provision tests: tiny wheels built here, served from a folder.

Nothing in the fast tests reaches a package index: locks and venvs are made from two tiny
projects built with ``pip wheel`` into a temporary folder and given to uv as --find-links
with --no-index. The real tests (marked slow) use envs/locks/cpu.txt and PyPI.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsenv.provision.locks import compile_lock
from dsenv.provision.uvcmd import Sources

ROOT = Path(__file__).resolve().parents[2]

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


@pytest.fixture(scope="session")
def tiny_wheels(tmp_path_factory) -> Path:
    """A folder with dsenv_tiny_a-1.0 (console script ``dsenv-tiny-a``) and dsenv_tiny_b-1.0
    (requires dsenv-tiny-a), built with ``pip wheel``."""
    src = tmp_path_factory.mktemp("tiny-src")
    out = tmp_path_factory.mktemp("tiny-wheels")
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


@pytest.fixture(scope="session")
def tiny_lock(tiny_wheels, tmp_path_factory) -> Path:
    """A hashed lock of dsenv-tiny-b (and so dsenv-tiny-a), written by compile_lock."""
    out = tmp_path_factory.mktemp("tiny-lock") / "tiny.txt"
    return compile_lock(["dsenv-tiny-b==1.0"], out, sources=offline(tiny_wheels),
                        regenerate="dsenv lock --stack tiny")


@pytest.fixture
def no_retries(monkeypatch):
    """uv gives up on an unreachable index at once instead of after 3 retries."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")

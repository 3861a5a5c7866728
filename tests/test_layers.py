"""The layer contract (.ci/layers.py): the real tree keeps it, and a breach is caught."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "layers.py"


def run_contract(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the product folders and the contract, to break on purpose."""
    for folder in ("dsenv", "envs", "doctor", "provision", "workloads"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_the_layer_contract():
    result = run_contract(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "layer contract: kept" in result.stdout


def test_an_upward_import_at_module_level_is_a_breach(tree):
    target = tree / "envs" / "stacks.py"
    target.write_text(target.read_text() + "\nfrom dsenv.provision import ProvisionError\n")
    result = run_contract(tree)
    assert result.returncode == 1
    assert "envs/stacks.py" in result.stdout
    assert "dsenv.envs.stacks (dsenv.envs) imports dsenv.provision" in result.stdout


def test_a_relative_upward_import_inside_a_function_is_a_breach(tree):
    target = tree / "dsenv" / "facts" / "gpu" / "inventory.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n"
                      "    from ...doctor.checks.node import gpu  # torch\n    return gpu\n")
    result = run_contract(tree)
    assert result.returncode == 1
    assert "(dsenv.facts) imports dsenv.doctor.checks" in result.stdout


def test_a_deferred_import_must_name_the_heavy_module_it_keeps_off(tree):
    target = tree / "envs" / "archs.py"
    original = target.read_text()
    target.write_text(original + "\n\ndef _late():\n    import json\n    return json\n")
    result = run_contract(tree)
    assert result.returncode == 1
    assert "import inside a function without a comment" in result.stdout
    target.write_text(original + "\n\ndef _late():\n    import torch  # torch: off --help\n"
                      "    return torch\n")
    assert run_contract(tree).returncode == 0


def test_importing_a_lower_layer_is_allowed(tree):
    target = tree / "workloads" / "report.py"
    target.write_text(target.read_text() + "\nfrom dsenv.provision import ProvisionError\n"
                      "from dsenv.facts.node import Node\n")
    assert run_contract(tree).returncode == 0

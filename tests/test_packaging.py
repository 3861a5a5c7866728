"""A normal (non-editable) install carries every mapped folder and data file and runs."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src") / "dsenv"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=300)
    return next(out.glob("dsenv-*.whl"))


def test_wheel_maps_top_level_folders_into_dsenv(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("dsenv/cli.py", "dsenv/doctor/runner.py", "dsenv/doctor/checks/node/system.py",
                     "dsenv/doctor/report_schema.json", "dsenv/envs/gpu_archs.toml",
                     "dsenv/envs/archs.py", "dsenv/workloads/assets.toml",
                     "dsenv/provision/__init__.py", "dsenv/envs/stacks.toml",
                     "dsenv/envs/sites/__init__.py", "dsenv/envs/sites/lumi.toml",
                     "dsenv/envs/sites/generic.toml", "dsenv/provision/targets.py",
                     "dsenv/envs/locks/cpu.txt", "dsenv/envs/requirements/cpu.in",
                     "dsenv/doctor/distributed.toml"):
        assert expected in names, expected
    assert not any(n.startswith(("tests/", "bench/", "doctor/", "envs/")) for n in names)


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    str(wheel)], check=True, timeout=300)
    out = subprocess.run([str(venv / "bin" / "dsenv"), "doctor", "--json", "--only",
                          "system,python"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    report = json.loads(out.stdout)
    assert report["results"] and out.returncode in (0, 1)
    located = subprocess.run([str(py), "-c", "import dsenv.doctor; print(dsenv.doctor.__file__)"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout
    assert str(venv) in located  # the installed copy, not the source tree

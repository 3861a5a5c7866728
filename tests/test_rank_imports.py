"""The ranks `dsenv doctor --distributed --launch` starts run the dsenv that started them, and
`python -m dsenv` run from the source checkout imports the checkout's subpackages.

Found on a lent H100 (2026-11-26): `bench/gpu_check.sh`, run from the clone with dsenv
installed by `pip install .`, ran `dsenv doctor --distributed --launch torchrun -n 2`; every
rank's `python -m dsenv` imported the clone's `dsenv/` folder (the working directory comes
first on a `-m` run's path), which holds only the core (setup.py maps `doctor/`, `envs/` ...
into the package on install), died with ModuleNotFoundError: dsenv.doctor, and the doctor said
only "torchrun exited 1 and no rank reported" with torchrun's closing summary as evidence.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsenv import proc
from tests.harness.cli import explain
from tests.harness.doctor_cli import report_of

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--sizes", "4K", "--iters", "2", "--warmup", "1", "--only", "distributed", "--json"]

# `python -m dsenv` with the checkout as the working directory and no install mapping the
# subpackages: -S leaves out site's .pth files (the editable install's finder), the
# site-packages folders are added back by hand for the dependencies.
FROM_CHECKOUT = """
import runpy, site, sys
sys.path.extend(site.getsitepackages())
sys.argv = ["dsenv", *sys.argv[1:]]
runpy.run_module("dsenv", run_name="__main__", alter_sys=True)
"""


def _from_checkout(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-c", FROM_CHECKOUT, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_python_m_dsenv_from_the_checkout_finds_the_mapped_subpackages():
    ran = _from_checkout("doctor", "--distributed", "--help", cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "--launch" in ran.stdout and "ModuleNotFoundError" not in ran.stderr
    where = _from_checkout("explain", "--help", cwd=ROOT)
    assert where.returncode == 0, where.stderr[-2000:]


def test_an_installed_layout_keeps_its_own_package_path(tmp_path):
    # the twin: a package that holds its subpackages (as pip installs it) beside a setup.py
    # and a doctor/ of another tree is not extended
    site = tmp_path / "site"
    (site / "dsenv" / "doctor").mkdir(parents=True)
    (site / "dsenv" / "__init__.py").write_text((ROOT / "dsenv" / "__init__.py").read_text())
    (site / "dsenv" / "doctor" / "__init__.py").write_text("MARK = 'installed'\n")
    (site / "setup.py").write_text("")
    (site / "doctor").mkdir()
    (site / "doctor" / "__init__.py").write_text("MARK = 'checkout'\n")
    code = "import dsenv, dsenv.doctor; print(len(dsenv.__path__), dsenv.doctor.MARK)"
    ran = subprocess.run([sys.executable, "-S", "-c", code], cwd=site, capture_output=True,
                         text=True, timeout=30)
    assert ran.stdout.split() == ["1", "installed"], ran.stderr


def test_launched_ranks_ignore_a_dsenv_folder_in_the_working_directory(tmp_path, run_env):
    # the GPU node's case on any Python >= 3.11: the command run from a folder holding a
    # `dsenv` package that is not the one installed (the launching command itself is started
    # with -P, as a console script is: its path does not hold the working directory)
    if sys.version_info < (3, 11):
        pytest.skip("PYTHONSAFEPATH needs Python 3.11")
    shadow = tmp_path / "dsenv"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("not the dsenv that launched")\n')
    env = dict(run_env, OMP_NUM_THREADS="1")
    ran = proc.run([sys.executable, "-P", "-m", "dsenv", "doctor", "--distributed", "--launch",
                    "torchrun", "-n", "2", *QUICK], timeout=120, env=env, cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    assert report_of(ran.stdout)["distributed"]["world_size"] == 2


def test_ranks_that_die_before_reporting_show_their_own_first_error(tmp_path, run_env):
    # PYTHONPATH puts a broken dsenv ahead of the real one for the ranks only (the launching
    # command runs isolated, -I): they die at import, torchrun closes with its summary block
    shadow = tmp_path / "shadow" / "dsenv"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("not the dsenv that launched")\n')
    env = dict(run_env, OMP_NUM_THREADS="1", PYTHONPATH=str(shadow.parent))
    ran = proc.run([sys.executable, "-I", "-m", "dsenv", "doctor", "--distributed", "--launch",
                    "torchrun", "-n", "2", *QUICK], timeout=120, env=env, cwd=str(tmp_path))
    assert ran.returncode == 1, explain(ran)
    failure = report_of(ran.stdout)["distributed"]["failure"]
    assert failure["message"] == "torchrun exited 1 and no rank reported"
    first = failure["evidence"][0]
    assert first.startswith("first error (line ")
    # both ranks die at once and write to torchrun's one stderr: Python writes the exception's
    # name, ": " and its message as separate writes, which can interleave between the ranks
    # ("ImportErrorImportError: : not the ...not the ..."); each piece stays whole
    assert "ImportError" in first and "not the dsenv that launched" in first, first
    # torchrun's closing block is still there, after the rank's own error
    assert any("exitcode" in line for line in failure["evidence"][1:])

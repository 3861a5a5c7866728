""".ci/skips.py: `.ci/run` fails a run that skipped more tests than README states for a fresh
clone, reading that number from README's own sentence and the count from pytest's summary."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "skips.py"
_spec = importlib.util.spec_from_file_location("ci_skips", SCRIPT)
skips = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(skips)


def test_readme_states_the_skips_of_a_fresh_clone_once():
    assert skips.stated_skips((ROOT / "README.md").read_text()) == 5


@pytest.mark.parametrize("line, count", [
    ("1273 passed, 5 skipped in 1440.12s (0:24:00)", 5),
    ("2 failed, 1265 passed, 9 skipped, 3 warnings in 1.00s", 9),
    ("1278 passed in 12.50s", 0),
    ("=========== 1 failed, 2 skipped, 1 error in 0.52s ===========", 2),
    ("no tests ran in 0.01s", 0),
])
def test_the_count_is_read_from_the_summary_line(line, count):
    log = f"..s..\nSKIPPED [1] tests/test_x.py:3: why\n{line}\n"
    assert skips.run_skips(log) == count


def test_the_phases_skips_add_up():
    """README's test command has two phases, each with its own summary line."""
    log = ("..s..\n3790 passed, 4 skipped in 460.10s (0:07:40)\n"
           "...s\n176 passed, 1 skipped in 1459.00s (0:24:19)\n")
    assert skips.run_skips(log) == 5


def test_every_serial_module_exists():
    """A renamed module would lose its serial marker (or its worker group) and run on both
    cores unnoticed; no module is in both."""
    from tests.conftest import REAL_ENV_MODULES, SERIAL_MODULES, SLURM_GROUP_MODULES

    here = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    for modules in (SERIAL_MODULES, SLURM_GROUP_MODULES, REAL_ENV_MODULES):
        assert modules <= here, sorted(modules - here)
    assert not (SERIAL_MODULES & SLURM_GROUP_MODULES or SERIAL_MODULES & REAL_ENV_MODULES
                or SLURM_GROUP_MODULES & REAL_ENV_MODULES)


def test_a_log_without_a_summary_says_so():
    assert skips.run_skips("....F\nKeyboardInterrupt\n") is None


@pytest.mark.parametrize("summary, code", [("1273 passed, 5 skipped in 9.0s", 0),
                                           ("1274 passed, 4 skipped in 9.0s", 0),
                                           ("1272 passed, 6 skipped in 9.0s", 1),
                                           ("interrupted", 2)])
def test_the_exit_status(tmp_path, summary, code):
    log = tmp_path / "pytest.log"
    log.write_text(f"SKIPPED [6] tests/test_x.py:3: no toolkit\n{summary}\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == code, done.stdout + done.stderr
    if code == 1:
        assert "6 tests skipped, README states 5" in done.stderr
        assert "SKIPPED [6] tests/test_x.py:3: no toolkit" in done.stderr


def test_a_readme_that_states_no_number_fails(tmp_path):
    (tmp_path / "README.md").write_text("# x\nSome tests skip.\n")
    (tmp_path / "pytest.log").write_text("3 passed in 1.0s\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "pytest.log"),
                           str(tmp_path / "README.md")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "A fresh clone skips N tests" in done.stderr

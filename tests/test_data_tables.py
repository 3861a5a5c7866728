"""dsenv/data.py: a parsed table is kept in its folder's __pycache__ and read from there by the
next process; a changed table, a copy that does not load, a folder that cannot hold it, a
value marshal cannot keep and DSENV_TABLE_CACHE=off all fall back to parsing the TOML."""

from __future__ import annotations

import datetime
import importlib
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv import data


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``tables_under_test`` holding ``t.toml``; load_table's memo cleared around."""
    folder = tmp_path / "tables_under_test"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "t.toml").write_text('[row]\nname = "first"\nsizes = [1, 2]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DSENV_TABLE_CACHE", raising=False)
    importlib.invalidate_caches()
    data.load_table.cache_clear()
    yield folder
    data.load_table.cache_clear()
    sys.modules.pop("tables_under_test", None)


def load(folder: Path) -> dict:
    data.load_table.cache_clear()
    return data.load_table(folder.name, "t.toml")


def kept(folder: Path) -> list[Path]:
    return sorted((folder / "__pycache__").glob("t.*.marshal"))


def test_the_parse_is_kept_and_the_next_load_reads_it(package):
    assert load(package) == {"row": {"name": "first", "sizes": [1, 2]}}
    [copy] = kept(package)
    assert marshal.loads(copy.read_bytes()) == {"row": {"name": "first", "sizes": [1, 2]}}
    # what the next load returns is the kept copy's content, not a parse of the TOML
    copy.write_bytes(marshal.dumps({"row": {"name": "from the copy"}}))
    assert load(package) == {"row": {"name": "from the copy"}}


def test_a_new_process_reads_the_copy(package):
    load(package)
    [copy] = kept(package)
    copy.write_bytes(marshal.dumps({"marker": 1}))
    out = subprocess.run(
        [sys.executable, "-c", "from dsenv.data import load_table; "
         f"print(load_table({package.name!r}, 't.toml'))"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(package.parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'marker': 1}"


def test_a_changed_table_is_parsed_again_and_its_old_copy_dropped(package):
    load(package)
    [old] = kept(package)
    (package / "t.toml").write_text('[row]\nname = "second"\n')
    assert load(package) == {"row": {"name": "second"}}
    [new] = kept(package)
    assert new != old and not old.exists()


def test_a_copy_that_does_not_load_is_parsed_over(package):
    load(package)
    [copy] = kept(package)
    copy.write_bytes(b"\x00not marshal")
    assert load(package) == {"row": {"name": "first", "sizes": [1, 2]}}
    assert marshal.loads(copy.read_bytes())["row"]["name"] == "first"  # written again


def test_a_folder_that_cannot_hold_the_copy_still_loads(package):
    (package / "__pycache__").write_text("a file where the folder would be")
    assert load(package) == {"row": {"name": "first", "sizes": [1, 2]}}
    assert (package / "__pycache__").is_file()
    assert not list(package.glob(".t.*.tmp"))  # nothing half-written left


def test_a_value_marshal_cannot_keep_is_parsed_each_time(package):
    (package / "t.toml").write_text("[row]\nwhen = 2026-11-29\n")
    assert load(package) == {"row": {"when": datetime.date(2026, 11, 29)}}
    assert kept(package) == []


def test_the_cache_can_be_turned_off(package, monkeypatch):
    monkeypatch.setenv("DSENV_TABLE_CACHE", "off")
    assert load(package) == {"row": {"name": "first", "sizes": [1, 2]}}
    assert kept(package) == []

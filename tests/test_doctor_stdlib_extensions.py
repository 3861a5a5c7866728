"""python.stdlib-extensions: the compiled standard-library modules of the job's interpreter.

The interpreters are real: a copy of the interpreter running the tests, in a prefix whose
lib-dynload lacks the modules a source build skips when the library's headers are missing
(tests/harness/pyenvs.make_source_build_prefix), the state pyenv leaves on a node without
liblzma-dev (scrapy/scrapy#5921, docker-library/python#86)."""

from __future__ import annotations

import sys
from pathlib import Path

from dsenv.doctor.checks.software.interpreter_build import urllib3_refuses
from dsenv.verdicts.findings import Status
from tests.harness import pyenvs


def test_every_module_imports_in_a_complete_build(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_source_build_prefix(tmp_path / "py")
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.OK, result
    assert "_ctypes, _ssl, zlib, _lzma, _bz2, _sqlite3" in result.summary
    assert any("ssl: OpenSSL" in e for e in result.evidence), result.evidence


def test_a_build_without_liblzma_warns_with_the_headers_to_install(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_source_build_prefix(tmp_path / "py", without=("_lzma", "_bz2"))
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.WARN, result
    assert result.mode == "env.python-built-without-stdlib-ext"
    assert "built without _lzma (lzma:" in result.summary and "_bz2 (bz2:" in result.summary
    assert any("No module named '_lzma'" in e for e in result.evidence), result.evidence
    assert any("liblzma-dev libbz2-dev" in e and "xz-devel bzip2-devel" in e
               for e in result.evidence), result.evidence


def test_a_build_without_libffi_fails_torch_cannot_import(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_source_build_prefix(tmp_path / "py", without=("_ctypes",))
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.FAIL, result
    assert result.mode == "env.python-built-without-stdlib-ext"
    assert "_ctypes (ctypes: torch and DeepSpeed" in result.summary


def test_a_module_that_exists_but_cannot_load_is_not_a_build_without_it(tmp_path, make_ctx,
                                                                       run_one):
    # a truncated copy of the extension (a half-synced prefix): it is there, its load fails
    prefix = pyenvs.make_source_build_prefix(tmp_path / "py", without=("_sqlite3",))
    tag = next(p.name for p in (Path(sys.base_prefix) / "lib" / pyenvs.PYDIR /
                                "lib-dynload").glob("_sqlite3.*"))
    (prefix / "lib" / pyenvs.PYDIR / "lib-dynload" / tag).write_bytes(b"\x7fELF")
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.FAIL, result
    assert not result.mode and "has _sqlite3 but cannot load it" in result.summary
    assert any("_sqlite3 -> ImportError" in e for e in result.evidence), result.evidence


def test_no_interpreter_skips_with_the_reason(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_conda_prefix(tmp_path / "env")  # then its interpreter goes
    for name in ("python", "python3", pyenvs.PYDIR):
        (prefix / "bin" / name).unlink()
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.SKIP, result
    assert "was not asked" in result.summary and "no interpreter" in result.summary


def test_an_interpreter_that_does_not_run_skips_with_its_words(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_conda_prefix(tmp_path / "env")
    python = prefix / "bin" / pyenvs.PYDIR  # an aarch64 build judged on an x86 login node
    python.unlink()
    python.write_text("#!/bin/sh\necho 'cannot execute binary file' >&2\nexit 126\n")
    python.chmod(0o755)
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.SKIP, result
    assert "was not asked" in result.summary


def test_urllib3_2_on_an_old_openssl_is_refused():
    # the values the threads print: "currently the 'ssl' module is compiled with 'OpenSSL
    # 1.0.2k-fips  26 Jan 2017'" (python/cpython#107493, urllib3/urllib3#3133)
    centos7 = (1, 0, 2, 11, 15)
    assert urllib3_refuses(centos7, "2.0.3")
    assert not urllib3_refuses(centos7, "1.26.18")  # pinned below 2: the fix
    assert not urllib3_refuses((3, 0, 13, 0, 15), "2.2.1")
    assert not urllib3_refuses((1, 1, 1, 23, 15), "2.2.1")  # 1.1.1w: the floor itself
    assert not urllib3_refuses(centos7, None) and not urllib3_refuses((), "2.2.1")


def test_urllib3_2_beside_this_machines_openssl_is_ok(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_source_build_prefix(tmp_path / "py")
    wheels = tmp_path / "wheels"
    pyenvs.build_wheel(wheels, "urllib3", "2.2.1", {"urllib3/__init__.py": ""})
    pyenvs.uv_install(wheels, "urllib3==2.2.1", python=prefix / "bin" / "python")
    result = run_one("python.stdlib-extensions", make_ctx(environment=str(prefix)))
    assert result.status == Status.OK, result
    assert any("urllib3 2.2.1" in e for e in result.evidence), result.evidence

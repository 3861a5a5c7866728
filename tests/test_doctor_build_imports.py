"""python.build-imports: torch <= 2.1's extension builder runs `from pkg_resources import
packaging`, which setuptools 70.x and setuptools >= 82 (or no setuptools) cannot serve.

The environments are real venvs. Their torch is a wheel holding torch's real version file
layout and the real import block of torch/utils/cpp_extension.py, recorded from PyPI's torch
2.1.2 and 2.2.0 wheels (tests/fixtures/torch_builders/); the setuptools in them are the real
releases: the machine's own (>= 82: no pkg_resources) and 70.0.0 / 80.9.0 from PyPI, which
.ci/run downloads into ~/.cache/dsenv-tests/wheels."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import setuptools
from packaging.version import Version

from dsenv.verdicts.findings import Status
from tests.harness import pyenvs

FIXTURES = Path(__file__).parent / "fixtures" / "torch_builders"
SETUPTOOLS_WHEELS = Path(os.environ.get("DSENV_TEST_WHEELS")
                         or Path.home() / ".cache" / "dsenv-tests" / "wheels")


def builder_text(release: str) -> str:
    lines = (FIXTURES / f"cpp_extension-{release}-head.txt").read_text().splitlines()
    return "\n".join(lines[2:]) + "\n"  # the two lines saying where it was recorded


def torch_with_builder(out: Path, release: str) -> Path:
    version_py = (f"__version__ = '{release}+cpu'\ndebug = False\ncuda = None\n"
                  "git_version = 'dsenv-tests'\nhip = None\n")
    return pyenvs.build_wheel(out, "torch", f"{release}+cpu", {
        "torch/__init__.py": pyenvs.TORCH_INIT, "torch/version.py": version_py,
        "torch/utils/__init__.py": "", "torch/utils/cpp_extension.py": builder_text(release)})


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    torch_with_builder(out, "2.1.2")
    torch_with_builder(out, "2.2.0")
    return out


def venv_with(tmp_path, wheels, torch: str, setuptools_release: str | None = None,
              system_site_packages: bool = False) -> Path:
    venv = pyenvs.make_venv(tmp_path / "venv", system_site_packages=system_site_packages)
    pyenvs.uv_install(wheels, f"torch=={torch}+cpu", python=venv / "bin" / "python")
    if setuptools_release:
        pyenvs.uv_install(SETUPTOOLS_WHEELS, f"setuptools=={setuptools_release}",
                          python=venv / "bin" / "python")
    return venv


def needs_setuptools_wheel(release: str):
    wheel = SETUPTOOLS_WHEELS / f"setuptools-{release}-py3-none-any.whl"
    return pytest.mark.skipif(not wheel.is_file(),
                              reason=f"{wheel} is absent: .ci/run downloads it from PyPI")


def test_the_recorded_builders_are_what_torch_shipped():
    # the 2.1.2 block imports packaging from pkg_resources; 2.2.0 dropped it
    assert "from pkg_resources import packaging" in builder_text("2.1.2")
    assert "pkg_resources" not in builder_text("2.2.0")


def test_no_setuptools_at_all_fails_with_the_interpreters_words(tmp_path, wheels, make_ctx,
                                                               run_one):
    # a venv made with --without-pip has no setuptools, as Python 3.12's venvs
    venv = venv_with(tmp_path, wheels, "2.1.2")
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.FAIL, result
    assert result.mode == "env.pkg-resources-unavailable"
    assert "torch 2.1.2+cpu's extension builder runs `from pkg_resources import packaging`" \
        in result.summary and "setuptools not installed" in result.summary
    assert any("No module named 'pkg_resources'" in e for e in result.evidence), result.evidence
    assert any("setuptools>=71,<82" in e for e in result.evidence)


@pytest.mark.skipif(Version(setuptools.__version__) < Version("82"),
                    reason="the interpreter running the tests has a setuptools with pkg_resources")
def test_a_setuptools_without_pkg_resources_fails(tmp_path, wheels, make_ctx, run_one):
    # the base interpreter's setuptools (>= 82, pkg_resources removed), seen through the venv
    venv = venv_with(tmp_path, wheels, "2.1.2", system_site_packages=True)
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.FAIL, result
    assert f"setuptools {setuptools.__version__}" in result.summary
    assert any("No module named 'pkg_resources'" in e for e in result.evidence)


@needs_setuptools_wheel("70.0.0")
def test_setuptools_70_fails_on_the_name_it_stopped_exporting(tmp_path, wheels, make_ctx,
                                                              run_one):
    venv = venv_with(tmp_path, wheels, "2.1.2", "70.0.0")
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.FAIL, result
    assert "(setuptools 70.0.0)" in result.summary
    assert any("cannot import name 'packaging' from 'pkg_resources'" in e
               for e in result.evidence), result.evidence


@needs_setuptools_wheel("80.9.0")
def test_a_setuptools_that_exports_packaging_serves_the_old_builder(tmp_path, wheels, make_ctx,
                                                                   run_one):
    venv = venv_with(tmp_path, wheels, "2.1.2", "80.9.0")
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.OK, result
    assert "setuptools 80.9.0 provides what it asks" in result.summary


def test_a_builder_without_pkg_resources_needs_nothing_of_it(tmp_path, wheels, make_ctx,
                                                             run_one):
    # torch 2.2's builder in the same setuptools-less venv: nothing to fail
    venv = venv_with(tmp_path, wheels, "2.2.0")
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.OK, result
    assert "torch 2.2.0+cpu's extension builder imports nothing from pkg_resources" \
        in result.summary


def test_the_real_environments_torch(make_ctx, run_one):
    result = run_one("python.build-imports", make_ctx(environment=sys.executable))
    import torch.utils.cpp_extension as builder  # the real one, read here only to compare
    uses = "pkg_resources" in Path(builder.__file__).read_text()
    assert result.status == Status.OK, result
    assert ("imports nothing from pkg_resources" in result.summary) is not uses


def test_no_torch_skips_with_the_reason(tmp_path, make_ctx, run_one):
    venv = pyenvs.make_venv(tmp_path / "bare")
    result = run_one("python.build-imports", make_ctx(environment=str(venv)))
    assert result.status == Status.SKIP
    assert result.summary.startswith("torch is not installed: ")


def test_an_environment_whose_interpreter_cannot_run_here_is_not_judged(tmp_path, wheels,
                                                                        make_ctx, run_one):
    # the environment's files without an interpreter (a prefix copied from another machine)
    prefix = tmp_path / "prefix"
    pyenvs.uv_install(wheels, "torch==2.1.2+cpu", target=pyenvs.site_packages(prefix))
    result = run_one("python.build-imports", make_ctx(environment=str(prefix)))
    assert result.status == Status.SKIP, result
    assert "`from pkg_resources import packaging` was not run" in result.summary

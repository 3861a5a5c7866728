"""python.system-libraries: ldd on the extension modules of packages that link system
libraries (opencv-python's cv2 and libGL/libgthread: ThoughtfulDev/EagleEye#132,
fisher60/friendo-bot#68). The extension is built for real with gcc, linked against a library
that is then left off every path (the failing case) or put on LD_LIBRARY_PATH (its twin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from dsenv.verdicts.findings import Status
from tests.harness.findings import here

PYDIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build "
                                "the extension module (build-essential in .ci/run)")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(folder holding libdsenvgl.so.1, the cv2 extension linked against it)."""
    root = tmp_path_factory.mktemp("cv2build")
    (root / "gl.c").write_text("int dsenv_gl_present(void) { return 1; }\n")
    (root / "cv2.c").write_text("int dsenv_gl_present(void);\n"
                                "int cv2_init(void) { return dsenv_gl_present(); }\n")
    libs = root / "libs"
    libs.mkdir()
    run = lambda *argv: subprocess.run(argv, check=True, cwd=root, timeout=60)  # noqa: E731
    run("gcc", "-shared", "-fPIC", "-Wl,-soname,libdsenvgl.so.1", "-o",
        str(libs / "libdsenvgl.so.1"), "gl.c")
    run("gcc", "-shared", "-fPIC", "-o", "cv2.abi3.so", "cv2.c", f"-L{libs}", "-l:libdsenvgl.so.1")
    return libs, root / "cv2.abi3.so"


def env_with_cv2(root, extension):
    cv2 = root / "lib" / PYDIR / "site-packages" / "cv2"
    cv2.mkdir(parents=True)
    (cv2 / "__init__.py").write_text("")
    shutil.copy(extension, cv2 / "cv2.abi3.so")
    return root


def ctx_for(make_ctx, prefix, **env):
    ctx = make_ctx(env={"PATH": os.environ["PATH"], **env})
    ctx.python_prefix = prefix
    return ctx


def test_a_library_cv2_links_that_no_path_has_fails_with_the_mode(tmp_path, make_ctx, run_one,
                                                                  built):
    libs, extension = built
    prefix = env_with_cv2(tmp_path / "env", extension)
    result = run_one("python.system-libraries", ctx_for(make_ctx, prefix))
    assert result.status == Status.FAIL, result
    assert result.mode == "loader.system-library-missing"
    assert result.summary.startswith("libdsenvgl.so.1 not found for cv2")
    assert "opencv-python-headless" in result.fix and "libgl1" in result.fix
    assert "libdsenvgl.so.1" in here(result)
    # the healthy twin: the same extension with its library on the job's LD_LIBRARY_PATH
    result = run_one("python.system-libraries", ctx_for(make_ctx, prefix,
                                                        LD_LIBRARY_PATH=str(libs)))
    assert result.status == Status.OK, result
    assert any("cv2.abi3.so: all found" in line for line in result.evidence)


def test_nothing_to_look_at_skips_with_the_reason(tmp_path, make_ctx, run_one, built):
    prefix = tmp_path / "env"
    (prefix / "lib" / PYDIR / "site-packages").mkdir(parents=True)
    result = run_one("python.system-libraries", ctx_for(make_ctx, prefix))
    assert result.status == Status.SKIP
    assert "no package that links system libraries (cv2)" in result.summary
    # cv2 there but no ldd to ask: skipped, never passed
    prefix = env_with_cv2(tmp_path / "env2", built[1])
    ctx = make_ctx(env={"PATH": str(tmp_path / "empty-bin")})
    ctx.python_prefix = prefix
    result = run_one("python.system-libraries", ctx)
    assert result.status == Status.SKIP and "ldd is not on PATH" in result.summary

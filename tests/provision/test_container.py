"""--kind container: a --system-site-packages venv on the image's Python (simulated by this
machine's interpreter), installing only what the image lacks; import and ldd checks."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.container import create_container_env, plan_container, plan_missing
from dsenv.provision.locks import read_lock
from dsenv.provision.venv import make_venv, venv_python
from dsenv.provision.verify.imports import import_check, import_check_lock, import_names
from dsenv.provision.verify.shared_libs import missing_shared_libraries
from tests.harness.tinywheels import offline, wheel_hash

PACKAGING = metadata.version("packaging")
RICH = metadata.version("rich")


@pytest.fixture
def mixed_lock(tiny_lock, tmp_path):
    """The tiny lock plus two packages this interpreter has at the locked version and one it
    has at another version (hashes are not checked for what is not installed)."""
    lock = tmp_path / "mixed.txt"
    lock.write_text(tiny_lock.read_text()
                    + f"packaging=={PACKAGING} \\\n    --hash=sha256:{'0' * 64}\n"
                    + f"rich=={RICH} \\\n    --hash=sha256:{'1' * 64}\n"
                    + "psutil==1.0.0 \\\n    --hash=sha256:" + "2" * 64 + "\n")
    return lock


def test_plan_splits_the_lock_into_what_the_image_has_and_what_to_install(mixed_lock,
                                                                          tiny_wheels):
    present, missing = plan_missing(mixed_lock, sys.executable)
    assert present == {"packaging": PACKAGING, "rich": RICH}
    names = [line.split("==")[0] for line in missing]
    assert names == ["dsenv-tiny-a", "dsenv-tiny-b", "psutil"]
    assert missing[0] == (f"dsenv-tiny-a==1.0 --hash={wheel_hash(tiny_wheels, 'dsenv-tiny-a')}")
    plan = plan_container(mixed_lock, sys.executable)
    assert plan.shadowed == {"psutil": (metadata.version("psutil"), "1.0.0")}
    assert "2 from the image, 3 to install (1 shadow the image's: psutil" in plan.summary()
    kept = plan_container(mixed_lock, sys.executable, keep=["PSUTIL"])
    assert kept.kept == {"psutil": (metadata.version("psutil"), "1.0.0")}
    assert kept.missing_names() == ["dsenv-tiny-a", "dsenv-tiny-b"] and not kept.shadowed


def test_container_env_installs_only_the_missing_packages_and_imports_everything(
        tiny_lock, tiny_wheels, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text(tiny_lock.read_text()
                    + f"packaging=={PACKAGING} \\\n    --hash=sha256:{'0' * 64}\n")
    final = tmp_path / "final"
    staging = tmp_path / ".final.tmp"
    plan = create_container_env(staging, lock, base_python=sys.executable,
                                sources=offline(tiny_wheels), compile_bytecode=False)
    staging.rename(final)
    assert plan.present == {"packaging": PACKAGING}
    site = next(final.glob("lib/python*/site-packages"))
    installed = sorted(p.name for p in site.glob("*.dist-info"))
    assert installed == ["dsenv_tiny_a-1.0.dist-info", "dsenv_tiny_b-1.0.dist-info"]
    assert "include-system-site-packages = true" in (final / "pyvenv.cfg").read_text()
    py = venv_python(final)
    assert import_check_lock(py, lock) == []
    out = subprocess.run([str(py), "-c", "import packaging, dsenvtinyb; print(packaging.__file__)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and str(final) not in out.stdout  # packaging: the image's


def test_import_names_come_from_top_level_or_record(tiny_lock, tiny_wheels, tmp_path):
    prefix = tmp_path / "env"
    create_container_env(prefix, tiny_lock, base_python=sys.executable,
                         sources=offline(tiny_wheels), compile_bytecode=False)
    names = import_names(venv_python(prefix), ["dsenv-tiny-a", "py-cpuinfo", "PyYAML",
                                               "no-such-dist"])
    assert names["dsenv-tiny-a"] == ["dsenvtinya"]
    assert names["py-cpuinfo"] == ["cpuinfo"]
    assert names["PyYAML"] == ["yaml"]  # _yaml (private) left out
    assert names["no-such-dist"] is None


def test_import_check_reports_failures_crashes_and_hangs_and_checks_the_rest(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "dsenv_ok.py").write_text("X = 1\n")
    (mods / "dsenv_raises.py").write_text("raise ImportError('libfoo.so.1: cannot open')\n")
    (mods / "dsenv_crash.py").write_text("import os\nos.abort()\n")
    (mods / "dsenv_hang.py").write_text("import time\ntime.sleep(60)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(mods)}
    failures = import_check(sys.executable, ["dsenv_ok", "dsenv_raises", "dsenv_crash",
                                             "dsenv_missing", "dsenv_hang", "json"],
                            env=env, timeout=5, owners={"dsenv_missing": "dsenv-missing"})
    by_module = {f.module: f for f in failures}
    assert sorted(by_module) == ["dsenv_crash", "dsenv_hang", "dsenv_missing", "dsenv_raises"]
    assert by_module["dsenv_raises"].error == "ImportError: libfoo.so.1: cannot open"
    assert "crashed the interpreter" in by_module["dsenv_crash"].error
    assert by_module["dsenv_hang"].error == "timed out after 5 s"
    assert str(by_module["dsenv_missing"]) == (
        "import dsenv_missing (dsenv-missing): ModuleNotFoundError: No module named "
        "'dsenv_missing'")


# ----------------------------------------------------------------------------- ldd
needs_gcc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("ldd")
                                    and shutil.which("readelf")),
                               reason="needs gcc, ldd and readelf")

LIB_C = "int dsenv_answer(void) { return 42; }\n"
EXT_C = r"""
#include <Python.h>
int dsenv_answer(void);
static PyObject *answer(PyObject *self, PyObject *args) {
    return PyLong_FromLong(dsenv_answer());
}
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "dsenvext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_dsenvext(void) { return PyModule_Create(&mod); }
"""


def _gcc(*args):
    subprocess.run(["gcc", *map(str, args)], check=True, timeout=120, capture_output=True)


@pytest.fixture
def image_with_extension(tmp_path):
    """A fake image library folder (``image/lib64/libdsenvtest.so``, like the NGC image's
    /opt/conda/lib/libxgboost.so) and a container venv whose site-packages holds a C
    extension linked against it, with RUNPATH ``$ORIGIN/../../..`` (= the venv's lib)."""
    image_lib = tmp_path / "image" / "lib64"
    image_lib.mkdir(parents=True)
    (tmp_path / "libdsenvtest.c").write_text(LIB_C)
    _gcc("-shared", "-fPIC", "-o", image_lib / "libdsenvtest.so", tmp_path / "libdsenvtest.c")
    prefix = tmp_path / "env"
    make_venv(prefix, python=sys.executable, system_site_packages=True)
    site = next(prefix.glob("lib/python*/site-packages"))
    (tmp_path / "ext.c").write_text(EXT_C)
    ext = site / f"dsenvext{sysconfig.get_config_var('EXT_SUFFIX')}"
    _gcc("-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", ext,
         tmp_path / "ext.c", f"-L{image_lib}", "-ldsenvtest", "-Wl,--enable-new-dtags",
         "-Wl,-rpath,$ORIGIN/../../../lib")
    return prefix, ext, image_lib


def _imports(prefix: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_python(prefix)), "-c", "import dsenvext; "
                           "print(dsenvext.answer())"], capture_output=True, text=True,
                          timeout=60, env=env)


@needs_gcc
def test_a_library_found_elsewhere_gets_a_symlink_fix_that_clears_it(image_with_extension):
    prefix, ext, image_lib = image_with_extension
    assert "libdsenvtest.so: cannot open shared object file" in _imports(prefix).stderr
    found = missing_shared_libraries([prefix], search_dirs=[image_lib.parent])
    assert len(found) == 1
    (item,) = found
    assert (item.so_file, item.library) == (ext, "libdsenvtest.so")
    assert item.found == (image_lib / "libdsenvtest.so",)
    target = prefix / "lib" / "libdsenvtest.so"
    assert item.fix == f"ln -s {image_lib / 'libdsenvtest.so'} {target}"
    assert str(item).startswith(f"{ext}: libdsenvtest.so not found; fix: ln -s ")
    # Apply the fix: the loader finds it, and the extension imports.
    subprocess.run(["sh", "-c", item.fix], check=True, timeout=30)
    assert missing_shared_libraries([prefix], search_dirs=[image_lib.parent]) == []
    assert _imports(prefix).stdout.strip() == "42"


@needs_gcc
def test_without_runpath_the_fix_is_ld_library_path(image_with_extension, tmp_path):
    prefix, ext, image_lib = image_with_extension
    site = ext.parent
    (tmp_path / "plain.c").write_text("int dsenv_answer(void);\n"
                                      "int twice(void) { return 2 * dsenv_answer(); }\n")
    _gcc("-shared", "-fPIC", "-o", site / "dsenvplain.so", tmp_path / "plain.c",
         f"-L{image_lib}", "-ldsenvtest")  # needs it, no RUNPATH
    found = {f.so_file.name: f for f in missing_shared_libraries(
        [site], search_dirs=[image_lib])}
    assert found["dsenvplain.so"].fix == (
        f"export LD_LIBRARY_PATH={image_lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(image_lib)}
    assert missing_shared_libraries([site], env=env) == []


@needs_gcc
def test_a_library_nowhere_or_only_in_another_version_says_what_to_install(
        image_with_extension):
    prefix, ext, image_lib = image_with_extension
    (image_lib / "libdsenvtest.so").rename(image_lib / "libdsenvtest.so.7")
    (item,) = missing_shared_libraries([prefix], search_dirs=[image_lib])
    assert item.fix.startswith(f"ln -s {image_lib / 'libdsenvtest.so.7'} ")  # unversioned
    (image_lib / "libdsenvtest.so.7").unlink()
    (item,) = missing_shared_libraries([prefix], search_dirs=[image_lib])
    assert item.found == () and "libdsenvtest.so is nowhere on this machine" in item.fix


@needs_gcc
def test_libraries_shipped_by_another_package_of_the_env_are_not_reported(
        image_with_extension):
    # Like deepspeed's cpu_adam_op.so needing libc10.so from torch/lib: found once torch is
    # imported, so ldd's "not found" is not a finding.
    prefix, ext, image_lib = image_with_extension
    provider = ext.parent / "fakelib" / "lib"
    provider.mkdir(parents=True)
    shutil.copy(image_lib / "libdsenvtest.so", provider / "libdsenvtest.so")
    assert missing_shared_libraries([prefix]) == []


def test_a_broken_interpreter_is_one_line(tmp_path):
    lock = tmp_path / "l.txt"
    lock.write_text("a==1 --hash=sha256:" + "0" * 64 + "\n")
    assert read_lock(lock.read_text())[0].name == "a"
    with pytest.raises(ProvisionError, match="cannot list the packages"):
        plan_missing(lock, "/bin/false")


@needs_gcc
def test_alternative_builds_of_one_module_are_fine_when_one_loads(image_with_extension,
                                                                  tmp_path):
    # mpi4py ships MPI.mpich.*.so (libmpi.so.12) and MPI.openmpi.*.so (libmpi.so.40) and
    # loads the one whose MPI exists: the other's missing library is not a finding.
    prefix, ext, image_lib = image_with_extension
    pkg = ext.parent / "dsenvalt"
    pkg.mkdir()
    (tmp_path / "plain.c").write_text("int dsenv_answer(void);\n"
                                      "int twice(void) { return 2 * dsenv_answer(); }\n")
    (tmp_path / "none.c").write_text("int twice(void) { return 2; }\n")
    _gcc("-shared", "-fPIC", "-o", pkg / "MOD.one.so", tmp_path / "plain.c", f"-L{image_lib}",
         "-ldsenvtest")
    found = [f.so_file.name for f in missing_shared_libraries([pkg], search_dirs=[image_lib])]
    assert found == ["MOD.one.so"]  # alone, it is a finding
    _gcc("-shared", "-fPIC", "-o", pkg / "MOD.two.so", tmp_path / "none.c")
    assert missing_shared_libraries([pkg], search_dirs=[image_lib]) == []

"""torch.extension-symbols: compiled modules that link torch against the torch installed
(issue 23: "undefined symbol: _ZN3c10..." read as another torch release or the other C++
string ABI before the job imports them).

Built for real: Python extension modules compiled here with gcc, linked to this torch's
libc10.so, each calling one C++ symbol by its mangled name, the names users posted: an
old-ABI `c10::Error` constructor (std::string as `Ss`: flash-attention#1644, LMCache#1294)
against this new-ABI torch, `at::Tensor::device() const` that torch 2.x no longer exports
(mmdetection#5547), and the new-ABI constructor torch does export (the healthy twin). Python
imports each and the dynamic loader says what users saw; the doctor reads the same files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.verdicts.findings import Status
from tests.harness.cli import dsenv
from tests.harness.pyenvs import make_venv, site_packages

torch = pytest.importorskip("torch")
TORCH_LIB = Path(torch.__file__).parent / "lib"
OLD_ABI_ERROR = "_ZN3c105ErrorC2ENS_14SourceLocationESs"
NEW_ABI_ERROR = ("_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
                 "traitsIcESaIcEEE")
GONE = "_ZNK2at6Tensor6deviceEv"  # at::Tensor::device() const, inline in torch 2.x
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
SOURCE = """#include <Python.h>
{declared}
static PyObject *call(PyObject *self, PyObject *args) {{ {calls} Py_RETURN_NONE; }}
static PyMethodDef methods[] = {{{{"call", call, METH_NOARGS, ""}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&module); }}
"""


def extension(folder: Path, name: str, symbol: str, own: str = "") -> Path:
    """An extension module ``name`` in ``folder`` that links libc10.so and calls ``symbol``
    (and, with ``own``, a library of its own package beside it that defines ``own``: a torch
    namespace symbol torch does not have, as libtorchaudio.so does for torchaudio)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH: no extension module can be built")
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.c"
    symbols = [symbol, own] if own else [symbol]  # C++ functions, called by mangled name
    source.write_text(SOURCE.format(name=name, calls=" ".join(f"{x}();" for x in symbols),
                                    declared="\n".join(f"extern void {x}(void);"
                                                       for x in symbols)))
    libs = []
    if own:
        (folder / "own.c").write_text(f"void {own}(void) {{}}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", str(folder / "own.c"), "-o",
                        str(folder / "libown.so")], check=True, timeout=120)
        (folder / "own.c").unlink()
        libs = [f"-L{folder}", "-lown", "-Wl,-rpath,$ORIGIN"]
    out = folder / f"{name}{SUFFIX}"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    str(source), "-o", str(out), f"-L{TORCH_LIB}", "-Wl,--no-as-needed",
                    "-lc10", f"-Wl,-rpath,{TORCH_LIB}", *libs], check=True, timeout=120)
    source.unlink()
    return out


def import_error(folder: Path, name: str) -> str:
    """What `import name` says, in a fresh interpreter: "" when it imports."""
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, "
                           f"{str(folder)!r}); import {name}"], capture_output=True, text=True,
                          timeout=120)
    return done.stderr.strip().splitlines()[-1] if done.returncode else ""


def env_with_torch(tmp_path: Path) -> Path:
    """A venv whose torch is this one's files: its version.py and its lib folder."""
    prefix = make_venv(tmp_path / "env")
    package = site_packages(prefix) / "torch"
    package.mkdir(parents=True)
    shutil.copy(Path(torch.__file__).parent / "version.py", package / "version.py")
    (package / "lib").symlink_to(TORCH_LIB)
    return prefix


def judge(tmp_path: Path, prefix: Path, extensions_dir: Path | None = None):
    all_checks()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "TORCH_EXTENSIONS_DIR": str(extensions_dir or tmp_path / "no-jit-builds")}
    ctx = Context(options=Options(target="login"), env=env, python_prefix=prefix)
    return run_check(CHECKS["torch.extension-symbols"], ctx)


def test_an_old_abi_wheel_under_a_new_abi_torch_fails_with_the_abi(tmp_path):
    prefix = env_with_torch(tmp_path)
    folder = site_packages(prefix)  # flash-attn's wheel puts the module at the top
    built = extension(folder, "flash_attn_2_cuda", OLD_ABI_ERROR)
    # installed as a wheel is: its RECORD lists the module (the doctor reads RECORDs, not the
    # whole of site-packages, and names the distribution, not the module)
    info = site_packages(prefix) / "flash_attn-2.7.4.post1.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"{built.name},sha256=x,1\nflash_attn/__init__.py,,"
                                 f"\n{info.name}/RECORD,,\n")
    error = import_error(folder, "flash_attn_2_cuda")  # the loader's own words
    assert error.startswith("ImportError: ") and f"undefined symbol: {OLD_ABI_ERROR}" in error
    found = judge(tmp_path, prefix)
    assert found.status is Status.FAIL and found.mode == "loader.ext-cxx11-abi-mismatch", found
    assert "flash_attn was built with the old C++ string ABI" in found.summary
    assert f"undefined symbol: {OLD_ABI_ERROR}" in found.summary
    assert any("cxx11abiTRUE" in line and "--force-reinstall flash_attn" in line
               for line in found.evidence), found.evidence


def test_a_jit_build_for_another_torch_fails_with_the_release(tmp_path):
    prefix, builds = env_with_torch(tmp_path), tmp_path / "torch_extensions"
    extension(builds / "fused_adam", "fused_adam", GONE)
    assert f"undefined symbol: {GONE}" in import_error(builds / "fused_adam", "fused_adam")
    found = judge(tmp_path, prefix, builds)
    assert found.status is Status.FAIL and found.mode == "loader.ext-built-for-other-torch", found
    assert found.summary.startswith("the JIT build fused_adam was built against another torch")
    assert any(f"rm -rf {builds / 'fused_adam'}" in line for line in found.evidence)


def test_a_stale_jit_build_is_read_before_a_large_site_packages(tmp_path, monkeypatch):
    """Recorded on a lent H200 (tests/fixtures/explain_gpu/stale_jit_import.log): the image's
    venv held ~780 shared objects, the bound (then 400) was spent on site-packages, and a JIT
    build made for another torch was never read: "5 compiled module(s) link torch: every torch
    symbol they ask for is in torch 2.11.0+cu130; 380 more not read". JIT builds come first."""
    from dsenv.facts.python import torch_symbols
    prefix, builds = env_with_torch(tmp_path), tmp_path / "torch_extensions"
    good = extension(site_packages(prefix) / "good_ext", "good_ext", NEW_ABI_ERROR)
    for n in range(3):  # more site-packages modules than the bound below
        shutil.copy(good, good.with_name(f"copy{n}{SUFFIX}"))
    extension(builds / "deepspeed_shm_comm", "deepspeed_shm_comm", GONE)
    monkeypatch.setattr(torch_symbols, "MAX_EXTENSIONS", 2)
    found = judge(tmp_path, prefix, builds)
    assert found.status is Status.FAIL and found.mode == "loader.ext-built-for-other-torch", found
    assert found.summary.startswith("the JIT build deepspeed_shm_comm was built"), found


def test_extensions_built_against_this_torch_pass(tmp_path):
    """The twin: modules asking only for what torch defines, one also for a torch-namespace
    symbol its own package's library defines (found beside it, as the loader finds it)."""
    prefix, builds = env_with_torch(tmp_path), tmp_path / "torch_extensions"
    extension(site_packages(prefix) / "good_ext", "good_ext", NEW_ABI_ERROR,
              own="_ZN5torch5audio7computeEv")
    extension(builds / "cpu_op", "cpu_op", NEW_ABI_ERROR)
    assert import_error(site_packages(prefix) / "good_ext", "good_ext") == ""
    found = judge(tmp_path, prefix, builds)
    assert found.status is Status.OK and found.summary.startswith("2 compiled module(s) link "
                                                                  "torch"), found
    assert "new (_GLIBCXX_USE_CXX11_ABI=1" in found.evidence[0]


def test_a_conda_layout_reads_torch_from_the_environments_lib(tmp_path):
    """conda's pytorch keeps libc10.so and libtorch*.so in $PREFIX/lib, torch/lib empty."""
    prefix = make_venv(tmp_path / "env")
    package = site_packages(prefix) / "torch"
    (package / "lib").mkdir(parents=True)
    shutil.copy(Path(torch.__file__).parent / "version.py", package / "version.py")
    for lib in TORCH_LIB.glob("lib*.so"):
        (prefix / "lib" / lib.name).symlink_to(lib)
    extension(site_packages(prefix) / "good_ext", "good_ext", NEW_ABI_ERROR)
    extension(site_packages(prefix) / "old_ext", "old_ext", GONE)
    found = judge(tmp_path, prefix)
    assert found.status is Status.FAIL and found.mode == "loader.ext-built-for-other-torch"
    assert "old_ext was built against another torch" in found.summary, found


def test_no_module_linking_torch_skips_with_the_reason(tmp_path):
    prefix = env_with_torch(tmp_path)
    found = judge(tmp_path, prefix)
    assert found.status is Status.SKIP and found.summary == (
        "no compiled module links torch's libraries: nothing to compare"), found
    assert found.evidence == [f"read: the modules installed in {site_packages(prefix)}"]


def test_no_torch_skips(tmp_path):
    found = judge(tmp_path, make_venv(tmp_path / "bare"))
    assert found.status is Status.SKIP and found.summary.startswith("torch is not installed")


def test_explain_here_runs_the_check_on_the_environment(tmp_path):
    """The post-mortem and the live check: the loader's line, explained with --here in the
    environment that holds the module, names the ABI and says this node shows it."""
    prefix = env_with_torch(tmp_path)
    folder = site_packages(prefix) / "flash_attn"
    extension(folder, "flash_attn_2_cuda", OLD_ABI_ERROR)
    error = import_error(folder, "flash_attn_2_cuda")
    done = dsenv("explain", "--here", "--env", str(prefix), error,
                 env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "none")})
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # as wrapped for the terminal
    assert "2 known causes share these words" in said, said  # the text cannot tell which
    assert "on this node torch.extension-symbols finds: FAIL flash_attn was built with the " \
           "old C++ string ABI" in said
    assert "of these causes, this node shows loader.ext-cxx11-abi-mismatch" in said


@pytest.mark.parametrize("symbol, says", [
    (OLD_ABI_ERROR, "of these causes, this node shows loader.ext-cxx11-abi-mismatch"),
    (GONE, "here does not define it: the extension was built against another torch release: "
           "this node shows loader.ext-built-for-other-torch"),
    (NEW_ABI_ERROR, "here defines _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_"
                    "stringIcSt11char_traitsIcESaIcEEE: the job loaded another torch"),
])
def test_explain_here_compares_the_symbol_with_this_torch(symbol, says):
    """Without the module at hand, --here still compares the log's symbol with this
    environment's torch, read from its libraries: the ABI (the symbol's std::string form
    against torch's), another release (same form, symbol gone), or a torch that has it."""
    assert torch._C._GLIBCXX_USE_CXX11_ABI, "the expectations are for a new-ABI torch"
    text = f"ImportError: /site-packages/ext/_C{SUFFIX}: undefined symbol: {symbol}"
    done = dsenv("explain", "--here", text, env={"TORCH_EXTENSIONS_DIR": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    said = "".join(done.stdout.split())  # wrapped for the terminal, long symbols split too
    assert "".join(says.split()) in said, done.stdout

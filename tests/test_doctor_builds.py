"""JIT build checks, each against a broken state made for real and a healthy twin:
deepspeed.extension-locks, deepspeed.extensions-dir, toolkit.ninja, torch.library-path."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.fix import fixers as fixes
from dsenv.facts.toolchain import extensions as ext
from dsenv.verdicts.findings import Status
from tests.harness.cli import dsenv
from tests.harness.findings import here
from tests.harness.mountns import (
    READ_ONLY,
    doctor_json,
    folder_of_another_user,
    in_namespace,
    needs_namespace,
    result,
    third_user_cannot_write,
)

HAS_TORCH = importlib.util.find_spec("torch") is not None
DS_OTHERS = "deepspeed.install,deepspeed.ops,deepspeed.accelerator"
# torch's own FileBaton, as a JIT build takes it: holds it until killed.
BATON = ("import sys, time\nfrom torch.utils.file_baton import FileBaton\n"
         "baton = FileBaton(sys.argv[1])\nassert baton.try_acquire()\n"
         "print('held', flush=True)\ntime.sleep(300)\n")


def make(tmp_path, env=None, root="/", prefix=None) -> Context:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    return Context(options=Options(target="login"), env={**base, **(env or {})},
                   root=Path(root), python_prefix=prefix)


def fake_mounts(tmp_path, *lines: str) -> Path:
    """A --root tree whose /proc/self/mountinfo lists ``/`` (ext4) and ``lines``."""
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    table = ["27 1 254:0 / / rw,relatime - ext4 /dev/vda rw", *lines]
    (root / "proc" / "self" / "mountinfo").write_text("\n".join(table) + "\n")
    return root


def fake_prefix(tmp_path, name="env", torch_version="2.5.1+cu124", cuda="12.4") -> Path:
    """An environment read from its files (no interpreter): torch's version.py only."""
    site = tmp_path / name / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text(
        f"__version__ = {torch_version!r}\ncuda = {cuda!r}\nhip = None\n")
    return tmp_path / name


# -- deepspeed.extension-locks ----------------------------------------------------------------


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (its FileBaton takes the lock)")
def test_killed_build_leaves_a_stale_lock(tmp_path, run_one):
    extdir = tmp_path / "ext"
    (extdir / "fused_adam").mkdir(parents=True)
    lock = extdir / "fused_adam" / "lock"
    env = {"TORCH_EXTENSIONS_DIR": str(extdir)}
    build = subprocess.Popen([sys.executable, "-c", BATON, str(lock)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert build.stdout.readline().strip() == "held"
        held = run_one("deepspeed.extension-locks", make(tmp_path, env))
    finally:
        build.kill()
        build.wait()
    assert held.status == Status.INFO, held
    assert f"pid {build.pid} (python" in held.evidence[0] and "has the lock open" in \
        held.evidence[0]

    assert lock.exists()  # what SIGKILL leaves behind
    stale = run_one("deepspeed.extension-locks", make(tmp_path, env))
    assert stale.status == Status.FAIL, stale
    assert "fused_adam" in stale.summary and "waits forever" in stale.summary
    assert here(stale) == f"rm {lock}"
    assert stale.action.kind == "remove-stale-lock" and stale.action.applicable
    # torch's next build of the op cannot take the baton: it would wait() forever
    retry = subprocess.run([sys.executable, "-c", "import sys\nfrom torch.utils.file_baton "
                            "import FileBaton\nprint(FileBaton(sys.argv[1]).try_acquire())",
                            str(lock)], capture_output=True, text=True, timeout=120)
    assert retry.stdout.strip() == "False", retry.stderr

    # `dsenv doctor --fix` applies it, then the check again
    ctx = make(tmp_path, env)
    assert str(lock) in fixes.apply(stale.action, ctx, "deepspeed.extension-locks")
    assert not lock.exists()
    assert run_one("deepspeed.extension-locks", make(tmp_path, env)).status == Status.OK


@pytest.mark.parametrize("how", ["cwd", "open-file"])
def test_a_build_working_in_the_folder_keeps_the_lock_live(tmp_path, run_one, how):
    build_dir = tmp_path / "ext" / "cpu_adam"
    build_dir.mkdir(parents=True)
    (build_dir / "lock").write_text("")
    if how == "cwd":  # ninja/c++ run with the build folder as working directory
        child = subprocess.Popen(["sleep", "300"], cwd=build_dir)
        expected = "works in the build folder"
    else:  # a compiler writing an object file there
        child = subprocess.Popen(["sh", "-c", "exec 3>>cpu_adam.o; exec sleep 300"],
                                 cwd=build_dir)
        expected = "has cpu_adam.o open"
    try:
        deadline = time.time() + 30
        # the open-file twin waits until the shell has opened cpu_adam.o (cwd is set at once)
        while how == "open-file" and time.time() < deadline and not _opened(child.pid):
            time.sleep(0.05)
        found = run_one("deepspeed.extension-locks",
                        make(tmp_path, {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}))
    finally:
        child.kill()
        child.wait()
    assert found.status == Status.INFO, found
    assert f"pid {child.pid}" in found.evidence[0] and expected in found.evidence[0]


def _opened(pid: int) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".o")
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_default_folder_of_another_env_is_scanned(tmp_path, run_one):
    # TORCH_EXTENSIONS_DIR unset: every py<XY>_<accel> folder under ~/.cache/torch_extensions
    lock = tmp_path / "home" / ".cache" / "torch_extensions" / "py310_cu118" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    found = run_one("deepspeed.extension-locks", make(tmp_path))
    assert found.status == Status.FAIL and here(found) == f"rm {lock}"
    subprocess.run(here(found), shell=True, check=True)  # the command by hand, then again
    assert run_one("deepspeed.extension-locks", make(tmp_path)).status == Status.OK


def test_several_stale_locks_are_removed_together(tmp_path, run_one):
    locks = [tmp_path / "ext" / op / "lock" for op in ("cpu_adam", "fused_adam")]
    for lock in locks:
        lock.parent.mkdir(parents=True)
        lock.write_text("")
    found = run_one("deepspeed.extension-locks",
                    make(tmp_path, {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}))
    assert found.status == Status.FAIL and here(found) == f"rm {locks[0]} {locks[1]}"
    assert found.action.applicable and found.action.paths == tuple(map(str, locks))
    fixes.apply(found.action, make(tmp_path), found.id)
    assert not any(lock.exists() for lock in locks)


def test_no_lock_is_ok(tmp_path, run_one):
    (tmp_path / "ext" / "fused_adam").mkdir(parents=True)
    (tmp_path / "ext" / "fused_adam" / "fused_adam.so").write_text("")
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    assert run_one("deepspeed.extension-locks", make(tmp_path, env)).status == Status.OK
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "missing")}
    assert run_one("deepspeed.extension-locks", make(tmp_path, env)).status == Status.OK


def test_lock_on_nfs_warns_while_young_and_fails_when_old(tmp_path, run_one):
    # the builder may run on another node: no process here proves nothing for an hour
    extdir = tmp_path / "ext"
    (extdir / "fused_adam").mkdir(parents=True)
    lock = extdir / "fused_adam" / "lock"
    lock.write_text("")
    root = fake_mounts(tmp_path, f"90 27 0:50 / {extdir} rw - nfs4 fs:/ext rw,vers=4.2")
    env = {"TORCH_EXTENSIONS_DIR": str(extdir)}
    young = run_one("deepspeed.extension-locks", make(tmp_path, env, root=root))
    assert young.status == Status.WARN and "another node" in young.summary, young
    assert here(young).startswith(f"rm {lock} once no job")
    assert not young.action.applicable and "another node" in young.action.why_not
    old = time.time() - 2 * 3600
    os.utime(lock, (old, old))
    aged = run_one("deepspeed.extension-locks", make(tmp_path, env, root=root))
    assert aged.status == Status.FAIL and "2.0 h old" in aged.summary, aged


def test_cli_reports_a_stale_lock(tmp_path):
    lock = tmp_path / "ext" / "transformer_inference" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    done = dsenv("doctor", "--only", "deepspeed", "--skip", DS_OTHERS + ",deepspeed.extensions-dir",
                 "--json", env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    found = result(doctor_json(done), "deepspeed.extension-locks")
    assert done.returncode != 0 and found["status"] == "fail", found
    assert here(found) == f"rm {lock}"


# -- deepspeed.extensions-dir -----------------------------------------------------------------


@pytest.mark.skipif(not HAS_TORCH, reason="compares with torch's own resolution")
@pytest.mark.parametrize("extra", [{}, {"XDG_CACHE_HOME": "{tmp}/xdg"},
                                   {"TORCH_EXTENSIONS_DIR": "{tmp}/explicit"}])
def test_root_matches_torch(tmp_path, extra):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"),
           **{k: v.format(tmp=tmp_path) for k, v in extra.items()}}
    code = ("import torch.utils.cpp_extension as c\n"
            "print(c._get_build_directory('op', False))")
    real = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout.strip().splitlines()[-1]
    ctx = Context(options=Options(target="login"), env=env, root=Path("/"))
    assert str(ext.extensions_root(ctx).path / "op") == real


@pytest.mark.parametrize("read_only", [True, False])
def test_read_only_extensions_dir_fails_tmpfs_is_ok(tmp_path, read_only):
    needs_namespace()
    extdir = tmp_path / "ext"
    extdir.mkdir()
    step = 'read_only "$EXT"' if read_only else 'mount -t tmpfs -o size=4m none "$EXT"'
    done = in_namespace(READ_ONLY + step + '\n"$PY" -m dsenv doctor --only deepspeed --skip '
                        f'{DS_OTHERS},deepspeed.extension-locks --json || true',
                        env={"EXT": str(extdir), "TORCH_EXTENSIONS_DIR": str(extdir)})
    found = result(doctor_json(done), "deepspeed.extensions-dir")
    if read_only:  # a read-only image or home: root cannot write either
        assert found["status"] == "fail" and "cannot be written" in found["summary"], found
        assert here(found).startswith("export TORCH_EXTENSIONS_DIR=")
        assert any("Read-only file system" in e for e in found["evidence"])
    else:
        assert found["status"] == "ok" and "(tmpfs)" in found["summary"], found


def test_folder_made_by_another_user_warns(tmp_path, run_one):
    with folder_of_another_user("torch_extensions") as extdir:
        found = run_one("deepspeed.extensions-dir",
                        make(tmp_path, {"TORCH_EXTENSIONS_DIR": str(extdir)}))
        assert found.status == Status.WARN and "belongs to uid 65534" in found.summary, found
        # why it matters: a third user cannot build there
        assert third_user_cannot_write(["mkdir", str(extdir / "op")])
    own = tmp_path / "own"
    own.mkdir()
    twin = run_one("deepspeed.extensions-dir", make(tmp_path, {"TORCH_EXTENSIONS_DIR": str(own)}))
    assert twin.status == Status.OK, twin


def test_default_folder_in_an_nfs_home_warns(tmp_path, run_one):
    home = tmp_path / "home"
    home.mkdir()
    root = fake_mounts(tmp_path, f"90 27 0:50 / {home} rw - nfs4 fs:/home rw,vers=4.2")
    found = run_one("deepspeed.extensions-dir", make(tmp_path, root=root))
    assert found.status == Status.WARN and "nfs4" in found.summary, found
    assert str(home / ".cache" / "torch_extensions" / "py") in found.evidence[0]
    assert "TORCH_EXTENSIONS_DIR unset" in found.evidence[1]
    assert here(found).startswith("export TORCH_EXTENSIONS_DIR=")
    twin = run_one("deepspeed.extensions-dir", make(tmp_path, root=fake_mounts(tmp_path)))
    assert twin.status == Status.OK, twin


def test_extensions_dir_fix_writes_the_activate_script(tmp_path, run_one):
    # break (default folder in an NFS home), fix (--fix's activate-extensions-dir), re-check
    home = tmp_path / "home"
    home.mkdir()
    prefix = fake_prefix(tmp_path)
    (prefix / "activate").write_text("# dsenv environment test\nexport DSENV_ENV=x\n")
    root = fake_mounts(tmp_path, f"90 27 0:50 / {home} rw - nfs4 fs:/home rw,vers=4.2")
    broken = run_one("deepspeed.extensions-dir", make(tmp_path, root=root, prefix=prefix))
    assert broken.status == Status.WARN, broken
    action = broken.action
    assert action.kind == "activate-extensions-dir" and action.applicable, action
    assert action.variables == (("TORCH_EXTENSIONS_DIR", str(prefix / "torch_extensions")),)
    ctx = make(tmp_path, root=root, prefix=prefix)
    assert "wrote the activate-extensions-dir block" in fixes.apply(action, ctx, broken.id)
    env, _note = fixes.recheck_env(action, ctx)
    assert env["TORCH_EXTENSIONS_DIR"] == str(prefix / "torch_extensions")
    again = run_one("deepspeed.extensions-dir", make(tmp_path, env, root=root, prefix=prefix))
    assert again.status == Status.OK, again


def test_extensions_dir_skips_without_torch(tmp_path, run_one):
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    empty = tmp_path / "bare" / "lib" / python / "site-packages"
    empty.mkdir(parents=True)
    found = run_one("deepspeed.extensions-dir", make(tmp_path, prefix=tmp_path / "bare"))
    # skipped for the one reason that holds here: the environment has no torch to JIT-build
    # with (dsenv's own interpreter has one, and must not be the one judged)
    assert found.status == Status.SKIP, found
    assert found.summary == "torch is not installed: nothing is JIT-built", \
        found


# -- toolkit.ninja ----------------------------------------------------------------------------


def test_ninja_installed_but_not_on_path(tmp_path):
    installed = Path(sys.prefix) / "bin" / "ninja"
    if not (HAS_TORCH and installed.is_file()):
        pytest.skip("needs torch and the ninja package in this interpreter's prefix")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    args = ("doctor", "--only", "toolkit", "--env", sys.prefix, "--json")
    broken = result(doctor_json(dsenv(*args, env={"PATH": str(empty)})), "toolkit.ninja")
    assert broken["status"] == "fail" and "not on the job's PATH" in broken["summary"], broken
    assert here(broken).startswith(f"export PATH={installed.parent}:$PATH")
    fixed = result(doctor_json(dsenv(*args, env={"PATH": f"{installed.parent}:{empty}"})),
                   "toolkit.ninja")
    assert fixed["status"] == "ok" and str(installed) in fixed["summary"], fixed


def test_ninja_that_does_not_run_fails_working_one_is_ok(tmp_path, fake_bin, run_one):
    prefix = fake_prefix(tmp_path)
    bindir = fake_bin("ninja", "echo 'ninja: error while loading shared libraries' >&2; exit 127\n")
    found = run_one("toolkit.ninja", make(tmp_path, {"PATH": str(bindir)}, prefix=prefix))
    assert found.status == Status.FAIL and "does not run" in found.summary, found
    bindir = fake_bin("ninja", "echo 1.11.1\n")
    twin = run_one("toolkit.ninja", make(tmp_path, {"PATH": str(bindir)}, prefix=prefix))
    assert twin.status == Status.OK and twin.summary.startswith("ninja 1.11.1"), twin


def test_no_ninja_anywhere_warns(tmp_path, run_one):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    found = run_one("toolkit.ninja",
                    make(tmp_path, {"PATH": str(empty)}, prefix=fake_prefix(tmp_path)))
    assert found.status == Status.WARN and here(found).endswith("-m pip install ninja"), found


# -- torch.library-path -----------------------------------------------------------------------

WHEEL_C = "int cublasLtGetStatusString(void) { return 12; }\nint cublasCreate_v2(void) { return 0; }\n"
OLD_C = "int cublasCreate_v2(void) { return 0; }\n"  # an older cuBLAS: no cublasLtGetStatusString
TORCH_C = "extern int cublasLtGetStatusString(void);\nint torch_probe(void) { return cublasLtGetStatusString(); }\n"


def _cc(tmp_path, source: str, out: Path, *flags: str) -> None:
    src = tmp_path / f"{out.name}.c"
    src.write_text(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, timeout=120)


@pytest.fixture
def cuda_wheel_env(tmp_path):
    """A venv whose 'torch' loads libtorch_cuda.so, which needs libcublas.so.12 from the
    nvidia-cublas-cu12 wheel through a RUNPATH, as torch's pip wheels do."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    wheel_lib = site / "nvidia" / "cublas" / "lib" / "libcublas.so.12"
    _cc(tmp_path, WHEEL_C, wheel_lib, "-Wl,-soname,libcublas.so.12")
    dist = site / "nvidia_cublas_cu12-12.4.5.8.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cublas-cu12\n"
                                   "Version: 12.4.5.8\n")
    (dist / "RECORD").write_text("nvidia/cublas/lib/libcublas.so.12,,\n")
    torch = site / "torch"
    _cc(tmp_path, TORCH_C, torch / "lib" / "libtorch_cuda.so", f"-L{wheel_lib.parent}",
        "-l:libcublas.so.12", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/cublas/lib")
    (torch / "version.py").write_text("__version__ = '2.5.1+cu124'\ncuda = '12.4'\nhip = None\n")
    (torch / "__init__.py").write_text(
        "import ctypes, os\n"
        "ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libtorch_cuda.so'))\n")
    return venv, wheel_lib


def _system_cublas(tmp_path, version: str, source: str | None, wheel_lib: Path) -> Path:
    """A CUDA module's lib64: libcublas.so.12 -> libcublas.so.<version>."""
    lib64 = tmp_path / f"cuda-{version}" / "lib64"
    real = lib64 / f"libcublas.so.{version}"
    if source is None:
        lib64.mkdir(parents=True)
        shutil.copy(wheel_lib, real)
    else:
        _cc(tmp_path, source, real, "-Wl,-soname,libcublas.so.12")
    (lib64 / "libcublas.so.12").symlink_to(real.name)
    return lib64


def test_older_cublas_on_ld_library_path_breaks_import(tmp_path, cuda_wheel_env, run_one):
    venv, wheel_lib = cuda_wheel_env
    lib64 = _system_cublas(tmp_path, "12.1.3.1", OLD_C, wheel_lib)
    other = tmp_path / "other-lib"
    other.mkdir()
    env = {"LD_LIBRARY_PATH": f"{lib64}:{other}"}
    found = run_one("torch.library-path", make(tmp_path, env, prefix=venv))
    assert found.status == Status.FAIL, found
    assert "undefined symbol: cublasLtGetStatusString" in found.summary
    assert "12.1.3.1" in found.evidence[0] and "12.4.5.8" in found.evidence[0]
    assert here(found) == f"export LD_LIBRARY_PATH={other}"
    # the fix, then the check again
    fixed = run_one("torch.library-path", make(tmp_path, {"LD_LIBRARY_PATH": str(other)},
                                                prefix=venv))
    assert fixed.status == Status.OK, fixed


def test_cli_reports_the_import_error(tmp_path, cuda_wheel_env):
    venv, wheel_lib = cuda_wheel_env
    lib64 = _system_cublas(tmp_path, "12.1.3.1", OLD_C, wheel_lib)
    done = dsenv("doctor", "--only", "torch", "--env", venv, "--json",
                 env={"LD_LIBRARY_PATH": str(lib64)})
    found = result(doctor_json(done), "torch.library-path")
    assert found["status"] == "fail" and "undefined symbol" in found["summary"], found
    assert here(found) == "unset LD_LIBRARY_PATH"


def test_other_cublas_that_loads_is_still_taken_first(tmp_path, cuda_wheel_env, run_one):
    venv, wheel_lib = cuda_wheel_env
    lib64 = _system_cublas(tmp_path, "12.6.4.1", WHEEL_C, wheel_lib)
    found = run_one("torch.library-path",
                    make(tmp_path, {"LD_LIBRARY_PATH": str(lib64)}, prefix=venv))
    assert found.status == Status.FAIL, found
    assert "torch loads libcublas.so.12.6.4.1 from LD_LIBRARY_PATH" in found.summary
    assert any(e.startswith("mapped by `import torch`: ") for e in found.evidence)


def test_same_version_copy_is_only_noted(tmp_path, cuda_wheel_env, run_one):
    venv, wheel_lib = cuda_wheel_env
    lib64 = _system_cublas(tmp_path, "12.4.5.8", None, wheel_lib)
    found = run_one("torch.library-path",
                    make(tmp_path, {"LD_LIBRARY_PATH": str(lib64)}, prefix=venv))
    assert found.status == Status.INFO and "same versions" in found.summary, found


def test_cpu_torch_and_no_wheel_libraries_skip(tmp_path, run_one):
    cpu = fake_prefix(tmp_path, "cpu", "2.5.1+cpu", None)
    assert run_one("torch.library-path", make(tmp_path, prefix=cpu)).status == Status.SKIP
    conda = fake_prefix(tmp_path, "conda")  # a CUDA torch without nvidia/*/lib next to it
    found = run_one("torch.library-path", make(tmp_path, prefix=conda))
    assert found.status == Status.SKIP and "nvidia-* wheels" in found.summary

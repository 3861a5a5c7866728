"""deepspeed area: the real pure-Python install here, a recorded build against another torch,
no compiler, the JIT cache, DeepSpeed's own op compatibility (one real subprocess, cached)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest

from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python import deepspeed_info as dsi
from dsenv.facts.python.torch_info import read_torch_build, torch_build
from dsenv.verdicts.findings import Status
from tests.harness.recorded import FIXTURES

PYDIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
REAL_TORCH = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
GPUS_KEY = visible_gpus.memo_key
V100 = Gpu("nvidia", 0, "Tesla V100-SXM2-16GB", "7.0", 16160)


def seed_compat(ctx, accelerator="cpu"):
    """Skip the 2-5 s subprocess: DeepSpeed's answer as this machine gives it."""
    ops = ("deepspeed_not_implemented", "async_io", "deepspeed_ccl_comm", "deepspeed_shm_comm",
           "cpu_adagrad", "cpu_adam", "cpu_lion", "fused_adam", "pin_memory")
    ctx.memo("dsenv.facts.python.deepspeed_info.op_compatibility",
             lambda: dsi.Compatibility(dict.fromkeys(ops, True), accelerator, True))
    return ctx


def seed_gpus(ctx, gpus):
    ctx.memo(GPUS_KEY, lambda: list(gpus))
    return ctx


def fake_site(tmp_path, info_file=FIXTURES / "deepspeed" / "git_version_info_installed.py"):
    """A prefix whose site-packages holds this machine's real torch/version.py and a
    deepspeed package with a recorded git_version_info_installed.py."""
    site = tmp_path / "env" / "lib" / PYDIR / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    shutil.copy(REAL_TORCH / "version.py", site / "torch" / "version.py")
    (site / "deepspeed").mkdir()
    (site / "deepspeed" / "__init__.py").write_text("")
    shutil.copy(info_file, site / "deepspeed" / "git_version_info_installed.py")
    meta = site / "deepspeed-0.19.8.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
    return tmp_path / "env"


def with_prefix(ctx, prefix):
    ctx.python_prefix = prefix
    return ctx


def test_read_assignments_of_real_install():
    ds, torch = dsi.read_deepspeed(sys.path), read_torch_build(sys.path)
    assert ds.version.startswith("0.") and ds.info_file is not None
    assert ds.precompiled == []  # the sdist built a pure-Python wheel here
    assert "cpu_adam" in ds.installed_ops
    assert torch.kind == "cpu" and torch.version.startswith("2.") and not torch.gpu_build
    assert torch.version_file == REAL_TORCH / "version.py"


def test_installs_reads_torch_from_the_fake_site(tmp_path, make_ctx):
    ctx = with_prefix(make_ctx(), fake_site(tmp_path))
    ds, torch = dsi.installs(ctx)
    site = tmp_path / "env" / "lib" / PYDIR / "site-packages"
    assert ds.version == "0.19.8" and ds.folder == site / "deepspeed"
    assert torch.location == str(site / "torch") and torch.kind == "cpu"
    assert torch == torch_build(ctx)  # the one reading every area shares


def test_install_real_is_ok(make_ctx, run_one):
    result = run_one("deepspeed.install", make_ctx())
    assert result.status == Status.OK
    assert "no ops precompiled" in result.summary and "CPU-only" in result.summary


def test_install_ops_built_against_other_torch_fails(tmp_path, make_ctx, run_one):
    ctx = with_prefix(make_ctx(), fake_site(tmp_path))
    result = run_one("deepspeed.install", ctx)
    assert result.status == Status.FAIL
    assert "torch 2.3, CUDA 12.1" in result.summary
    assert any("ops built against torch 2.3, installed torch is 2.13" in e for e in result.evidence)
    assert "--no-build-isolation" in result.fix and "DS_BUILD_" in result.fix
    ops = run_one("deepspeed.ops", ctx)
    assert ops.status == Status.SKIP and "deepspeed.install" in ops.summary


def test_not_installed_fails_on_login_and_compute(tmp_path, make_ctx, run_one):
    """The job's `import deepspeed` fails: not ready on either target (issue 24)."""
    (tmp_path / "empty" / "lib" / PYDIR / "site-packages").mkdir(parents=True)
    login = with_prefix(make_ctx(), tmp_path / "empty")
    compute = with_prefix(make_ctx(target="compute"), tmp_path / "empty")
    on_login = run_one("deepspeed.install", login)
    assert on_login.status == Status.FAIL and "dsenv doctor --env PREFIX" in on_login.fix
    assert run_one("deepspeed.install", compute).status == Status.FAIL
    assert run_one("deepspeed.ops", login).status == Status.SKIP


def test_ops_compatibility_asked_with_verbose_then_cached(tmp_path, make_ctx, run_one):
    had_torch = "torch" in sys.modules  # earlier tests in the same run may have imported it
    env = {"PATH": shutil.os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "DSENV_CACHE_DIR": str(tmp_path / "dsenv-cache")}
    first = make_ctx(env=env, probe_timeout=60, verbose=True, environment=sys.executable)
    compat = dsi.op_compatibility(first)
    assert compat.error is None and not compat.from_cache and compat.source == "builders"
    assert compat.accelerator == "cpu" and compat.compatible["cpu_adam"] is True
    assert (tmp_path / "dsenv-cache" / dsi.CACHE_FILE).is_file()

    result = run_one("deepspeed.ops", first)
    # pure-Python deepspeed, nothing precompiled, gcc + ninja here, empty JIT cache: warn
    assert result.status == Status.WARN, result
    assert "deepspeed_shm_comm (~90 s)" in result.summary and "fused_adam" in result.summary
    assert "TORCH_EXTENSIONS_DIR" in result.fix
    assert any("asked DeepSpeed's op builders" in e for e in result.evidence)

    second = make_ctx(env=env, probe_timeout=60, environment=sys.executable)  # no --verbose
    start = time.monotonic()
    again = dsi.op_compatibility(second)
    assert again.from_cache and again.source == "cache" and again.compatible == compat.compatible
    assert time.monotonic() - start < 0.5
    assert ("torch" in sys.modules) == had_torch  # nothing imported torch in this process

    changed = make_ctx(env={**env, "DS_ACCELERATOR": "cpu"}, environment=sys.executable)
    assert dsi.fingerprint(changed, *dsi.installs(changed), sys.executable) != \
        dsi.fingerprint(second, *dsi.installs(second), sys.executable)


def test_ops_compatibility_cold_run_asks_nothing(tmp_path, make_ctx, run_one):
    # the first run after an install: no cache, no --verbose: DeepSpeed 0.19.8 records no
    # compatible_ops, so the op builders (which import torch) are not asked
    env = {"PATH": shutil.os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "DSENV_CACHE_DIR": str(tmp_path / "empty-cache")}
    ctx = make_ctx(env=env, environment=sys.executable)
    start = time.monotonic()
    compat = dsi.op_compatibility(ctx)
    assert compat.source == "not asked" and not compat.known and compat.error is None
    assert time.monotonic() - start < 1.0
    assert not (tmp_path / "empty-cache").exists()
    result = run_one("deepspeed.ops", ctx)
    assert result.status == Status.WARN and "fused_adam" in result.summary
    assert any("not asked" in e and "--verbose" in e for e in result.evidence)


def test_ops_compatibility_recorded_at_install_is_used(tmp_path, make_ctx, run_one):
    # DeepSpeed up to 0.14 writes compatible_ops into git_version_info_installed.py
    recorded = tmp_path / "git_version_info_installed.py"
    recorded.write_text(
        "version='0.14.0'\ngit_hash='unknown'\ngit_branch='unknown'\n"
        "installed_ops={'cpu_adam': False, 'fused_adam': False}\n"
        "compatible_ops={'cpu_adam': True, 'fused_adam': False, 'deepspeed_shm_comm': True}\n"
        "torch_info={'version': '0.0', 'bf16_support': False, 'cuda_version': '0.0', "
        "'nccl_version': '0.0', 'hip_version': '0.0'}\n")
    ctx = with_prefix(make_ctx(env={"PATH": shutil.os.environ["PATH"],
                                    "HOME": str(tmp_path / "home")}),
                      fake_site(tmp_path, info_file=recorded))
    compat = dsi.op_compatibility(ctx)
    assert compat.source == "recorded" and compat.compatible["fused_adam"] is False
    result = run_one("deepspeed.ops", ctx)
    assert result.status == Status.FAIL  # fused_adam: not precompiled and not compatible
    assert "fused_adam not precompiled and not compatible here" in result.summary
    assert any("recorded by DeepSpeed at install" in e for e in result.evidence)


def test_ops_no_compiler_fails(tmp_path, make_ctx, run_one):
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    ctx = seed_compat(make_ctx(env={"PATH": str(empty), "HOME": str(tmp_path / "home")}))
    result = run_one("deepspeed.ops", ctx)
    assert result.status == Status.FAIL
    assert "the first fused op will fail to JIT-compile" in result.summary
    assert "C++ compiler" in result.summary and "ninja" in result.summary
    assert result.fix.startswith("precompile the ops: `dsenv provision --arch cpu`")


def test_ops_already_in_jit_cache_ok(tmp_path, make_ctx, run_one):
    cache = tmp_path / "shared" / "torch_extensions"
    for op in ("deepspeed_shm_comm", "fused_adam"):
        (cache / op).mkdir(parents=True)
        (cache / op / f"{op}.so").write_bytes(b"\x7fELF")
    env = {"PATH": shutil.os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "TORCH_EXTENSIONS_DIR": str(cache)}
    result = run_one("deepspeed.ops", seed_compat(make_ctx(env=env)))
    assert result.status == Status.OK and str(cache) in result.summary


def test_default_jit_root_matches_torch_layout(tmp_path, make_ctx):
    ctx = make_ctx(env={"HOME": str(tmp_path)})
    _, torch = dsi.installs(ctx)
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    assert dsi.jit_build_root(ctx, torch) == tmp_path / ".cache" / "torch_extensions" / f"{py}_cpu"


def test_accelerator_cpu_node_info(make_ctx, run_one):
    result = run_one("deepspeed.accelerator", seed_gpus(make_ctx(), []))
    assert result.status == Status.INFO
    assert "Setting accelerator to CPU" in result.summary and "DS_ACCELERATOR=cpu" in result.summary


def cuda_torch_site(tmp_path):
    """fake_site with a CUDA build of torch (version.py says cuda = '12.1')."""
    prefix = fake_site(tmp_path)
    version = prefix / "lib" / PYDIR / "site-packages" / "torch" / "version.py"
    version.write_text("__version__ = '2.3.0+cu121'\ncuda = '12.1'\nhip = None\n")
    return prefix


@pytest.mark.parametrize("target,status", [("login", Status.INFO), ("compute", Status.WARN)])
def test_accelerator_cuda_torch_without_gpu_names_no_gpu_at_build(tmp_path, make_ctx, run_one,
                                                                  target, status):
    """DeepSpeed picks cpu where a CUDA torch sees no GPU: ops built there are the CPU
    accelerator's (DeepSpeed#5553): the finding carries the catalogue's fix."""
    ctx = seed_gpus(with_prefix(make_ctx(target=target), cuda_torch_site(tmp_path)), [])
    result = run_one("deepspeed.accelerator", ctx)
    assert (result.status, result.mode) == (status, "deepspeed.no-gpu-at-build")
    assert "CUDA 12.1" in result.summary and "DS_ACCELERATOR=cuda" in result.fix


def test_accelerator_cuda_torch_with_gpu_is_ok(tmp_path, make_ctx, run_one):
    ctx = seed_gpus(with_prefix(make_ctx(), cuda_torch_site(tmp_path)), [V100])
    result = run_one("deepspeed.accelerator", ctx)
    assert result.status == Status.OK and not result.mode


def test_accelerator_explicit_cpu_ok(make_ctx, run_one):
    env = {"PATH": "/usr/bin", "DS_ACCELERATOR": "cpu"}
    ctx = make_ctx(env=env, environment=sys.executable)  # not /usr/bin's python3
    assert run_one("deepspeed.accelerator", seed_gpus(ctx, [])).status == Status.OK


def test_accelerator_unknown_name_fails(make_ctx, run_one):
    result = run_one("deepspeed.accelerator", make_ctx(env={"DS_ACCELERATOR": "gpu"},
                                                       environment=sys.executable))
    assert result.status == Status.FAIL and "cuda" in result.evidence[0]  # DeepSpeed's own list


def test_accelerator_gpus_with_cpu_torch_fails_on_compute(make_ctx, run_one):
    result = run_one("deepspeed.accelerator",
                     seed_gpus(make_ctx(target="compute"), [V100, V100]))
    assert result.status == Status.FAIL
    assert "2 GPU(s) visible but torch 2.13" in result.summary


def test_accelerator_cuda_forced_with_cpu_torch_fails(make_ctx, run_one):
    ctx = seed_gpus(make_ctx(env={"DS_ACCELERATOR": "cuda"}, environment=sys.executable), [V100])
    result = run_one("deepspeed.accelerator", ctx)
    assert result.status == Status.FAIL and "CPU-only" in result.summary

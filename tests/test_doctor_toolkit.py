"""toolkit area: nvcc/hipcc versions against torch, CUDA_HOME, compiler and ninja, archs."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.facts.toolchain import toolkit as tk
from dsenv.verdicts.findings import Status
from tests.harness import pyenvs
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

VISIBLE = visible_gpus.memo_key
BUILD = "dsenv.facts.python.torch_info.torch_build"
CU124 = TorchBuild("2.4.1+cu124", cuda="12.4", location="/site/torch")
CPU = TorchBuild("2.13.0+cpu", location="/site/torch")
REAL_NVCC = sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))
needs_real_nvcc = pytest.mark.skipif(not REAL_NVCC, reason="no CUDA toolkit in /usr/local/cuda*")


def v100():
    return Gpu("nvidia", 0, "Tesla V100-SXM2-32GB", "7.0", driver="550.54.14")


@pytest.fixture
def ctx_with(make_ctx, fake_bin, tmp_path):
    """Context with fake tools printing recorded outputs, seeded torch build and GPUs."""

    def build(tools=None, torch=CU124, gpus=(), target="compute", **env):
        folder = tmp_path / "empty-bin"
        folder.mkdir(exist_ok=True)
        for name, fixture in (tools or {}).items():
            out = tmp_path / f"{name}.out"
            out.write_text(fixture_text(fixture))
            folder = fake_bin(name, f"/bin/cat '{out}'\n")
        ctx = make_ctx(env={"PATH": f"{folder}:/nonexistent", **env}, target=target,
                       root=tmp_path / "root")
        if torch is not None:
            ctx.memo(BUILD, lambda: torch)
        ctx.memo(VISIBLE, lambda: list(gpus))
        return ctx

    return build


# -- parsers and the toolkit table ---------------------------------------------------------
@pytest.mark.parametrize("fixture,version", [
    ("nvcc_11.1.txt", "11.1.105"), ("nvcc_11.3.txt", "11.3.109"), ("nvcc_11.8.txt", "11.8.89"),
    ("nvcc_12.4.txt", "12.4.131"), ("nvcc_13.0.txt", "13.0.88"),
])
def test_parse_nvcc_version(fixture, version):
    assert tk.parse_nvcc_version(fixture_text(f"gpu/{fixture}")) == version


def test_parse_hip_version():
    assert tk.parse_hip_version(fixture_text("gpu/hipconfig_3.10.txt")) == "3.10.20465"


def test_parse_compiler_version_line():
    assert tk.parse_first_version("g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright") == "12.2.0"


@pytest.mark.parametrize("cuda,row,min_arch,max_arch", [
    ("12.4.131", "12.4", "5.0", "9.0"), ("12.7", "12.6", "5.0", "9.0"),
    ("11.8", "11.8", "3.5", "9.0"), ("13.0.88", "13.0", "7.5", "12.1"),
])
def test_toolkit_rows(cuda, row, min_arch, max_arch):
    found = tk.toolkit_row(cuda)
    assert (found.version, found.min_arch, found.max_arch) == (row, min_arch, max_arch)


def test_unknown_toolkit_has_no_row():
    assert tk.toolkit_row("10.2") is None


def test_cuda_13_cannot_build_volta_but_12_can():
    assert not tk.can_build(tk.toolkit_row("13.0"), "7.0")
    assert tk.can_build(tk.toolkit_row("12.9"), "7.0")
    assert tk.toolkits_for("3.7")[-1] == "11.8"  # K80: CUDA 11 is the last that builds for it


@pytest.mark.parametrize("value,archs,unknown", [
    ("7.0;8.0+PTX", ["7.0", "8.0"], []),
    ("3.7", ["3.7"], []),
    ("Volta Ampere", ["7.0", "8.0", "8.6"], []),
    ("Ada", ["8.9"], []),
    ("8.0 banana", ["8.0"], ["banana"]),
])
def test_parse_torch_cuda_arch_list(value, archs, unknown):
    assert tk.parse_arch_list(value) == (archs, unknown)


# -- the real nvcc on this machine -----------------------------------------------------------
@needs_real_nvcc
def test_real_nvcc_is_found_through_cuda_home(make_ctx):
    home = str(Path(REAL_NVCC[0]).parent.parent)
    tool = tk.nvcc(make_ctx(env={"PATH": "/nonexistent", "CUDA_HOME": home}))
    assert tool.found and tool.major is not None and tool.how == f"CUDA_HOME={home}"


@needs_real_nvcc
def test_real_nvcc_13_cannot_build_arch_list_7_0(make_ctx, run_one):
    home = str(Path(REAL_NVCC[0]).parent.parent)
    ctx = make_ctx(env={"PATH": "/nonexistent", "CUDA_HOME": home,
                        "TORCH_CUDA_ARCH_LIST": "7.0;8.0"}, target="compute")
    result = run_one("toolkit.arch-support", ctx)
    if tk.nvcc(ctx).major != 13:
        pytest.skip(f"the toolkit here is not CUDA 13 ({tk.nvcc(ctx).version})")
    assert result.status is Status.FAIL and "cannot build 7.0" in result.summary
    assert "CUDA 12.x toolkit" in here(result) and "drop it from TORCH_CUDA_ARCH_LIST" in here(result)
    fine = make_ctx(env={"PATH": "/nonexistent", "CUDA_HOME": home,
                         "TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX"})
    assert run_one("toolkit.arch-support", fine).status is Status.OK


@needs_real_nvcc
def test_real_nvcc_against_real_cpu_torch_is_info(make_ctx, run_one):
    home = str(Path(REAL_NVCC[0]).parent.parent)
    result = run_one("toolkit.nvcc", make_ctx(env={"PATH": "/nonexistent", "CUDA_HOME": home}))
    assert result.status is Status.INFO and "CPU build" in result.summary


@needs_real_nvcc
def test_real_nvcc_13_against_a_cuda_12_torch_fails(make_ctx, run_one):
    home = str(Path(REAL_NVCC[0]).parent.parent)
    ctx = make_ctx(env={"PATH": "/nonexistent", "CUDA_HOME": home}, target="compute")
    ctx.memo(BUILD, lambda: CU124)
    if tk.nvcc(ctx).major == 12:
        pytest.skip("the toolkit here is CUDA 12")
    result = run_one("toolkit.nvcc", ctx)
    assert result.status is Status.FAIL and "module load cuda/12.4" in here(result)


# -- checks on recorded outputs ----------------------------------------------------------------
def test_nvcc_matching_major(ctx_with, run_one):
    result = run_one("toolkit.nvcc", ctx_with({"nvcc": "gpu/nvcc_12.4.txt"}))
    assert result.status is Status.OK and "nvcc 12.4.131" in result.summary


def test_nvcc_major_mismatch(ctx_with, run_one):
    result = run_one("toolkit.nvcc", ctx_with({"nvcc": "gpu/nvcc_11.8.txt"}))
    assert result.status is Status.FAIL and "majors differ" in result.summary


def test_nvcc_missing(ctx_with, run_one):
    assert run_one("toolkit.nvcc", ctx_with()).status is Status.FAIL
    assert run_one("toolkit.nvcc", ctx_with(target="login")).status is Status.WARN
    assert run_one("toolkit.nvcc", ctx_with(torch=TorchBuild(None))).status is Status.SKIP


def test_hipcc_against_a_rocm_torch(ctx_with, run_one):
    rocm = TorchBuild("2.3.1+rocm5.7", hip="5.7.31921", location="/site/torch")
    result = run_one("toolkit.hipcc", ctx_with({"hipcc": "gpu/hipconfig_3.10.txt"}, torch=rocm))
    assert result.status is Status.FAIL and "module load rocm/5.7.31921" in result.fix
    old = TorchBuild("1.8.0+rocm3.10", hip="3.10.20465", location="/site/torch")
    assert run_one("toolkit.hipcc", ctx_with({"hipcc": "gpu/hipconfig_3.10.txt"},
                                             torch=old)).status is Status.OK
    assert run_one("toolkit.hipcc", ctx_with()).status is Status.SKIP  # CUDA torch


def test_cuda_home(ctx_with, run_one, tmp_path):
    broken = run_one("toolkit.cuda-home", ctx_with(CUDA_HOME=str(tmp_path / "cuda-12.4")))
    assert broken.status is Status.FAIL and "no bin/nvcc" in broken.summary
    found = run_one("toolkit.cuda-home", ctx_with({"nvcc": "gpu/nvcc_12.4.txt"}))
    assert found.status is Status.OK and "torch will use" in found.summary
    assert run_one("toolkit.cuda-home", ctx_with(target="login")).status is Status.WARN
    assert run_one("toolkit.cuda-home", ctx_with(torch=CPU)).status is Status.SKIP


@needs_real_nvcc
def test_cuda_home_pointing_at_a_real_toolkit(ctx_with, run_one):
    home = str(Path(REAL_NVCC[0]).parent.parent)
    assert run_one("toolkit.cuda-home", ctx_with(CUDA_HOME=home)).status is Status.OK


def test_compiler_and_ninja_on_this_machine(make_ctx, run_one):
    result = run_one("toolkit.compiler", make_ctx())
    assert result.status is Status.OK and "ninja" in result.summary


def test_compiler_missing(ctx_with, run_one):
    result = run_one("toolkit.compiler", ctx_with())
    assert result.status is Status.FAIL and "no C++ compiler" in result.summary
    assert run_one("toolkit.compiler", ctx_with(target="login")).status is Status.WARN


def test_ninja_package_without_its_binary_on_path(ctx_with, run_one):
    gxx = "/usr/bin/g++" if os.path.exists("/usr/bin/g++") else None
    if gxx is None or tk.ninja(ctx_with()).version is None:
        pytest.skip("needs g++ and the ninja Python package")
    result = run_one("toolkit.compiler", ctx_with(CXX=gxx))
    assert result.status is Status.FAIL and "binary is not on PATH" in result.summary


def test_arch_support_against_visible_gpus(ctx_with, run_one):
    blocked = run_one("toolkit.arch-support", ctx_with({"nvcc": "gpu/nvcc_13.0.txt"},
                                                       gpus=[v100()]))
    assert blocked.status is Status.FAIL and "visible GPU Tesla V100" in blocked.summary
    assert "module load cuda/12.9" in here(blocked)
    fine = run_one("toolkit.arch-support", ctx_with({"nvcc": "gpu/nvcc_12.4.txt"}, gpus=[v100()]))
    assert fine.status is Status.OK and "7.0" in fine.summary


def test_k80_needs_cuda_11(ctx_with, run_one):
    k80 = Gpu("nvidia", 0, "Tesla K80", "3.7")
    result = run_one("toolkit.arch-support", ctx_with({"nvcc": "gpu/nvcc_12.4.txt"}, gpus=[k80]))
    assert result.status is Status.FAIL and "cuda/11.8" in here(result)
    assert run_one("toolkit.arch-support",
                   ctx_with({"nvcc": "gpu/nvcc_11.3.txt"}, gpus=[k80])).status is Status.OK


def test_arch_support_rejects_garbage_arch_list(ctx_with, run_one):
    result = run_one("toolkit.arch-support",
                     ctx_with({"nvcc": "gpu/nvcc_12.4.txt"}, TORCH_CUDA_ARCH_LIST="8.0;sm80x"))
    assert result.status is Status.FAIL and "sm80x" in result.summary


def test_arch_support_skips_without_nvcc(ctx_with, run_one):
    assert run_one("toolkit.arch-support", ctx_with()).status is Status.SKIP


# -- ninja follows the environment under test -----------------------------------------------
def test_ninja_package_is_looked_for_in_the_judged_environment(tmp_path, make_ctx, run_one):
    cxx = "/usr/bin/c++"
    if not os.path.exists(cxx):
        pytest.skip("needs a C++ compiler at /usr/bin/c++")
    bindir = tmp_path / "tools"  # a compiler on PATH, no ninja binary
    bindir.mkdir()
    (bindir / "c++").symlink_to(cxx)
    venv = pyenvs.make_venv(tmp_path / "venv")
    env = {"PATH": str(bindir), "HOME": str(tmp_path)}

    def judged():
        return run_one("toolkit.compiler", make_ctx(env=env, environment=str(venv),
                                                    target="compute"))

    result = judged()  # dsenv's own environment has the ninja package: that does not count
    assert result.status is Status.FAIL and "ninja is missing" in result.summary

    wheels = tmp_path / "wheels"
    pyenvs.build_wheel(wheels, "ninja", "1.11.1.4", {
        "ninja/__init__.py": "",
        "ninja/data/bin/ninja": "#!/bin/sh\necho 1.11.1\n"})
    pyenvs.uv_install(wheels, "ninja==1.11.1.4", python=venv / "bin" / "python")
    result = judged()
    assert result.status is Status.FAIL
    assert "ninja is installed as a Python package but its binary is not on PATH" in result.summary
    assert any("python package ninja 1.11.1.4" in e and str(venv) in e for e in result.evidence)

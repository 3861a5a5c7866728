"""torch.rocblas-kernels: the Tensile files in the folder rocBLAS will read, against each AMD
GPU's gfx target (issue 23: "Cannot read .../TensileLibrary.dat" before the job, not in it).

The library folder is laid out from a listing rocBLAS printed on a real ROCm 6 install
(tests/fixtures/gpu/rocblas_library_listing_rocm6.txt: 13 targets, no gfx1201): an MI210's
gfx90a is there (the healthy twin), an RX 9070's gfx1201 is not (a build without the target),
HSA_OVERRIDE_GFX_VERSION changes the target looked up, an empty or missing folder is the files
not being where rocBLAS looks, and a CUDA torch, no AMD GPU or no librocblas at all is a skip
with its reason.
"""

from __future__ import annotations

import re

import pytest

from dsenv.facts.gpu import rocblas
from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.verdicts.findings import Status
from tests.harness.recorded import fixture_text

LISTED = [re.search(r'/([^/"]+)"$', line).group(1)
          for line in fixture_text("gpu/rocblas_library_listing_rocm6.txt").splitlines()
          if line.strip()]
MI210 = Gpu("amd", 0, "AMD Instinct MI210", "gfx90a")
RX9070 = Gpu("amd", 0, "AMD Radeon RX 9070 XT", "gfx1201")
A100 = Gpu("nvidia", 0, "NVIDIA A100-SXM4-80GB", "8.0", 81920, "550.54.14")


def rocm_torch(tmp_path, files=LISTED, own_rocblas=True, folder=True):
    """A torch ROCm wheel's layout: torch/lib/librocblas.so and torch/lib/rocblas/library."""
    torch = tmp_path / "site" / "torch"
    (torch / "lib").mkdir(parents=True)
    if own_rocblas:
        (torch / "lib" / "librocblas.so.4").write_bytes(b"\x7fELF")
        if folder:
            library = torch / "lib" / "rocblas" / "library"
            library.mkdir(parents=True)
            for name in files:
                (library / name).write_bytes(b"")
    return TorchBuild("2.5.1+rocm6.2", hip="6.2.41133-dd7f95766", location=str(torch))


@pytest.fixture
def judged(make_ctx, run_one, tmp_path):
    def judge(gpus, torch, **env):
        ctx = make_ctx(env={"PATH": "/usr/bin:/bin", **env}, target="compute")
        ctx.memo(visible_gpus.memo_key, lambda: list(gpus))
        ctx.memo("dsenv.facts.python.torch_info.torch_build", lambda: torch)
        return run_one("torch.rocblas-kernels", ctx)
    return judge


def test_the_listing_parses_into_its_targets():
    assert len(LISTED) == 13
    folder_targets = sorted({rocblas.TARGET_FILE.match(n).group(1) for n in LISTED})
    assert "gfx90a" in folder_targets and "gfx942" in folder_targets
    assert "gfx1201" not in folder_targets


def test_a_gpu_whose_target_has_kernels_passes(judged, tmp_path):
    result = judged([MI210, MI210], rocm_torch(tmp_path))
    assert result.status is Status.OK, result
    assert "gfx90a" in result.summary and "2 GPU(s)" in result.summary
    assert "beside torch's own librocblas" in result.evidence[0]


def test_a_gpu_whose_target_has_none_fails_as_the_build(judged, tmp_path):
    result = judged([RX9070], rocm_torch(tmp_path))
    assert result.status is Status.FAIL and result.mode == "gpu.rocm-gfx-unsupported"
    assert "RX 9070 XT (gfx1201, the GPU's own)" in result.summary
    assert "Cannot read .../TensileLibrary.dat" in result.summary


def test_the_override_is_the_target_looked_up(judged, tmp_path):
    torch = rocm_torch(tmp_path)
    # a gfx1201 taken for gfx1100, which the folder has: passes; taken for gfx1200: fails
    assert judged([RX9070], torch, HSA_OVERRIDE_GFX_VERSION="11.0.0").status is Status.OK
    bad = judged([RX9070], torch, HSA_OVERRIDE_GFX_VERSION="12.0.0")
    assert bad.status is Status.FAIL and "gfx1200, HSA_OVERRIDE_GFX_VERSION=12.0.0" in bad.summary
    assert rocblas.target_of("gfx90a:sramecc+:xnack-", {}) == ("gfx90a", "the GPU's own")
    assert rocblas.target_of("gfx1030", {"HSA_OVERRIDE_GFX_VERSION": "9.0.10"})[0] == "gfx90a"


@pytest.mark.parametrize("files, folder, held", [
    ([], True, "holds no TensileLibrary files"),
    (LISTED, False, "does not exist"),
])
def test_files_not_where_rocblas_looks_fail_as_that(judged, tmp_path, files, folder, held):
    result = judged([MI210], rocm_torch(tmp_path, files=files, folder=folder))
    assert result.status is Status.FAIL and result.mode == "rocm.rocblas-tensile-files-missing"
    assert held in result.summary and "lib/rocblas/library" in result.summary


def test_rocblas_tensile_libpath_is_the_folder_read(judged, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = judged([MI210], rocm_torch(tmp_path), ROCBLAS_TENSILE_LIBPATH=str(elsewhere))
    assert result.status is Status.FAIL and result.mode == "rocm.rocblas-tensile-files-missing"
    assert f"{elsewhere} (ROCBLAS_TENSILE_LIBPATH)" in result.summary


def test_the_system_rocm_is_read_when_torch_has_no_rocblas(judged, tmp_path):
    rocm = tmp_path / "rocm"
    (rocm / "lib" / "rocblas" / "library").mkdir(parents=True)
    (rocm / "lib" / "librocblas.so.4").write_bytes(b"")
    for name in LISTED:
        (rocm / "lib" / "rocblas" / "library" / name).write_bytes(b"")
    torch = rocm_torch(tmp_path, own_rocblas=False)
    result = judged([MI210], torch, ROCM_PATH=str(rocm))
    assert result.status is Status.OK and f"beside {rocm}'s librocblas" in result.evidence[0]


def test_a_merged_library_is_not_compared(judged, tmp_path):
    result = judged([MI210], rocm_torch(tmp_path, files=["TensileLibrary.dat"]))
    assert result.status is Status.SKIP and "merged TensileLibrary.dat" in result.summary


@pytest.mark.parametrize("gpus, why", [
    ([A100], "rocBLAS is ROCm's"),  # a CUDA torch on an NVIDIA GPU
    ([], "no GPU visible"),
])
def test_nothing_to_judge_skips_with_the_reason(judged, tmp_path, gpus, why):
    torch = rocm_torch(tmp_path)
    if gpus == [A100]:
        torch = TorchBuild("2.11.0+cu126", cuda="12.6", location=torch.location)
    result = judged(gpus, torch)
    assert result.status is Status.SKIP and why in result.summary


def test_no_librocblas_anywhere_skips(judged, tmp_path):
    result = judged([MI210], rocm_torch(tmp_path, own_rocblas=False),
                    ROCM_PATH=str(tmp_path / "no-rocm"))
    assert result.status is Status.SKIP and "no librocblas" in result.summary


def test_a_stale_rocm_folder_on_ld_library_path_sends_rocblas_elsewhere(judged, tmp_path):
    """A torch linked against the system ROCm loads the first librocblas on LD_LIBRARY_PATH; an
    old layout's folder there (ROCm < 5.2's <rocm>/rocblas/lib) has no rocblas/library."""
    stale = tmp_path / "rocm" / "rocblas" / "lib"
    stale.mkdir(parents=True)
    (stale / "librocblas.so.0").write_bytes(b"")
    torch = rocm_torch(tmp_path, own_rocblas=False)
    result = judged([MI210], torch, LD_LIBRARY_PATH=str(stale))
    assert result.status is Status.FAIL and result.mode == "rocm.rocblas-tensile-files-missing"
    assert f"first librocblas on LD_LIBRARY_PATH ({stale})" in result.summary

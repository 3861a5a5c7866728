"""toolkit.arch-list: TORCH_CUDA_ARCH_LIST held against the GPUs nvidia-smi lists (issue 23).

The GPU inventory is a recorded nvidia-smi output, printed by a fake nvidia-smi on PATH; the
check runs nvidia-smi as on a real node. A list that leaves out a visible GPU fails with the
list that adds it; that list, exported as the fix says, passes.
"""

from __future__ import annotations

import re

import pytest

from dsenv.facts.toolchain.toolkit import arch_list_code
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import printing, tool
from tests.harness.findings import here

TITANV_ADA = "gpu/nvidia_smi_titanv_ada.csv"  # a TITAN V (7.0, a V100's arch) and an Ada (8.9)
H200 = "gpu/nvidia_smi_h200.csv"  # one H200 (9.0)
A100_OLD_DRIVER = "gpu/nvidia_smi_a100_470.csv"  # no compute_cap column: arch from the name


@pytest.fixture
def node(make_ctx, tmp_path):
    """node(recording, arch_list) -> a compute-node Context whose nvidia-smi prints RECORDING
    (None: no nvidia-smi at all) and whose TORCH_CUDA_ARCH_LIST is ARCH_LIST (None: unset)."""

    def build(recording, arch_list):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        if recording:
            tool(bin_dir, "nvidia-smi", printing(tmp_path / "data", recording) + "\n")
        env = {"PATH": str(bin_dir), "HOME": str(tmp_path / "home")}
        if arch_list is not None:
            env["TORCH_CUDA_ARCH_LIST"] = arch_list
        return make_ctx(env=env, target="compute")

    return build


def exported(fix: str) -> str:
    return re.search(r'export TORCH_CUDA_ARCH_LIST="([^"]+)"', fix).group(1)


def test_a_list_without_the_volta_gpus_arch_fails_and_its_fix_passes(node, run_one):
    result = run_one("toolkit.arch-list", node(TITANV_ADA, "8.0"))
    assert result.status is Status.FAIL, result
    assert "leaves out NVIDIA TITAN V (7.0)" in result.summary
    assert "no kernel image is available" in result.summary
    assert "Ada" not in result.summary  # sm_80 code runs on an 8.9 GPU (same major, newer minor)
    assert here(result).startswith("add the GPU's arch")
    fixed = exported(here(result))
    assert fixed == "7.0;8.0"
    twin = run_one("toolkit.arch-list", node(TITANV_ADA, fixed))
    assert twin.status is Status.OK, twin
    assert "covers the 2 visible GPU(s) (7.0, 8.9)" in twin.summary


def test_an_older_arch_does_not_run_on_a_newer_major(node, run_one):
    result = run_one("toolkit.arch-list", node(H200, "7.0;8.0"))
    assert result.status is Status.FAIL and "NVIDIA H200 (9.0)" in result.summary, result
    assert exported(here(result)) == "9.0;7.0;8.0"


@pytest.mark.parametrize("arch_list, how", [("9.0", "runs sm_90"), ("9.0a", "runs sm_90a"),
                                            ("Hopper", "runs sm_90"),
                                            ("8.0+PTX", "runs compute_80")])
def test_lists_that_cover_the_h200(node, run_one, arch_list, how):
    result = run_one("toolkit.arch-list", node(H200, arch_list))
    assert result.status is Status.OK, result
    assert any(how in line for line in result.evidence), result.evidence
    assert ("through PTX" in result.summary) == ("compute_" in how)


def test_an_arch_taken_from_the_gpus_name_on_an_old_driver(node, run_one):
    assert run_one("toolkit.arch-list", node(A100_OLD_DRIVER, "Volta")).status is Status.OK
    result = run_one("toolkit.arch-list", node(A100_OLD_DRIVER, "6.0 7.0"))
    assert result.status is Status.FAIL and "(8.0)" in result.summary, result


def test_no_gpu_visible_skips_with_the_reason(node, run_one):
    result = run_one("toolkit.arch-list", node(None, "8.0"))
    assert result.status is Status.SKIP
    assert result.summary.startswith("no NVIDIA GPU visible")


def test_an_unset_list_skips(node, run_one):
    result = run_one("toolkit.arch-list", node(TITANV_ADA, None))
    assert result.status is Status.SKIP and "not set" in result.summary


def test_the_list_is_read_as_torch_reads_it():
    assert arch_list_code("7.0;8.0+PTX") == (["sm_70", "sm_80", "compute_80"], [])
    assert arch_list_code("Ampere 9.0a") == (["sm_80", "sm_86", "compute_86", "sm_90a"], [])
    assert arch_list_code("8.0, sm_90") == (["sm_80"], ["sm_90"])

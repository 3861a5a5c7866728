"""TORCH_CUDA_ARCH_LIST as nvcc, torch and DeepSpeed read it: what `dsenv smoke|run` hand
DeepSpeed (or refuse) before the engine starts, and who the doctor's toolkit.arch-support
names as unable to use an entry.

torch and DeepSpeed are asked for real (the ones installed here: DeepSpeed 0.19.8, whose
compute_capability_args reads the list without a GPU), against the traceback a real H200
run recorded (tests/fixtures/deepspeed/h200_fused_adam_arch_list_9.0a.txt).
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsenv.doctor import catalogue
from dsenv.facts.gpu.inventory import visible_gpus
from dsenv.facts.python import deepspeed_info, target_env
from dsenv.facts.python.deepspeed_info import DeepSpeedInstall
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.facts.toolchain import arch_parsers, arch_readers
from dsenv.facts.toolchain import toolkit as tk
from dsenv.verdicts.findings import Status
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.training import opbuild
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

H200 = "deepspeed/h200_fused_adam_arch_list_9.0a.txt"
CU130 = TorchBuild("2.11.0+cu130", cuda="13.0", location="/site/torch")
DS_VERSION = md.version("deepspeed")
needs_0_19_8 = pytest.mark.skipif(DS_VERSION != "0.19.8",
                                  reason=f"recorded with DeepSpeed 0.19.8, here {DS_VERSION}")


def recorded_failure() -> tuple[str, int]:
    """(the error, builder.py's line) of the H200 run's traceback."""
    text = fixture_text(H200)
    error = re.findall(r"^\[rank0\]: (ValueError: .*)$", text, re.M)[-1]
    line = re.findall(r'op_builder/builder\.py", line (\d+), in compute_capability_args', text)
    return error, int(line[-1])


# -- asking torch and DeepSpeed (the code a run imports) --------------------------------------
@needs_0_19_8
def test_deepspeed_here_fails_on_9_0a_exactly_as_on_the_h200():
    error, line = recorded_failure()
    answer = arch_parsers.ask("9.0a")
    assert answer["deepspeed_error"] == error == "ValueError: invalid literal for int() with " \
                                                 "base 10: '0a'"
    assert answer["deepspeed_where"] == (f"deepspeed/ops/op_builder/builder.py:{line} "
                                         "(compute_capability_args)")
    assert answer["torch_error"] is None  # torch's extension builder takes 9.0a


@needs_0_19_8
def test_9_0a_is_handed_to_deepspeed_as_9_0_and_said_in_one_line():
    new, line = opbuild.plan_arch_list(arch_parsers.ask("9.0a"), "9.0")
    assert new == "9.0"
    assert arch_parsers.deepspeed_archs(new) == ("9.0+PTX", None, "")  # its JIT adds +PTX
    assert "\n" not in line and line.startswith("TORCH_CUDA_ARCH_LIST=9.0a: DeepSpeed 0.19.8's")
    assert "'0a'" in line and "hands them 9.0 (they build 9.0+PTX)" in line
    assert "sm_90a's arch-specific instructions" in line


def test_a_list_deepspeed_reads_is_left_alone():
    assert opbuild.plan_arch_list(arch_parsers.ask("9.0"), "9.0") == (None, "")


@needs_0_19_8
@pytest.mark.parametrize("value, handed", [
    ("10.0a", "10.0"), ("8.0;9.0a", "8.0;9.0"), ("8.0 9.0a+PTX", "8.0;9.0+PTX"),
    ("Hopper", "9.0+PTX"), ("9.0+PTX", None), ("8.0 9.0", None), ("8.0;9.0", None),
])
def test_every_form_torch_takes_is_handed_over_or_left_alone(value, handed):
    new, line = opbuild.plan_arch_list(arch_parsers.ask(value), "9.0")
    assert new == handed and bool(line) == bool(handed)
    if handed:
        assert arch_parsers.deepspeed_archs(handed)[1] is None


def test_a_form_torch_rejects_is_refused_naming_torch_and_the_fix():
    answer = arch_parsers.ask("12.0f")
    if answer["torch_error"] is None:  # a torch that knows family variants: handed over
        assert opbuild.plan_arch_list(answer, "12.0")[0] == "12.0"
        return
    with pytest.raises(WorkloadError) as refused:
        opbuild.plan_arch_list(answer, "12.0")
    message = str(refused.value)
    assert f"torch {answer['torch']}'s extension builder rejects 12.0f" in message
    assert 'export TORCH_CUDA_ARCH_LIST="12.0"' in message and refused.value.exit_code == 2


def test_the_run_changes_the_list_before_the_engine_starts(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    said: list[str] = []
    rt = SimpleNamespace(on_gpu=True, device="cuda:0", log=said.append)
    env = {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert opbuild.prepare_arch_list(rt, env)["deepspeed_builds"] == "9.0+PTX" and not said
    if DS_VERSION == "0.19.8":
        env = {"TORCH_CUDA_ARCH_LIST": "9.0a"}
        record = opbuild.prepare_arch_list(rt, env)
        assert env["TORCH_CUDA_ARCH_LIST"] == "9.0" == record["handed_to_deepspeed"]
        assert len(said) == 1 and "hands them 9.0" in said[0]
    with pytest.raises(WorkloadError, match=r"sm_90 \(ValueError: Unknown CUDA arch"):
        opbuild.prepare_arch_list(rt, {"TORCH_CUDA_ARCH_LIST": "sm_90"})
    cpu = SimpleNamespace(on_gpu=False, device="cpu", log=said.append)
    assert opbuild.prepare_arch_list(cpu, {"TORCH_CUDA_ARCH_LIST": "sm_90"}) is None


def test_explain_knows_the_recorded_traceback():
    assert "jit.arch-list-variant" in [m.id for m, _ in catalogue.explain(fixture_text(H200))]


def test_variants_count_as_their_gpu_arch_for_nvcc():
    assert tk.parse_arch_list("9.0a;10.0a+PTX 12.0f") == (["9.0", "10.0", "12.0"], [])


# -- the doctor: who cannot use an entry -------------------------------------------------------
@pytest.fixture
def arch_ctx(make_ctx, fake_bin, tmp_path):
    """toolkit.arch-support's context: nvcc 13.0.88 (recorded), no GPU, this list."""

    def build(value: str, deepspeed: DeepSpeedInstall | None | str = "real",
              env_python: str | None = "real"):
        out = tmp_path / "nvcc.out"
        out.write_text(fixture_text("gpu/nvcc_13.0.txt"))
        folder = fake_bin("nvcc", f"/bin/cat '{out}'\n")
        ctx = make_ctx(env={"PATH": f"{folder}:/nonexistent", "TORCH_CUDA_ARCH_LIST": value,
                            "DSENV_CACHE_DIR": str(tmp_path / "cache")}, target="compute")
        ctx.memo(visible_gpus.memo_key, lambda: [])
        if deepspeed != "real":
            ctx.memo(deepspeed_info.installs.memo_key, lambda: (deepspeed, CU130))
        if env_python is None:
            ctx.memo(target_env.environment.memo_key, lambda: target_env.PythonEnv(
                None, tmp_path / "env", "option", "--env", problem="no bin/python (seeded)"))
        return ctx

    return build


@needs_0_19_8
def test_doctor_names_deepspeeds_builder_for_9_0a_not_nvcc(arch_ctx, run_one):
    """Asked for real: DeepSpeed 0.19.8 and torch in dsenv's own interpreter."""
    result = run_one("toolkit.arch-support", arch_ctx("9.0a"))
    assert result.status is Status.FAIL, result
    assert result.summary.startswith("DeepSpeed 0.19.8's op builders cannot read 9.0a")
    assert "builder.py:710 (compute_capability_args)" in result.summary
    assert "and nvcc 13.0.88 can" in result.summary and "nvcc cannot" not in result.summary
    # the catalogue's fix, this node's specifics as "here:" lines (one fix per mode)
    assert result.fix == catalogue.fix_for("jit.arch-list-variant")
    assert "`dsenv smoke` and `dsenv run` hand DeepSpeed 9.0 instead" in here(result)
    assert 'export TORCH_CUDA_ARCH_LIST="9.0"' in here(result)
    assert any(line.startswith("asked torch") for line in result.evidence)


def test_doctor_falls_back_to_deepspeeds_parser_per_release(arch_ctx, run_one, tmp_path):
    ds = DeepSpeedInstall("0.19.8", tmp_path / "deepspeed")
    result = run_one("toolkit.arch-support", arch_ctx("8.0;9.0a", ds, env_python=None))
    assert result.status is Status.FAIL
    assert result.summary.startswith("DeepSpeed 0.19.8's op builders cannot read 9.0a")
    assert "blob/v0.19.8/op_builder/builder.py#L710" in result.summary
    assert any("envs/deepspeed_arch_lists.toml" in line for line in result.evidence)
    assert 'export TORCH_CUDA_ARCH_LIST="8.0;9.0"' in here(result)


def test_doctor_judges_nvcc_alone_without_deepspeed(arch_ctx, run_one):
    result = run_one("toolkit.arch-support", arch_ctx("9.0a", None))
    assert result.status is Status.OK and "covers 9.0" in result.summary
    assert any("no DeepSpeed in" in line and "nvcc alone is judged" in line
               for line in result.evidence)


def test_doctor_names_nvcc_when_nvcc_is_the_culprit(arch_ctx, run_one, tmp_path):
    result = run_one("toolkit.arch-support", arch_ctx("7.0", DeepSpeedInstall(
        "0.19.8", tmp_path / "deepspeed")))
    assert result.status is Status.FAIL and "DeepSpeed" not in result.summary
    assert result.summary.startswith("nvcc 13.0.88 builds compute capability 7.5 to 12.1: "
                                     "cannot build 7.0")
    both = run_one("toolkit.arch-support", arch_ctx("7.0;9.0a", DeepSpeedInstall(
        "0.19.8", tmp_path / "deepspeed"), env_python=None))
    assert "cannot build 7.0" in both.summary and "cannot read 9.0a" in both.summary


def test_release_rows_cover_what_was_read(tmp_path):
    assert arch_readers.from_data("0.18.9", ["9.0a"], "x").deepspeed_rejects == {}
    assert arch_readers.from_data("0.19.6", ["9.0a"], "x").how == "not asked"
    assert list(arch_readers.from_data("0.19.1", ["9.0a", "Hopper", "8.0+PTX"],
                                       "x").deepspeed_rejects) == ["9.0a", "Hopper"]


def test_every_cause_a_build_failure_names_exists():
    from dsenv.doctor.registry import all_checks

    checks = {c.id for c in all_checks()}
    modes = {m.id for m in catalogue.modes()}
    for _, check, explain in opbuild.CAUSES:
        assert check in checks and explain in modes, (check, explain)
    assert opbuild.DEFAULT_CAUSE[0] in checks


def test_the_probe_script_runs_alone(tmp_path):
    """The doctor runs arch_parsers.py's text in the job's interpreter: no dsenv import."""
    source = Path(arch_parsers.__file__).read_text()
    assert not re.search(r"^\s*(from|import) dsenv", source, re.M)

"""provision.ops against the real installed DeepSpeed (0.19.8 here): its op builders decide,
asked in a subprocess, for the cpu, 3.7, 7.0, 8.0, 9.0 and gfx90a targets; compilers on the
"node" are the doctor's probes, with recorded nvcc/hipcc outputs behind fake binaries."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from dsenv.envs.op_failures import known_failure
from dsenv.envs.stacks import get_stack
from dsenv.provision import ProvisionError
from dsenv.provision.ops.builders import inspect_ops
from dsenv.provision.ops.choose import OpsChoice, choose_ops, parse_mode
from dsenv.provision.targets import resolve_arch
from tests.harness.recorded import fixture_text

# Found, never imported here: DeepSpeed (and torch) are only imported by the subprocess.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="deepspeed is not installed")

# The ops whose builders carry an arch filter (filter_ccs) and the minimum they keep.
FILTERED = {"transformer_inference": "6.0", "inference_core_ops": "6.0", "ragged_ops": "6.0",
            "evoformer_attn": "7.0", "fp_quantizer": "8.0", "cutlass_ops": "8.0",
            "ragged_device_ops": "8.0"}
CPU_OPS = {"cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam",
           "pin_memory"}


def node_env(tmp_path, **tools):
    """os.environ with a PATH whose compilers are fakes printing recorded outputs
    (``nvcc="gpu/nvcc_12.4.txt"``), and no real nvcc or CUDA_HOME."""
    folder = tmp_path / "node" / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    for name, fixture in tools.items():
        out = tmp_path / f"{name}.out"
        out.write_text(fixture_text(fixture))
        script = folder / name
        script.write_text(f"#!/bin/sh\ncat '{out}'\n")
        script.chmod(0o755)
    keep = [p for p in os.environ["PATH"].split(":")
            if p and not (os.path.isfile(os.path.join(p, "nvcc"))
                          or os.path.isfile(os.path.join(p, "hipcc")))]
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "ROCM_PATH", "ROCM_HOME",
                        "TORCH_CUDA_ARCH_LIST", "DS_ACCELERATOR")}
    env["PATH"] = ":".join([str(folder), *keep])
    if "nvcc" not in tools:
        env["CUDA_HOME"] = str(tmp_path / "no-cuda")  # hide /usr/local/cuda too
    if "hipcc" not in tools:
        env["ROCM_PATH"] = str(tmp_path / "no-rocm")
    return env


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """``reports(spec, nvcc=fixture)`` -> (DeepSpeed's report for the target, the node's
    environment). One DeepSpeed subprocess per target (what its builders say does not depend
    on the node's compilers, which dsenv judges itself), one fake node per compiler set."""
    asked, nodes = {}, {}

    def get(spec, **tools):
        if spec not in asked:
            asked[spec] = inspect_ops(resolve_arch(spec),
                                      env=node_env(tmp_path_factory.mktemp("node")))
        key = tuple(sorted(tools.items()))
        if key not in nodes:
            nodes[key] = node_env(tmp_path_factory.mktemp("node"), **tools)
        return asked[spec], nodes[key]

    return get


def choose(reports, spec, stack, mode="auto", judge_torch=False, **tools) -> OpsChoice:
    report, env = reports(spec, **tools)
    return choose_ops(resolve_arch(spec), get_stack(stack) if stack else None, mode,
                      env=env, judge_torch=judge_torch, report=report)


def libaio_links() -> bool:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    probe = subprocess.run([cc, "-x", "c", "-", "-laio", "-o", os.devnull],
                           input="void io_submit(void); int main(){io_submit();return 0;}",
                           capture_output=True, text=True)
    return probe.returncode == 0


# -- what DeepSpeed's builders say -------------------------------------------------------
def test_report_reads_the_builders_of_the_installed_deepspeed(reports):
    report, _ = reports("8.0")
    assert report.accelerator == "cuda" and report.deepspeed
    assert report.ops["fused_adam"].build_var == "DS_BUILD_FUSED_ADAM"
    assert report.ops["async_io"].build_var == "DS_BUILD_AIO"
    assert report.ops["ragged_device_ops"].build_var == "DS_BUILD_RAGGED_DEVICE_OPS"
    assert report.ops["cutlass_ops"].build_var == "DS_BUILD_CUTLASS_OPS"
    assert report.ops["fp_quantizer"].where.startswith("deepspeed/ops/op_builder/fp_quantizer.py:")
    assert {n for n, op in report.ops.items() if op.minimum_arch} == set(FILTERED)
    for name, minimum in FILTERED.items():
        assert report.ops[name].minimum_arch == minimum, name
    assert "deepspeed_shm_comm" in report.other_ops and report.other_accelerator == "cpu"
    assert report.cuda_minor_mismatch_ok["12"][0] == "12.0"


def test_cpu_target_uses_deepspeeds_cpu_accelerator(reports):
    report, _ = reports("cpu")
    assert report.accelerator == "cpu"
    assert CPU_OPS | {"deepspeed_ccl_comm", "deepspeed_not_implemented"} <= set(report.ops)
    assert report.ops["deepspeed_shm_comm"].build_var == "DS_BUILD_SHM_COMM"
    assert report.ops["deepspeed_ccl_comm"].build_var == "DS_BUILD_CCL_COMM"
    assert "fp_quantizer" in report.other_ops


# -- cpu ----------------------------------------------------------------------------------
def test_cpu_auto_builds_the_cpu_ops_and_says_why_not_the_others(reports):
    choice = choose(reports, "cpu", "cpu", judge_torch=True)
    assert choice.accelerator == "cpu"
    assert CPU_OPS <= set(choice.build)
    # DeepSpeed's CPU builder() drops async_io's -laio: precompiled, it would not load
    assert "async_io" not in choice.build
    assert "drops -laio from the link" in choice.omitted["async_io"]
    assert "cpu/builder.py" in choice.omitted["async_io"]
    assert "CCL_ROOT" in choice.omitted["deepspeed_ccl_comm"]  # oneCCL is not here
    assert "placeholder" in choice.omitted["deepspeed_not_implemented"]
    env = choice.env()
    assert env["DS_BUILD_OPS"] == "0" and env["DS_ACCELERATOR"] == "cpu"
    assert env["DS_BUILD_CPU_ADAM"] == env["DS_BUILD_SHM_COMM"] == env["DS_BUILD_FUSED_ADAM"] == "1"
    assert env["DS_BUILD_CCL_COMM"] == "0" and env["DS_BUILD_NOT_IMPLEMENTED"] == "0"


def test_cpu_list_and_pin_memory_follows_async_io(reports):
    choice = choose(reports, "cpu", "cpu", "cpu_adam, fused_adam")
    assert choice.build == ("cpu_adam", "fused_adam") and not choice.omitted
    assert {k for k, v in choice.env().items() if v == "1"} == {"DS_BUILD_CPU_ADAM",
                                                                "DS_BUILD_FUSED_ADAM"}
    if libaio_links():  # the GPU accelerator's builder keeps -laio: there it precompiles
        report, _ = reports("cpu")
        assert report.ops["async_io"].lost_link_flags == ("-laio",)
        assert report.ops["cpu_adam"].lost_link_flags == ()


def test_none_builds_nothing_and_disables_every_op(reports):
    choice = choose(reports, "cpu", "cpu", "none")
    assert choice.build == () and not choice.omitted
    env = choice.env()
    assert env["DS_BUILD_OPS"] == "0" and set(env.values()) <= {"0", "cpu"}


def test_list_errors(reports):
    with pytest.raises(ProvisionError) as error:
        choose(reports, "cpu", "cpu", "cpu_adam,nope")
    assert "unknown op(s) nope" in str(error.value) and "cpu_adam" in str(error.value)
    with pytest.raises(ProvisionError, match="CCL_ROOT"):
        choose(reports, "cpu", "cpu", "deepspeed_ccl_comm")
    with pytest.raises(ProvisionError) as error:
        choose(reports, "8.0", "cuda13.0", "deepspeed_shm_comm", nvcc="gpu/nvcc_13.0.txt")
    assert "belong to DeepSpeed's cpu accelerator" in str(error.value)


def test_no_cxx_compiler_means_nothing_builds(reports, tmp_path):
    report, env = reports("cpu")
    bare = dict(env, PATH=str(tmp_path), CXX="no-such-c++")
    choice = choose_ops(resolve_arch("cpu"), get_stack("cpu"), "auto", env=bare, report=report)
    assert choice.build == ()
    assert all("no C++ compiler" in r or "placeholder" in r or "drops -laio" in r
               for r in choice.omitted.values())
    assert "no C++ compiler" in choice.omitted["cpu_adam"]


def test_mode_parsing():
    assert parse_mode("AUTO") == ("auto", [])
    assert parse_mode("cpu_adam, fused_adam") == ("list", ["cpu_adam", "fused_adam"])
    with pytest.raises(ProvisionError):
        parse_mode(" , ")


# -- DS_BUILD_OPS=1 fails for TORCH_CUDA_ARCH_LIST=3.7, works for 7.0 (github.com/chrissark/ds-HPC5)
def arch_omitted(choice: OpsChoice) -> dict[str, str]:
    return {n: r for n, r in choice.omitted.items() if "filter_ccs" in r}


def test_kepler_omits_the_ops_whose_builders_filter_it_out(reports):
    choice = choose(reports, "3.7", None, nvcc="gpu/nvcc_11.8.txt")  # CUDA 11 builds sm_37
    omitted = arch_omitted(choice)
    assert set(omitted) == set(FILTERED)
    for name, reason in omitted.items():
        assert f"needs sm_{FILTERED[name].replace('.', '')} or newer" in reason
        assert "drops sm_37 (Kepler)" in reason
        assert (f"Unable to load {name} op due to no compute capabilities remaining after "
                "filtering") in reason
    assert {"fused_adam", "fused_lamb", "transformer", "cpu_adam"} <= set(choice.build)


def test_volta_keeps_the_pascal_and_volta_ops_that_kepler_loses(reports):
    choice = choose(reports, "7.0", "cuda12.6", nvcc="gpu/nvcc_12.4.txt")
    assert set(arch_omitted(choice)) == {"fp_quantizer", "cutlass_ops", "ragged_device_ops"}
    kepler = choose(reports, "3.7", None, nvcc="gpu/nvcc_11.8.txt")
    # What made DS_BUILD_OPS=1 fail for 3.7 and not for 7.0: these builders need sm_60/sm_70.
    assert set(arch_omitted(kepler)) - set(arch_omitted(choice)) == {
        "transformer_inference", "inference_core_ops", "ragged_ops", "evoformer_attn"}
    assert {"transformer_inference", "inference_core_ops", "ragged_ops"} <= set(choice.build)


def test_cuda13_nvcc_refuses_volta_ops_with_the_fix(reports):
    choice = choose(reports, "7.0", "cuda12.6", nvcc="gpu/nvcc_13.0.txt")
    assert choice.omitted["fused_adam"] == (
        "CUDA 13.0's nvcc cannot build sm_70 (Volta; CUDA 13 dropped sm_50–sm_72): load a "
        "CUDA 12.x module (e.g. `module load cuda/12.6`, or CUDA_HOME=<its root>) or pass "
        "--ops none")
    assert "fused_adam" not in choice.build and "cpu_adam" in choice.build  # host ops build


def test_ampere_and_hopper_build_the_sm80_ops(reports):
    for spec in ("8.0", "9.0"):
        choice = choose(reports, spec, "cuda13.0", nvcc="gpu/nvcc_13.0.txt")
        assert not arch_omitted(choice), spec
        assert {"transformer_inference", "fused_adam"} <= set(choice.build)
        assert "deepspeed-kernels" in choice.omitted["cutlass_ops"]  # dskernels not here
        assert "CUTLASS" in choice.omitted["evoformer_attn"]
        env = choice.env()
        assert env["DS_ACCELERATOR"] == "cuda" and env["DS_BUILD_FUSED_ADAM"] == "1"
        # nvcc 13.0 cannot compile DeepSpeed 0.19.8's fp_quantizer (envs/op_build_failures)
        assert "fp_quantizer" not in choice.build
        assert "q_exponent_bits" in choice.omitted["fp_quantizer"]
        assert env["DS_BUILD_FP_QUANTIZER"] == "0"
    # its healthy twin: an nvcc outside the failing range builds it (CUDA major permitting)
    assert known_failure("fp_quantizer", "0.19.8", "13.0.88") is not None
    assert known_failure("fp_quantizer", "0.19.8", "12.8.93") is None
    assert known_failure("fp_quantizer", "0.19.9", "13.0.88") is None
    assert known_failure("fused_adam", "0.19.8", "13.0.88") is None


def test_volta_plus_ampere_builds_fp_quantizer_for_ampere_only_and_warns_about_bf16(reports):
    choice = choose(reports, "7.0;8.0", "cuda12.6", nvcc="gpu/nvcc_12.4.txt")
    assert "fp_quantizer" in choice.build
    assert choice.notes["fp_quantizer"].startswith("built for sm_80 only")
    assert any("turns off DeepSpeed's bf16 kernels" in w for w in choice.warnings)


def test_cuda_major_of_nvcc_must_be_torchs(reports):
    choice = choose(reports, "8.0", "cuda13.0", nvcc="gpu/nvcc_12.4.txt")
    assert "assert_no_cuda_mismatch" in choice.omitted["fused_adam"]


def test_cpu_torch_cannot_compile_cuda_ops(reports):
    # This interpreter's torch is the CPU build: judged by default.
    report, env = reports("8.0", nvcc="gpu/nvcc_13.0.txt")
    if report.torch.get("cuda"):
        pytest.skip("a CUDA torch is installed here")
    choice = choose_ops(resolve_arch("8.0"), get_stack("cuda13.0"), "auto", env=env,
                        report=report)
    assert "not a CUDA build" in choice.omitted["fused_adam"]
    assert f"torch {report.torch['version']} in this interpreter" in choice.omitted["fused_adam"]


def test_no_nvcc_here(reports):
    choice = choose(reports, "8.0", "cuda13.0")
    assert choice.omitted["fused_adam"].startswith("no nvcc here")
    assert "module load cuda/13.0" in choice.omitted["fused_adam"]


def test_all_is_strict_about_what_cannot_be_built_here(reports):
    with pytest.raises(ProvisionError) as error:
        choose(reports, "8.0", "cuda13.0", "all", nvcc="gpu/nvcc_13.0.txt")
    text = str(error.value)
    assert "cutlass_ops" in text and "--ops auto" in text
    with pytest.raises(ProvisionError, match="needs sm_80 or newer"):
        choose(reports, "7.0", "cuda12.6", "fp_quantizer", nvcc="gpu/nvcc_12.4.txt")


# -- AMD ----------------------------------------------------------------------------------
def test_gfx90a_rocm_rules(reports):
    choice = choose(reports, "gfx90a", "rocm7.2", hipcc="gpu/hipconfig_3.10.txt")
    assert choice.omitted["gds"].startswith("not supported on ROCm")
    assert "gds is not compatible with ROCM" in choice.omitted["gds"]
    assert not arch_omitted(choice)  # filter_ccs is a CUDA rule
    assert {"fused_adam", "transformer_inference", "fp_quantizer"} <= set(choice.build)
    without = choose(reports, "gfx90a", "rocm7.2")
    assert without.omitted["fused_adam"].startswith("no hipcc here")


def test_two_amd_archs_warn_about_deepspeeds_rocm_arch_override(reports):
    choice = choose(reports, "gfx90a;gfx942", "rocm7.2", hipcc="gpu/hipconfig_3.10.txt")
    assert any("replaces PYTORCH_ROCM_ARCH" in w for w in choice.warnings)


# -- the subprocess -----------------------------------------------------------------------
def test_interpreter_without_deepspeed(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")],
                   check=True, timeout=120)
    with pytest.raises(ProvisionError, match="cannot ask DeepSpeed.*install deepspeed"):
        inspect_ops(resolve_arch("cpu"), python=str(tmp_path / "v" / "bin" / "python"))


def test_hung_interpreter_is_killed(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nsleep 30\n")
    python.chmod(0o755)
    with pytest.raises(ProvisionError, match="took more than 1 s"):
        inspect_ops(resolve_arch("cpu"), python=str(python), timeout=1)


def test_the_probe_asks_py_cpuinfo_once(tmp_path):
    """DeepSpeed's builders call cpuinfo.get_cpu_info() twice per CPU op and each call is a
    fresh subprocess (1-1.5 s here): the probe answers them all from one call."""
    import cpuinfo

    (tmp_path / "answer.json").write_text(json.dumps(cpuinfo.get_cpu_info()))
    (tmp_path / "cpuinfo.py").write_text(
        "import json, os\n"
        "def get_cpu_info():\n"
        f"    with open({str(tmp_path / 'calls')!r}, 'a') as f:\n"
        "        f.write('call\\n')\n"
        f"    return json.load(open({str(tmp_path / 'answer.json')!r}))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    report = inspect_ops(resolve_arch("cpu"), env=env)
    assert report.ops["cpu_adam"].compatible
    assert (tmp_path / "calls").read_text().splitlines() == ["call"]


def test_setup_py_can_create_every_chosen_cpu_extension(reports):
    """What DeepSpeed's setup.py does for each enabled op before compiling it:
    ``ext_modules.append(builder.builder())`` (sources, include dirs, flags), for real."""
    choice = choose(reports, "cpu", "cpu", judge_torch=True)
    script = (
        "import json, os, sys\n"
        "from deepspeed.ops.op_builder.all_ops import ALL_OPS\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    builder = ALL_OPS[name]\n"
        "    ext = builder.builder()\n"
        "    found = all(os.path.isfile(builder.deepspeed_src_path(s)) for s in ext.sources)\n"
        "    out[name] = [ext.name, found]\n"
        "print('DSENV' + json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", script, *choice.build],
                         env={**os.environ, **choice.env()}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    made = json.loads(run.stdout.split("DSENV", 1)[1])
    assert set(made) == set(choice.build)
    assert made["cpu_adam"][0] == "deepspeed.ops.adam.cpu_adam_op"
    assert all(found for _, found in made.values()), made  # every source file is installed

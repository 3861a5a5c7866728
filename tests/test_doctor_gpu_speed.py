"""The doctor on a GPU node pays for each slow probe once, and slow probes overlap (issue 22).

On an H200 node (2026-11-26) the doctor took as long as ds_report: its torch probe imported
torch (2.9-4.2 s there) to run one tensor op. By default the probe now asks the CUDA driver
(dsenv/facts/gpu/cuda_driver.py) and reads torch's arch list from libtorch_cuda.so; the
tests here run that on a fake driver and recorded outputs of the real one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv.doctor import registry
from dsenv.doctor.command import timing_section
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.render import render_json
from dsenv.doctor.runner import run_checks
from dsenv.facts.gpu import cuda_driver
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.python import target_env
from dsenv.facts.python import torch_info as tp
from dsenv.facts.python.target_env import PythonEnv
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.facts.toolchain import fatbin
from dsenv.verdicts.findings import Status
from tests.harness.fakecuda import build_libcuda, fatbin_elf, needs_cc

FIXTURES = Path(__file__).parent / "fixtures"
SCHEMA = json.loads((Path(registry.__file__).parent / "report_schema.json").read_text())
SLOW = 1.0  # seconds each fake slow probe takes
CU130 = "2.11.0+cu130"


def fixture_text(name: str) -> str:
    """A recorded output under tests/fixtures without its '# source:' lines (this module
    stands alone: it commits apart from the shared test harness)."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# source:"))


def recorded_counts() -> list[tuple[str, int]]:
    """libtorch_cuda.so of torch 2.11.0+cu130 as entries, from the H200 recording."""
    entries = []
    for line in fixture_text("cuda-build/torch-2.11.0-cu130-fatbin-counts.txt").split("\n"):
        if line.strip():
            kind, arch, count = line.split()
            entries += [(kind, int(arch))] * int(count)
    return entries


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory) -> Path:
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    return build_libcuda(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture
def gpu_node(tmp_path, make_ctx, fake_bin, libcuda):
    """A compute node with one H200 whose nvidia-smi and CUDA driver each take SLOW s, and
    a CUDA torch whose libtorch_cuda.so holds torch 2.11.0+cu130's kernels."""

    def build(**options):
        log = tmp_path / "calls.log"
        fixtures = FIXTURES / "gpu"
        fake_bin("nvidia-smi", f"""echo "nvidia-smi $*" >> '{log}'
sleep {SLOW}
case "$*" in
  *compute_mode*) sed 1d '{fixtures / "nvidia_smi_compute_mode_h200.csv"}' ;;
  *compute-apps*) echo "gpu_uuid, pid, process_name" ;;
  topo*) sed 1d '{fixtures / "nvidia_smi_topo_h200.txt"}' ;;
  *) sed 1d '{fixtures / "nvidia_smi_h200.csv"}' ;;
esac
""")
        torch = tmp_path / "site" / "torch"
        fatbin_elf(torch / "lib" / "libtorch_cuda.so", recorded_counts())
        env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
               "LD_LIBRARY_PATH": str(libcuda), "FAKE_CUDA_INIT_MS": str(int(SLOW * 1000)),
               "FAKE_CUDA_LOG": str(log)}
        ctx = make_ctx(env=env, target="compute", **options)
        ctx.memo(tp.torch_build.memo_key,
                 lambda: TorchBuild(CU130, cuda="13.0", location=str(torch)))
        ctx.memo(target_env.environment.memo_key,
                 lambda: PythonEnv(None, tmp_path / "env", "option", "--env (test)"))
        return ctx, log

    return build


def gpu_and_torch_checks():
    all_checks()
    return [c for c in CHECKS.values() if c.area in ("gpu", "torch")]


# -- recorded on the H200 --------------------------------------------------------------------
def test_the_h200_driver_probe_recording_parses():
    run = cuda_driver.parse_output(fixture_text("gpu/cuda_driver_probe_h200.txt"))
    assert run.available and run.driver_version == "13.0" and run.device_count == 1
    (device,) = run.devices
    assert (device.name, device.arch, device.work, device.usable) == (
        "NVIDIA H200", "9.0", "kernel", True)
    assert 0 < run.seconds["total"] < 1.0  # against 3.3-3.5 s for torch's probe there
    hidden = cuda_driver.parse_output(fixture_text("gpu/cuda_driver_probe_hidden_h200.txt"))
    assert hidden.ran and not hidden.available
    assert hidden.init_error == "cuInit: CUDA_ERROR_NO_DEVICE"  # CUDA_VISIBLE_DEVICES=""


def test_torch_2_11_arch_list_read_from_its_kernels_matches_torchs_own(tmp_path):
    """The 2789 entries of libtorch_cuda.so say what get_arch_list() said, without the
    stray sm_89, sm_103 and sm_121 kernels."""
    code = fatbin.read_device_code(fatbin_elf(tmp_path / "libtorch_cuda.so", recorded_counts()))
    assert code.entries == 2789 and "10.3" in code.elf and "8.9" in code.elf
    torch_said = tp.parse_probe_output(fixture_text("gpu/torch_probe_cu130_h200.txt"))
    assert code.built_for() == list(torch_said.arch_list) == [
        "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert torch_said.devices[0].arch == "9.0"  # torch 2.11 names gcnArchName 'NVIDIA H200'


# -- the driver probe's script against a fake libcuda ------------------------------------------
def run_script(libcuda, **variables):
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(libcuda), **variables}
    done = subprocess.run([*cuda_driver.interpreter(), "-c", cuda_driver.SCRIPT], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return cuda_driver.parse_output(done.stdout)


@needs_cc
def test_driver_script_runs_a_kernel_on_each_device(libcuda):
    run = run_script(libcuda, FAKE_CUDA_DEVICES="3")
    assert run.available and [d.usable for d in run.devices] == [True] * 3
    assert {d.work for d in run.devices} == {"kernel"}


@needs_cc
def test_driver_script_without_ptx_jit_uses_a_memset_and_says_so(libcuda):
    (device,) = run_script(libcuda, FAKE_CUDA_NO_JIT="1").devices
    assert device.usable and device.work == "memset" and "no PTX JIT" in device.note


@needs_cc
def test_driver_script_reports_cuinit_errors(libcuda):
    run = run_script(libcuda, FAKE_CUDA_INIT_RC="100")
    assert run.ran and not run.available and run.init_error == "cuInit: CUDA_ERROR_NO_DEVICE"


def test_driver_script_without_libcuda():
    done = subprocess.run([*cuda_driver.interpreter(), "-c", cuda_driver.SCRIPT],
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/nonexistent"},
                          capture_output=True, text=True, timeout=60)
    run = cuda_driver.parse_output(done.stdout)
    if run.available:
        pytest.skip("this machine has a real GPU driver")
    assert "libcuda.so.1" in (run.init_error or "") or run.device_count == 0


# -- the doctor on the fake GPU node ---------------------------------------------------------
@needs_cc
def test_slow_gpu_probes_overlap_and_each_runs_once(gpu_node):
    ctx, log = gpu_node()
    start = time.monotonic()
    results = {r.id: r for r in run_checks(gpu_and_torch_checks(), ctx)}
    elapsed = time.monotonic() - start
    # nvidia-smi (SLOW) and the CUDA driver (SLOW) run side by side: about one SLOW, not two
    assert elapsed < 1.8 * SLOW, f"the gpu and torch areas took {elapsed:.2f} s"
    calls = log.read_text().splitlines()
    assert calls.count("cuInit") == 1, calls  # asked by torch.arch-list and torch.usable
    smi = [c for c in calls if c.startswith("nvidia-smi")]
    assert len(smi) == len(set(smi)), smi  # each nvidia-smi question asked once
    usable, archs = results["torch.usable"], results["torch.arch-list"]
    assert usable.status is Status.OK, usable
    assert "a kernel ran on 1 GPU(s) through the CUDA driver" in usable.summary
    assert any("torch not imported" in line for line in usable.evidence)
    assert archs.status is Status.OK and "libtorch_cuda.so" in archs.evidence[0]
    assert archs.evidence[0].endswith("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    assert results["gpu.devices"].status is Status.OK

    timing = timing_section(ctx, elapsed)
    probes = {p["id"]: p for p in timing["probes"]}
    driver = probes["dsenv.facts.gpu.cuda_driver.driver_run"]
    smi_probe = probes["dsenv.facts.gpu.inventory.inventory"]
    assert driver["seconds"] >= SLOW and smi_probe["seconds"] >= SLOW
    assert abs(driver["started_s"] - smi_probe["started_s"]) < 0.5 * SLOW  # side by side
    report = json.loads(render_json(list(results.values()), ctx, {"timing": timing}))
    pytest.importorskip("jsonschema").validate(report, SCHEMA)


@needs_cc
def test_a_gpu_the_driver_cannot_use_fails_torch_usable(gpu_node):
    ctx, _ = gpu_node()
    ctx.env = {**ctx.env, "FAKE_CUDA_INIT_MS": "0", "FAKE_CUDA_INIT_RC": "999"}
    all_checks()
    (result,) = run_checks([CHECKS["torch.usable"]], ctx)
    assert result.status is Status.FAIL and "found no usable GPU" in result.summary
    assert "cuInit: CUDA_ERROR_UNKNOWN" in result.evidence[0]


@needs_cc
def test_a_hung_driver_fails_within_the_probe_timeout(gpu_node):
    ctx, _ = gpu_node(probe_timeout=0.5)
    ctx.env = {**ctx.env, "FAKE_CUDA_INIT_MS": "30000"}
    ctx.memo(gpu_probe.visible_gpus.memo_key, lambda: gpu_probe.parse_nvidia_csv(
        fixture_text("gpu/nvidia_smi_h200.csv")))
    all_checks()
    start = time.monotonic()
    (result,) = run_checks([CHECKS["torch.usable"]], ctx)
    assert time.monotonic() - start < 5
    assert result.status is Status.FAIL
    assert result.summary == "initialising CUDA did not finish within 1 s"


def test_verbose_asks_torch_itself(tmp_path, make_ctx, fake_bin):
    """--verbose (thorough): the one subprocess that imports torch, as before."""
    probe = tmp_path / "python"
    probe.write_text("#!/bin/sh\nsed 1d '{}'\n".format(FIXTURES / "gpu" /
                                                         "torch_probe_cu130_h200.txt"))
    probe.chmod(0o755)
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin"}, target="compute", verbose=True)
    ctx.memo(tp.torch_build.memo_key, lambda: TorchBuild(CU130, cuda="13.0",
                                                         location=str(tmp_path / "torch")))
    ctx.memo(target_env.environment.memo_key,
             lambda: PythonEnv(str(probe), tmp_path, "option", "--env (test)"))
    ctx.memo(gpu_probe.visible_gpus.memo_key, lambda: gpu_probe.parse_nvidia_csv(
        fixture_text("gpu/nvidia_smi_h200.csv")))
    runtime = tp.torch_runtime(ctx)
    assert runtime.source == "torch" and runtime.arch_list[-1] == "sm_120"
    all_checks()
    (result,) = run_checks([CHECKS["torch.usable"]], ctx)
    assert result.status is Status.OK and result.summary.startswith("a tensor op ran on 1 GPU")


def test_without_libtorch_cuda_the_probe_asks_torch(tmp_path, make_ctx):
    """A torch whose libraries are not where pip or conda put them: ask torch."""
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin"}, target="compute")
    ctx.memo(tp.torch_build.memo_key, lambda: TorchBuild(CU130, cuda="13.0",
                                                         location=str(tmp_path / "torch")))
    ctx.memo(target_env.environment.memo_key,
             lambda: PythonEnv(None, tmp_path, "option", "--env (test)"))
    ctx.memo(gpu_probe.visible_gpus.memo_key, lambda: [])
    assert tp.driver_runtime(ctx, tp.torch_build(ctx)) is None
    assert tp.torch_runtime(ctx).problem == "not run: no GPU visible"


def test_the_interpreter_of_the_driver_probe_starts_fast():
    start = time.monotonic()
    subprocess.run([*cuda_driver.interpreter(), "-c", "import ctypes, json, threading"],
                   check=True, timeout=30)
    assert time.monotonic() - start < 1.0
    assert sys.executable == cuda_driver.interpreter()[0]

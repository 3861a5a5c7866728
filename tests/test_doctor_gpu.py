"""gpu area: nvidia-smi / AMD tool parsers on recorded outputs, visibility, tool health."""

from __future__ import annotations

import time

import pytest

from dsenv.doctor.checks.node.gpu import slurm_gpu_variables
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_checks
from dsenv.facts.gpu import inventory as probe
from dsenv.facts.gpu.inventory import Gpu
from dsenv.facts.python.torch_info import TorchBuild, torch_build
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.recorded import FIXTURES, fixture_text


def a100(index, uuid):
    return Gpu("nvidia", index, "NVIDIA A100-SXM4-80GB", "8.0", 81920, "535.54.03", uuid)


FOUR = [a100(i, f"GPU-{i}aaaaaaa-62ce-2c30-9150-555ef08935e{i}") for i in range(4)]


@pytest.fixture
def tool_env(fake_bin, tmp_path):
    """``tool_env(name, fixture=..., rc=0)`` fakes a vendor tool printing a recorded output."""
    folder = {}

    def make(name, fixture=None, rc=0, script=None):
        if script is None:
            out = tmp_path / f"{name}.out"
            out.write_text(fixture_text(fixture) if fixture else "")
            script = f"cat '{out}'\nexit {rc}\n"
        folder["bin"] = fake_bin(name, script)
        return {"PATH": f"{folder['bin']}:/usr/bin:/bin"}

    return make


# -- parsers on recorded outputs -------------------------------------------------------------
def test_nvidia_csv_with_compute_cap_columns_in_any_order():
    gpus = probe.parse_nvidia_csv(fixture_text("gpu/nvidia_smi_titanv_ada.csv"))
    assert [(g.index, g.name, g.arch, g.driver) for g in gpus] == [
        (0, "NVIDIA TITAN V", "7.0", "570.86.15"),
        (1, "NVIDIA RTX 5880 Ada Generation", "8.9", "570.86.15")]
    assert gpus[0].memory_mib is None and gpus[0].uuid is None


def test_nvidia_csv_without_compute_cap_takes_the_arch_from_the_name():
    (gpu,) = probe.parse_nvidia_csv(fixture_text("gpu/nvidia_smi_a100_470.csv"))
    assert gpu.arch == "8.0"
    assert gpu.uuid == "GPU-a75cda02-62ce-2c30-9150-555ef08935e2"
    assert gpu.bus_id == "00000000:94:00.0" and gpu.driver == "470.103.01"


def test_nvidia_csv_units_are_stripped():
    text = "index, name, memory.total [MiB], compute_cap\n0, NVIDIA H100 80GB HBM3, 81559 MiB, 9.0\n"
    (gpu,) = probe.parse_nvidia_csv(text)
    assert (gpu.memory_mib, gpu.arch) == (81559, "9.0")


def test_rocminfo_gpu_agent_gives_the_gfx_arch():
    (gpu,) = probe.parse_rocminfo(fixture_text("gpu/rocminfo_mi250x.txt"))
    assert (gpu.vendor, gpu.name, gpu.arch, gpu.uuid) == (
        "amd", "AMD Instinct MI250X/MI250", "gfx90a", "GPU-124d13ccd7b050e5")


def test_rocminfo_cpu_agents_are_not_gpus():
    assert probe.parse_rocminfo(fixture_text("gpu/rocminfo_cpu_agent.txt")) == []


def test_amd_smi_static_text():
    (gpu,) = probe.parse_amd_smi_static(fixture_text("gpu/amd_smi_static_mi350x.txt"))
    assert (gpu.index, gpu.name, gpu.arch, gpu.bus_id) == (
        0, "AMD Instinct MI350X", "gfx950", "0000:05:00.0")


def test_rocm_smi_bogus_gfx_version_is_not_trusted():
    (gpu,) = probe.parse_rocm_smi_product(fixture_text("gpu/rocm_smi_productname_mi250x.json"))
    assert gpu.name.startswith("AMD INSTINCT MI200") and gpu.arch == ""  # not "gfx9010"


def test_fixtures_name_their_source():
    for path in (FIXTURES / "gpu").iterdir():
        assert path.read_text().startswith("# source: "), path.name


# -- visibility ---------------------------------------------------------------------------
@pytest.mark.parametrize("value,indices,unknown", [
    ("2,0", [2, 0], []),
    ("GPU-1aaaaaaa-62ce-2c30-9150-555ef08935e1", [1], []),
    ("GPU-3aaa", [3], []),  # unique UUID prefixes are accepted, like CUDA does
    ("0,7,1", [0], ["7", "1"]),  # the runtime stops at the first unknown entry
    ("NoDevFiles", [], ["NoDevFiles"]),
    ("", [], []),
    ("MIG-4f1a6d1c-9cbb-5b2e-a8b0-2c8f3c7d9e10", [0, 1, 2, 3], []),  # not judged
])
def test_cuda_visible_devices(value, indices, unknown):
    view = probe.apply_visibility(FOUR, {"CUDA_VISIBLE_DEVICES": value})
    assert [g.index for g in view.gpus] == indices
    assert list(view.unknown) == unknown


def test_rocr_then_hip_visible_devices():
    mi = [Gpu("amd", i, "AMD Instinct MI250X/MI250", "gfx90a", uuid=f"GPU-{i}bcd") for i in range(4)]
    view = probe.apply_visibility(mi, {"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2"})
    assert [g.index for g in view.gpus] == [3]  # HIP indexes what ROCR left


# -- checks through fake tools ------------------------------------------------------------------
def test_nvidia_smi_and_devices_pass_on_a_recorded_node(make_ctx, run_one, tool_env):
    ctx = make_ctx(env=tool_env("nvidia-smi", "gpu/nvidia_smi_titanv_ada.csv"), target="compute")
    assert run_one("gpu.nvidia-smi", ctx).status is Status.OK
    result = run_one("gpu.devices", ctx)
    assert result.status is Status.OK
    assert "NVIDIA TITAN V (compute capability 7.0" in result.summary
    assert [g.index for g in probe.visible_gpus(ctx)] == [0, 1]


def test_old_driver_retries_without_compute_cap(make_ctx, run_one, tool_env, tmp_path):
    csv = tmp_path / "a100.csv"
    csv.write_text(fixture_text("gpu/nvidia_smi_a100_470.csv"))
    err = fixture_text("gpu/nvidia_smi_compute_cap_invalid.txt")
    script = (f'case "$*" in *compute_cap*) printf \'{err.strip()}\\n\'; exit 2;; esac\n'
              f"cat '{csv}'\n")
    ctx = make_ctx(env=tool_env("nvidia-smi", script=script), target="compute")
    (gpu,) = probe.visible_gpus(ctx)
    assert gpu.arch == "8.0"
    assert run_one("gpu.nvidia-smi", ctx).status is Status.OK


def test_hung_nvidia_smi_fails_within_the_probe_timeout(make_ctx, tool_env):
    ctx = make_ctx(env=tool_env("nvidia-smi", script="sleep 60\n"), target="compute",
                   probe_timeout=1.5, gpus_per_node=4)
    all_checks()
    start = time.monotonic()
    results = {r.id: r for r in run_checks([c for c in CHECKS.values() if c.area == "gpu"], ctx)}
    elapsed = time.monotonic() - start
    assert elapsed < 1.5 + 1.0, f"the gpu area took {elapsed:.1f} s"
    hung = results["gpu.nvidia-smi"]
    assert hung.status is Status.FAIL
    assert "did not answer within 1.5 s" in hung.summary and "hung" in hung.summary
    assert hung.fix and "exclude" in hung.fix
    assert results["gpu.devices"].status is Status.FAIL  # 4 GPUs planned, none known


def test_nvidia_smi_error_fails_on_compute_warns_on_login(make_ctx, run_one, tool_env):
    # The message nvidia-smi prints when the kernel module is not loaded.
    env = tool_env("nvidia-smi", script="echo \"NVIDIA-SMI has failed because it couldn't "
                   "communicate with the NVIDIA driver.\"\nexit 9\n")
    assert run_one("gpu.nvidia-smi", make_ctx(env=env, target="compute")).status is Status.FAIL
    login = run_one("gpu.nvidia-smi", make_ctx(env=env, target="login"))
    assert login.status is Status.WARN and "exited 9" in login.evidence[0]


def test_no_gpu_here_skips_tools_and_is_info_on_login(make_ctx, run_one):
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin"})
    assert run_one("gpu.nvidia-smi", ctx).status is Status.SKIP
    assert run_one("gpu.rocm", ctx).status is Status.SKIP
    assert run_one("gpu.devices", ctx).status is Status.INFO
    assert run_one("gpu.visible-devices", ctx).status is Status.SKIP


def test_no_gpu_on_compute_fails_when_gpus_are_planned(make_ctx, run_one):
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin"}, target="compute", gpus_per_node=4)
    result = run_one("gpu.devices", ctx)
    assert result.status is Status.FAIL and "--gpus-per-node 4" in result.summary
    assert "--gpus-per-node" in result.fix and "DS_ACCELERATOR=cpu" in result.fix


def test_fewer_gpus_than_planned_fails(make_ctx, run_one, tool_env):
    ctx = make_ctx(env=tool_env("nvidia-smi", "gpu/nvidia_smi_titanv_ada.csv"),
                   target="compute", gpus_per_node=4)
    result = run_one("gpu.devices", ctx)
    assert result.status is Status.FAIL and "--gpus-per-node 4" in result.summary


def test_rocminfo_node(make_ctx, run_one, tool_env):
    ctx = make_ctx(env=tool_env("rocminfo", "gpu/rocminfo_mi250x.txt"), target="compute")
    assert run_one("gpu.rocm", ctx).status is Status.OK
    devices = run_one("gpu.devices", ctx)
    assert devices.status is Status.OK and "gfx90a" in devices.summary


def test_unknown_arch_warns(make_ctx, run_one, tool_env):
    ctx = make_ctx(env=tool_env("rocm-smi", "gpu/rocm_smi_productname_mi250x.json"),
                   target="compute")
    assert run_one("gpu.devices", ctx).status is Status.WARN


def test_visible_devices_checks(make_ctx, run_one, tool_env):
    env = tool_env("nvidia-smi", "gpu/nvidia_smi_titanv_ada.csv")
    assert run_one("gpu.visible-devices", make_ctx(env=env)).status is Status.OK
    picked = run_one("gpu.visible-devices", make_ctx(env={**env, "CUDA_VISIBLE_DEVICES": "1"}))
    assert picked.status is Status.OK and "1 of 2" in picked.summary
    bad = run_one("gpu.visible-devices",
                  make_ctx(env={**env, "CUDA_VISIBLE_DEVICES": "0,3"}, target="compute"))
    assert bad.status is Status.FAIL and "3" in bad.summary
    empty = run_one("gpu.visible-devices",
                    make_ctx(env={**env, "CUDA_VISIBLE_DEVICES": ""}, target="compute",
                             gpus_per_node=2))
    assert empty.status is Status.FAIL and "hides every GPU" in empty.summary
    hidden = run_one("gpu.devices", make_ctx(env={**env, "CUDA_VISIBLE_DEVICES": ""},
                                             target="compute", gpus_per_node=2))
    assert hidden.status is Status.FAIL and "2 present but hidden" in hidden.summary


def test_rocr_visible_devices_naming_a_missing_gpu_fails(make_ctx, run_one, tool_env):
    env = {**tool_env("rocminfo", "gpu/rocminfo_mi250x.txt"), "ROCR_VISIBLE_DEVICES": "0,1"}
    result = run_one("gpu.visible-devices", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and "1" in result.summary


def test_seeded_visible_gpus_are_what_other_areas_see(make_ctx):
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin"})
    ctx.memo(gpu_probe_key(), lambda: FOUR[:2])
    assert probe.visible_gpus(ctx) == FOUR[:2]


def test_rocminfo_failing_is_reported(make_ctx, run_one, tool_env):
    # rocminfo's own message when the amdgpu/kfd driver is not loaded.
    env = tool_env("rocminfo", script="echo 'ROCk module is NOT loaded, possibly no GPU "
                   "devices'\nexit 1\n")
    result = run_one("gpu.rocm", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and "rocminfo failed" in result.summary
    assert "ROCk module is NOT loaded" in result.evidence[0]
    assert result.mode == "rocm.amdgpu-driver-not-loaded"
    assert run_one("gpu.rocm", make_ctx(env=env)).status is Status.WARN


def test_rocminfo_failing_with_the_driver_loaded_names_another_cause(make_ctx, run_one,
                                                                     tool_env, tmp_path):
    # the twin: amdgpu loaded, /dev/kfd there, the runtime refuses the GPU (rocminfo#27)
    env = tool_env("rocminfo", script="echo 'ROCk module is loaded'\necho 'Call returned "
                   "HSA_STATUS_ERROR_OUT_OF_RESOURCES'\nexit 1\n")
    (tmp_path / "root" / "dev").mkdir(parents=True)
    (tmp_path / "root" / "dev" / "kfd").touch()
    result = run_one("gpu.rocm", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and result.mode == "rocm.gpu-not-supported-by-kfd"


def gpu_probe_key():
    from dsenv.facts.gpu.inventory import visible_gpus

    return visible_gpus.memo_key


# -- CPU jobs are jobs: "no GPU visible" fails only when the job expects GPUs ------------------
CPU_TORCH = TorchBuild("2.13.0+cpu", location="/env/torch")
CUDA_TORCH = TorchBuild("2.5.1+cu121", cuda="12.1", location="/env/torch")


def no_gpu_job(make_ctx, torch=CPU_TORCH, target="compute", **env_and_options):
    """A node where no GPU tool exists, with ``torch`` seeded as the job's build."""
    options = {k: env_and_options.pop(k) for k in ("gpus_per_node",) if k in env_and_options}
    ctx = make_ctx(env={"PATH": "/nonexistent", **env_and_options}, target=target, **options)
    ctx.memo(torch_build.memo_key, lambda: torch)
    return ctx


@pytest.mark.parametrize("torch, setup", [
    (CUDA_TORCH, {"gpus_per_node": 0}),  # the plan says CPU, whatever the wheel
    (CUDA_TORCH, {"DS_ACCELERATOR": "cpu"}),  # pip's default CUDA wheel, run on CPUs
    (CPU_TORCH, {}),  # a CPU torch is a CPU job
    (CPU_TORCH, {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "cpu", "SLURM_NTASKS": "4"}),
    (CPU_TORCH, {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "0"}),  # zero GPUs allocated
    (CPU_TORCH, {"CUDA_VISIBLE_DEVICES": ""}),  # hidden on purpose
], ids=["gpus-per-node-0", "ds-accelerator-cpu", "cpu-torch", "cpu-partition",
        "slurm-zero-gpus", "visible-devices-empty"])
def test_a_cpu_job_on_a_compute_node_passes(make_ctx, run_one, torch, setup):
    result = run_one("gpu.devices", no_gpu_job(make_ctx, torch, **setup))
    assert result.status is Status.OK, result
    assert "a CPU job" in result.summary and "none needed" in result.summary


@pytest.mark.parametrize("torch, setup, reason", [
    (CPU_TORCH, {"gpus_per_node": 4}, "--gpus-per-node 4"),
    (CPU_TORCH, {"SLURM_GPUS_ON_NODE": "4", "DS_ACCELERATOR": "cpu"}, "SLURM_GPUS_ON_NODE=4"),
    (CPU_TORCH, {"SLURM_JOB_GPUS": "0,1"}, "SLURM_JOB_GPUS=0,1"),
    (CPU_TORCH, {"SLURM_GPUS_PER_NODE": "a100:2"}, "SLURM_GPUS_PER_NODE=a100:2"),
    (CPU_TORCH, {"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES=0 names GPUs"),
    (CPU_TORCH, {"DS_ACCELERATOR": "cuda"}, "DS_ACCELERATOR=cuda"),
    (CUDA_TORCH, {}, "torch 2.5.1+cu121 (CUDA 12.1 build)"),
], ids=["gpus-per-node-4", "slurm-gpus-on-node", "slurm-job-gpus", "slurm-gpus-per-node",
        "visible-devices", "ds-accelerator-cuda", "cuda-torch"])
def test_a_gpu_job_without_a_visible_gpu_fails(make_ctx, run_one, torch, setup, reason):
    result = run_one("gpu.devices", no_gpu_job(make_ctx, torch, **setup))
    assert result.status is Status.FAIL, result
    assert "the job expects GPUs (" in result.summary and reason in result.summary
    expected_fix = "exclude" if reason.startswith("SLURM") else "--gpus-per-node 0"
    assert expected_fix in here(result)


def test_nothing_says_what_the_job_runs_on_warns(make_ctx, run_one):
    result = run_one("gpu.devices", no_gpu_job(make_ctx, TorchBuild(None)))
    assert result.status is Status.WARN and "`--gpus-per-node G` (0 for a CPU job)" in here(result)


@pytest.mark.parametrize("torch, setup", [(CUDA_TORCH, {"gpus_per_node": 4}), (CPU_TORCH, {})])
def test_the_login_node_stays_informational(make_ctx, run_one, torch, setup):
    result = run_one("gpu.devices", no_gpu_job(make_ctx, torch, target="login", **setup))
    assert result.status is Status.INFO and "login node" in result.summary


def test_a_cpu_job_may_hide_the_gpus_of_its_node(make_ctx, run_one, tool_env):
    env = {**tool_env("nvidia-smi", "gpu/nvidia_smi_titanv_ada.csv"),
           "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}
    ctx = make_ctx(env=env, target="compute")
    ctx.memo(torch_build.memo_key, lambda: CUDA_TORCH)
    devices, variables = run_one("gpu.devices", ctx), run_one("gpu.visible-devices", ctx)
    assert devices.status is Status.OK and "2 present but hidden" in devices.summary
    assert variables.status is Status.INFO and "a CPU job (DS_ACCELERATOR=cpu)" in variables.summary
    # The twin that plans GPUs: hiding them all is a failure again.
    gpu_job = make_ctx(env=env, target="compute", gpus_per_node=2)
    assert run_one("gpu.devices", gpu_job).status is Status.FAIL
    assert run_one("gpu.visible-devices", gpu_job).status is Status.FAIL


@pytest.mark.parametrize("value, counts", [
    ("4", True), ("0", False), ("a100:2", True), ("a100:0", False), ("gpu:a100:2,v100:1", True),
    ("", False), ("a100", True)])
def test_slurm_gpu_counts(value, counts):
    found = slurm_gpu_variables({"SLURM_GPUS_PER_NODE": value, "SLURM_GPU_BIND": "closest"})
    assert bool(found) is counts


# -- gpu.kernel-floors: FlashAttention-2 and Triton against the visible GPUs ------------------


def test_kernel_floors_against_the_judged_environment(tmp_path, make_ctx, run_one):
    """flash-attn 2 in the judged environment (a real venv with the package installed by uv)
    on a V100 warns with the catalogue's mode and fix; an A100 is fine; triton on a P100 is
    Triton's floor; no GPU and no such package skip with the reason."""
    from dsenv.doctor import catalogue
    from dsenv.facts.gpu.inventory import Gpu, visible_gpus
    from tests.harness import pyenvs

    venv = pyenvs.make_venv(tmp_path / "venv")
    wheels = tmp_path / "wheels"
    pyenvs.simple_wheel(wheels, "flash-attn", "2.5.8")
    pyenvs.simple_wheel(wheels, "triton", "3.1.0")

    def judged(*gpus):
        ctx = make_ctx(env={"HOME": str(tmp_path)}, environment=str(venv), target="compute")
        ctx.memo(visible_gpus.memo_key, lambda: list(gpus))
        return run_one("gpu.kernel-floors", ctx)

    v100 = Gpu("nvidia", 0, "Tesla V100-SXM2-32GB", "7.0", driver="550.54.14")
    a100 = Gpu("nvidia", 0, "NVIDIA A100-SXM4-80GB", "8.0", driver="550.54.14")
    p100 = Gpu("nvidia", 0, "Tesla P100-PCIE-16GB", "6.0", driver="550.54.14")
    assert judged(v100).status is Status.SKIP  # nothing installed yet
    pyenvs.uv_install(wheels, "flash-attn==2.5.8", python=venv / "bin" / "python")
    found = judged(v100)
    assert found.status is Status.WARN and found.mode == "gpu.flash-attn-needs-ampere", found
    assert "Tesla V100-SXM2-32GB (7.0)" in found.summary and "8.0 or newer" in found.summary
    assert found.fix == catalogue.fix_for("gpu.flash-attn-needs-ampere")
    assert judged(a100).status is Status.OK
    assert judged().status is Status.SKIP  # no GPU visible
    pyenvs.uv_install(wheels, "triton==3.1.0", python=venv / "bin" / "python")
    both = judged(p100)
    assert both.mode == "gpu.flash-attn-needs-ampere"  # the first floor it is below
    assert "flash-attn 2.5.8 installed" in both.evidence and "triton 3.1.0 installed" in \
        both.evidence
    venv = pyenvs.make_venv(tmp_path / "triton-only")
    pyenvs.uv_install(wheels, "triton==3.1.0", python=venv / "bin" / "python")
    pascal = judged(p100)
    assert pascal.status is Status.WARN and pascal.mode == "gpu.too-old-for-triton", pascal
    assert "torch.compile (Triton) cannot run on Tesla P100-PCIE-16GB (6.0)" in pascal.summary
    assert judged(v100).status is Status.OK  # 7.0 is Triton's floor, inclusive

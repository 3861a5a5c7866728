"""gpu.compute-mode and system.threads, each made to fail or warn and made healthy.

Compute modes come from a fake nvidia-smi on PATH printing recorded outputs (the Exclusive_Process
CSV is composed from nvidia-smi's documented values: its source line says how); threads from
the CLI run under a real CPU affinity mask (os.sched_setaffinity in the child).
"""

import os

import pytest

from dsenv.facts.gpu.modes import parse_compute_apps, parse_compute_modes
from dsenv.facts.launch import joblayout
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import clean_env, doctor, fake_nvidia_smi
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

EXCLUSIVE = "gpu/nvidia_smi_compute_mode_exclusive.csv"
DEFAULT = "gpu/nvidia_smi_titanv_ada.csv"  # recorded: compute_cap, compute_mode, ..., index
APPS = "gpu/nvidia_smi_compute_apps_vgpu.csv"


def smi_env(tmp_path, modes, apps="", **variables):
    folder = fake_nvidia_smi(tmp_path / "smi", modes=modes, apps=apps)
    return {"PATH": f"{folder}:{os.environ['PATH']}", "HOME": str(tmp_path), **variables}


# -- gpu.compute-mode ---------------------------------------------------------------------------


def test_compute_mode_parsers_read_the_recorded_outputs():
    modes = parse_compute_modes(fixture_text(DEFAULT))
    assert [(m.index, m.kind) for m in modes] == [(0, "default"), (1, "default")]
    modes = parse_compute_modes(fixture_text(EXCLUSIVE))
    assert {m.kind for m in modes} == {"exclusive"} and modes[1].uuid.startswith("GPU-777ead31")
    apps = parse_compute_apps(fixture_text(APPS))
    assert len(apps) == 3 and apps[0].name == "vgpu"


def test_default_mode_is_ok(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=smi_env(tmp_path, DEFAULT), target="compute", gpus_per_node=8)
    result = run_one("gpu.compute-mode", ctx)
    assert result.status is Status.OK and "Default" in result.summary


def test_more_ranks_than_exclusive_gpus_fails(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=smi_env(tmp_path, EXCLUSIVE), target="compute", gpus_per_node=4)
    result = run_one("gpu.compute-mode", ctx)
    assert result.status is Status.FAIL, result
    assert "4 ranks per node on 2 GPU(s)" in result.summary and "busy or unavailable" in result.summary


def test_one_rank_per_exclusive_gpu_is_a_note(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=smi_env(tmp_path, EXCLUSIVE), target="compute", gpus_per_node=2)
    result = run_one("gpu.compute-mode", ctx)
    assert result.status is Status.INFO, result


def test_leftover_processes_on_exclusive_gpus_fail(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=smi_env(tmp_path, EXCLUSIVE, apps=APPS), target="compute", gpus_per_node=2)
    result = run_one("gpu.compute-mode", ctx)
    assert result.status is Status.FAIL and "3 process(es)" in result.summary


def test_visible_devices_leave_fewer_gpus_than_ranks(make_ctx, run_one, tmp_path):
    env = smi_env(tmp_path, EXCLUSIVE, CUDA_VISIBLE_DEVICES="1")
    result = run_one("gpu.compute-mode", make_ctx(env=env, target="compute", gpus_per_node=2))
    assert result.status is Status.FAIL and "on 1 GPU(s)" in result.summary
    # planned on a login node: a warning, the compute nodes may differ
    result = run_one("gpu.compute-mode", make_ctx(env=env, target="login", gpus_per_node=2))
    assert result.status is Status.WARN


def test_without_nvidia_smi_it_skips(make_ctx, run_one, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_one("gpu.compute-mode", make_ctx(env={"PATH": str(empty)}))
    assert result.status is Status.SKIP


@pytest.mark.parametrize("gpus, expected", [("4", "fail"), ("2", "info")])
def test_compute_mode_through_the_cli(tmp_path, gpus, expected):
    env = clean_env(**smi_env(tmp_path, EXCLUSIVE))
    results = doctor("--only", "gpu", "--target", "compute", "--gpus-per-node", gpus, env=env)
    assert results["gpu.compute-mode"]["status"] == expected, results["gpu.compute-mode"]


# -- system.threads -------------------------------------------------------------------------------


def pinned(cpus):
    """preexec_fn: run the doctor on these CPUs only, as a Slurm step or cgroup would."""
    return lambda: os.sched_setaffinity(0, cpus)


@pytest.mark.parametrize("omp, ranks, expected", [
    ("2", "1", "warn"),  # 2 threads on the one CPU the process may use
    ("1", "1", "ok"),
    (None, "2", "warn"),  # 2 ranks, more than the one CPU
])
def test_threads_against_a_real_affinity_mask(tmp_path, omp, ranks, expected):
    env = clean_env(**({"OMP_NUM_THREADS": omp} if omp else {}))
    results = doctor("--only", "system", "--gpus-per-node", ranks, "--launcher", "deepspeed",
                     env=env, preexec_fn=pinned({0}))
    result = results["system.threads"]
    assert result["status"] == expected, result
    assert "1 CPU(s) in this process's affinity mask" in " ".join(result["evidence"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_unset_threads_with_two_ranks_on_two_cpus_warns_and_one_each_is_ok(tmp_path):
    args = ("--only", "system", "--gpus-per-node", "2", "--launcher", "deepspeed")
    unset = doctor(*args, env=clean_env(), preexec_fn=pinned({0, 1}))["system.threads"]
    assert unset["status"] == "warn" and here(unset).startswith("export OMP_NUM_THREADS=1")
    one = doctor(*args, env=clean_env(OMP_NUM_THREADS="1"), preexec_fn=pinned({0, 1}))
    assert one["system.threads"]["status"] == "ok", one["system.threads"]


def test_srun_ranks_count_their_task_cpus(make_ctx, run_one):
    env = {"SLURM_CPUS_PER_TASK": "2", "OMP_NUM_THREADS": "4"}
    result = run_one("system.threads", make_ctx(env=env, launcher="srun", gpus_per_node=4))
    assert result.status is Status.WARN and "OMP_NUM_THREADS=4 x 4 rank(s)" in result.summary
    result = run_one("system.threads", make_ctx(env={**env, "OMP_NUM_THREADS": "2"},
                                                launcher="srun", gpus_per_node=4))
    assert result.status is Status.OK
    result = run_one("system.threads", make_ctx(env={"SLURM_CPUS_PER_TASK": "8", "OMP_NUM_THREADS":
                                                     "1"}, launcher="srun", gpus_per_node=4))
    assert result.status is Status.INFO and "cpu_adam" in result.summary


def test_torchrun_sets_one_thread_itself(make_ctx, run_one):
    result = run_one("system.threads", make_ctx(env={}, launcher="torchrun", gpus_per_node=2))
    assert result.status in (Status.INFO, Status.WARN)  # WARN only with fewer CPUs than ranks
    if len(os.sched_getaffinity(0)) >= 2:
        assert result.status is Status.INFO and "torchrun sets it to 1" in result.summary


def test_a_thread_count_openmp_cannot_read_warns(make_ctx, run_one):
    result = run_one("system.threads", make_ctx(env={"OMP_NUM_THREADS": "all"}))
    assert result.status is Status.WARN and "not a positive thread count" in result.summary
    assert joblayout.cpu_share(make_ctx(env={}), 1).per_rank >= 1

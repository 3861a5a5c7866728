"""system area: each check made to pass and to warn or fail, on recorded roots."""

import resource
from pathlib import Path

import pytest

from dsenv.facts.host.machine import parse_proc_cpuinfo, parse_size
from dsenv.verdicts.findings import Status
from tests.harness.recorded import fixture_text


def write(root, path, text=""):
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def test_cpuinfo_parser_reads_real_x86_and_arm_outputs():
    model, flags, count = parse_proc_cpuinfo(fixture_text("system/cpuinfo_epyc_this_machine.txt"))
    assert model.startswith("AMD EPYC") and "avx2" in flags and count == 2
    model, flags, count = parse_proc_cpuinfo(fixture_text("system/cpuinfo_arm_cortex_a76.txt"))
    assert "asimd" in flags and count == 2 and model == ""


def test_cpu_with_avx512_passes(make_ctx, run_one, tmp_path):
    write(tmp_path / "root", "/proc/cpuinfo", fixture_text("system/cpuinfo_epyc_this_machine.txt"))
    result = run_one("system.cpu", make_ctx())
    assert result.status is Status.OK and "AVX" in result.summary


def test_cpu_without_avx2_warns_about_cpu_adam(make_ctx, run_one, tmp_path):
    write(tmp_path / "root", "/proc/cpuinfo",
          "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2670 0\nflags\t\t: fpu sse sse2 avx\n")
    result = run_one("system.cpu", make_ctx())
    assert result.status is Status.WARN and "cpu_adam" in result.summary


def test_os_release_is_read_from_the_root(make_ctx, run_one, tmp_path):
    write(tmp_path / "root", "/etc/os-release", 'PRETTY_NAME="Rocky Linux 8.9 (Green Obsidian)"\n')
    result = run_one("system.os", make_ctx())
    assert result.status is Status.OK and "Rocky Linux 8.9" in result.summary


def test_old_glibc_warns_that_torch_wheels_will_not_load(make_ctx, run_one, tmp_path, monkeypatch):
    import platform

    write(tmp_path / "root", "/etc/os-release", 'PRETTY_NAME="CentOS Linux 7 (Core)"\n')
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.17"))
    result = run_one("system.os", make_ctx())
    assert result.status is Status.WARN and "glibc 2.17" in result.summary


@pytest.mark.parametrize("text, expected", [("64m", 64 << 20), ("8G", 8 << 30), ("65536k", 64 << 20),
                                            ("12", 12), ("lots", None)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_shm_large_passes(make_ctx, run_one, tmp_path):
    (tmp_path / "root" / "dev" / "shm").mkdir(parents=True)  # on the real disk: many GiB
    assert run_one("system.shm", make_ctx()).status is Status.OK


def test_shm_missing_fails(make_ctx, run_one):
    result = run_one("system.shm", make_ctx(target="compute"))
    assert result.status is Status.FAIL and "--shm-size" in result.fix


def test_shm_64mb_container_fails_on_compute(make_ctx, run_one, tmp_path, monkeypatch):
    import os

    (tmp_path / "root" / "dev" / "shm").mkdir(parents=True)
    real = os.statvfs

    class Tiny:
        f_frsize, f_blocks = 4096, (64 << 20) // 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny if str(p).endswith("dev/shm") else real(p))
    assert run_one("system.shm", make_ctx(target="compute")).status is Status.FAIL
    assert run_one("system.shm", make_ctx(target="login")).status is Status.WARN


def test_memlock_limited_with_rdma_fails_on_compute(make_ctx, run_one, tmp_path, monkeypatch):
    (tmp_path / "root" / "sys" / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    monkeypatch.setattr(resource, "getrlimit", lambda r: (64 * 1024, 64 * 1024))
    result = run_one("system.memlock", make_ctx(target="compute"))
    assert result.status is Status.FAIL and "mlx5_0" in result.evidence[0]
    assert "memlock unlimited" in result.fix


def test_memlock_unlimited_passes(make_ctx, run_one, monkeypatch):
    inf = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda r: (inf, inf))
    assert run_one("system.memlock", make_ctx(target="compute")).status is Status.OK


def test_slurm_outside_allocation_is_info(make_ctx, run_one):
    assert run_one("system.slurm", make_ctx(env={})).status is Status.INFO


def test_slurm_allocation_matching_the_plan_passes(make_ctx, run_one):
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "8",
           "SLURM_NTASKS_PER_NODE": "4"}
    result = run_one("system.slurm", make_ctx(env=env, target="compute", launcher="srun",
                                              nodes=2, gpus_per_node=4))
    assert result.status is Status.OK and "job 4242: 2 node(s), 8 task(s)" in result.summary


def test_slurm_allocation_with_too_few_tasks_warns(make_ctx, run_one):
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2"}
    result = run_one("system.slurm", make_ctx(env=env, target="compute", launcher="srun",
                                              nodes=2, gpus_per_node=4))
    assert result.status is Status.WARN and "--ntasks-per-node=4" in result.fix


def test_slurm_cpu_job_is_not_held_to_a_gpu_count(make_ctx, run_one):
    # A CPU partition: 4 CPU ranks on one node, no GPU variable anywhere.
    env = {"SLURM_JOB_ID": "51", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "4",
           "SLURM_JOB_PARTITION": "cpu"}
    cpu_job = run_one("system.slurm", make_ctx(env=env, target="compute", launcher="srun",
                                               nodes=1, gpus_per_node=0))
    assert cpu_job.status is Status.OK and "no GPUs allocated" in cpu_job.summary
    gpu_job = run_one("system.slurm", make_ctx(env=env, target="compute", launcher="srun",
                                               nodes=1, gpus_per_node=2))
    assert gpu_job.status is Status.WARN and "2 ranks are planned" in gpu_job.summary


def test_slurm_gpu_allocation_is_shown(make_ctx, run_one):
    env = {"SLURM_JOB_ID": "52", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "4",
           "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1,2,3"}
    result = run_one("system.slurm", make_ctx(env=env, target="compute"))
    assert result.status is Status.OK and "no GPUs allocated" not in result.summary
    assert "SLURM_GPUS_ON_NODE=4" in result.evidence and "SLURM_JOB_GPUS=0,1,2,3" in result.evidence


def test_container_detected_from_env_and_files(make_ctx, run_one, tmp_path):
    result = run_one("system.container", make_ctx(env={"APPTAINER_CONTAINER": "/scratch/ds.sif"}))
    assert "Apptainer" in result.summary and "/scratch/ds.sif" in result.evidence[0]
    write(tmp_path / "root", "/.dockerenv")
    assert "Docker" in run_one("system.container", make_ctx(env={})).summary


def test_no_container(make_ctx, run_one):
    assert run_one("system.container", make_ctx(env={})).summary == "not inside a container"


def _with_python(ctx, version):
    """``ctx`` whose environment under test (the job's, not dsenv's) runs Python ``version``."""
    from dsenv.facts.python import target_env

    env = target_env.PythonEnv("/env/bin/python3", Path("/env"), "option",
                               "--env /env", version=version, probed=True)
    ctx.memo(target_env.environment.memo_key, lambda: env)
    return ctx


def test_python_version_is_judged_in_the_jobs_environment(run_one, make_ctx):
    assert run_one("system.python", _with_python(make_ctx(), "3.11.7")).status is Status.OK
    old = run_one("system.python", _with_python(make_ctx(), "3.8.10"))
    assert old.status is Status.FAIL and "Python 3.8.10" in old.summary
    assert "interpreter: /env/bin/python3" in old.evidence


def test_memory_small_node_warns_on_compute(run_one, make_ctx, monkeypatch):
    import psutil

    class Small:
        total, available = 8 << 30, 6 << 30

    assert run_one("system.memory", make_ctx(target="compute")).status is Status.OK
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Small)
    assert run_one("system.memory", make_ctx(target="compute")).status is Status.WARN

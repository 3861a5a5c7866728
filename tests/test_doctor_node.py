"""gpu.compute-mode, gpu.mig and system.threads, each made to fail or warn and made healthy.

Compute modes come from a fake nvidia-smi on PATH printing recorded outputs (the Exclusive_Process
CSV is composed from nvidia-smi's documented values: its source line says how); threads from
the CLI run under a real CPU affinity mask (os.sched_setaffinity in the child).
"""

import json
import os

import pytest

from dsenv.facts.gpu.inventory import parse_gpu_list
from dsenv.facts.gpu.modes import mig_view, parse_compute_apps, parse_compute_modes
from dsenv.facts.launch import joblayout
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import clean_env, doctor, fake_nvidia_smi, tool
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

EXCLUSIVE = "gpu/nvidia_smi_compute_mode_exclusive.csv"
DEFAULT = "gpu/nvidia_smi_titanv_ada.csv"  # recorded: compute_cap, compute_mode, ..., index
APPS = "gpu/nvidia_smi_compute_apps_vgpu.csv"


def smi_env(tmp_path, modes, apps="", listing=None, **variables):
    folder = fake_nvidia_smi(tmp_path / "smi", modes=modes, apps=apps, listing=listing)
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


# -- gpu.mig ------------------------------------------------------------------------------------
# nvidia-smi -L as printed: an H200 with MIG off (recorded on a lent node), four A100s with MIG
# on GPU 0 only (telegraf#5812), one A100 in seven 1g.10gb instances (datadog-agent#33120)
H200_LIST = "gpu/nvidia_smi_L_h200.txt"
MIXED = "gpu/nvidia_smi_L_mig_mixed_a100.txt"
SEVEN = "gpu/nvidia_smi_L_mig_7x1g_a100.txt"
SLICE = "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"  # device 0 of SEVEN


def mig_env(tmp_path, listing, **variables):
    return smi_env(tmp_path, DEFAULT, listing=listing, **variables)


def test_the_gpu_list_parser_reads_the_recorded_outputs():
    (h200,) = parse_gpu_list(fixture_text(H200_LIST))
    assert h200.name == "NVIDIA H200" and h200.mig == ()
    mixed = parse_gpu_list(fixture_text(MIXED))
    assert [len(g.mig) for g in mixed] == [4, 0, 0, 0]
    assert mixed[0].mig[3].uuid == "MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b"
    (seven,) = parse_gpu_list(fixture_text(SEVEN))
    assert {d.profile for d in seven.mig} == {"1g.10gb"} and len(seven.mig) == 7
    # CUDA_VISIBLE_DEVICES applied: GPU indices, MIG UUIDs, an entry naming nothing
    assert len(mig_view(mixed, {}).devices) == 4 and len(mig_view(mixed, {}).whole) == 3
    view = mig_view(mixed, {"CUDA_VISIBLE_DEVICES": "1,2"})
    assert view.devices == () and [g.index for g in view.whole] == [1, 2]
    view = mig_view([seven], {"CUDA_VISIBLE_DEVICES": f"{SLICE},MIG-nothing,{seven.mig[1].uuid}"})
    assert [d.device for d in view.devices] == [0] and view.unknown == ("MIG-nothing",)


def test_a_gpu_without_mig_is_ok(make_ctx, run_one, tmp_path):
    """The healthy twin, on the H200's own listing."""
    ctx = make_ctx(env=mig_env(tmp_path, H200_LIST), target="compute", gpus_per_node=1)
    result = run_one("gpu.mig", ctx)
    assert result.status is Status.OK and result.summary == ("no GPU is MIG-partitioned: 1 whole "
                                                             "GPU(s)"), result


def test_more_ranks_than_one_mig_instance_per_process_fails(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=mig_env(tmp_path, SEVEN), target="compute", gpus_per_node=7)
    result = run_one("gpu.mig", ctx)
    assert result.status is Status.FAIL and result.mode == "gpu.mig-one-instance-per-process"
    assert "7 ranks per node" in result.summary and "rank 1 fails" in result.summary, result
    assert "7 MIG device(s) (7 x 1g.10gb)" in " ".join(result.evidence)
    # planned on a login node: a warning, the compute nodes may differ
    ctx = make_ctx(env=mig_env(tmp_path, SEVEN), target="login", gpus_per_node=7)
    assert run_one("gpu.mig", ctx).status is Status.WARN


def test_several_instances_for_one_process_warn(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env=mig_env(tmp_path, SEVEN), target="compute", gpus_per_node=1)
    result = run_one("gpu.mig", ctx)
    assert result.status is Status.WARN and "7 MIG instances visible to one process" in (
        result.summary), result


def test_one_instance_per_task_under_srun_is_ok(make_ctx, run_one, tmp_path):
    """Slurm's --gres=gpu:1g.10gb:1 per task: this task's CUDA_VISIBLE_DEVICES is its own slice;
    the same one slice handed by torchrun to two ranks fails."""
    env = mig_env(tmp_path, SEVEN, CUDA_VISIBLE_DEVICES=SLICE, SLURM_NTASKS_PER_NODE="7")
    result = run_one("gpu.mig", make_ctx(env=env, target="compute", launcher="srun"))
    assert result.status is Status.OK and SLICE in result.summary, result
    result = run_one("gpu.mig", make_ctx(env=env, target="compute", launcher="torchrun",
                                         gpus_per_node=2))
    assert result.status is Status.FAIL and "each rank sees 1 device(s)" in result.summary


def test_whole_gpus_beside_a_partitioned_one(make_ctx, run_one, tmp_path):
    # three whole GPUs and one instance of GPU 0 per process: four ranks fit, five do not
    ctx = make_ctx(env=mig_env(tmp_path, MIXED), target="compute", gpus_per_node=5)
    assert run_one("gpu.mig", ctx).status is Status.FAIL
    ctx = make_ctx(env=mig_env(tmp_path, MIXED), target="compute", gpus_per_node=4)
    assert run_one("gpu.mig", ctx).status is Status.WARN  # 4 instances, one used
    env = mig_env(tmp_path, MIXED, CUDA_VISIBLE_DEVICES="1,2,3")
    result = run_one("gpu.mig", make_ctx(env=env, target="compute", gpus_per_node=3))
    assert result.status is Status.OK and "hidden" in result.summary, result


def test_a_mig_uuid_the_node_lacks_is_a_device_that_does_not_exist(make_ctx, run_one, tmp_path):
    """Recorded on the H200 (tests/fixtures/explain_gpu/mig_uuid_absent.log): with a MIG UUID
    of no instance torch counted 0 devices and said 'No CUDA GPUs are available'. Before
    nvidia-smi -L was read, a MIG UUID kept every GPU visible and the doctor passed it."""
    folder = fake_nvidia_smi(tmp_path / "smi", modes=DEFAULT, listing=H200_LIST,
                             inventory="gpu/nvidia_smi_h200.csv")
    absent = "MIG-00000000-0000-0000-0000-000000000000"
    env = {"PATH": f"{folder}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "CUDA_VISIBLE_DEVICES": absent}
    ctx = make_ctx(env=env, target="compute")
    result = run_one("gpu.visible-devices", ctx)
    assert result.status is Status.FAIL and result.mode == "gpu.visible-devices-remapped"
    assert f"names device(s) that do not exist: {absent}" in result.summary, result
    assert run_one("gpu.devices", ctx).status is Status.FAIL  # nothing left visible
    result = run_one("gpu.mig", ctx)  # said once, by gpu.visible-devices
    assert result.status is Status.SKIP and "gpu.visible-devices reports it" in result.summary
    # the twin: a MIG UUID the node has keeps its parent GPU
    listing = fake_nvidia_smi(tmp_path / "smi7", modes=DEFAULT, listing=SEVEN,
                              inventory="gpu/nvidia_smi_h200.csv")
    env = {**env, "PATH": f"{listing}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": SLICE}
    result = run_one("gpu.visible-devices", make_ctx(env=env, target="compute"))
    assert result.status is Status.OK and "1 of 1 GPU(s) visible" in result.summary, result


def test_mig_skips_when_nvidia_smi_finds_nothing(make_ctx, run_one, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_one("gpu.mig", make_ctx(env={"PATH": str(empty)}))
    assert result.status is Status.SKIP and "nvidia-smi is not on PATH" in result.summary
    # the tool answers -L with an error (the fake knows no -L here)
    result = run_one("gpu.mig", make_ctx(env=smi_env(tmp_path, DEFAULT), target="compute"))
    assert result.status is Status.SKIP and "did not answer" in result.summary, result
    # it answers with nothing at all
    silent = tool(tmp_path / "silent", "nvidia-smi", "exit 0\n")
    result = run_one("gpu.mig", make_ctx(env={"PATH": f"{silent}:{os.environ['PATH']}"},
                                         target="compute"))
    assert result.status is Status.SKIP and "listed no GPU" in result.summary, result


def test_explain_here_runs_gpu_mig_on_the_node(tmp_path):
    """From the explanation to the proof: pytorch#131650's num_gpus assert with MIG is named
    gpu.mig-one-instance-per-process, and --here runs gpu.mig on this node: seven instances for
    seven ranks per node (Slurm's task count) show the cause; the H200's whole GPU does not."""
    from tests.harness.cli import dsenv
    from tests.harness.recorded import FIXTURES

    rows = (FIXTURES / "explain_symptoms" / "gpu.jsonl").read_text().splitlines()
    text = next(json.loads(r)["text"] for r in rows if "pytorch/issues/131650" in r)
    for listing, shows in ((SEVEN, "the cause is present here"), (H200_LIST, "not found here")):
        folder = fake_nvidia_smi(tmp_path / listing.replace("/", "-"), modes=DEFAULT,
                                 listing=listing)
        done = dsenv("explain", "--here", "--json", text, env={
            "PATH": f"{folder}:{os.environ['PATH']}", "SLURM_NTASKS_PER_NODE": "7"})
        match = json.loads(done.stdout)["matches"][0]
        assert match["id"] == "gpu.mig-one-instance-per-process", match["id"]
        here = " ".join(match["here"])
        assert "gpu.mig finds" in here and shows in here, here

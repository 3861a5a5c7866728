"""`dsenv doctor --distributed`: real ranks under every launcher (CPU, gloo, loopback), the
failures it must name (a rank that exits, sleeps forever or never arrives; singletons; a
wrong world size), and the pure logic underneath (exact sums, busbw, diagnosis, verdicts)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dsenv import proc
from dsenv.cli import main as dsenv_main
from dsenv.doctor.distributed import command as distributed
from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed import report as distributed_report
from dsenv.doctor.distributed.command import FAULT_VARIABLE, parse_fault
from dsenv.doctor.distributed.outcome import Outcome, WrongElement
from dsenv.verdicts.findings import Status
from tests.harness.cli import explain
from tests.harness.doctor_cli import report_of, statuses
from tests.harness.recorded import fixture_text

DOCTOR = [sys.executable, "-m", "dsenv", "doctor", "--distributed"]
QUICK = ["--sizes", "4K,64K", "--iters", "2", "--warmup", "1"]  # a few seconds of gloo


def rank_env(run_env, **extra):
    env = {k: v for k, v in run_env.items() if k != FAULT_VARIABLE}
    return dict(env, OMP_NUM_THREADS="1", **extra)


def assert_healthy(report: dict, launcher: str) -> None:
    seen = statuses(report)
    assert seen == {"distributed.launch": "ok", "distributed.rendezvous": "ok",
                    "distributed.environment": "ok", "distributed.devices": "skip",
                    "distributed.allreduce": "ok", "distributed.busbw": "info",
                    "distributed.links": "skip"}, seen
    dist = report["distributed"]
    assert dist["launcher"] == launcher and dist["world_size"] == 2 and dist["failure"] is None
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert len({r["pid"] for r in dist["ranks"]}) == 2
    assert all(r["interface"].startswith("lo") for r in dist["ranks"])
    assert [row["bytes"] for row in dist["allreduce"]] == [4096, 65536]
    assert all(row["wrong"] == 0 and row["busbw_gbps"] > 0 for row in dist["allreduce"])
    assert report["exit_code"] == 0


# ----------------------------------------------------------------------------- pure logic
def test_sizes_parse_and_print():
    assert [ranks.parse_size(s) for s in ("64M", "4k", "1GiB", "512", "2 MB")] == \
        [64 << 20, 4096, 1 << 30, 512, 2 << 20]
    assert ranks.format_size(64 << 20) == "64 MiB" and ranks.format_size(1000) == "1000 B"
    for bad in ("", "0", "12X", "-4K", "1.5M"):
        with pytest.raises(ValueError):
            ranks.parse_size(bad)


def test_busbw_follows_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: all-reduce busbw = algbw * 2(n-1)/n
    assert ranks.algorithm_bandwidth(64 << 20, 0.01) == pytest.approx(6.7108864)
    assert ranks.bus_bandwidth(10.0, 2) == 10.0
    assert ranks.bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert ranks.bus_bandwidth(10.0, 1) == 0.0


@pytest.mark.parametrize("world", [2, 3, 8, 64, 65, 512, 8192, 100_000])
def test_correctness_data_sums_exactly_in_float32_in_any_order(world):
    bound = ranks.exact_value_bound(world)
    rng = np.random.default_rng(world)
    a = rng.integers(-bound, bound + 1, 500).astype(np.float32)
    b = (rng.integers(1, bound + 1, 500) * rng.choice([-1, 1], 500)).astype(np.float32)
    coefficients = [ranks.rank_coefficient(r) for r in range(world)]
    assert sum(coefficients) == ranks.coefficient_sum(world)
    exact = world * a.astype(np.int64) + ranks.coefficient_sum(world) * b.astype(np.int64)
    assert np.abs(exact).max() < 2**24 and (b != 0).all()
    for order in (np.arange(world), np.arange(world)[::-1], rng.permutation(world)):
        total = np.zeros(500, np.float32)
        for r in order:
            total += a + np.float32(coefficients[r]) * b
        assert np.array_equal(total.astype(np.int64), exact)
    # and it detects a rank counted twice
    assert not np.array_equal((total + a + b).astype(np.int64), exact)
    # the bound is the largest that is exact: one more can leave float32's exact integers
    assert (bound + 1) * (world + ranks.coefficient_sum(world)) >= 2**24


def test_fault_hook_is_explicit():
    assert parse_fault(None) is None and parse_fault("") is None
    fault = parse_fault("exit=3:1@check")
    assert (fault.action, fault.rank, fault.stage, fault.code) == ("exit", 1, "check", 3)
    assert parse_fault("hang:0").stage == "check" and parse_fault("hang:0").action == "hang"
    for bad in ("1", "crash:1", "exit:1@later", "hang", "exit=x:1"):
        with pytest.raises(ValueError, match=FAULT_VARIABLE):
            parse_fault(bad)


def test_world_size_problems_compare_only_what_must_agree():
    assert ranks.world_size_problems("torchrun", 16, {"WORLD_SIZE": "16",
                                                      "SLURM_STEP_NUM_TASKS": "2"}, None) == []
    by_hand = ranks.world_size_problems("env", 4, {"WORLD_SIZE": "4",
                                                   "OMPI_COMM_WORLD_SIZE": "2"}, None)
    assert by_hand == ["WORLD_SIZE=4 was set by hand, but the launcher started 2 rank(s) "
                       "(OMPI_COMM_WORLD_SIZE=2)"]
    assert ranks.world_size_problems("srun", 2, {}, 8, "--nodes 2 x --gpus-per-node 4") == \
        ["srun gives a world of 2 rank(s), --nodes 2 x --gpus-per-node 4 says 8"]


def test_singleton_evidence():
    assert ranks.singleton_evidence(1, {}) == []
    assert ranks.singleton_evidence(2, {"SLURM_STEP_NUM_TASKS": "2"}) == []
    step = ranks.singleton_evidence(1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_ID": "0"})
    assert step == ["SLURM_STEP_NUM_TASKS=4: the launcher started 4 ranks, this one sees a "
                    "world of 1"]
    batch = ranks.singleton_evidence(1, {"SLURM_NTASKS": "8", "SLURM_JOB_ID": "7"})
    assert batch == ["SLURM_NTASKS=8 but no srun step: the job script ran this command once, "
                     "without srun"]
    assert ranks.singleton_evidence(1, {}, ["2 copies"]) == ["2 copies"]


def _gpu_records(uuids_by_rank, host="node1"):
    return [{"rank": r, "host": host, "device": f"cuda:{r}", "device_uuid": u}
            for r, u in enumerate(uuids_by_rank)]


def test_two_ranks_on_one_gpu_are_found_by_uuid():
    uuids = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", fixture_text("gpu/nvidia_smi_L_4x3090.txt"))
    assert len(uuids) == 4
    assert ranks.shared_devices(_gpu_records(uuids)) == []
    # ranks 2 and 3 on GPU 2: torch reports the UUID without nvidia-smi's "GPU-" prefix
    shared = _gpu_records([uuids[0], uuids[1], uuids[2], uuids[2][4:].upper()])
    assert ranks.shared_devices(shared) == [(f"GPU {uuids[2][4:]} on node1", [2, 3])]
    # the recorded A100 (nvidia-smi --query-gpu) on two hosts is two GPUs only when the
    # UUIDs differ: the same UUID twice is one GPU, whatever the host name says
    from dsenv.facts.gpu.inventory import parse_nvidia_csv

    a100 = parse_nvidia_csv(fixture_text("gpu/nvidia_smi_a100_470.csv"))[0]
    twice = _gpu_records([a100.uuid]) + [{"rank": 1, "host": "node2", "device": "cuda:0",
                                          "device_uuid": a100.uuid}]
    assert [r for _, r in ranks.shared_devices(twice)] == [[0, 1]]
    cpu = [{"rank": r, "host": "h", "device": "cpu", "device_uuid": None} for r in range(2)]
    assert ranks.shared_devices(cpu) == []
    by_bus = [{"rank": r, "host": "h", "device": "cuda:0", "device_bus_id": "0000:94:00.0"}
              for r in range(2)]
    assert ranks.shared_devices(by_bus) == [("GPU at PCI 0000:94:00.0 on h", [0, 1])]


def test_numa_nodes_from_cpulists(tmp_path):
    assert ranks.parse_cpulist("0-3,8-11\n") == {0, 1, 2, 3, 8, 9, 10, 11}
    for node, cpus in (("node0", "0-3"), ("node1", "4-7")):
        folder = tmp_path / "sys/devices/system/node" / node
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    assert ranks.numa_nodes_of({5}, tmp_path) == [1]
    assert ranks.numa_nodes_of({3, 4}, tmp_path) == [0, 1]
    assert ranks.numa_nodes_of(os.sched_getaffinity(0)) != []  # this machine's real sysfs


STEPS = ["start", "rendezvous", "init", "all-reduce check 4 KiB", "bandwidth 4 KiB", "gather",
         "done"]


def test_diagnosis_names_who_exited_who_never_came_and_who_is_behind():
    hosts = {0: "n0", 1: "n1", 2: "n2"}
    exited = ranks.diagnose(4, hosts, {0: 3, 2: 3}, {1: 2}, STEPS)
    assert [(c.rank, c.state) for c in exited] == [(1, "exited"), (3, "absent")]
    assert exited[0].detail == ("rank 1 (n1) exited before the end: its last step was "
                                "'init' (its connection closed)")
    assert exited[1].detail == ("rank 3 (host unknown: it never reported) did not arrive: "
                                "it never reached the rendezvous")
    stuck = ranks.diagnose(3, hosts, {0: 3, 1: 2, 2: 3}, {}, STEPS)
    assert [(c.rank, c.state, c.step) for c in stuck] == [(1, "stuck", "init")]
    assert ranks.diagnose(3, hosts, {0: 3, 1: 3, 2: 3}, {}, STEPS) == []  # nobody behind


def _plan(**kw):
    return distributed.Plan(timeout_s=30.0, **kw)


def _outcome(**kw) -> Outcome:
    """An outcome as rank 0's JSON has it, read back."""
    outcome = {"rank": 0, "launcher": "srun", "backend": "nccl", "world_size": 2,
               "master": "n0:29500", "timeout_s": 30.0, "seconds": 4.0, "warmup": 5, "iters": 20,
               "ranks": [{"rank": r, "host": f"n{r}", "local_rank": 0, "device": "cuda:0",
                          "device_uuid": f"u{r}", "pid": 100 + r} for r in range(2)],
               "allreduce": [{"bytes": 1 << 20, "count": 1 << 18, "type": "float",
                              "redop": "sum", "wrong": 0, "time_us": 100.0, "algbw_gbps": 10.5,
                              "busbw_gbps": 10.5},
                             {"bytes": 64 << 20, "count": 16 << 20, "type": "float",
                              "redop": "sum", "wrong": 0, "time_us": 3000.0,
                              "algbw_gbps": 22.4, "busbw_gbps": 22.4}],
               "timing": {"rendezvous_s": 0.5, "init_s": 1.0}, "failure": None,
               "fault_injected": None}
    outcome.update(kw)
    return Outcome.from_json(outcome)


@pytest.mark.parametrize("expected, status", [(22.0, Status.OK), (30.0, Status.WARN),
                                              (50.0, Status.FAIL)])
def test_bandwidth_verdict_against_the_expectation(expected, status, tmp_path):
    results = {r.id: r for r in distributed_report.results_from(
        _outcome(), _plan(expect_busbw=expected), prefix=tmp_path)}
    busbw = results["distributed.busbw"]
    assert busbw.status is status
    assert busbw.summary.startswith("busbw 22.40 GB/s at 64 MiB: ")
    assert (busbw.fix is None) == (status is Status.OK)
    assert results["distributed.devices"].status is Status.OK


STAGE_BUSBW = distributed_report.STAGES.index("busbw")


def test_bandwidth_expectation_comes_from_the_site_profile(tmp_path):
    # two hosts: inter-node; lumi.toml says 50 GB/s
    busbw = distributed_report.results_from(_outcome(), _plan(site="lumi"), prefix=tmp_path)[STAGE_BUSBW]
    assert busbw.status is Status.FAIL and "site lumi: expect_busbw_gbps.inter_node" in busbw.summary
    none = distributed_report.results_from(_outcome(), _plan(site="hpc5"), prefix=tmp_path)[STAGE_BUSBW]
    assert none.status is Status.INFO and "site hpc5 has no expect_busbw_gbps.inter_node" in none.summary
    # no --site, no provisioned environment: say how to give one
    bare = distributed_report.results_from(_outcome(), _plan(), prefix=tmp_path)[STAGE_BUSBW]
    assert bare.status is Status.INFO and "--expect-busbw" in bare.summary


def test_site_profiles_validate_expected_bandwidth():
    from dsenv.envs.sites import _problems, load_site

    assert load_site("lumi").expect_busbw_gbps == {"inter_node": 50.0}
    raw = {"name": "x", "default_kind": "venv", "expect_busbw_gbps": {"cross_rack": 5, "intra_node": -1}}
    found = _problems("x", raw)
    assert "[expect_busbw_gbps] 'cross_rack' is not one of intra_node, inter_node" in found
    assert "[expect_busbw_gbps] intra_node must be a number of GB/s above 0" in found


def test_wrong_sum_shared_gpu_and_later_stages():
    wrong = _outcome()
    wrong.allreduce[1].wrong = 3
    wrong.allreduce[1].first_wrong = WrongElement(index=7, got=1.0, expected=2.0)
    results = {r.id: r for r in distributed_report.results_from(wrong, _plan(expect_busbw=1.0))}
    assert results["distributed.allreduce"].status is Status.FAIL
    assert results["distributed.allreduce"].summary == \
        "wrong sum at 64 MiB: 3 of 16777216 elements differ"
    shared = _outcome(allreduce=[], failure={
        "kind": "aborted", "step": "rendezvous", "culprits": [],
        "message": "ranks 0, 1 share one GPU (GPU u0 on n0): each rank needs its own"})
    results = {r.id: r for r in distributed_report.results_from(shared, _plan())}
    assert results["distributed.devices"].status is Status.FAIL
    assert "--gpus-per-task=1" in results["distributed.devices"].fix
    assert results["distributed.launch"].status is Status.OK
    assert results["distributed.allreduce"].status is Status.SKIP
    stuck = _outcome(allreduce=[], failure={
        "kind": "timeout", "step": "all-reduce check 1 MiB", "message": "m",
        "culprits": [{"rank": 1, "host": "n1", "state": "stuck", "step": "init", "detail": "d"}]})
    results = {r.id: r for r in distributed_report.results_from(stuck, _plan())}
    assert results["distributed.allreduce"].status is Status.FAIL
    assert "py-spy dump --pid 101" in results["distributed.allreduce"].fix


def test_distributed_modules_import_no_torch():
    code = ("import sys, dsenv.doctor.distributed.command, dsenv.doctor.distributed.launch\n"
            "print([m for m in ('torch', 'deepspeed') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("argv, message", [
    (["--distributed", "--launch", "torchrun"], "--launch torchrun needs -n N"),
    (["--distributed", "-n", "2"], "-n needs --launch mpirun|torchrun"),
    (["--distributed", "--launch", "mpirun", "-n", "1"], "one rank has nobody to talk to"),
    (["--timeout", "5"], "--timeout needs --distributed"),
    (["--only", "distributed"], "--only distributed needs --distributed"),
    (["--distributed", "--sizes", "64X"], "--sizes: '64X' is not a size"),
    (["--distributed", "--site", "atlantis"], "--site atlantis: unknown site"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert dsenv_main(["doctor", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsenv doctor: ") and message in err[0], err


def test_a_mistyped_fault_hook_is_refused(capsys, monkeypatch):
    monkeypatch.setenv(FAULT_VARIABLE, "hang-1")
    assert dsenv_main(["doctor", "--distributed"]) == 2
    assert FAULT_VARIABLE in capsys.readouterr().err


# ----------------------------------------------------------------------------- real ranks
def test_launch_torchrun_joins_the_full_doctor_report(tmp_path, run_env):
    ran = proc.run([*DOCTOR, "--launch", "torchrun", "-n", "2", *QUICK, "--json"], timeout=120,
                   env=rank_env(run_env), cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    report = report_of(ran.stdout)
    assert_healthy(report, "torchrun")
    areas = {r["area"] for r in report["results"]}
    assert {"system", "python", "distributed"} <= areas  # the normal checks ran too
    assert report["distributed"]["launched"]["returncode"] == 0


def test_launch_mpirun_prints_one_table(tmp_path, run_env):
    if proc.which("mpirun", run_env) is None:
        pytest.skip("mpirun not installed")
    ran = proc.run([*DOCTOR, "--launch", "mpirun", "-n", "2", *QUICK, "--only", "distributed"],
                   timeout=120, env=rank_env(run_env), cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    out = ran.stdout
    assert out.count("dsenv doctor --distributed — 2 ranks under mpirun, backend gloo") == 1
    table = out[out.index("rank  host"):out.index("all-reduce")]
    assert len(re.findall(r"^\s+[01]\s+\S+\s+[01]\s+cpu", table, re.M)) == 2
    assert re.search(r"^\s+65536\s+16384\s+float\s+sum\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+0$", out, re.M)
    assert "✓  All-reduce is exact" in out and "4 ok, 1 info, 2 skipped" in out


def _under(launcher: str, env: dict) -> list[str]:
    dsenv = ["-m", "dsenv", "doctor", "--distributed", *QUICK, "--only", "distributed", "--json"]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", env["MASTER_PORT"], *dsenv]
    if launcher == "deepspeed":  # --num_gpus: without GPUs the launcher counts NUMA nodes
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                "--master_port", env["MASTER_PORT"], "--module", *dsenv[1:]]
    if shutil.which("mpirun", path=env.get("PATH")) is None:
        pytest.skip("mpirun not installed")
    exported = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "PATH")
    return ["mpirun", "--allow-run-as-root", "-np", "2",
            *[arg for var in exported for arg in ("-x", var)], sys.executable, *dsenv]


@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("deepspeed", marks=pytest.mark.slow),
                                      "mpirun"])
def test_under_a_launcher_rank_0_reports(tmp_path, run_env, launcher):
    env = rank_env(run_env)
    ran = proc.run(_under(launcher, env), timeout=120, env=env, cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    assert_healthy(report_of(ran.stdout), launcher)
    assert ran.stdout.count('"schema": "dsenv.doctor/1"') == 1  # rank 0 only


@pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")
def test_under_srun(slurm, tmp_path, run_env):
    env = slurm.env(rank_env(run_env))
    ran = slurm.run(["srun", "-n", "2", "--mpi=pmix", sys.executable, "-m", "dsenv", "doctor",
                     "--distributed", *QUICK, "--only", "distributed", "--json"],
                    timeout=120, env=env, cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    report = report_of(ran.stdout)
    assert_healthy(report, "srun")
    assert report["distributed"]["master"] == f"127.0.0.1:{env['MASTER_PORT']}"


@pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")
def test_under_srun_a_rank_that_exits_is_named(slurm, tmp_path, run_env):
    # no MASTER_ADDR/PORT: derived from the step as the workloads do (one node: loopback; the
    # port 20000 + job id % 20000); srun keeps rank 0 running when rank 1 exits
    env = {k: v for k, v in slurm.env(rank_env(run_env, **{FAULT_VARIABLE: "exit=4:1"})).items()
           if k not in ("MASTER_ADDR", "MASTER_PORT")}
    start = time.monotonic()
    ran = slurm.run(["srun", "-n", "2", sys.executable, "-m", "dsenv", "doctor", "--distributed",
                     *QUICK, "--only", "distributed", "--json", "--timeout", "30"],
                    timeout=120, env=env, cwd=str(tmp_path))
    assert time.monotonic() - start < 30  # named when it left, not at the deadline
    assert ran.returncode != 0, explain(ran)
    report = report_of(ran.stdout)
    port = int(report["distributed"]["master"].removeprefix("127.0.0.1:"))
    assert 20000 <= port < 40000
    culprits = report["distributed"]["failure"]["culprits"]
    assert [(c["rank"], c["state"]) for c in culprits] == [(1, "exited")]


# ----------------------------------------------------------------------------- failures
def _timed_run(argv, env, tmp_path, timeout_s):
    start = time.monotonic()
    ran = proc.run(argv, timeout=timeout_s + 60, env=env, cwd=str(tmp_path))
    elapsed = time.monotonic() - start
    assert not ran.timed_out, explain(ran)
    assert elapsed < timeout_s + 10, f"returned after {elapsed:.1f} s\n" + explain(ran)
    return ran, elapsed


@pytest.mark.parametrize("fault, state", [("exit:1", "exited"),
                                          pytest.param("hang:1", "stuck", marks=pytest.mark.slow)])
def test_a_rank_that_exits_or_sleeps_forever_is_named(tmp_path, run_env, fault, state):
    timeout = 12
    env = rank_env(run_env, **{FAULT_VARIABLE: fault})
    ran, elapsed = _timed_run([*DOCTOR, "--launch", "torchrun", "-n", "2", *QUICK,
                               "--only", "distributed", "--timeout", str(timeout), "--json"],
                              env, tmp_path, timeout)
    assert ran.returncode == 1, explain(ran)
    report = report_of(ran.stdout)
    failure = report["distributed"]["failure"]
    host = report["distributed"]["ranks"][1]["host"]
    assert [(c["rank"], c["host"], c["state"]) for c in failure["culprits"]] == \
        [(1, host, state)]
    assert failure["message"].startswith(f"rank 1 ({host}) ")
    assert statuses(report)["distributed.allreduce"] == "fail"
    assert statuses(report)["distributed.busbw"] == "skip"
    assert report["distributed"]["fault_injected"].startswith(FAULT_VARIABLE)
    if state == "exited":  # known at once, not at the deadline
        assert elapsed < timeout


@pytest.mark.slow  # runs to its --timeout by design
def test_a_rank_that_never_arrives_is_named(tmp_path, run_env):
    if proc.which("mpirun", run_env) is None:
        pytest.skip("mpirun not installed")
    timeout = 10
    env = rank_env(run_env, **{FAULT_VARIABLE: "hang:1@start"})
    ran, _ = _timed_run([*DOCTOR, "--launch", "mpirun", "-n", "2", *QUICK, "--only",
                         "distributed", "--timeout", str(timeout)], env, tmp_path, timeout)
    assert ran.returncode == 1, explain(ran)
    assert "✗  Every rank arrives" in ran.stdout
    flat = " ".join(ran.stdout.split())
    host = socket.gethostname()  # one node: where the missing rank was started
    assert (f"rank 1 ({host}) did not arrive: it never reached the rendezvous (the run did "
            f"not finish within {timeout} s)") in flat


def test_exit_under_external_mpirun_is_named_by_rank_0(tmp_path, run_env):
    env = rank_env(run_env, **{FAULT_VARIABLE: "exit=3:1"})
    argv = _under("mpirun", env)
    argv[argv.index("-np"):argv.index("-np")] = ["-x", FAULT_VARIABLE]
    ran, elapsed = _timed_run([*argv, "--timeout", "20"], env, tmp_path, 20)
    assert ran.returncode != 0
    report = report_of(ran.stdout)
    assert [(c["rank"], c["state"]) for c in report["distributed"]["failure"]["culprits"]] == \
        [(1, "exited")]
    assert elapsed < 20  # named when it left, not at the deadline


# The silent-singleton detector counts copies of its own command line under its parent, or its
# grandparent when it is the parent's only child: from a pytest worker that is the xdist
# controller, whose tree holds the other worker too. The two tests that run the bare command
# share one worker, so neither sees the other's copies (a CI run failed on that race).
SINGLETON_GROUP = pytest.mark.xdist_group("singleton-detector")


@SINGLETON_GROUP
def test_two_independent_single_rank_processes_are_singletons(tmp_path, run_env):
    env = rank_env(run_env)
    command = " ".join([*DOCTOR, "--only", "distributed", "--json"])
    # started a moment apart, as the tasks of one srun step are
    ran = proc.run(["sh", "-c", f"{command} > a.json & sleep 0.3; {command} > b.json & wait"],
                   timeout=60, env=env, cwd=str(tmp_path))
    assert ran.returncode == 0, explain(ran)
    for name in ("a.json", "b.json"):
        report = report_of((tmp_path / name).read_text())
        assert statuses(report)["distributed.launch"] == "fail"
        failure = report["distributed"]["failure"]
        assert failure["kind"] == "singletons"
        assert re.fullmatch(r"2 copies of this command run side by side under sh \(pid \d+; "
                            r"pids \d+, \d+\), each sees rank 0 of 1", failure["evidence"][0])
        assert report["exit_code"] == 1


@SINGLETON_GROUP
def test_a_lone_process_is_a_warning_and_a_batch_script_without_srun_a_singleton(tmp_path,
                                                                                  run_env):
    env = rank_env(run_env)
    alone = proc.run([*DOCTOR, "--only", "distributed", "--json"], timeout=60, env=env,
                     cwd=str(tmp_path))
    assert alone.returncode == 0, explain(alone)
    assert statuses(report_of(alone.stdout))["distributed.launch"] == "warn"
    batch = proc.run([*DOCTOR, "--only", "distributed", "--json"], timeout=60, cwd=str(tmp_path),
                     env=dict(env, SLURM_JOB_ID="42", SLURM_NTASKS="4"))
    assert batch.returncode == 1, explain(batch)
    assert report_of(batch.stdout)["distributed"]["failure"]["evidence"] == [
        "SLURM_NTASKS=4 but no srun step: the job script ran this command once, without srun"]


def test_a_world_size_other_than_expected_stops_every_rank_at_once(tmp_path, run_env):
    env = rank_env(run_env)
    argv = _under("torchrun", env) + ["--expect-world-size", "3"]
    ran = proc.run(argv, timeout=120, env=env, cwd=str(tmp_path))
    assert ran.returncode != 0
    report = report_of(ran.stdout)
    assert report["distributed"]["failure"]["message"] == \
        "torchrun gives a world of 2 rank(s), --expect-world-size says 3"
    assert report["distributed"]["allreduce"] == []  # nobody waited for a third rank
    # rank 1 reaches the same verdict, but torchrun may stop it before it prints (rank 0's
    # exit tears the group down): its line is not asserted, it was a race in CI


def test_rank_0_stops_the_run_for_a_shared_gpu_or_a_world_disagreement():
    from dsenv.doctor.distributed.rank import RankRun
    from dsenv.workloads.launch.env import RankInfo

    uuids = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", fixture_text("gpu/nvidia_smi_L_4x3090.txt"))
    info = RankInfo("srun", 0, 0, 4, 4, "127.0.0.1", 29500)
    run = RankRun(_plan(), info, {}, emit=lambda outcome: 0)
    run.records = {r: dict(rec, world_size=4) for r, rec in enumerate(_gpu_records(uuids))}
    assert run.record_problems() == []
    run.records[3]["device_uuid"] = uuids[1]
    run.records[2]["world_size"] = 8
    assert run.record_problems() == [
        "ranks disagree on the world size: rank 2 (node1) says 8, rank 0 says 4",
        f"ranks 1, 3 share one GPU (GPU {uuids[1][4:]} on node1): each rank needs its own"]

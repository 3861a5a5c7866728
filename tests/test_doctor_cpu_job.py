"""CPU jobs are jobs, through the real command: `--gpus-per-node 0` is accepted, a CPU job on
a compute target passes gpu.devices, and each GPU-job twin (GPUs planned, Slurm GPU
variables, DS_ACCELERATOR=cuda) fails it. No GPU tool is on PATH, so every machine agrees."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dsenv.cli import build_parser
from dsenv.doctor.distributed.command import make_plan
from tests.harness.cli import dsenv

DOCTOR = ["doctor", "--target", "compute", "--only", "gpu"]
GPU_VARIABLES = ("SLURM_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
                 "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES",
                 "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "DS_ACCELERATOR", "NO_COLOR")


def doctor(*args, **variables):
    """`dsenv doctor --target compute --only gpu ARGS` without the GPU variables of this
    process, with ``variables``; only the interpreter's folder on PATH."""
    return dsenv(*DOCTOR, *args, drop=GPU_VARIABLES, timeout=60,
                 env={"PATH": str(Path(sys.executable).parent), **variables})


def devices(done) -> dict:
    report = json.loads(done.stdout)
    (result,) = [r for r in report["results"] if r["id"] == "gpu.devices"]
    return result


@pytest.mark.parametrize("args, variables", [
    (["--gpus-per-node", "0"], {"DS_ACCELERATOR": "cpu"}),
    (["--gpus-per-node", "0"], {"DS_ACCELERATOR": "cuda"}),  # the plan given here wins
    ([], {"DS_ACCELERATOR": "cpu", "SLURM_JOB_ID": "9", "SLURM_JOB_PARTITION": "cpu"}),
], ids=["gpus-per-node-0", "plan-over-accelerator", "cpu-partition"])
def test_a_cpu_job_is_ready_to_run(args, variables):
    done = doctor("--json", *args, **variables)
    assert done.returncode == 0, done.stdout + done.stderr
    result = devices(done)
    assert result["status"] == "ok" and "a CPU job" in result["summary"]
    screen = doctor(*args, **variables)
    assert screen.stdout.splitlines()[0] == "ready to run: 0 failures, 0 warnings"
    assert screen.returncode == 0


@pytest.mark.parametrize("args, variables, reason", [
    (["--gpus-per-node", "4"], {"DS_ACCELERATOR": "cpu"}, "--gpus-per-node 4"),
    ([], {"SLURM_JOB_ID": "9", "SLURM_GPUS_ON_NODE": "4", "DS_ACCELERATOR": "cpu"},
     "SLURM_GPUS_ON_NODE=4"),
    ([], {"SLURM_JOB_ID": "9", "SLURM_GPUS": "2"}, "SLURM_GPUS=2"),
    ([], {"DS_ACCELERATOR": "cuda"}, "DS_ACCELERATOR=cuda"),
], ids=["gpus-per-node-4", "slurm-gpus-on-node", "slurm-gpus", "ds-accelerator-cuda"])
def test_a_gpu_job_without_a_gpu_is_not_ready(args, variables, reason):
    done = doctor("--json", *args, **variables)
    assert done.returncode == 1
    result = devices(done)
    assert result["status"] == "fail" and reason in result["summary"]
    screen = doctor(*args, **variables)
    assert screen.stdout.splitlines()[0] == "not ready: 1 failure, 0 warnings"
    assert screen.returncode == 1


def _plan(*argv):
    return make_plan(build_parser().parse_args(["doctor", "--distributed", *argv]), {})


def test_distributed_world_size_from_the_gpu_count_and_a_cpu_job():
    # --gpus-per-node 0 is accepted; a CPU job's ranks per node are the launcher's choice,
    # so no world size is inferred from it...
    assert _plan("--nodes", "2", "--gpus-per-node", "0").expect_world_size is None
    # ... it is named with --expect-world-size; a GPU count still multiplies.
    cpu = _plan("--nodes", "2", "--gpus-per-node", "0", "--expect-world-size", "8")
    assert (cpu.expect_world_size, cpu.expect_world_from) == (8, "--expect-world-size")
    gpu = _plan("--nodes", "2", "--gpus-per-node", "4")
    assert (gpu.expect_world_size, gpu.expect_world_from) == (8, "--nodes 2 x --gpus-per-node 4")

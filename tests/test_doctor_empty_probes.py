"""Every registered check against a node whose probes find nothing (issue 23).

An empty root (no /sys, /proc, /dev, /etc), a PATH folder with no command in it, an empty
HOME, an empty folder as the Python environment, and a job shape that makes the multi-node
checks run (--nodes 2 with a launcher). Three such nodes: nothing at all; DeepSpeed's
launcher with a hostfile of two hosts, none of which answers (no ssh); an srun launch inside
a two-node allocation, whose srun step cannot start (no srun on PATH). The last two set the
variables the per-host checks judge (MASTER_ADDR, the interface and HCA variables), so they
reach the code that reads the hosts' answers.

Two more put a stub of every command the probes run on PATH (nvidia-smi, rocminfo, nvcc, c++,
ompi_info, srun, ssh, ...), each exiting 0 and printing nothing: empty output, not absence.

On each, no check may raise (a contained exception is an ERROR result with a traceback), a
skip says why, and no check may pass vacuously: an ``ok`` whose summary counts nothing ("on
all 0 hosts", "(0 checked)", "0 GPU(s)", "nothing to check") vouches for nothing, and must be
a skip with the reason (or an info, where what was found is worth showing).
"""

from __future__ import annotations

import re
import time

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import all_checks
from dsenv.doctor.runner import run_checks
from dsenv.verdicts.findings import Result, Status

# An ok summary that counts zero things, or says there was nothing to judge.
VACUOUS = re.compile(
    r"\b(?:all|every|each|any|none of|of)\s+0\b"  # "on all 0 hosts", "0 of 0"
    r"|(?<![\w.:=/+-])0\s+(?:of|checked|found|judged|tested)\b"  # "(0 checked)"
    r"|(?<![\w.:=/+-])0\s+(?!bytes\b|seconds\b)[A-Za-z]+(?:s|\(s\))(?![\w(])"  # "0 hosts"
    r"|\bnothing (?:to|was) (?:check|compare|judge|test)",
    re.IGNORECASE)

# Every command a probe runs, present, exiting 0 and printing nothing.
SILENT_TOOLS = ("nvidia-smi", "amd-smi", "rocm-smi", "rocminfo", "nvcc", "hipcc", "c++", "g++",
                "ninja", "ldconfig", "mpirun", "mpiexec", "ompi_info", "srun", "ssh", "pdsh",
                "python3", "ip")
JUDGED = {"MASTER_ADDR": "node-a", "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0",
          "NCCL_IB_HCA": "mlx5_0"}
SLURM = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
NODES = {
    # name: (extra variables, launcher, target, a hostfile of two hosts, silent tools on PATH)
    "nothing": ({}, "deepspeed", "login", False, False),
    "ssh-hosts-silent": (JUDGED, "deepspeed", "compute", True, False),
    "srun-hosts-silent": ({**SLURM, **JUDGED}, "srun", "compute", False, False),
    "tools-print-nothing": ({**SLURM, **JUDGED}, "srun", "compute", True, True),
    "ssh-prints-nothing": (JUDGED, "deepspeed", "compute", True, True),
}


def vacuous(result: Result) -> bool:
    return result.status is Status.OK and bool(VACUOUS.search(result.summary))


@pytest.mark.parametrize("case", ["0 hosts", "exist on all 0 hosts", "reaches them (0 checked)",
                                  "covers all 0 GPU(s)", "0 of 0 ports active",
                                  "none installed here; nothing to check"])
def test_the_rule_catches_zero_counts(case):
    assert vacuous(Result("x.y", "x", "", Status.OK, case))
    assert not vacuous(Result("x.y", "x", "", Status.SKIP, case))


@pytest.mark.parametrize("case", ["port 29500 is free on this node", "Linux, glibc 2.36",
                                  "CUDA_VISIBLE_DEVICES=0 selects GPU 0", "cuda:0 ran",
                                  "2 hosts answered in 0.0 s", "10 GPU(s)", "sm_80 covers 8.0",
                                  "free: 0 bytes reserved"])
def test_the_rule_leaves_real_counts_alone(case):
    assert not vacuous(Result("x.y", "x", "", Status.OK, case))


def _context(tmp_path, name: str) -> Context:
    extra, launcher, target, hostfile, tools = NODES[name]
    for folder in ("root", "bin", "home", "prefix"):
        (tmp_path / folder).mkdir()
    for tool in SILENT_TOOLS if tools else ():
        (tmp_path / "bin" / tool).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    if hostfile:  # DeepSpeed's default --hostfile, under the node's root
        (tmp_path / "root" / "job").mkdir()
        (tmp_path / "root" / "job" / "hostfile").write_text("node-a slots=1\nnode-b slots=1\n")
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path / "home"), **extra}
    options = Options(target=target, launcher=launcher, nodes=2, probe_timeout=1.0)
    return Context(options=options, env=env, root=tmp_path / "root",
                   python_prefix=tmp_path / "prefix")


@pytest.mark.parametrize("name", list(NODES))
def test_no_check_raises_or_passes_vacuously_when_probes_find_nothing(tmp_path, name):
    checks = all_checks()
    ctx = _context(tmp_path, name)
    started = time.monotonic()
    results = run_checks(checks, ctx)
    assert time.monotonic() - started < 20
    assert len(results) == len(checks)
    raised = [f"{r.id}: {r.summary}" for r in results
              if r.status is Status.ERROR or r.traceback]
    hollow = [f"{r.id}: {r.summary}" for r in results if vacuous(r)]
    unexplained = [r.id for r in results if r.status is Status.SKIP and len(r.summary) < 12]
    assert not raised and not hollow and not unexplained, (
        "checks that raised:\n" + "\n".join(raised) + "\nchecks that pass on nothing:\n" +
        "\n".join(hollow) + "\nchecks that skip without a reason: " + ", ".join(unexplained))


def test_the_silent_hosts_are_named_once_and_the_per_host_checks_skip(tmp_path, run_one):
    ctx = _context(tmp_path, "ssh-hosts-silent")
    answer = run_one("launch.hosts-answer", ctx)
    assert answer.status is Status.FAIL and "node-a, node-b" in answer.summary, answer
    for check_id in ("launch.hosts-paths", "launch.hosts-master", "launch.hosts-ifname"):
        result = run_one(check_id, ctx)
        assert result.status is Status.SKIP, result
        assert "none of the 2 hosts answered over ssh" in result.summary, result

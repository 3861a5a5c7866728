"""`dsenv provision --dry-run` always prints the whole plan: the arch variable DeepSpeed's op
builds read, the ops (omissions grouped by reason), every step, and a missing lock as the
step that locks on site rather than a stop. An unknown op in --ops is a usage error (exit 2,
one line naming it and the known ones) in a dry run as in a real one.

Each dry run asks this interpreter's DeepSpeed for its op builders (~2 s).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dsenv.envs.targets import resolve_arch
from dsenv.provision.ops.choose import UnknownOpError, check_op_names
from dsenv.provision.ops.reasons import group_omissions
from dsenv.provision.uvcmd import index_unreachable
from tests.harness.cli import dsenv, one_line

WIDE = {"COLUMNS": "400"}


def dry_run(tmp_path: Path, *args: str, env=None, stops: bool = False):
    """(header, steps) of a dry run; ``stops``: the plan is the refusal the real run stops
    with, and the dry run exits as the real run would (2, the same one line on stderr)."""
    prefix = tmp_path / "envs" / "env"
    done = dsenv("provision", *args, "--prefix", str(prefix), "--dry-run",
                 env={**WIDE, **(env or {})})
    assert done.returncode == (2 if stops else 0), done.stdout + done.stderr
    assert not prefix.parent.exists()  # a dry run writes nothing
    marker = "\nsteps: none: the real run stops while it plans:" if stops else "\nsteps ("
    header, steps = done.stdout.split(marker, 1)
    if stops:
        stop, = [line for line in steps.splitlines() if line.startswith("- ")]  # one step
        said = one_line(done, "dsenv provision: ")
        assert stop.endswith(f"STOPS THE REAL RUN HERE: {said}"), (stop, said)
        assert "  note    ops" not in header  # notes say only what will happen
    return header, steps


def line_of(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(start))


def test_gfx90a_plans_the_site_lock_and_groups_the_gpu_ops_without_hipcc(tmp_path):
    env = {"ROCM_PATH": "", "ROCM_HOME": "", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    closed = index_unreachable("https://download.pytorch.org/whl/rocm7.2", 5)
    header, steps = dry_run(tmp_path, "--arch", "gfx90a", env=env, stops=bool(closed))
    assert line_of(header, "arch").split() == ["arch", "PYTORCH_ROCM_ARCH=gfx90a"]
    assert "stack   rocm7.2: torch==2.13.0+rocm7.2" in header
    assert "none committed for stack rocm7.2: locked on site" in line_of(header, "lock")
    first = steps.split("\n- ")[1]
    assert first.startswith("lock on site against https://download.pytorch.org/whl/rocm7.2")
    if closed:  # this machine: the real run stops while it plans, and so does the plan
        assert "uv pip compile" not in steps and "uv pip sync" not in steps
    else:
        assert "requirements && uv pip compile rocm7.2.in -o " in first
    # with a lock given, the plan goes on: the ops, grouped by reason, AMD advice only
    lock = tmp_path / "given-lock.txt"
    lock.write_text("")
    header, steps = dry_run(tmp_path, "--arch", "gfx90a", "--lock", str(lock), env=env)
    assert "uv pip sync --require-hashes" in steps and str(lock) in steps
    assert re.search(r" PYTORCH_ROCM_ARCH=gfx90a uv pip install --python \S+ "
                     r"--no-build-isolation", steps)
    assert "deepspeed-kernels)" not in header.replace("(nvidia-cutlass, deepspeed-kernels)", "")
    assert "pip install deepspeed-kernels" not in header and "Install nvidia-cutlass" not in header
    assert "omit cutlass_ops: NVIDIA only" in header
    if Path("/opt/rocm").exists():
        pytest.skip("this machine has /opt/rocm: hipcc may be found")
    grouped = re.search(r"ops: omit (\d+) GPU ops \(([^)]*)\): no hipcc here", header)
    assert grouped, header
    ops = grouped.group(2).split(", ")
    assert int(grouped.group(1)) == len(ops) >= 10 and "fused_adam" in ops
    assert header.count("no hipcc here") == 1  # one line for the reason, not one per op


@pytest.mark.parametrize("arch, variable", [("8.0", "TORCH_CUDA_ARCH_LIST=8.0"),
                                            ("8.0;9.0", "TORCH_CUDA_ARCH_LIST='8.0;9.0'")])
def test_nvidia_plans_show_the_arch_list_the_ops_and_the_committed_lock(tmp_path, arch,
                                                                        variable):
    header, steps = dry_run(tmp_path, "--arch", arch)
    assert line_of(header, "arch").split() == ["arch", variable]
    assert line_of(header, "lock").endswith("envs/locks/cuda13.0.txt")
    assert "lock on site" not in steps
    assert re.search(r"ops \(DeepSpeed [0-9.]+ here\): build ", header)
    assert "fused_adam" in header  # built, or omitted with its reason
    assert re.search(rf" {re.escape(variable)} uv pip install --python \S+ "
                     r"--no-build-isolation", steps)
    assert "uv pip sync --require-hashes" in steps and "verify" in steps


def test_cpu_plan_has_no_arch_variable_and_builds_the_cpu_ops(tmp_path):
    header, steps = dry_run(tmp_path, "--arch", "cpu")
    assert "none (CPU target" in line_of(header, "arch")
    assert line_of(header, "lock").endswith("envs/locks/cpu.txt")
    built = line_of(header, "note    ops (DeepSpeed").split("build ", 1)[1].split(", ")
    assert "cpu_adam" in built
    assert "TORCH_CUDA_ARCH_LIST" not in steps and "PYTORCH_ROCM_ARCH" not in steps


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "real"])
def test_an_unknown_op_is_a_usage_error_naming_it_and_the_known_ones(tmp_path, dry):
    prefix = tmp_path / "envs" / "env"
    done = dsenv("provision", "--arch", "cpu", "--ops", "cpu_adam,no_such_op", "--prefix",
                 str(prefix), *(["--dry-run"] if dry else []))
    line = one_line(done, "dsenv provision: --ops cpu_adam,no_such_op: unknown op(s) "
                          "no_such_op; DeepSpeed ")
    known = line.split(" knows: ", 1)[1].split(", ")
    assert "cpu_adam" in known and "no_such_op" not in known
    assert not prefix.parent.exists()


def test_known_op_names_pass_the_early_check():
    check_op_names(resolve_arch("cpu"), "cpu_adam,fused_adam")  # no error
    with pytest.raises(UnknownOpError):
        check_op_names(resolve_arch("cpu"), "fused_lamb")  # a CUDA op: not cpu's


def test_omissions_are_grouped_by_reason_most_ops_first():
    omitted = {"a": "no hipcc here", "b": "no hipcc here", "c": "not linked", "d": "no hipcc here",
               "e": "cannot import"}
    lines = group_omissions(omitted, gpu_ops=("a", "b", "d"))
    assert lines[0] == "3 GPU ops (a, b, d): no hipcc here"
    assert sorted(lines[1:]) == ["c: not linked", "e: cannot import"]
    assert group_omissions({"a": "x", "c": "x"}, gpu_ops=("a",)) == ["2 ops (a, c): x"]
    assert group_omissions({}) == []


def test_a_dry_run_shows_no_arch_variable_from_the_callers_shell(tmp_path):
    """The plan's variable is the target's, not a stray TORCH_CUDA_ARCH_LIST in the shell."""
    header, _steps = dry_run(tmp_path, "--arch", "8.0",
                             env={"TORCH_CUDA_ARCH_LIST": "7.0;7.5"})
    assert line_of(header, "arch").split() == ["arch", "TORCH_CUDA_ARCH_LIST=8.0"]


def test_volta_with_a_cuda13_nvcc_plans_and_shows_where_the_real_run_stops(tmp_path):
    """nvcc 13 cannot build sm_70 and no CUDA 12 nvcc comes from PyPI's wheels: the real run
    refuses in one line before it installs anything, and the dry run says so: the refusal
    is its one step, and it exits 2 with the same line."""
    if not Path("/usr/local/bin/nvcc").exists() and not shutil.which("nvcc"):
        pytest.skip("needs the CUDA 13 nvcc this machine has")
    header, steps = dry_run(tmp_path, "--arch", "7.0", stops=True)
    assert line_of(header, "arch").split() == ["arch", "TORCH_CUDA_ARCH_LIST=7.0"]
    stop = line_of(steps, "- DeepSpeed ops --ops auto: STOPS THE REAL RUN HERE")
    assert "cannot build sm_70" in stop and "nvidia-cuda-nvcc-cu12" in stop
    assert "uv pip sync" not in steps and steps.count("DeepSpeed ops") == 1
    real = dsenv("provision", "--arch", "7.0", "--prefix", str(tmp_path / "real"))
    assert not (tmp_path / "real").exists() and real.returncode == 2
    assert stop.endswith(one_line(real, "dsenv provision: "))
    none = dry_run(tmp_path, "--arch", "7.0", "--ops", "none")[1]
    assert "STOPS THE REAL RUN HERE" not in none  # its healthy twin: no ops, no nvcc needed

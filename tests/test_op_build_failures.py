"""A DeepSpeed op that fails to JIT-build during `dsenv smoke|run`: one line naming the op,
the compiler and targets, the log holding the whole failure and the doctor check; exit 1,
no traceback. Staged for real on the CPU with CXX=/bin/false (torch asks the compiler for
its version first, so the failure is immediate), beside its healthy twin.
"""

from __future__ import annotations

import re

import pytest

from dsenv.workloads.training import opbuild
from tests.harness.cli import dsenv

SMOKE = ("smoke", "bert-squad", "--preset", "zero3-offload", "--examples", "1")


def test_a_failed_jit_build_ends_in_one_line(tmp_path, run_env):
    """A fresh extensions folder: the first op the smoke builds fails (cpu_adam, at
    deepspeed.initialize; one rank builds no shm_comm)."""
    env = {**run_env, "CXX": "/bin/false", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    done = dsenv(*SMOKE, "--output-dir", tmp_path / "out", env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("dsenv smoke bert-squad: DeepSpeed op cpu_adam failed to "
                           "JIT-build (RuntimeError: DeepSpeedCPUAdam requires the cpu_adam op")
    assert "with C++ compiler /bin/false (CXX) for the host CPU" in line
    assert "check: `dsenv doctor --only toolkit` (toolkit.compiler)" in line
    log = tmp_path / "ext" / "cpu_adam" / opbuild.LOG_NAME
    assert f"full log: {log};" in line
    text = log.read_text()
    assert "compilers: C++ compiler /bin/false (CXX)" in text
    assert "Traceback" in text and "check_compiler_ok_for_platform" in text
    assert not (tmp_path / "ext" / "deepspeed_shm_comm").exists()


@pytest.mark.slow
def test_its_healthy_twin_passes(tmp_path, run_env, no_references):
    """The same smoke with the compiler left alone (the session's extensions folder: its
    first run builds cpu_adam, ~2 min on 2 cores)."""
    done = dsenv(*SMOKE, "--references", no_references, "--output-dir", tmp_path / "out",
                 env=run_env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not re.search(r"failed to JIT-build|Traceback", done.stdout + done.stderr)


def test_a_failure_through_deepspeeds_jit_load_names_its_op(tmp_path, monkeypatch):
    """DeepSpeed's own OpBuilder.jit_load, refusing an op it deems incompatible."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    class Refused(OpBuilder):
        NAME = "dsenv_refused_op"

        def __init__(self):
            super().__init__(name=self.NAME)

        def absolute_name(self):
            return "dsenv_refused_op"

        def sources(self):
            return []

        def is_compatible(self, verbose=False):
            self.error_log = "seeded: not compatible"
            return False

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    with pytest.raises(opbuild.OpBuildError) as failed:
        with opbuild.reported():
            Refused().jit_load()
    message = str(failed.value)
    assert failed.value.exit_code == 1 and "\n" not in message
    assert message.startswith("DeepSpeed op dsenv_refused_op failed to JIT-build (RuntimeError: "
                              "Unable to JIT load the dsenv_refused_op op")
    log = tmp_path / "ext" / "dsenv_refused_op" / opbuild.LOG_NAME
    assert f"full log: {log}" in message and "seeded: not compatible" in log.read_text()


def test_other_errors_pass_through():
    with pytest.raises(KeyError):
        with opbuild.reported():
            raise KeyError("not an op build")

"""Real environments (slow): envs/locks/cpu.txt synced into a venv built in staging,
DeepSpeed's cpu_adam precompiled into it, the venv renamed into place, and a training step
with DeepSpeedCPUAdam that compiles nothing.

Needs PyPI (or a warm uv cache) and torch 2.13.0+cpu from /opt/wheels (this project's
machines) or https://download.pytorch.org/whl/cpu. Time on 2 cores with a warm uv cache:
sync ~2 s (no bytecode), cpu_adam build ~2 min, the rest ~30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.locks import lock_path
from dsenv.provision.ops.build import build_ops, verify_installed_ops
from dsenv.provision.shown import logged_commands, not_carried_out, planned_commands
from dsenv.provision.venv import make_venv, venv_python
from dsenv.provision.verify.imports import import_check_lock
from dsenv.provision.verify.shared_libs import missing_shared_libraries
from tests.provision.conftest import LOCAL_TORCH

pytestmark = pytest.mark.slow

STEP = r"""
import json, sys, time
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
x = torch.randn(256, 32)
y = x[:, :1] * 3.0 - x[:, 1:2]
opt = DeepSpeedCPUAdam(model.parameters(), lr=1e-2)
losses = []
start = time.monotonic()
for _ in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
op = sys.modules.get("deepspeed.ops.adam.cpu_adam_op")
print("@@" + json.dumps({"losses": losses, "op_file": getattr(op, "__file__", None),
                         "seconds": time.monotonic() - start, "prefix": sys.prefix}))
del opt
"""


def test_the_real_run_logs_the_commands_the_dry_run_printed_in_order(cpu_plan, cpu_env):
    """Issue 21: the dry run's commands (venv, sync, the cpu_adam build with its DS_BUILD_*
    switches) appear verbatim and in order in the real run's log; the ops it assumed from
    dsenv's own DeepSpeed are the environment's (no difference line). Doctored, it fails."""
    final, _manifest, out = cpu_env
    planned = planned_commands(cpu_plan)
    assert len(planned) == 3, cpu_plan
    assert planned[0].startswith(f"uv venv {final} --relocatable ")
    assert planned[1].startswith(f"uv pip sync --require-hashes --python {final}/bin/python ")
    assert planned[2].startswith("DS_ACCELERATOR=cpu ") and "DS_BUILD_CPU_ADAM=1" in planned[2]
    assert f" uv pip install --python {final}/bin/python --no-build-isolation" in planned[2]
    logged = logged_commands((final / "dsenv-build.log").read_text())
    assert not_carried_out(planned, logged) == [], (planned, logged)
    assert "ops differ from the plan" not in out
    doctored = [c.replace("DS_BUILD_CPU_ADAM=1", "DS_BUILD_CPU_ADAM=0") for c in logged]
    assert not_carried_out(planned, doctored) == [planned[2]]


def _run(argv, env=None, timeout=300):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_cpu_lock_installs_and_imports_after_the_rename(cpu_env):
    final, manifest, _out = cpu_env
    py = venv_python(final)
    out = _run([py, "-c", "import sys, torch, deepspeed, transformers, datasets, mpi4py; "
                "print(sys.prefix, torch.__version__, deepspeed.__version__)"],
               env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1].split() == [str(final), "2.13.0+cpu", "0.19.8"]
    assert import_check_lock(py, lock_path("cpu")) == []
    assert missing_shared_libraries([final]) == []


def test_cpu_adam_is_precompiled_and_ds_report_runs_from_the_renamed_env(cpu_env):
    final, manifest, out = cpu_env
    assert manifest["ops"]["requested"] == ["cpu_adam"] == manifest["ops"]["installed"]
    assert manifest["versions"]["deepspeed"] == "0.19.8" and manifest["stack"] == "cpu"
    assert manifest["env_dir"] == str(final) and manifest["kind"] == "venv"
    assert verify_installed_ops(venv_python(final), ["cpu_adam"]) == ([], [])
    log = (final / "dsenv-build.log").read_text()
    assert log.count("building 'deepspeed.ops.adam.cpu_adam_op'")
    assert "DeepSpeed ops precompiled and verified: cpu_adam" in out
    # DeepSpeed's own console script (a legacy scripts= file) from the renamed prefix.
    out = _run([final / "bin" / "ds_report"], env={**os.environ, "DS_ACCELERATOR": "cpu",
                                                    "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("cpu_adam "))
    assert "[YES]" in row
    assert f"deepspeed install path ........... ['{final}" in out.stdout


def test_a_training_step_uses_the_precompiled_op_and_compiles_nothing(cpu_env, tmp_path):
    final, _manifest, _out = cpu_env
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "DS_ACCELERATOR": "cpu"}
    start = time.monotonic()
    out = _run([venv_python(final), "-c", STEP], env=env)
    seconds = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line[2:] for line in out.stdout.splitlines()
                             if line.startswith("@@")))
    assert result["prefix"] == str(final)
    assert result["op_file"].startswith(str(final))  # the precompiled op, not a JIT build
    assert result["losses"][-1] < 0.2 * result["losses"][0]
    assert list(extensions.iterdir()) == []
    output = out.stdout + out.stderr
    for jit_sign in ("Building extension", "ninja", "Emitting ninja", "Loading extension"):
        assert jit_sign not in output, jit_sign
    print(f"\ntraining step process: {seconds:.1f} s, 20 steps {result['seconds']:.3f} s")


@pytest.fixture(scope="module")
def scratch_env(tmp_path_factory):
    """A --system-site-packages venv (torch and deepspeed of this interpreter visible) for
    builds that must fail: nothing is downloaded but deepspeed's sdist."""
    return make_venv(tmp_path_factory.mktemp("scratch") / "env", python=sys.executable,
                     system_site_packages=True)


def test_a_cuda_op_on_the_cpu_accelerator_is_refused_naming_the_log(scratch_env, tmp_path,
                                                                    monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)  # CI exports cpu: let DeepSpeed detect
    # fused_lamb is a CUDA op: DeepSpeed's CPU accelerator does not build it and installs
    # without error; the verification catches it.
    log = tmp_path / "build.log"
    with pytest.raises(ProvisionError) as err:
        build_ops(scratch_env, {"DS_BUILD_FUSED_LAMB": "1"}, {"TORCH_CUDA_ARCH_LIST": "7.0"},
                  deepspeed_requirement="deepspeed==0.19.8", log=log, compile_bytecode=False)
    message = str(err.value)
    assert "\n" not in message
    assert "requested but not precompiled: fused_lamb" in message
    assert "Setting accelerator to CPU" in message and message.endswith(f"full log: {log}")


def test_an_op_that_does_not_compile_is_one_line_with_the_compiler_error(scratch_env, tmp_path):
    log = tmp_path / "build.log"
    env = {**os.environ, "CXXFLAGS": "-include dsenv_missing_header.h"}
    with pytest.raises(ProvisionError) as err:
        build_ops(scratch_env, {"DS_BUILD_CPU_ADAGRAD": "1"}, {},
                  deepspeed_requirement="deepspeed==0.19.8", log=log, env=env,
                  compile_bytecode=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("DeepSpeed ops build (cpu_adagrad) failed after ")
    assert "fatal error: dsenv_missing_header.h: No such file or directory" in message
    assert message.endswith(f"full log: {log}")


def test_a_new_users_journey_provisions_then_smokes_in_that_environment(cpu_env, tmp_path):
    """Issue 24: provision with warm shared caches, activate, `dsenv smoke bert-squad`: the
    smoke runs in the new environment's interpreter (its lock's transformers, its
    precompiled ops, nothing JIT-built), the first line and the report say which environment
    ran and why, and the whole journey takes at most 120 s on this machine (idle; more in
    proportion to the load when other tests share the cores).
    The provision is the second with the first's ops cache: the wheel the first build made is
    installed (hash-checked), verified as usual, and its precompiled op loads without JIT."""
    final, manifest, _ = cpu_env
    assert manifest["ops"]["cache"]["result"] != "hit"  # the first build compiled
    assert manifest["ops"]["cpu_flags"]["flags"]  # -march=native's flags recorded
    env_dir = tmp_path / "journey"
    links = ["--find-links", str(LOCAL_TORCH)] if LOCAL_TORCH.is_dir() else []
    start = time.monotonic()
    built = _run([sys.executable, "-m", "dsenv", "provision", "--arch", "cpu", "--ops",
                  "cpu_adam", "--no-bytecode", "--prefix", env_dir, "--ops-cache",
                  final.parent.parent / "ops-cache", *links], timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    provisioned = time.monotonic() - start
    again = json.loads((env_dir / "dsenv-env.json").read_text())
    assert again["ops"]["cache"]["result"] == "hit"
    assert again["ops"]["installed"] == ["cpu_adam"]
    assert "DeepSpeed ops from the ops cache and verified: cpu_adam" in " ".join(
        built.stdout.split())
    out = tmp_path / "smoke"
    smoke = _run(["bash", "-c", f". {env_dir}/activate && {sys.executable} -m dsenv smoke "
                  f"bert-squad --output-dir {out}"], timeout=600,
                 env={k: v for k, v in os.environ.items()
                      if k not in ("TORCH_EXTENSIONS_DIR", "VIRTUAL_ENV", "CONDA_PREFIX")})
    seconds = time.monotonic() - start
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    first = smoke.stdout.splitlines()[0]
    assert first.startswith(f"environment {env_dir} (Python ") and "activate script" in first
    report = json.loads((out / "report.json").read_text())
    assert report["environment"]["prefix"] == str(env_dir)
    assert Path(report["environment"]["running"]).parent == env_dir / "bin"
    lock = (Path(__file__).resolve().parents[2] / "envs" / "locks" / "cpu.txt").read_text()
    assert f"transformers=={report['versions']['transformers']} " in lock
    assert "compiling DeepSpeed op" not in smoke.stdout
    load = _run([env_dir / "bin" / "python", "-c", "from deepspeed.ops.op_builder import "
                 "CPUAdamBuilder; print(CPUAdamBuilder().load().__file__)"],
                env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert load.returncode == 0, load.stderr
    assert str(env_dir) in load.stdout  # the precompiled op of the second env, no JIT build
    took = (f"provision (warm caches) {provisioned:.0f} s + smoke in the new environment "
            f"{seconds - provisioned:.0f} s = {seconds:.0f} s")
    print(f"\n{took}")
    # 120 s on an idle machine; on a busy one (the suite's first phase runs this package beside
    # other tests) every process gets its share of the cores, and the bound grows with the
    # load: a journey several times slower than it should be still fails
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    bound = 120 * max(1.0, load / cores)
    print(f"time judged against {bound:.0f} s (load {load:.1f} on {cores} cores)")
    assert seconds <= bound, took

"""provision.activation: the activate script, sourced for real by sh (dash here) and bash in
a subprocess that prints the variables it set."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.envs.sites import Site, load_site
from dsenv.envs.stacks import get_stack
from dsenv.provision import ProvisionError
from dsenv.provision.record.activation import (
    ACTIVATE_NAME,
    detect_kind,
    render_activation,
    sh_value,
    write_activation,
)
from dsenv.provision.targets import resolve_arch

SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]
SHOWN = ("VIRTUAL_ENV", "CONDA_PREFIX", "DSENV_ENV", "TORCH_EXTENSIONS_DIR",
         "TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM_ARCH", "DS_ACCELERATOR", "HF_HOME",
         "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "NCCL_SOCKET_IFNAME",
         "NCCL_IB_DISABLE", "MIOPEN_USER_DB_PATH", "FI_CXI_DISABLE_CQ_HUGETLB", "HOOKED",
         "OMP_NUM_THREADS")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real venv (uv when it is here, else the stdlib)."""
    path = tmp_path_factory.mktemp("act") / "env"
    if shutil.which("uv"):
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(path)], check=True,
                       timeout=120)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                       timeout=120)
    return path


def source(shell: str, script: Path, env: dict, tmp_path: Path) -> tuple[dict, str, str]:
    """Source ``script`` in ``shell`` with exactly ``env``; the variables afterwards."""
    printer = "; ".join(f'printf "%s=%s\\n" {v} "${{{v}-UNSET}}"' for v in SHOWN)
    command = f". {script} && {printer} && command -v python"
    run = subprocess.run([shell, "-c", command], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    values = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    python = run.stdout.strip().splitlines()[-1]
    return values, python, run.stderr


def base_env(tmp_path, **extra) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "USER": "ada", **extra}


@pytest.mark.parametrize("shell", SHELLS)
def test_lumi_script_on_a_compute_node(shell, venv, tmp_path, fake_bin):
    log = tmp_path / "module.log"
    fake_bin("module", f'echo "$*" >> {log}\n')  # Lmod's `module`, as a command here
    script = write_activation(venv, load_site("lumi"), resolve_arch("gfx90a"),
                              get_stack("rocm7.2"))
    assert script == venv / ACTIVATE_NAME
    env = base_env(tmp_path, PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin", SLURM_JOB_ID="4242",
                   SLURM_NODEID="7")
    values, python, stderr = source(shell, script, env, tmp_path)
    assert log.read_text() == "swap PrgEnv-cray PrgEnv-gnu\n"
    assert values["VIRTUAL_ENV"] == str(venv) and python == str(venv / "bin" / "python")
    assert values["DSENV_ENV"] == str(venv)
    assert values["TORCH_EXTENSIONS_DIR"] == str(venv / "torch_extensions")
    assert values["PYTORCH_ROCM_ARCH"] == "gfx90a"
    assert values["TORCH_CUDA_ARCH_LIST"] == "UNSET" and values["DS_ACCELERATOR"] == "UNSET"
    assert values["HF_HUB_OFFLINE"] == values["HF_DATASETS_OFFLINE"] == "1"
    assert values["TRANSFORMERS_OFFLINE"] == "1"
    assert values["NCCL_SOCKET_IFNAME"] == "hsn" and values["FI_CXI_DISABLE_CQ_HUGETLB"] == "1"
    assert values["MIOPEN_USER_DB_PATH"] == "/tmp/ada-miopen-cache-7"
    assert values["HF_HOME"] == "UNSET"  # LUMI's profile leaves it alone
    assert stderr == ""


@pytest.mark.parametrize("shell", SHELLS)
def test_login_node_without_module_command(shell, venv, tmp_path):
    script = write_activation(venv, load_site("daint"), resolve_arch("P100"),
                              get_stack("cuda12.6"))
    env = base_env(tmp_path, SCRATCH="/scratch/snx/ada", NCCL_SOCKET_IFNAME="mine")
    values, _, stderr = source(shell, script, env, tmp_path)
    assert stderr == ""  # no `module` here (a container, a laptop): skipped quietly
    assert values["HF_HUB_OFFLINE"] == "UNSET"  # not inside a Slurm job
    assert values["HF_HOME"] == "/scratch/snx/ada/huggingface"  # the site's default, expanded
    assert values["NCCL_SOCKET_IFNAME"] == "mine"  # the user's own value wins
    assert values["NCCL_IB_DISABLE"] == "1" and values["OMP_NUM_THREADS"] == "1"
    assert values["TORCH_CUDA_ARCH_LIST"] == "6.0"


@pytest.mark.parametrize("shell", SHELLS)
def test_cpu_stack_sets_ds_accelerator_and_keeps_hf_home(shell, venv, tmp_path):
    script = write_activation(venv, load_site("generic"), resolve_arch("cpu"), get_stack("cpu"))
    env = base_env(tmp_path, HF_HOME="/data/hf", SLURM_JOB_ID="1",
                   SLURM_CPUS_PER_TASK="4")
    values, _, _ = source(shell, script, env, tmp_path)
    assert values["DS_ACCELERATOR"] == "cpu" and values["HF_HOME"] == "/data/hf"
    assert values["HF_HUB_OFFLINE"] == "1"
    assert "module" not in script.read_text()


def test_offline_can_be_turned_off(venv, tmp_path):
    script = write_activation(venv, load_site("generic"), resolve_arch("cpu"), get_stack("cpu"),
                              compute_offline=False)
    values, _, _ = source("sh", script, base_env(tmp_path, SLURM_JOB_ID="9"), tmp_path)
    assert values["HF_HUB_OFFLINE"] == "UNSET"


def test_conda_prefix_with_activation_hooks(tmp_path):
    prefix = tmp_path / "conda-env"
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "bin").mkdir()
    python = prefix / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    hooks = prefix / "etc" / "conda" / "activate.d"
    hooks.mkdir(parents=True)
    (hooks / "cuda-nvcc_activate.sh").write_text('export HOOKED="$CONDA_PREFIX"\n')
    assert detect_kind(prefix) == "conda"
    script = write_activation(prefix, load_site("hpc5"), resolve_arch("V100"),
                              get_stack("cuda12.6"))
    values, found, _ = source("sh", script, base_env(tmp_path), tmp_path)
    assert values["CONDA_PREFIX"] == str(prefix) and values["HOOKED"] == str(prefix)
    assert found == str(python)
    assert values["HF_HOME"] == "/s/ls4/users/ada/.cache/huggingface"


def test_site_values_cannot_run_commands(venv, tmp_path):
    marker = tmp_path / "pwned"
    evil = Site(name="evil", title="", sources=(), vendor="", default_arch="",
                default_kind="venv", default_stack="",
                env={"NCCL_SOCKET_IFNAME": f'$(touch {marker})`touch {marker}`"; touch {marker}'},
                modules=(f"load x; touch {marker}",))
    script = venv / "evil-activate"
    script.write_text(render_activation(venv, evil, resolve_arch("cpu"), None))
    values, _, _ = source("sh", script, base_env(tmp_path), tmp_path)
    assert not marker.exists()
    assert values["NCCL_SOCKET_IFNAME"].startswith("$(touch")


def test_sh_value_keeps_only_variable_expansions():
    assert sh_value("/tmp/${USER:-x}-$SLURM_NODEID") == '"/tmp/${USER:-x}-$SLURM_NODEID"'
    assert sh_value('a"b`c`$(d)\\') == '"a\\"b\\`c\\`\\$(d)\\\\"'


def test_no_secrets_in_activate_scripts(venv):
    leaky = Site(name="leaky", title="", sources=(), vendor="", default_arch="",
                 default_kind="venv", default_stack="", env={"WANDB_API_KEY": "abc"})
    with pytest.raises(ProvisionError, match="WANDB_API_KEY.*credential"):
        render_activation(venv, leaky, resolve_arch("cpu"), None)

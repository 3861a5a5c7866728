"""The launchers a DeepSpeed job can be started with (envs/launchers.toml, their one home),
and the Hugging Face variables that keep a job on a node without internet from reaching the
Hub."""

from __future__ import annotations

from dsenv.data import load_table
from dsenv.redact import is_secret_name


def launch_table() -> dict:
    """envs/launchers.toml: [launcher.NAME] (how `dsenv launch` starts ranks with it) and
    [container.RUNTIME] (the runtimes that can run a rank inside a batch job)."""
    return load_table("dsenv.envs", "launchers.toml")


# srun: Slurm's own; mpirun: an MPI's; deepspeed: DeepSpeed's launcher (pdsh/ssh across
# nodes); torchrun: PyTorch's elastic launcher (c10d rendezvous).
LAUNCHERS: tuple[str, ...] = tuple(launch_table()["launcher"])
# The launchers that start one process per rank (a Slurm task or an MPI process); the
# others start one launcher per node, which forks the node's ranks.
TASK_PER_RANK: tuple[str, ...] = tuple(name for name, spec in launch_table()["launcher"].items()
                                       if spec["tasks_per_node"] == "ranks")

# huggingface_hub reads HF_HUB_OFFLINE (and transformers' older TRANSFORMERS_OFFLINE);
# datasets reads HF_DATASETS_OFFLINE (huggingface_hub constants.py, datasets config.py).
HUB_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")

# What a rank on another host needs from the job's environment that DeepSpeed's pdsh runner
# does not carry by itself (it exports only the prefixes of its EXPORT_ENVS and of the
# accelerator, deepspeed/launcher/runner.py): caches, compilers, libraries, the fabric.
# `dsenv launch` writes these into the file DS_ENV_FILE names; the doctor's launch.ds-env
# checks that each one set reaches the other hosts.
REMOTE_ENV_PREFIXES = ("NCCL_", "HF_", "TRANSFORMERS_", "HUGGINGFACE_", "TORCH_", "TRITON_",
                       "MIOPEN_", "FI_", "GLOO_", "UCX_", "PYTHON")
REMOTE_ENV_NAMES = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "ROCM_PATH",
                    "OMP_NUM_THREADS", "DS_ACCELERATOR", "XDG_CACHE_HOME")
REMOTE_ENV_SKIPPED = ("PYTHONSTARTUP", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONHASHSEED",
                      "TORCHELASTIC_ERROR_FILE")


def needed_on_remote_hosts(name: str) -> bool:
    """A variable the other hosts' ranks need; never a secret (it would go into a file)."""
    return (name not in REMOTE_ENV_SKIPPED and not is_secret_name(name)
            and (name.startswith(REMOTE_ENV_PREFIXES) or name in REMOTE_ENV_NAMES))

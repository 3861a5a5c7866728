"""The launchers a DeepSpeed job can be started with, and the Hugging Face variables that
keep a job on a node without internet from reaching the Hub."""

from __future__ import annotations

from dsenv.redact import is_secret_name

# srun: Slurm's own; mpirun: an MPI's; deepspeed: DeepSpeed's launcher (pdsh/ssh across
# nodes); torchrun: PyTorch's elastic launcher (c10d rendezvous).
LAUNCHERS = ("srun", "mpirun", "deepspeed", "torchrun")

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

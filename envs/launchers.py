"""The launchers a DeepSpeed job can be started with, and the Hugging Face variables that
keep a job on a node without internet from reaching the Hub."""

from __future__ import annotations

# srun: Slurm's own; mpirun: an MPI's; deepspeed: DeepSpeed's launcher (pdsh/ssh across
# nodes); torchrun: PyTorch's elastic launcher (c10d rendezvous).
LAUNCHERS = ("srun", "mpirun", "deepspeed", "torchrun")

# huggingface_hub reads HF_HUB_OFFLINE (and transformers' older TRANSFORMERS_OFFLINE);
# datasets reads HF_DATASETS_OFFLINE (huggingface_hub constants.py, datasets config.py).
HUB_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")

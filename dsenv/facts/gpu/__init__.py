"""GPUs: the inventory (nvidia-smi, amd-smi/rocm-smi) and their modes and processes."""

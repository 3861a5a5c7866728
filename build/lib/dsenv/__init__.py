"""dsenv: reproducible DeepSpeed environments, health checks and smoke workloads for HPC."""

__version__ = "0.1.0"

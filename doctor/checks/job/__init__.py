"""Checks about the job: ds_config, launcher and hosts, MPI/PMI, NCCL and the fabric."""

"""How a job is launched: Slurm, the job's layout, DeepSpeed's launcher, the other hosts."""

"""dsenv launch: sbatch job scripts and Kubeflow MPIJobs, with the launchers' tables."""

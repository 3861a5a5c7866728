"""Open MPI with Slurm's PMIx through EasyBuild: options, easyconfig, the build, its record."""

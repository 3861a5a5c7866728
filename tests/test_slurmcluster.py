"""The test cluster itself: a real one-node Slurm that starts, runs jobs, and stops."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")

RANK_PRINTER = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(f'rank {c.rank} of {c.size}')"


def test_node_is_idle_and_batch_jobs_report_their_exit_code(slurm, tmp_path):
    assert slurm.node_state() == "idle"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -n 2\nsrun -n 2 hostname\nexit 3\n")
    job = slurm.sbatch(script, timeout=60)
    assert job.exit_code == 3 and job.state == "FAILED"
    assert len(job.output.split()) == 2


def test_mpi_default_is_written_to_slurm_conf(slurm_cluster):
    cluster = slurm_cluster(mpi_default="pmi2")
    shown = cluster.run(["scontrol", "show", "config"], timeout=30).stdout
    assert any(line.split("=")[0].strip() == "MpiDefault" and line.split("=")[1].strip() == "pmi2"
               for line in shown.splitlines() if "=" in line)


def test_hidden_pmix_library_makes_srun_pmix_fail_for_real(slurm_cluster):
    cluster = slurm_cluster(pmix_library=False)
    launched = cluster.run(["srun", "-n", "1", "--mpi=pmix", "true"], timeout=60)
    assert launched.returncode != 0
    assert "can not load PMIx library" in launched.stderr
    # the host outside the cluster's namespace still has it: nothing was removed for real
    assert any(p.name == "libpmix.so" for p in _pmix_dirs())


def _pmix_dirs():
    from tests.harness.slurmcluster import pmix_dev_library

    library = pmix_dev_library()
    return list(library.parent.iterdir()) if library else []

"""Does this Open MPI support Slurm and PMIx? One verdict for the doctor's mpi.ompi-support
check and for `dsenv provision openmpi`, which judges the Open MPI it has just built."""

from __future__ import annotations

from dsenv.facts.mpi import installation as mpi
from dsenv.facts.node import Node
from dsenv.verdicts.findings import Finding, fail, ok, skip, warn

PROVISION_FIX = ("launch with `mpirun -np $SLURM_NTASKS ...` inside the allocation, or build an "
                 "Open MPI with Slurm+PMIx support: `dsenv provision openmpi`")


def ompi_support(node: Node) -> Finding:
    """The verdict on the Open MPI first on ``node``'s PATH (fail on a compute node that will
    direct-launch with srun, warn elsewhere)."""
    install = mpi.mpi_install(node)
    if install is None:
        return skip(mpi.NO_MPI)
    if install.family != "openmpi":
        what = (install.describe() if install.family in mpi.FAMILY_NAMES
                else install.launcher or "an MPI dsenv does not recognise")
        return skip(f"the MPI on PATH is {what}, not Open MPI")
    parsed, how = mpi.ompi_info(node)
    if parsed is None:
        return warn(f"cannot read how Open MPI was built: {how}",
                    "load the full Open MPI module (ompi_info belongs next to mpirun)")
    version = parsed.version or install.version
    if (parsed.major or install.major or 0) >= 5:
        return ok(f"Open MPI {version}: PMIx built in ({parsed.pmix_builtin}); direct launch "
                  "needs `srun --mpi=pmix`", how)
    slurm = parsed.slurm_components
    clients = parsed.pmix_clients
    pmi = [c for c in ("s1", "s2") if parsed.has("pmix", c)]
    evidence = [how, "Slurm components: " + (", ".join(slurm) or "none"),
                "pmix components: " + (", ".join(sorted(parsed.components.get("pmix", ()))) or "none")]
    if not clients and not pmi:
        srun_launch = node.job.launcher in (None, "srun") and node.is_compute
        return (fail if srun_launch else warn)(
            f"Open MPI {version} was built without Slurm's PMI/PMIx support: srun direct "
            "launch crashes (\"OMPI was not built with SLURM's PMI support\")",
            PROVISION_FIX, *evidence)
    if not slurm:
        return warn(f"Open MPI {version} has no Slurm components: mpirun cannot read the "
                    "allocation and falls back to ssh", "`dsenv provision openmpi` (an Open MPI "
                    "configured --with-slurm --with-pmix)", *evidence)
    via = ", ".join(clients + pmi)
    return ok(f"Open MPI {version}: Slurm support ({len(slurm)} components) and PMI via {via}",
              *evidence)

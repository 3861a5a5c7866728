"""Which launcher starts which MPI: the rules that read envs/mpi_launch.toml.

An MPI is described by duck-typed facts from the node-facts layer: an install with
``family`` and ``major``, and (Open MPI only) a parsed ``ompi_info`` with ``major``,
``slurm_components`` and ``has(framework, component)``. The doctor's mpi checks and
``dsenv launch`` (choosing ``srun --mpi=...``) both ask these functions.
"""

from __future__ import annotations

from dsenv.data import load_table

# The plugins worth trying, best first: PMIx where both sides speak it, then PMI-2.
PLUGIN_ORDER = ("pmix", "pmi2", "cray_shasta", "none")


def launch_table() -> dict:
    return load_table("dsenv.envs", "mpi_launch.toml")


def mpi_profile(install, parsed) -> str:
    """The [mpi.*] row of mpi_launch.toml that describes this MPI."""
    if install.family == "openmpi":
        major = (parsed.major if parsed else None) or install.major or 0
        return "openmpi5" if major >= 5 else "openmpi-orte"
    return install.family


def srun_outcome(row: dict, plugin: str, parsed) -> tuple[str, str]:
    """(outcome name, why) for `srun --mpi=plugin` with this MPI."""
    if "srun_needs" in row:
        needs = row["srun_needs"].get(plugin)
        if needs is None:
            return "unknown", f"no rule for --mpi={plugin}"
        if parsed is None:
            return "unknown", "ompi_info could not be read"
        have = [c for c in needs if parsed.has("pmix", c)]
        if have:
            return "ok", f"ompi_info lists pmix component(s) {', '.join(have)}"
        return row["srun_without"], (f"--mpi={plugin} needs Open MPI's pmix component "
                                     f"{' or '.join(needs)}; ompi_info lists none of them")
    outcome = row.get("srun", {}).get(plugin, "unknown")
    return outcome, row.get("source", "")


def mpirun_outcome(row: dict, parsed) -> str:
    if parsed is not None and "mpirun_without_slurm" in row and not parsed.slurm_components:
        return row["mpirun_without_slurm"]
    return row.get("mpirun", "unknown")


def working_plugins(install, parsed) -> list[str]:
    """The srun plugins that start this MPI's ranks correctly, best first."""
    row = launch_table()["mpi"].get(mpi_profile(install, parsed))
    return [p for p in PLUGIN_ORDER if row and srun_outcome(row, p, parsed)[0] == "ok"]

"""Who am I in the job? Rank discovery for every launcher, without importing torch.

Launchers and what they export (checked in this order; the first match wins):

==========  =========================================================================
deepspeed   RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, plus CROSS_RANK, LOCAL_SIZE
torchrun    RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, plus TORCHELASTIC_RUN_ID
env         RANK and WORLD_SIZE set by hand (or by another tool)
mpirun      Open MPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE
mpirun      MPICH/Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
srun        SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID (inside an srun step only)
none        a single process
==========  =========================================================================

MPI comes before Slurm on purpose: ``mpirun`` inside an allocation starts its daemons
with ``srun``, so its ranks inherit the daemon's SLURM_PROCID (the node index, not the rank).
A batch script that runs ``python`` without ``srun`` sees SLURM_PROCID=0 and SLURM_NTASKS>1
but no step: that is one process, not rank 0 of N waiting forever for peers.

:func:`apply` exports RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT so that
``deepspeed.init_distributed`` never falls back to mpi4py discovery (which takes the
master address from ``hostname -I``). MASTER_ADDR/MASTER_PORT keep values already set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass

from dsenv.facts.launch.slurmlists import SlurmListError, first_count, first_host
from dsenv.workloads.errors import WorkloadError

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class RankInfo:
    launcher: str  # deepspeed | torchrun | env | mpirun | srun | none
    rank: int
    local_rank: int
    world_size: int
    local_size: int | None
    master_addr: str | None  # None: unknown yet (multi-node mpirun without MASTER_ADDR)
    master_port: int
    mpi_flavour: str | None = None  # openmpi | hydra, for mpirun

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def as_dict(self) -> dict:
        return asdict(self)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value.strip())
    except ValueError:
        raise WorkloadError(f"{name}={value!r} is not a whole number") from None


def _first_host(env: Mapping[str, str]) -> str | None:
    """The first host of the step's (else the job's) Slurm hostlist: the rendezvous."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            try:
                return first_host(env[name])
            except SlurmListError as exc:
                raise WorkloadError(f"{name}={env[name]!r}: {exc}; export MASTER_ADDR=<first "
                                    "node's address>") from None
    return None


def discover(env: Mapping[str, str] | None = None) -> RankInfo:
    """Work out rank, local rank and world size from the launcher's environment."""
    env = os.environ if env is None else env
    flavour = None
    if "RANK" in env and "WORLD_SIZE" in env:
        if "CROSS_RANK" in env or "LOCAL_SIZE" in env:
            launcher = "deepspeed"
            local_size = _int(env, "LOCAL_SIZE")
        elif "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env:
            launcher = "torchrun"
            local_size = _int(env, "LOCAL_WORLD_SIZE")
        else:
            launcher = "env"
            local_size = _int(env, "LOCAL_WORLD_SIZE", _int(env, "LOCAL_SIZE"))
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", rank if local_size in (None, world) else None)
        if local_rank is None:
            raise WorkloadError("RANK and WORLD_SIZE are set but LOCAL_RANK is not; "
                                "set LOCAL_RANK (the rank's index on its node)")
    elif "OMPI_COMM_WORLD_RANK" in env:
        launcher, flavour = "mpirun", "openmpi"
        rank = _int(env, "OMPI_COMM_WORLD_RANK")
        world = _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        launcher, flavour = "mpirun", "hydra"
        rank, world = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        local_rank = _int(env, "MPI_LOCALRANKID", 0 if world == 1 else None)
        local_size = _int(env, "MPI_LOCALNRANKS")
        if local_rank is None:
            raise WorkloadError("PMI_RANK/PMI_SIZE are set but MPI_LOCALRANKID is not: cannot "
                                "tell which GPU this rank owns; set LOCAL_RANK")
    elif "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_STEP_ID" in env):
        launcher = "srun"
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
        local_rank = _int(env, "SLURM_LOCALID", 0)
        local_size = first_count(env.get("SLURM_STEP_TASKS_PER_NODE")
                                 or env.get("SLURM_TASKS_PER_NODE"))
    else:
        launcher, rank, world, local_rank, local_size = "none", 0, 1, 0, 1

    if world < 1 or not 0 <= rank < world:
        raise WorkloadError(f"{launcher}: rank {rank} is not within world size {world}")
    if local_rank < 0 or (local_size is not None and local_rank >= local_size):
        raise WorkloadError(f"{launcher}: local rank {local_rank} is not within local size "
                            f"{local_size}")

    master_addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT")
    single_node = world == 1 or local_size == world
    if master_addr is None:
        if single_node:
            master_addr = "127.0.0.1"
        elif launcher == "srun":
            master_addr = _first_host(env)
    if port is None:
        if world == 1:  # the store binds port 0 and the kernel picks one: no window in
            port = 0     # which another process on the node can take it (EADDRINUSE)
        elif launcher == "srun" and env.get("SLURM_JOB_ID", "").isdigit():
            port = 20000 + int(env["SLURM_JOB_ID"]) % 20000  # same on every rank, per job
        else:
            port = DEFAULT_PORT
    return RankInfo(launcher, rank, local_rank, world, local_size, master_addr, port, flavour)


def apply(info: RankInfo, env: MutableMapping[str, str] | None = None) -> None:
    """Export the torch.distributed variables (keeping MASTER_ADDR/PORT already set)."""
    env = os.environ if env is None else env
    if info.master_addr is None:
        raise WorkloadError(
            f"{info.launcher}: ranks span several nodes and MASTER_ADDR is not set; export "
            "MASTER_ADDR=<first node's address> (mpirun: -x MASTER_ADDR)")
    env["RANK"] = str(info.rank)
    env["LOCAL_RANK"] = str(info.local_rank)
    env["WORLD_SIZE"] = str(info.world_size)
    if info.local_size is not None:
        env.setdefault("LOCAL_WORLD_SIZE", str(info.local_size))
    env.setdefault("MASTER_ADDR", info.master_addr)
    env.setdefault("MASTER_PORT", str(info.master_port))

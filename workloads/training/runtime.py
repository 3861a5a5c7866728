"""Who and where this rank is at run time: the ranks any launcher started, the device, the
console, and the few collectives every workload uses around the engine.

    rt = runtime.start()          # ranks from any launcher, torch.distributed variables, device
    runtime.barrier(rt)           # every rank waits (rank 0 made the smoke's assets)
    value = runtime.broadcast(rt, value)  # rank 0's verdict, so every rank exits alike
    runtime.shutdown()            # the process group, once the report is written

torch is imported inside the functions: workload modules import this one, and the doctor
and the command line read those modules' settings without loading torch.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import socket
import sys
from dataclasses import dataclass, field

import dsenv
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.launch.env import RankInfo, apply, discover


@dataclass
class Runtime:
    ranks: RankInfo
    on_gpu: bool
    device: str  # "cuda:0" or "cpu"
    device_type: str  # "NVIDIA H100 80GB HBM3", "AMD Instinct MI100", "cpu:AMD EPYC"
    backend: str  # nccl or gloo
    console: object  # rich Console; silent on ranks other than 0
    threads: int = 1
    notes: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # each rank's host name, in rank order
    pids: list[int] = field(default_factory=list)  # each rank's process id, in rank order

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def is_main(self) -> bool:
        return self.ranks.rank == 0

    def log(self, message: str) -> None:
        self.console.print(message, highlight=False)

    def describe(self) -> dict:
        return {"launcher": self.ranks.launcher, "mpi": self.ranks.mpi_flavour,
                "world_size": self.world_size, "local_size": self.ranks.local_size,
                "device": self.device, "device_type": self.device_type,
                "backend": self.backend, "torch_threads_per_rank": self.threads,
                "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
                "hosts": sorted(set(self.hosts)) or [socket.gethostname()],
                "ranks_per_host": {h: self.hosts.count(h) for h in sorted(set(self.hosts))}}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mpi_master_addr() -> str:
    """Multi-node mpirun without MASTER_ADDR: rank 0's host name, broadcast over MPI."""
    try:
        from mpi4py import MPI  # mpi4py: MPI_Init only for this one question
    except ImportError:
        raise WorkloadError("mpirun across nodes without MASTER_ADDR, and no mpi4py to ask "
                            "rank 0: export MASTER_ADDR (mpirun -x MASTER_ADDR=...)") from None
    return MPI.COMM_WORLD.bcast(socket.getfqdn() if MPI.COMM_WORLD.Get_rank() == 0 else None)


def prefer_env_ninja(env=None) -> str | None:
    """Make JIT builds use the ninja of this Python environment, when it has one.

    Two ninja versions disagree on their build log (1.11's hashes are not 1.13's), so when
    the one on PATH changes between runs, every run rebuilds every DeepSpeed op (~1 min
    each on 2 cores). Measured here: Debian's mpirun, given ``-x PATH``, puts /usr/bin
    (ninja 1.11) in front of the venv's bin (pip's ninja 1.13). Returns the PATH entry added.
    """
    env = os.environ if env is None else env
    bindir = os.path.dirname(sys.executable)
    ninja = os.path.join(bindir, "ninja")
    if not os.access(ninja, os.X_OK) or shutil.which("ninja", path=env.get("PATH")) == ninja:
        return None
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return bindir


def start(quiet: bool = False) -> Runtime:
    """Discover the ranks, export the torch.distributed variables, choose the device."""
    from rich.console import Console  # rich: only once a run starts

    prefer_env_ninja()
    ranks = discover()
    if ranks.master_addr is None and ranks.launcher == "mpirun":
        ranks = RankInfo(**{**ranks.as_dict(), "master_addr": _mpi_master_addr()})
    apply(ranks)

    import torch  # torch: only once a run starts

    if torch.cuda.is_available():  # CUDA or ROCm (torch.version.hip); RCCL answers to nccl
        count = torch.cuda.device_count()
        index = ranks.local_rank % count
        torch.cuda.set_device(index)
        on_gpu, device, backend = True, f"cuda:{index}", "nccl"
        device_type = torch.cuda.get_device_name(index)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        on_gpu, device, backend = False, "cpu", "gloo"
        device_type = f"cpu:{_cpu_model()}"
        local = ranks.local_size or 1
        if "OMP_NUM_THREADS" not in os.environ and local > 1:  # ranks share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    # mpirun gives its ranks a pty: keep colours, but no spinners or live redraws in logs
    console = Console(quiet=quiet or ranks.rank != 0, highlight=False,
                      force_interactive=False if ranks.launcher in ("mpirun", "srun") else None)
    return Runtime(ranks, on_gpu, device, device_type, backend, console,
                   threads=torch.get_num_threads())


# ----------------------------------------------------------------------------- collectives
def gather(rt: Runtime, value) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if rt.world_size == 1:
        return [value]
    import torch.distributed as dist  # torch: only once a run starts

    gathered: list = [None] * rt.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def broadcast(rt: Runtime, value):
    """Rank 0's ``value`` on every rank (so every rank exits with the same code)."""
    if rt.world_size == 1:
        return value
    import torch.distributed as dist  # torch: only once a run starts

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(rt: Runtime) -> None:
    if rt.world_size > 1:
        import torch.distributed as dist  # torch: only once a run starts

        dist.barrier()


left_a_process_group = False  # set by shutdown() on a rank of a multi-rank run


def shutdown() -> None:
    """Leave the process group together: a rank that tears gloo down while a peer still
    waits on its last message aborts that peer ("terminate called without an active
    exception", exit -6, seen across hosts with the deepspeed launcher), so every rank
    meets at a barrier first (mosaicml/streaming#186 does the same)."""
    import torch.distributed as dist  # torch: only once a run starts

    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            global left_a_process_group
            left_a_process_group = True
            try:
                dist.barrier()
            except RuntimeError:  # a peer already gone: nothing left to wait for
                pass
        dist.destroy_process_group()


def end_rank_process(code: int) -> None:
    """End a rank of a multi-rank run without interpreter finalization. A rank can still
    abort there after leaving the group (SIGABRT, "terminate called without an active
    exception": gloo's worker threads hold work objects while Python tears down,
    pytorch/pytorch#179291), which turns a PASS into a failed job. Its report is written by
    now; MPI is finalized if mpi4py started it (mpirun fails a rank that exits without)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ----------------------------------------------------------------------------- versions
def versions() -> dict:
    import torch  # torch: only once a run starts

    found = {"python": sys.version.split()[0], "platform": platform.platform()}
    found["dsenv"] = dsenv.__version__  # in the job's environment it runs from an overlay
    for dist in ("torch", "deepspeed", "transformers", "tokenizers", "datasets",
                 "numpy", "mpi4py"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    found["cuda"] = torch.version.cuda
    found["hip"] = getattr(torch.version, "hip", None)
    return found

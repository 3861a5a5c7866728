"""What every workload shares at run time: ranks, device, the DeepSpeed engine, the training
loop through the engine, timing, distributed prediction and generation, and the atomic
model save.

A workload calls, top to bottom::

    rt = engine.start()                          # ranks from any launcher, device, console
    planned = dsconfig.build_config(..., world_size=rt.world_size, on_gpu=rt.on_gpu)
    engine.init_distributed(rt, planned.config)  # says so first if ops must be JIT-built
    ds = engine.initialize(model, planned.config)
    stats = engine.train(ds, rt, batches, steps)
    logits = engine.predict(ds, rt, inputs, batch_size)   # or engine.generate(...)
    engine.save_model_atomically(ds, rt, target, extra=tokenizer.save_pretrained)

torch and deepspeed are imported inside the functions, never at module import.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.workloads.launch_env import RankInfo, WorkloadError, apply, discover

from dsenv.staging import staged_dir

# Measured first-build times on a 2-core VM (FACTS.md and this project's runs), seconds.
OP_BUILD_SECONDS = {"deepspeed_shm_comm": 60, "cpu_adam": 90, "fused_adam": 100}


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
                "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"}


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
    import socket

    try:
        from mpi4py import MPI
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
    from rich.console import Console

    prefer_env_ninja()
    ranks = discover()
    if ranks.master_addr is None and ranks.launcher == "mpirun":
        ranks = RankInfo(**{**ranks.as_dict(), "master_addr": _mpi_master_addr()})
    apply(ranks)

    import torch

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


def _quiet_deepspeed(verbose: bool) -> None:
    if not verbose:
        import warnings

        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
        from deepspeed.utils import logger

        logger.setLevel(logging.ERROR)


def ops_to_build(config: dict, on_gpu: bool) -> list[tuple[str, Path]]:
    """DeepSpeed ops this config loads that are neither prebuilt nor in the JIT cache."""
    from dsenv.workloads.dsconfig import required_ops
    from torch.utils import cpp_extension

    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:  # pragma: no cover - very old DeepSpeed
        installed_ops = {}
    missing = []
    for op in required_ops(config, on_gpu):
        if installed_ops.get(op.removeprefix("deepspeed_")) or installed_ops.get(op):
            continue
        build_dir = Path(cpp_extension._get_build_directory(op, verbose=False))
        if not (build_dir / f"{op}.so").exists():
            missing.append((op, build_dir))
    return missing


def announce_builds(rt: Runtime, config: dict) -> list[str]:
    """Say, before it starts, that a first run JIT-compiles ops (else it looks hung)."""
    missing = ops_to_build(config, rt.on_gpu)
    cores = os.cpu_count() or 1
    for op, build_dir in missing:
        est = OP_BUILD_SECONDS.get(op, 90) * 2 / min(max(cores, 2), 4)
        rt.log(f"[yellow]compiling DeepSpeed op {op} for the first time, ~{est / 60:.0f}-"
               f"{est * 1.5 / 60:.0f} min on {cores} cores[/] (into {build_dir.parent}; "
               f"later runs load it in seconds)")
    return [op for op, _ in missing]


def init_distributed(rt: Runtime, config: dict, verbose: bool = False) -> dict:
    """torch.distributed through DeepSpeed, never via mpi4py discovery. Returns timings."""
    import datetime

    import deepspeed

    _quiet_deepspeed(verbose)
    building = announce_builds(rt, config) if rt.is_main else []
    started = time.perf_counter()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if not verbose else contextlib.nullcontext():
        deepspeed.init_distributed(dist_backend=rt.backend, auto_mpi_discovery=False,
                                   timeout=datetime.timedelta(minutes=15))
    import torch.distributed as dist

    if dist.get_world_size() != rt.world_size:  # a silent singleton: refuse, never train alone
        raise WorkloadError(f"{rt.ranks.launcher} said world size {rt.world_size} but "
                            f"torch.distributed has {dist.get_world_size()}")
    return {"init_distributed_s": time.perf_counter() - started, "ops_built": building}


def initialize(model, config: dict, verbose: bool = False, sync_gradients: bool = True):
    """deepspeed.initialize with the full config; returns the engine.

    ``sync_gradients=False`` (seed 004's independent workers): no gradient all-reduce, so
    every rank trains its own model on its own batches. Only without ZeRO: ZeRO stages
    partition gradients and optimizer states over the ranks. The config must not clip
    gradients either (:func:`dsenv.workloads.dsconfig.without_gradient_sync`): DeepSpeed
    averages the clipping norm over the ranks.
    """
    import deepspeed

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if not verbose else contextlib.nullcontext():
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
    import torch.distributed as dist

    stage = engine.zero_optimization_stage()
    if not sync_gradients and stage != 0:
        raise WorkloadError(f"training without gradient sync needs a preset without ZeRO "
                            f"(fp32, bf16, fp16), not ZeRO stage {stage}")
    if stage == 0 and (dist.get_world_size() == 1 or not sync_gradients):
        # Without ZeRO, backward() all-reduces every gradient (flatten, all_reduce, divide by
        # the world size, copy back): an identity for one rank, yet 1.3 ms of an 11 ms smoke
        # step here (bench/smoke_overhead.py). ZeRO stages reduce into their partitions in
        # the same call, so they keep it.
        engine.enable_backward_allreduce = False
    return engine


# ----------------------------------------------------------------------------- data
def to_tensors(features: dict[str, list], keys: tuple[str, ...]) -> dict:
    import torch

    return {key: torch.tensor(features[key], dtype=torch.long) for key in keys}


def micro_batches(tensors: dict, micro_batch: int, rt: Runtime, seed: int,
                  independent: bool = False) -> Iterator[dict]:
    """Endless micro-batches of this rank's shard; every epoch a fresh seeded permutation,
    the same on every rank, split so the ranks never see the same sample in one epoch.
    ``independent``: every rank draws from the whole data set in its own order (workers
    that train without gradient sync, each its own model)."""
    import torch

    n = len(next(iter(tensors.values())))
    per_rank = n if independent else n // rt.world_size
    if per_rank < micro_batch:
        raise WorkloadError(f"{n} training samples are too few for micro-batch {micro_batch} "
                            f"x world size {rt.world_size}")
    first = 0 if independent else rt.rank * per_rank
    if independent:
        seed += 7919 * rt.rank
    epoch = 0
    while True:
        gen = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=gen)[first:first + per_rank]
        for i in range(0, per_rank - micro_batch + 1, micro_batch):
            idx = order[i:i + micro_batch]
            yield {key: value[idx] for key, value in tensors.items()}
        epoch += 1


# ----------------------------------------------------------------------------- train
@dataclass
class TrainStats:
    steps: int
    warmup_steps: int
    loss_curve: list[float]
    seconds: float  # all steps
    timed_seconds: float  # steps after warm-up
    samples_per_s: float  # global samples/s after warm-up
    train_batch_size: int


def _sync(rt: Runtime) -> None:
    if rt.on_gpu:
        import torch

        torch.cuda.synchronize()


def train(engine, rt: Runtime, batches: Iterator[dict], steps: int, warmup_steps: int,
          label: str = "training") -> TrainStats:
    """``steps`` optimizer steps through the engine; loss per step; samples/s after warm-up."""
    import torch
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    grad_accum = engine.gradient_accumulation_steps()
    train_batch = engine.train_batch_size()
    warmup_steps = min(warmup_steps, max(steps - 1, 0))
    engine.train()
    losses = []
    # live bar on an interactive terminal; plain lines in logs (mpirun gives ranks a pty,
    # so a batch job's log would otherwise fill with redraws)
    live = rt.is_main and rt.console.is_interactive
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=rt.console, disable=not live,
                        transient=False)
    every = max(1, steps // 10)
    begin = timed_from = time.perf_counter()
    with progress:
        task = progress.add_task(label, total=steps, loss="-")
        for step in range(steps):
            if step == warmup_steps:
                _sync(rt)
                timed_from = time.perf_counter()
            total = None
            for _ in range(grad_accum):
                batch = {k: v.to(engine.device, non_blocking=True) for k, v in next(batches).items()}
                loss = engine(**batch).loss
                engine.backward(loss)
                engine.step()
                total = loss.detach() if total is None else total + loss.detach()
            losses.append(total / grad_accum)
            if not rt.is_main:
                continue
            if live and (step % 10 == 0 or step == steps - 1):
                progress.update(task, completed=step + 1, loss=f"{float(losses[-1]):.3f}")
            elif not live and ((step + 1) % every == 0 or step == steps - 1):
                rt.log(f"{label} step {step + 1}/{steps} loss {float(losses[-1]):.4f} "
                       f"({time.perf_counter() - begin:.1f} s)")
    _sync(rt)
    end = time.perf_counter()
    curve = torch.stack(losses).float().cpu().tolist() if losses else []
    timed = end - timed_from
    timed_steps = steps - warmup_steps
    return TrainStats(steps, warmup_steps, curve, end - begin, timed,
                      timed_steps * train_batch / timed if timed > 0 else 0.0, train_batch)


def _share(n: int, rank: int, world: int) -> list[int]:
    """This rank's indices of ``n`` inputs split over ``world`` ranks, padded with repeats
    so that every rank runs the same number of batches (as ZeRO-3 needs)."""
    per_rank = math.ceil(n / world)
    lo = min(rank * per_rank, n)
    index = list(range(lo, min(lo + per_rank, n)))
    return index + [index[-1] if index else 0] * (per_rank - len(index))


def predict(engine, rt: Runtime, inputs: dict, batch_size: int,
            outputs: tuple[str, ...] = ("start_logits", "end_logits"),
            split_over_ranks: bool = True) -> dict:
    """Forward ``inputs`` split over the ranks (every rank runs the same number of batches,
    as ZeRO-3 needs); every rank gets all outputs back, as numpy arrays, in input order.
    ``split_over_ranks=False``: every rank forwards all of them through its own model and
    keeps its own outputs (ranks that trained without gradient sync)."""
    import numpy as np
    import torch

    n = len(next(iter(inputs.values())))
    rank, world = (rt.rank, rt.world_size) if split_over_ranks else (0, 1)
    index_t = torch.tensor(_share(n, rank, world), dtype=torch.long)
    collected: dict[str, list] = {name: [] for name in outputs}
    engine.eval()
    with torch.no_grad():
        for i in range(0, len(index_t), batch_size):
            idx = index_t[i:i + batch_size]
            batch = {k: v[idx].to(engine.device) for k, v in inputs.items()}
            result = engine(**batch)
            for name in outputs:
                collected[name].append(getattr(result, name).float().cpu().numpy())
    mine = {name: np.concatenate(parts) if parts else np.zeros((0,)) for name, parts in
            collected.items()}
    gathered = gather(rt, mine) if split_over_ranks else [mine]
    engine.train()
    return {name: np.concatenate([part[name] for part in gathered])[:n] for name in outputs}


def generate(engine, rt: Runtime, inputs: dict, batch_size: int, max_new_tokens: int,
             num_beams: int = 1) -> list[list[int]]:
    """Generated token ids for ``inputs`` (input_ids, attention_mask), split over the ranks
    as :func:`predict` splits them; every rank gets all sequences back, in input order.
    Under ZeRO-3 every forward gathers the partitioned parameters collectively, so with
    several ranks ``synced_gpus`` keeps each rank stepping until all are done."""
    import torch

    n = len(next(iter(inputs.values())))
    index_t = torch.tensor(_share(n, rt.rank, rt.world_size), dtype=torch.long)
    synced = engine.zero_optimization_stage() == 3 and rt.world_size > 1
    mine: list[list[int]] = []
    engine.eval()
    with torch.no_grad():
        for i in range(0, len(index_t), batch_size):
            idx = index_t[i:i + batch_size]
            batch = {k: v[idx].to(engine.device) for k, v in inputs.items()}
            out = engine.module.generate(**batch, max_new_tokens=max_new_tokens,
                                         do_sample=False, num_beams=num_beams,
                                         synced_gpus=synced)
            mine.extend(out.cpu().tolist())
    engine.train()
    return [seq for part in gather(rt, mine) for seq in part][:n]


def gather(rt: Runtime, value) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if rt.world_size == 1:
        return [value]
    import torch.distributed as dist

    gathered: list = [None] * rt.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def weights_digest(module) -> str:
    """sha256 of a module's parameters and buffers as this rank holds them: equal on two
    ranks only when their weights are bit for bit the same (without ZeRO-3, which leaves
    each rank a partition)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def broadcast(rt: Runtime, value):
    """Rank 0's ``value`` on every rank (so every rank exits with the same code)."""
    if rt.world_size == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(rt: Runtime) -> None:
    if rt.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- saving
def save_model_atomically(engine, rt: Runtime, target: Path,
                          extra: Callable[[Path], object] | None = None,
                          source_rank: int = 0) -> Path:
    """save_pretrained into a hidden temporary folder next to ``target``, then rename it
    into place: an interrupted run never leaves a half-written model under ``target``.
    ZeRO-3 parameters are gathered first (every rank must call this). ``source_rank``: the
    rank whose model is saved (ranks that trained without gradient sync differ); rank 0
    writes it, since transformers' save_pretrained writes weights on rank 0 only."""
    import deepspeed

    target = Path(target)
    module = engine.module
    gathered = (deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
                if engine.zero_optimization_stage() == 3 else contextlib.nullcontext())
    state = None
    with gathered:
        if rt.rank == source_rank:
            state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    if source_rank != 0:
        import torch.distributed as dist

        box = [state]
        dist.broadcast_object_list(box, src=source_rank)
        state = box[0]
    if rt.is_main:
        with staged_dir(target) as tmp:
            module.save_pretrained(tmp, state_dict=state)
            if extra is not None:
                extra(tmp)
    barrier(rt)
    return target


# ----------------------------------------------------------------------------- versions
def versions() -> dict:
    import importlib.metadata as md
    import sys

    import torch

    found = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("dsenv", "torch", "deepspeed", "transformers", "tokenizers", "datasets",
                 "numpy", "mpi4py"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    found["cuda"] = torch.version.cuda
    found["hip"] = getattr(torch.version, "hip", None)
    return found

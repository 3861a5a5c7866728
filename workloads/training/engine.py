"""The DeepSpeed engine as every workload drives it: the ops a config JIT-builds (announced
before they are), torch.distributed through DeepSpeed, deepspeed.initialize, the training
loop, distributed prediction and generation, and the atomic model save.

A workload calls, top to bottom::

    rt = runtime.start()                         # ranks from any launcher, device, console
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
import datetime
import hashlib
import io
import logging
import math
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.envs.training_stack import jit_seconds
from dsenv.facts.host import contention
from dsenv.staging import staged_dir
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.training.dsconfig import required_ops
from dsenv.workloads.training.opbuild import prepare_arch_list, reported
from dsenv.workloads.training.phases import PhaseClock, StepTimes
from dsenv.workloads.training.runtime import Runtime, barrier, gather

UNMEASURED_BUILD_S = 90  # an op envs/training_stack.toml has no first-build time for


def _quiet_deepspeed(verbose: bool) -> None:
    if not verbose:
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
        from deepspeed.utils import logger  # deepspeed: only once a run starts

        logger.setLevel(logging.ERROR)


def ops_to_build(config: dict, on_gpu: bool, world_size: int = 2) -> list[tuple[str, Path]]:
    """DeepSpeed ops this config loads that are neither prebuilt nor in the JIT cache."""
    from torch.utils import cpp_extension  # torch: only once a run starts

    try:
        from deepspeed.git_version_info import installed_ops  # deepspeed: only once a run starts
    except ImportError:  # pragma: no cover - very old DeepSpeed
        installed_ops = {}
    missing = []
    for op in required_ops(config, on_gpu, world_size):
        if installed_ops.get(op.removeprefix("deepspeed_")) or installed_ops.get(op):
            continue
        build_dir = Path(cpp_extension._get_build_directory(op, verbose=False))
        if not (build_dir / f"{op}.so").exists():
            missing.append((op, build_dir))
    return missing


def announce_builds(rt: Runtime, config: dict) -> list[str]:
    """Say, before it starts, that a first run JIT-compiles ops (else it looks hung)."""
    missing = ops_to_build(config, rt.on_gpu, rt.world_size)
    cores = os.cpu_count() or 1
    for op, build_dir in missing:
        est = (jit_seconds(op) or UNMEASURED_BUILD_S) * 2 / min(max(cores, 2), 4)
        low, high = max(1, round(est / 60)), max(1, round(est * 1.5 / 60))
        span = f"{low}" if low == high else f"{low}-{high}"
        rt.log(f"[yellow]compiling DeepSpeed op {op} for the first time, ~{span} min on "
               f"{cores} cores[/] (into {build_dir.parent}; later runs load it in seconds)")
    return [op for op, _ in missing]


@contextlib.contextmanager
def _no_shm_comm(skip: bool):
    """DeepSpeed's TorchBackend builds the shm_comm op for every CPU run
    (deepspeed/comm/torch.py build_shm_op, ~1.5 min of JIT on 2 cores); one rank has no peer
    to reduce with, so a one-process run goes without it (build_shm_op's own 'not
    compatible' answer: None)."""
    if not skip:
        yield
        return

    # by its sys.modules name: deepspeed.comm's `torch` attribute is torch itself
    ds_torch = sys.modules["deepspeed.comm.torch"]
    build = getattr(ds_torch, "build_shm_op", None)
    ds_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        if build is not None:
            ds_torch.build_shm_op = build


def init_distributed(rt: Runtime, config: dict, verbose: bool = False) -> dict:
    """torch.distributed through DeepSpeed, never via mpi4py discovery. Returns timings."""
    import deepspeed  # deepspeed: only once a run starts

    _quiet_deepspeed(verbose)
    arch_list = prepare_arch_list(rt)  # before any op build: a list DeepSpeed reads, or refused
    building = announce_builds(rt, config) if rt.is_main else []
    started = time.perf_counter()
    sink = io.StringIO()
    with (contextlib.redirect_stdout(sink) if not verbose else contextlib.nullcontext()), \
            reported():
        with _no_shm_comm(not rt.on_gpu and rt.world_size == 1):
            deepspeed.init_distributed(dist_backend=rt.backend, auto_mpi_discovery=False,
                                       timeout=datetime.timedelta(minutes=15))
    import torch.distributed as dist  # torch: only once a run starts

    if os.environ.get("MASTER_PORT") == "0":  # one process: report the port its store bound
        os.environ["MASTER_PORT"] = str(_bound_port(dist) or 0)
    if dist.get_world_size() != rt.world_size:  # a silent singleton: refuse, never train alone
        raise WorkloadError(f"{rt.ranks.launcher} said world size {rt.world_size} but "
                            f"torch.distributed has {dist.get_world_size()}")
    # the run report lists every rank's host; the contention probe knows the run's processes
    rt.hosts, rt.pids = (list(x) for x in zip(*gather(rt, (socket.gethostname(),
                                                            os.getpid())), strict=True))
    return {"init_distributed_s": time.perf_counter() - started, "ops_built": building,
            **({"arch_list": arch_list} if arch_list else {})}


def _bound_port(dist) -> int | None:
    """The port the default group's TCPStore listens on (under its PrefixStores); None where
    this torch does not say (the report then shows port 0: the kernel's choice)."""
    default_store = getattr(dist.distributed_c10d, "_get_default_store", None)  # private API
    store = default_store() if default_store else None
    while not hasattr(store, "port") and hasattr(store, "underlying_store"):
        store = store.underlying_store
    return getattr(store, "port", None)


def initialize(model, config: dict, verbose: bool = False, sync_gradients: bool = True):
    """deepspeed.initialize with the full config; returns the engine.

    ``sync_gradients=False`` (independent workers: bert-mrpc's --no-sync-gradients): no
    gradient all-reduce, so every rank trains its own model on its own batches. Only
    without ZeRO: ZeRO stages partition gradients and optimizer states over the ranks. The
    config must not clip gradients either
    (:func:`dsenv.workloads.training.dsconfig.without_gradient_sync`): DeepSpeed averages the
    clipping norm over the ranks.
    """
    import deepspeed  # deepspeed: only once a run starts

    sink = io.StringIO()
    with (contextlib.redirect_stdout(sink) if not verbose else contextlib.nullcontext()), \
            reported():  # a failed op build: one line, not a traceback
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
    import torch.distributed as dist  # torch: only once a run starts

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
    import torch  # torch: only once a run starts

    return {key: torch.tensor(features[key], dtype=torch.long) for key in keys}


def micro_batches(tensors: dict, micro_batch: int, rt: Runtime, seed: int,
                  independent: bool = False) -> Iterator[dict]:
    """Endless micro-batches of this rank's shard; every epoch a fresh seeded permutation,
    the same on every rank, split so the ranks never see the same sample in one epoch.
    ``independent``: every rank draws from the whole data set in its own order (workers
    that train without gradient sync, each its own model)."""
    import torch  # torch: only once a run starts

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
    split: dict = field(default_factory=dict)  # ms per step by phase (phases.PhaseClock)
    contention: contention.Contention | None = None  # others on the node while timed (rank 0)
    step_seconds: list[float] = field(default_factory=list)  # each step (phases.StepTimes)


def _sync(rt: Runtime) -> None:
    if rt.on_gpu:
        import torch  # torch: only once a run starts

        torch.cuda.synchronize()


def train(engine, rt: Runtime, batches: Iterator[dict], steps: int, warmup_steps: int,
          label: str = "training", clip_norm: float = 0.0) -> TrainStats:
    """``steps`` optimizer steps through the engine; loss per step; samples/s after warm-up;
    where the timed steps' time went (:mod:`dsenv.workloads.training.phases`). ``clip_norm``: clip
    gradients here, between backward and step (the config left DeepSpeed's clipping off:
    :func:`dsenv.workloads.training.dsconfig.outside_clipping`)."""
    import torch  # torch: only once a run starts
    from rich.progress import (  # rich: only once a run starts
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
    before = None  # the contention sample at the first timed step (rank 0)
    engine.train()
    losses = []
    clock = PhaseClock(rt.on_gpu)
    step_times = StepTimes(rt.on_gpu)
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
            step_times.mark()
            if step == warmup_steps:
                _sync(rt)
                timed_from = time.perf_counter()
                before = contention.sample() if rt.is_main else None
            total = None
            timed = step >= warmup_steps
            for _ in range(grad_accum):
                # pinned, so the copy is truly asynchronous: torch waits for the GPU before
                # copying from pageable memory, which drains the queue every step
                batch = {k: (v.pin_memory() if rt.on_gpu else v).to(engine.device,
                                                                     non_blocking=True)
                         for k, v in next(batches).items()}
                clock.mark(0, timed)
                loss = engine(**batch).loss
                clock.mark(1, timed)
                engine.backward(loss)
                if clip_norm and engine.is_gradient_accumulation_boundary():
                    torch.nn.utils.clip_grad_norm_(engine.module.parameters(), clip_norm)
                clock.mark(2, timed)
                engine.step()
                clock.mark(3, timed)
                total = loss.detach() if total is None else total + loss.detach()
            losses.append(total / grad_accum)
            if not rt.is_main:
                continue
            if live and (step % 10 == 0 or step == steps - 1):
                progress.update(task, completed=step + 1, loss=f"{float(losses[-1]):.3f}")
            elif not live and ((step + 1) % every == 0 or step == steps - 1):
                rt.log(f"{label} step {step + 1}/{steps} loss {float(losses[-1]):.4f} "
                       f"({time.perf_counter() - begin:.1f} s)")
    step_times.mark()
    _sync(rt)
    end = time.perf_counter()
    busy = _contention(rt, before) if before is not None else None
    curve = torch.stack(losses).float().cpu().tolist() if losses else []
    timed = end - timed_from
    timed_steps = steps - warmup_steps
    split = clock.summary(grad_accum)
    return TrainStats(steps, warmup_steps, curve, end - begin, timed,
                      timed_steps * train_batch / timed if timed > 0 else 0.0, train_batch,
                      split, busy, step_times.seconds())


def _contention(rt: Runtime, before) -> contention.Contention:
    """Who else used this node's cores (and GPUs) during the timed steps."""
    here = socket.gethostname()
    pids = {pid for host, pid in zip(rt.hosts, rt.pids, strict=True) if host == here}
    pids = pids or {os.getpid()}
    gpus = []
    if rt.on_gpu:
        gpus = [f"{pid} {name}" for pid, name in contention.gpu_processes(
            os.environ.get("CUDA_VISIBLE_DEVICES") or None) if pid not in pids]
    return contention.between(before, contention.sample(before.cores), pids,
                              gpu_others=tuple(gpus))


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
    import numpy as np  # numpy: only once a run starts
    import torch  # torch: only once a run starts

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
    import torch  # torch: only once a run starts

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


def weights_digest(module) -> str:
    """sha256 of a module's parameters and buffers as this rank holds them: equal on two
    ranks only when their weights are bit for bit the same (without ZeRO-3, which leaves
    each rank a partition)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- saving
def save_model_atomically(engine, rt: Runtime, target: Path,
                          extra: Callable[[Path], object] | None = None,
                          source_rank: int = 0) -> Path:
    """save_pretrained into a hidden temporary folder next to ``target``, then rename it
    into place: an interrupted run never leaves a half-written model under ``target``.
    ZeRO-3 parameters are gathered first (every rank must call this). ``source_rank``: the
    rank whose model is saved (ranks that trained without gradient sync differ); rank 0
    writes it, since transformers' save_pretrained writes weights on rank 0 only."""
    import deepspeed  # deepspeed: only once a run starts

    target = Path(target)
    module = engine.module
    gathered = (deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
                if engine.zero_optimization_stage() == 3 else contextlib.nullcontext())
    state = None
    with gathered:
        if rt.rank == source_rank:
            state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    if source_rank != 0:
        import torch.distributed as dist  # torch: only once a run starts

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

"""What the ranks of ``dsenv doctor --distributed`` do together: all-reduce random data at
each size and check every element against the exact sum, then time the all-reduces as
nccl-tests times them (algbw, busbw = algbw x 2(n-1)/n, time averaged over the ranks)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.outcome import RANK_PHASES, AllreduceRow, WrongElement
from dsenv.doctor.distributed.pairs import rows_of, time_pairs

if TYPE_CHECKING:
    from dsenv.doctor.distributed.rank import RankRun


MIN_TIMED_ITERS = 3


def check_and_time(run: RankRun, seed: int) -> None:
    """All-reduce checks, then timings, at each of ``run.sizes``; rows into ``run.rows``.
    ``seed`` is rank 0's, so that every rank draws the same random data."""
    import torch  # torch: only the ranks need it, never `dsenv --help` or a plain doctor run
    import torch.distributed as dist  # torch, as above

    device = torch.device("cuda", torch.cuda.current_device()) if run.backend == "nccl" \
        else torch.device("cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = run.world
    bound = ranks.exact_value_bound(n)
    generator = torch.Generator(device=device)
    buffers = []
    started = time.monotonic()
    for i, size in enumerate(run.sizes):
        if i == 0:
            run.fault_point("check")
        run.enter(f"all-reduce check {ranks.format_size(size)}")
        count = max(1, size // 4)
        generator.manual_seed(seed + i)  # the same A and B on every rank
        # One random draw (the draw, not the all-reduce, dominated a 64 MiB check on CPU):
        # A in [-(m-1), m-1], B = |A shifted by one| + 1 in [1, m], never 0.
        a = torch.randint(1 - bound, bound, (count,), generator=generator, device=device,
                          dtype=torch.int32).to(torch.float32)
        b = torch.roll(a, 1).abs_().add_(1)
        x = a + ranks.rank_coefficient(run.rank) * b  # differs per rank, never all 0
        dist.all_reduce(x)
        sync()
        expected = n * a + ranks.coefficient_sum(n) * b
        wrong = x != expected
        count_wrong = int(wrong.sum())
        row = AllreduceRow(bytes=count * 4, count=count, wrong=count_wrong)
        if count_wrong:
            at = int(wrong.nonzero()[0])
            row.first_wrong = WrongElement(at, float(x[at]), float(expected[at]))
        run.rows.append(row)
        del a, b, expected, wrong
        buffers.append(x)
    run.timing.check_s = time.monotonic() - started
    started = time.monotonic()
    times = []
    for i, size in enumerate(run.sizes):
        if i == 0:
            run.fault_point("bandwidth")
        run.enter(f"bandwidth {ranks.format_size(size)}")
        times.append(timed_allreduce(buffers[i], run.plan.warmup_for(run.backend),
                                     run.plan.iters_for(run.backend),
                                     run.plan.budget_for(run.backend)))
    run.timing.bandwidth_s = time.monotonic() - started
    run.enter("gather")
    # nccl-tests reports the time averaged over the ranks (its -a 1 default)
    # ... and, in the same all-reduce, each rank's seconds per phase in its own slot
    phases = [float(getattr(run.timing, name) or 0.0) for name in RANK_PHASES]
    slots = [0.0] * (n * len(phases))
    slots[run.rank * len(phases):(run.rank + 1) * len(phases)] = phases
    gathered = torch.tensor(times + slots, dtype=torch.float64, device=device)
    dist.all_reduce(gathered)
    values = gathered.tolist()
    if run.rank == 0:
        for rank, record in run.records.items():
            mine = values[len(times) + rank * len(phases):][:len(phases)]
            record["phases"] = {name: round(v, 6) for name, v in zip(RANK_PHASES, mine,
                                                                     strict=True)}
    for row, total in zip(run.rows, values[:len(times)], strict=True):
        seconds = total / n
        row.time_us = seconds * 1e6
        row.algbw_gbps = ranks.algorithm_bandwidth(row.bytes, seconds)
        row.busbw_gbps = ranks.bus_bandwidth(row.algbw_gbps, n)
    pairs = run.pair_plan.pairs if run.pair_plan else []
    if pairs:  # one rank of each host pair, after the sweep (.pairs)
        run.enter("host pairs")
        started = time.monotonic()
        seconds = time_pairs(run, pairs)
        run.timing.pairs_s = time.monotonic() - started
        if run.rank == 0:
            run.pair_plan.rows = rows_of(pairs, seconds, run.records, run.backend)


def timed_allreduce(x, warmup: int, iters: int, budget_s: float | None = None) -> float:
    """Seconds per in-place all-reduce of ``x`` as nccl-tests times it: ``warmup`` untimed
    ones, a barrier, then ``iters`` back to back, timed to the completion of the last.

    ``budget_s``: the seconds this size may take. The first warm-up is timed and every rank
    takes the slowest rank's time (one all-reduce of a float, so all ranks run the same
    count); when ``warmup + iters`` of those would overrun the budget, fewer are run, never
    fewer than MIN_TIMED_ITERS timed, as the OSU micro-benchmarks run fewer iterations of
    large messages (a 64 MiB gloo all-reduce over a slow CPU fabric takes ~0.3 s each).
    """
    import torch  # torch: only the ranks need it
    import torch.distributed as dist  # torch, as above

    on_gpu = x.device.type == "cuda"

    def sync():
        if on_gpu:
            torch.cuda.synchronize(x.device)

    if budget_s is not None and warmup > 0:
        sync()
        first = time.perf_counter()
        dist.all_reduce(x)
        sync()
        estimate = torch.tensor([time.perf_counter() - first], dtype=torch.float64,
                                device=x.device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
        each = max(estimate.item(), 1e-9)
        iters = max(MIN_TIMED_ITERS, min(iters, int(budget_s / each)))
        warmup = min(warmup - 1, max(0, int(budget_s / 4 / each) - 1))  # one already ran
    for _ in range(warmup):
        dist.all_reduce(x)
    sync()
    if on_gpu:
        dist.barrier(device_ids=[x.device.index])
    else:
        dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    return (time.perf_counter() - start) / iters

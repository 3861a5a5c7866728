"""Bus bandwidth between host pairs, so that one slow link is named, not averaged away.

After the all-ranks sweep (:mod:`.allreduce`), the lowest rank of each host
exchanges one buffer with the lowest rank of another host, both ways at once: the traffic of
a 2-rank all-reduce (each side sends and receives the whole buffer), so busbw = bytes / time
compares with the all-ranks busbw. Each pair keeps its fastest of ``iters`` exchanges: a
slow link is slow every time, while load on a shared node only ever slows an exchange down,
so the fastest is what the link can do. Rank 0 chooses the pairs (:func:`plan_pairs`) from the
records and hands them to every rank in its ``go`` word; each pair's lower rank times it and
one all-reduce of a vector (one float per pair) brings the times to rank 0.

Bounded for 1,000 hosts: up to ``all_pairs_up_to`` hosts (distributed.toml) every pair is
timed, one at a time, a barrier between two (8 hosts: 28 pairs);
above it only ring neighbours, H pairs in 3 rounds of pairs that share no host and run
together, so the cost is 3 rounds and one vector of H floats at rank 0, whatever H is.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.command import AREA, defaults
from dsenv.doctor.distributed.outcome import PairPlan, PairRow, RankRecord
from dsenv.verdicts.findings import Result, Status

if TYPE_CHECKING:
    from dsenv.doctor.distributed.rank import RankRun

TITLE = "Bandwidth between host pairs"
MAX_ROWS_SHOWN = 16


def settings() -> dict:
    return defaults()["pairs"]


# -- rank 0: which pairs ---------------------------------------------------------------------------
def host_leaders(records: Mapping[int, RankRecord]) -> dict[str, int]:
    """{host: its lowest rank}, hosts in the order of those ranks."""
    leaders: dict[str, int] = {}
    for rank in sorted(records):
        leaders.setdefault(str(records[rank].get("host")), rank)
    return leaders


def plan_pairs(records: Mapping[int, RankRecord], all_pairs_up_to: int | None = None
               ) -> PairPlan:
    """What was chosen and why, and the pairs: [[rank a, rank b, round], ...]."""
    limit = settings()["all_pairs_up_to"] if all_pairs_up_to is None else all_pairs_up_to
    leaders = list(host_leaders(records).values())
    hosts = len(leaders)
    if hosts < 2:
        return PairPlan("all ranks on one host: no host pairs", [])
    if hosts <= limit:
        pairs = [[a, b, i] for i, (a, b) in enumerate(itertools.combinations(leaders, 2))]
        return PairPlan(f"every pair of {hosts} hosts ({len(pairs)}), one at a time", pairs)
    pairs = []
    for i in range(hosts):
        # ring neighbours: even pairs, then odd pairs; with an odd H the closing pair
        # (last host, first host) shares a host with pair 0, so it gets a round of its own
        round_ = 2 if (hosts % 2 and i == hosts - 1) else i % 2
        pairs.append([leaders[i], leaders[(i + 1) % hosts], round_])
    total = hosts * (hosts - 1) // 2
    return PairPlan(f"ring neighbours of {hosts} hosts ({hosts} of {total} pairs, 3 rounds; "
                    f"every pair above {limit} hosts would take too long)", pairs)


# -- every rank: time its pairs ----------------------------------------------------------------
def time_pairs(run: RankRun, pairs: list[list[int]]) -> list[float]:
    """Seconds of each pair's fastest exchange (0 where this rank is not the pair's lower
    rank before the sum), the same list on every rank afterwards."""
    import torch  # torch: only the ranks need it, never `dsenv --help` or a plain doctor run
    import torch.distributed as dist  # torch, as above

    conf = settings()
    size = ranks.parse_size(conf["sizes"][run.backend])
    on_gpu = run.backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu \
        else torch.device("cpu")
    send = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    received = torch.empty_like(send)
    times = torch.zeros(len(pairs), dtype=torch.float64, device=device)

    def sync():
        if on_gpu:
            torch.cuda.synchronize(device)

    def exchange(peer: int):
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, received, peer)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    for round_ in sorted({p[2] for p in pairs}):
        for index, (a, b, r) in enumerate(pairs):
            if r != round_ or run.rank not in (a, b):
                continue
            peer = b if run.rank == a else a
            for _ in range(conf["warmup"]):
                exchange(peer)
            sync()
            best = float("inf")
            for _ in range(conf["iters"]):
                start = time.perf_counter()
                exchange(peer)
                sync()
                best = min(best, time.perf_counter() - start)
            if run.rank == a:
                times[index] = best
        if on_gpu:
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
    dist.all_reduce(times)
    return times.tolist()


def rows_of(pairs: list[list[int]], seconds: list[float], records: Mapping[int, RankRecord],
            backend: str) -> list[PairRow]:
    size = max(1, ranks.parse_size(settings()["sizes"][backend]) // 4) * 4
    return [PairRow([records[a].get("host"), records[b].get("host")], [a, b], size, t * 1e6,
                    ranks.algorithm_bandwidth(size, t))
            for (a, b, _), t in zip(pairs, seconds, strict=True)]


# -- the verdict -----------------------------------------------------------------------------------
def percentile(values: list[float], percent: float) -> float:
    """Nearest-rank percentile (the smallest value with ``percent`` % of values at or below)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def slow_pairs(rows: list[PairRow]) -> tuple[float, list[PairRow], list[str]]:
    """(reference busbw, the rows below slow_below x reference, hosts in every slow row)."""
    conf = settings()
    values = [r.busbw_gbps for r in rows]
    if len(values) < 2:
        return (values[0] if values else 0.0), [], []
    reference = percentile(values, conf["reference_percentile"])
    slow = [r for r in rows if r.busbw_gbps < conf["slow_below"] * reference]
    common = set(slow[0].hosts) if slow else set()
    for row in slow[1:]:
        common &= set(row.hosts)
    if len(slow) == 1:
        common = set()  # one slow pair: either end could be the slow one
    return reference, slow, sorted(common)


def _pair(row: PairRow) -> str:
    return f"{row.hosts[0]} - {row.hosts[1]}"


def result(links: PairPlan | None) -> Result:
    """The distributed.links result from the outcome's host pairs (None: not reached)."""
    def make(status, summary, evidence=(), fix=None):
        return Result(f"{AREA}.links", AREA, TITLE, status, summary, list(evidence), fix)

    if not links:
        return make(Status.SKIP, "not timed: the ranks did not reach it")
    rows = links.rows or []
    if not links.pairs:
        return make(Status.SKIP, links.selection or "no host pairs")
    ordered = sorted(rows, key=lambda r: r.busbw_gbps)
    evidence = [f"{_pair(r)} (ranks {r.ranks[0]}, {r.ranks[1]}): {r.time_us:.1f} us, "
                f"busbw {r.busbw_gbps:.2f} GB/s" for r in ordered[:MAX_ROWS_SHOWN]]
    if len(ordered) > MAX_ROWS_SHOWN:
        evidence.append(f"{len(ordered) - MAX_ROWS_SHOWN} faster pairs in --json")
    evidence.append(f"pairs: {links.selection}; {ranks.format_size(rows[0].bytes)} "
                    "both ways at once per exchange")
    reference, slow, common = slow_pairs(rows)
    spread = (f"busbw {ordered[0].busbw_gbps:.2f} ({_pair(ordered[0])}) to "
              f"{ordered[-1].busbw_gbps:.2f} GB/s ({_pair(ordered[-1])})")
    if len(rows) == 1:
        return make(Status.INFO, f"one pair ({_pair(rows[0])}): busbw "
                    f"{rows[0].busbw_gbps:.2f} GB/s", evidence)
    if not slow:
        return make(Status.OK, f"{len(rows)} pairs, {spread}", evidence)
    conf = settings()
    named = ", ".join(f"{_pair(r)} at {r.busbw_gbps:.2f} GB/s" for r in slow[:4])
    summary = (f"{len(slow)} slow pair{'s' if len(slow) > 1 else ''}: {named}, below "
               f"{conf['slow_below']:g} x the pairs' reference {reference:.2f} GB/s (their "
               f"{conf['reference_percentile']}th percentile)")
    if common:
        summary += f"; {', '.join(common)} is in every slow pair: its link is the slow one"
    where = ", ".join(common) if common else "both hosts of each slow pair"
    fix = (f"check the fabric link of {where}: `ip -s link` and `ethtool` on the interface "
           "the ranks use (the interface column), cabling or switch port, a traffic shaper "
           "(`tc qdisc show`); rerun with NCCL_DEBUG=INFO to see the transport each pair used")
    return make(Status.WARN, summary, evidence, fix)

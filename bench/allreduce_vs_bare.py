"""`dsenv doctor --distributed`'s all-reduce bus bandwidth against a bare torch.distributed
all_reduce loop at the same size, alternating, in one run.

    python bench/allreduce_vs_bare.py [--mode both|inprocess|launch] [--rounds 7]
                                      [--size 64M] [--nprocs 2] [--threads 1]

inprocess: N ranks (torchrun) of this file's worker share one process group and alternate,
    round by round, between dsenv's timing (dsenv.doctor.distributed.allreduce.timed_allreduce,
    what the doctor's ranks run) and a bare loop written here (warm-up all_reduces, a
    barrier, timed all_reduces). Same processes, same size, the order swapped every round:
    the comparison the machine's load disturbs least.
launch: each round runs the whole command, `dsenv doctor --distributed --launch torchrun -n N
    --sizes SIZE --only distributed --json` (its ranks with their watchdog, liveness and
    store threads, the correctness pass first), and N fresh ranks of the bare loop alone,
    alternating which goes first; busbw read from each.
Both sides: the same warm-up and timed counts (dsenv's CPU defaults 3 and 10), busbw =
algbw x 2(n-1)/n with the time averaged over the ranks (nccl-tests' definitions), the same
OMP_NUM_THREADS (--threads). Goal (issue 6): dsenv/bare >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from dsenv.doctor.distributed.allreduce import timed_allreduce
from dsenv.doctor.distributed.ranks import (
    algorithm_bandwidth,
    bus_bandwidth,
    format_size,
    parse_size,
)
from dsenv.net import free_port


def bare_seconds(x, warmup: int, iters: int) -> float:
    """The bare loop: what someone would write with torch.distributed alone."""
    import torch  # torch: only the ranks need it
    import torch.distributed as dist  # torch, as above

    for _ in range(warmup):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def worker(args, size: int) -> None:
    """One rank (run by torchrun): --mode launch runs the bare loop once; inprocess
    alternates dsenv's timing and the bare loop --rounds times."""
    import torch  # torch: only the ranks need it
    import torch.distributed as dist  # torch, as above

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if on_gpu else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    n = dist.get_world_size()

    def busbw(seconds: float) -> float:
        total = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(total)  # the time averaged over the ranks
        return bus_bandwidth(algorithm_bandwidth(size, float(total) / n), n)

    sides = {"bare": bare_seconds, "dsenv": timed_allreduce}
    order = ["bare"] if args.mode == "launch" else ["dsenv", "bare"]
    rounds = 1 if args.mode == "launch" else args.rounds
    for round_ in range(rounds):
        result = {}
        for name in order if round_ % 2 == 0 else order[::-1]:
            x = torch.randn(size // 4, device=device)
            result[name] = busbw(sides[name](x, args.warmup, args.iters))
            del x
        if dist.get_rank() == 0:
            print("ROUND " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def torchrun(args, size: int, mode: str, env: dict) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                          str(args.nprocs), "--master_addr", "127.0.0.1", "--master_port",
                          str(free_port()), __file__, "--worker", "--mode", mode, "--size",
                          str(size), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
                          "--iters", str(args.iters)],
                         capture_output=True, text=True, env=env, timeout=1800)
    rounds = [json.loads(line[6:]) for line in out.stdout.splitlines()
              if line.startswith("ROUND ")]
    if not rounds:
        raise SystemExit(f"bench ranks failed (rc {out.returncode}): {out.stderr[-2000:]}")
    return rounds


def dsenv_command(args, env) -> float:
    out = subprocess.run(["dsenv", "doctor", "--distributed", "--launch", "torchrun", "-n",
                          str(args.nprocs), "--sizes", args.size, "--warmup", str(args.warmup),
                          "--iters", str(args.iters), "--only", "distributed", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(out.stdout)
    rows = report["distributed"]["allreduce"]
    if report["distributed"]["failure"] or not rows:
        raise SystemExit(f"dsenv run failed: {report['distributed']['failure']}")
    return rows[-1]["busbw_gbps"]


def summary(title: str, rounds: list[dict]) -> float:
    d = statistics.median(r["dsenv"] for r in rounds)
    b = statistics.median(r["bare"] for r in rounds)
    ratios = [r["dsenv"] / r["bare"] for r in rounds]
    print(f"{title}: median busbw dsenv {d:.3f} GB/s, bare {b:.3f} GB/s; ratio of medians "
          f"{d / b:.3f}; per-round ratios {min(ratios):.2f}-{max(ratios):.2f}, median "
          f"{statistics.median(ratios):.3f} ({len(rounds)} rounds)")
    return d / b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("both", "inprocess", "launch"), default="both")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", default="64M")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for both")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(args.size)
    if args.worker:
        worker(args, size)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MASTER_ADDR="127.0.0.1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    print(f"all-reduce {format_size(size)}, {args.nprocs} ranks (torchrun), warm-up "
          f"{args.warmup}, timed {args.iters}, OMP_NUM_THREADS={args.threads}, load before "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    ratios = {}
    if args.mode in ("both", "inprocess"):
        rounds = torchrun(args, size, "inprocess", env)
        for i, r in enumerate(rounds, 1):
            print(f"  in-process round {i}: dsenv {r['dsenv']:.3f}, bare {r['bare']:.3f} GB/s")
        ratios["in-process"] = summary("in-process", rounds)
    if args.mode in ("both", "launch"):
        rounds = []
        for i in range(args.rounds):
            if i % 2 == 0:
                r = {"dsenv": dsenv_command(args, env),
                     "bare": torchrun(args, size, "launch", env)[0]["bare"]}
            else:
                r = {"bare": torchrun(args, size, "launch", env)[0]["bare"],
                     "dsenv": dsenv_command(args, env)}
            rounds.append(r)
            print(f"  whole-command round {i + 1}: dsenv {r['dsenv']:.3f}, bare "
                  f"{r['bare']:.3f} GB/s", flush=True)
        ratios["whole command"] = summary("whole command", rounds)
    print("goal dsenv/bare >= 0.9: " + ", ".join(
        f"{k} {v:.3f} {'met' if v >= 0.9 else 'NOT met'}" for k, v in ratios.items())
        + f"; load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

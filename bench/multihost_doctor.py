"""`dsenv doctor --distributed` on namespaced hosts: time to verdict, and its bus bandwidth
against a bare torch.distributed all-reduce loop across the same hosts, in one run.

    python bench/multihost_doctor.py [--hosts 4] [--rounds 5] [--size 64M]

Starts the multi-host test cluster (tests/netns.py, tests/slurmcluster.py: N namespaced hosts,
one slurmd each, gloo over hsn0) and submits one job of N nodes x 1 task. Each round runs,
alternating which goes first:
  doctor: `srun dsenv doctor --distributed --only distributed --json` (its default sizes,
          64 KiB to 64 MiB on CPU, then the host pairs), timed
          from srun's start to its end on the batch host (time to verdict, as a user waits
          for it: Python start, imports, rendezvous, checks, sweep, host pairs, report);
  bare:   `srun python THIS --bare SIZE`: init_process_group, the same warm-up and timed
          all_reduce counts (dsenv's CPU defaults 3 and 10) on the same size, nothing else.
busbw = algbw x 2(n-1)/n with the time averaged over the ranks (nccl-tests' definitions),
both read at SIZE (the doctor's largest default size). Goals (issue 16): time to verdict <= 10 s on 4 hosts; doctor/bare >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP, ITERS = 3, 10


def bare(size: int) -> None:
    """One rank of the bare loop (run by srun on every host)."""
    import torch  # torch: only the ranks need it
    import torch.distributed as dist  # torch, as above

    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['MASTER_PORT']}", rank=rank, world_size=world)
    x = torch.ones(size // 4, dtype=torch.float32)
    for _ in range(WARMUP):
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    seconds = torch.tensor([(time.perf_counter() - start) / ITERS], dtype=torch.float64)
    dist.all_reduce(seconds)
    if rank == 0:
        mean = seconds.item() / world
        print("BARE " + json.dumps({"busbw_gbps": size / mean / 1e9 * 2 * (world - 1) / world,
                                    "time_us": mean * 1e6}), flush=True)
    dist.destroy_process_group()


JOB = """#!/bin/bash
export MASTER_ADDR=h1 GLOO_SOCKET_IFNAME=hsn0 OMP_NUM_THREADS=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
run_doctor() {{
    export MASTER_PORT=$((MASTER_PORT_BASE + $1))
    start=$EPOCHREALTIME
    srun --mpi=none {python} -m dsenv doctor --distributed --only distributed --json \\
        --timeout 60 {doctor_args} > {folder}/doctor-$1.json
    echo "DOCTOR $1 $(awk "BEGIN {{ print $EPOCHREALTIME - $start }}")"
}}
run_bare() {{
    export MASTER_PORT=$((MASTER_PORT_BASE + 100 + $1))
    srun --mpi=none {python} {this} --bare {size}
}}
MASTER_PORT_BASE=$((20000 + SLURM_JOB_ID % 10000))
for round in $(seq 1 {rounds}); do
    if [ $((round % 2)) -eq 1 ]; then run_doctor $round; run_bare $round
    else run_bare $round; run_doctor $round; fi
done
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", default="64M")
    parser.add_argument("--doctor-args", default="", help="more `dsenv doctor` arguments")
    parser.add_argument("--bare", metavar="SIZE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from dsenv.doctor.distributed.ranks import parse_size

    if args.bare:
        bare(parse_size(args.bare))
        return 0
    from tests.harness import slurmcluster

    cluster = slurmcluster.SlurmCluster(hosts=args.hosts).start()
    try:
        folder = cluster.state_dir / "bench"
        folder.mkdir()
        script = folder / "job.sh"
        script.write_text(JOB.format(python=sys.executable, this=Path(__file__).resolve(),
                                     size=args.size, folder=folder, rounds=args.rounds,
                                     doctor_args=args.doctor_args))
        env = {k: v for k, v in cluster.env().items()
               if not k.startswith(("MASTER_", "GLOO_", "OMPI_", "PMI"))}
        job = cluster.sbatch(script, timeout=60 * args.rounds + 120, cwd=folder, env=env,
                             args=[f"--nodes={args.hosts}", "--ntasks-per-node=1"])
        if job.exit_code != 0:
            print(job.output[-4000:])
            return 1
        verdicts = [float(line.split()[2]) for line in job.output.splitlines()
                    if line.startswith("DOCTOR ")]
        bare_bw = [json.loads(line[5:])["busbw_gbps"] for line in job.output.splitlines()
                   if line.startswith("BARE ")]
        doctor_bw, inside = [], []
        for round_ in range(1, args.rounds + 1):
            report = json.loads((folder / f"doctor-{round_}.json").read_text())
            doctor_bw.append(report["distributed"]["allreduce"][-1]["busbw_gbps"])
            inside.append(report["distributed"]["seconds"])
            print(f"round {round_} rank 0 phases: " + ", ".join(
                f"{k} {v:.2f}" for k, v in report["distributed"]["timing"].items()))
            assert report["exit_code"] == 0, report["summary"]
    finally:
        cluster.stop()
    ratios = [d / b for d, b in zip(doctor_bw, bare_bw, strict=True)]
    print(f"{args.hosts} hosts x 1 rank, gloo over hsn0, {args.size}, {args.rounds} rounds "
          "(doctor and bare alternating which goes first)")
    for i, (t, d, b, n) in enumerate(zip(verdicts, doctor_bw, bare_bw, inside, strict=True),
                                     1):
        print(f"  round {i}: time to verdict {t:5.2f} s (rank 0's test itself {n:5.2f} s)   "
              f"busbw doctor {d:.3f} GB/s   bare {b:.3f} GB/s   ratio {d / b:.2f}")
    print(f"time to verdict: median {statistics.median(verdicts):.2f} s "
          f"(min {min(verdicts):.2f}, max {max(verdicts):.2f}); goal <= 10 s")
    print(f"busbw doctor/bare: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); goal >= 0.9")
    return 0


if __name__ == "__main__":
    sys.exit(main())

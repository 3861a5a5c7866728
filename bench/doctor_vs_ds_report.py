"""`dsenv doctor` against DeepSpeed's own `ds_report`, alternating, in one run.

    python bench/doctor_vs_ds_report.py [--rounds 7]

Each round runs `ds_report`, then `dsenv doctor` with its probe cache warm (the usual case:
the cache only changes when packages or toolkits change), then `dsenv doctor` with an empty
cache (the first run after an install). Prints the medians and the ratios doctor/ds_report.
Goal (issue 2): warm doctor <= 0.5 x ds_report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ds_report = shutil.which("ds_report")
    dsenv = shutil.which("dsenv")
    if not ds_report or not dsenv:
        print("needs both ds_report (pip install deepspeed) and dsenv on PATH", file=sys.stderr)
        return 2
    base = dict(os.environ)
    warm_dir = tempfile.mkdtemp(prefix="dsenv-bench-warm-")
    warm_env = dict(base, DSENV_CACHE_DIR=warm_dir)
    subprocess.run([dsenv, "doctor", "--json"], env=warm_env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)  # fill the cache
    times: dict[str, list[float]] = {"ds_report": [], "doctor (warm cache)": [],
                                     "doctor (cold cache)": []}
    for _ in range(args.rounds):
        times["ds_report"].append(timed([ds_report], base))
        times["doctor (warm cache)"].append(timed([dsenv, "doctor", "--json"], warm_env))
        cold_dir = tempfile.mkdtemp(prefix="dsenv-bench-cold-")
        times["doctor (cold cache)"].append(
            timed([dsenv, "doctor", "--json"], dict(base, DSENV_CACHE_DIR=cold_dir)))
        shutil.rmtree(cold_dir, ignore_errors=True)
    shutil.rmtree(warm_dir, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'command':<22} {'median s':>9} {'min s':>7} {'max s':>7}  ratio to ds_report")
    for name, values in times.items():
        ratio = medians[name] / medians["ds_report"]
        print(f"{name:<22} {medians[name]:>9.3f} {min(values):>7.3f} {max(values):>7.3f}  {ratio:.2f}")
    warm_ratio = medians["doctor (warm cache)"] / medians["ds_report"]
    print(f"\nmedian ratio doctor/ds_report (warm): {warm_ratio:.2f}  (goal <= 0.50: "
          f"{'met' if warm_ratio <= 0.5 else 'NOT met'}), rounds={args.rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`dsenv doctor` against DeepSpeed's own `ds_report`, alternating, in one run.

    python bench/doctor_vs_ds_report.py [--rounds 7] [--json FILE]

Each round runs `ds_report`, then `dsenv doctor` with its probe cache warm (the usual case:
the cache only changes when packages or toolkits change), then `dsenv doctor` with an empty
cache (the first run after an install). Prints the medians of wall time and of CPU time (user
+ system of the command and its children: steadier than wall time on a loaded machine) and
the ratios doctor/ds_report. Goals (issue 14): warm <= 0.25 x ds_report, cold <= 0.5 x; on
a GPU node (issue 22) the same. Then where one doctor run's time went, from its report's
per-check seconds and per-probe timing (the slowest five of each), and the GPU it ran on.
``--json FILE`` writes all of it as one JSON object (a device check keeps it).

dsenv's modules are byte-compiled first, as an install does (pip and uv write the .pyc files
of what they install, DeepSpeed's and torch's included): an editable checkout run under
PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module it imports on every run.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GOALS = {"doctor (warm cache)": 0.25, "doctor (cold cache)": 0.5}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300, check=False)
    return time.perf_counter() - start, _children_cpu() - cpu


def compile_dsenv() -> None:
    """Byte-compile dsenv's source folders (an editable install's are the checkout's)."""
    for name in ("dsenv", "dsenv.envs", "dsenv.doctor", "dsenv.provision", "dsenv.workloads"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)


def where_time_went(dsenv: str, env: dict) -> dict:
    """One `dsenv doctor --json` run: its slowest checks and probes."""
    done = subprocess.run([dsenv, "doctor", "--json"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return {"error": f"dsenv doctor --json exited {done.returncode}: {done.stderr[-300:]}"}
    checks = sorted(report["results"], key=lambda r: -(r.get("seconds") or 0))[:5]
    timing = report.get("timing") or {}
    probes = sorted(timing.get("probes") or [], key=lambda p: -p["seconds"])[:5]
    return {"checks_s": timing.get("checks_s"),
            "slowest_checks": [{"id": r["id"], "seconds": round(r.get("seconds") or 0, 3),
                                "summary": r["summary"]} for r in checks],
            "slowest_probes": probes}


def gpu_line() -> str:
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60,
                          check=False)
    return " | ".join(done.stdout.strip().splitlines()) or f"nvidia-smi -L: {done.stderr}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    ds_report = shutil.which("ds_report")
    dsenv = shutil.which("dsenv")
    if not ds_report or not dsenv:
        print("needs both ds_report (pip install deepspeed) and dsenv on PATH", file=sys.stderr)
        return 2
    compile_dsenv()
    base = dict(os.environ)
    warm_dir = tempfile.mkdtemp(prefix="dsenv-bench-warm-")
    warm_env = dict(base, DSENV_CACHE_DIR=warm_dir)
    subprocess.run([dsenv, "doctor", "--json"], env=warm_env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)  # fill the cache
    times: dict[str, list[tuple[float, float]]] = {"ds_report": [], "doctor (warm cache)": [],
                                                   "doctor (cold cache)": []}
    for _ in range(args.rounds):
        times["ds_report"].append(timed([ds_report], base))
        times["doctor (warm cache)"].append(timed([dsenv, "doctor", "--json"], warm_env))
        cold_dir = tempfile.mkdtemp(prefix="dsenv-bench-cold-")
        times["doctor (cold cache)"].append(
            timed([dsenv, "doctor", "--json"], dict(base, DSENV_CACHE_DIR=cold_dir)))
        shutil.rmtree(cold_dir, ignore_errors=True)
    shutil.rmtree(warm_dir, ignore_errors=True)

    walls = {name: [w for w, _ in values] for name, values in times.items()}
    cpus = {name: [c for _, c in values] for name, values in times.items()}
    wall_med = {name: statistics.median(v) for name, v in walls.items()}
    cpu_med = {name: statistics.median(v) for name, v in cpus.items()}
    print(f"{'command':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'wall ratio':>10} "
          f"{'CPU s':>7} {'CPU ratio':>9}")
    for name in times:
        print(f"{name:<22} {wall_med[name]:>9.3f} {min(walls[name]):>7.3f} "
              f"{max(walls[name]):>7.3f} {wall_med[name] / wall_med['ds_report']:>10.2f} "
              f"{cpu_med[name]:>7.3f} {cpu_med[name] / cpu_med['ds_report']:>9.2f}")
    print()
    for name, goal in GOALS.items():
        wall = wall_med[name] / wall_med["ds_report"]
        cpu = cpu_med[name] / cpu_med["ds_report"]
        print(f"{name}: wall {wall:.2f}, CPU {cpu:.2f} x ds_report (goal <= {goal:.2f}: "
              f"{'met' if wall <= goal else 'NOT met'}), rounds={args.rounds}")
    went = where_time_went(dsenv, base)
    gpus = gpu_line()
    print(f"\nwhere one doctor run's time went ({gpus}; checks run in parallel: "
          f"{went.get('checks_s')} s all together):")
    for row in went.get("slowest_checks", []):
        print(f"  check {row['id']:<28} {row['seconds']:>7.3f} s  {row['summary'][:70]}")
    for row in went.get("slowest_probes", []):
        print(f"  probe {row['id']:<50} {row['seconds']:>7.3f} s (started at "
              f"{row['started_s']:.3f} s)")
    if "error" in went:
        print("  " + went["error"])
    if args.json:
        figures = {
            "gpus": gpus, "rounds": args.rounds, "platform": platform.platform(),
            "commands": {name: {"wall_median_s": round(wall_med[name], 3),
                                "wall_min_s": round(min(walls[name]), 3),
                                "wall_max_s": round(max(walls[name]), 3),
                                "cpu_median_s": round(cpu_med[name], 3),
                                "wall_ratio": round(wall_med[name] / wall_med["ds_report"], 3)}
                         for name in times},
            "goals": {name: {"goal": goal, "met": wall_med[name] / wall_med["ds_report"] <= goal}
                      for name, goal in GOALS.items()},
            "doctor_run": went,
        }
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long `dsenv --help` takes, against the interpreter's own start and `ds_report --help`.

    python bench/help_time.py [--runs 21]

`dsenv --help` must stay about an interpreter start: it imports nothing heavy (no torch, no
DeepSpeed, no doctor checks; tests/test_doctor_framework.py proves that without a clock).
This times it instead of a wall-clock limit inside the suite, where a busy CI machine would
make it flaky. Each round runs, in turn, `python -c pass` (the floor), `dsenv --help` (the
console script this interpreter installed, not a pyenv shim) and, when DeepSpeed is
installed, `ds_report --help` (a peer that imports torch and DeepSpeed first). Prints the
median, min and max wall time and the median CPU time (user + system of the child: steadier
on a loaded machine) of each, and their ratios to the floor; then whether dsenv's median is
within the 0.3 s budget the old timed test had.

dsenv's modules are byte-compiled first, as an install does (see doctor_vs_ds_report.py).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUDGET_S = 0.3  # the limit test_help_is_fast had


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``; a failed run stops the bench."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                   check=True)
    return time.perf_counter() - start, _children_cpu() - cpu


def script(name: str) -> str | None:
    """The console script beside this interpreter (a pyenv shim on PATH would add its own
    start-up), else the one on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which(name)


def compile_dsenv() -> None:
    for name in ("dsenv", "dsenv.envs", "dsenv.doctor", "dsenv.provision", "dsenv.workloads"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    dsenv = script("dsenv")
    if not dsenv:
        print("needs dsenv installed (pip install -e .)", file=sys.stderr)
        return 2
    compile_dsenv()
    commands = {"python -c pass": [sys.executable, "-c", "pass"], "dsenv --help": [dsenv, "--help"]}
    ds_report = script("ds_report")
    if ds_report:
        commands["ds_report --help"] = [ds_report, "--help"]
    for argv in commands.values():  # warm the page cache
        timed(argv)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():
            times[name].append(timed(argv))

    wall = {name: [w for w, _ in values] for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    median = {name: statistics.median(values) for name, values in wall.items()}
    floor = "python -c pass"
    print(f"{'command':<18} {'median s':>9} {'min s':>7} {'max s':>7} {'x floor':>8} "
          f"{'CPU s':>7} {'CPU x floor':>11}")
    for name in commands:
        print(f"{name:<18} {median[name]:>9.3f} {min(wall[name]):>7.3f} {max(wall[name]):>7.3f} "
              f"{median[name] / median[floor]:>8.2f} {cpu[name]:>7.3f} "
              f"{cpu[name] / cpu[floor]:>11.2f}")
    print()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at the end")
    own = median["dsenv --help"]
    print(f"dsenv --help: median {own:.3f} s wall ({cpu['dsenv --help']:.3f} s CPU) over "
          f"{args.runs} runs, {own - median[floor]:.3f} s above the interpreter's start"
          + (f", {median['ds_report --help'] / own:.1f}x faster than ds_report --help"
             if ds_report else "")
          + f"; budget {BUDGET_S} s: {'met' if own <= BUDGET_S else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

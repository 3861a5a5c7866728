"""What the HTML report of a run costs, against the plotting library a user would reach for.

    python bench/html_report_cost.py REPORT.json [--rounds 7]

REPORT.json is a real run's report (e.g. ``dsenv smoke bert-squad`` writes
dsenv-output/bert-squad-smoke/report.json). Times, per round, in this process:

* dsenv: ``write_run_page`` (the whole page: both plots as inline SVG, verdicts, examples,
  tables, written through a temporary file and a rename), as the run does after report.json;
* matplotlib (when installed): the same two plots only (loss per step, samples/s per device
  per step), each drawn to an in-memory SVG with ``savefig(format="svg")``, the Agg backend;
  the import is timed once, apart, since a run would pay it once.

Prints the medians and the ratio dsenv / matplotlib (< 1: dsenv's whole page is cheaper than
the peer's two plots). Goal (issue): the page costs <= 1 s on top of a smoke.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

from dsenv.workloads.pages import write_run_page


def matplotlib_plots(report: dict) -> int:
    """The two plots as SVG with matplotlib; the bytes written."""
    import matplotlib.pyplot as plt

    train = report["training"]
    batch, world = report["batch"]["train_batch_size"], report["run"]["world_size"]
    size = 0
    for ys in (train["loss_curve"], [batch / s / world for s in train["step_seconds"] if s]):
        figure, axes = plt.subplots(figsize=(6.4, 2.6))
        axes.plot(range(1, len(ys) + 1), ys)
        axes.axvline(train["warmup_steps"] + 0.5, linestyle=":")
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
        plt.close(figure)
        size += len(buffer.getvalue())
    return size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    report = json.loads(args.report.read_text())
    steps = len(report["training"].get("step_seconds") or [])
    print(f"report: {args.report} ({report['workload']} {report['mode']}, {steps} steps)")
    try:
        started = time.perf_counter()
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401

        imported = time.perf_counter() - started
    except ImportError:
        imported = None
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            started = time.perf_counter()
            page = write_run_page(report, Path(folder) / "report.html")
            ours.append(time.perf_counter() - started)
            if imported is not None:
                started = time.perf_counter()
                matplotlib_plots(report)
                theirs.append(time.perf_counter() - started)
        size = page.stat().st_size
    mine = statistics.median(ours)
    print(f"dsenv page (whole, {size / 1024:.0f} KiB): median {mine * 1000:.1f} ms over "
          f"{args.rounds} rounds")
    if imported is None:
        print("matplotlib: not installed (pip install matplotlib to compare)")
        return 0
    peer = statistics.median(theirs)
    print(f"matplotlib (two plots only, SVG): median {peer * 1000:.1f} ms, plus its import "
          f"{imported * 1000:.0f} ms once")
    print(f"ratio dsenv / matplotlib: {mine / peer:.2f} (import excluded), "
          f"{mine / (peer + imported):.2f} (one run's cost, import included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``dsenv smoke all``: every bundled smoke in turn, then one table.

Each workload runs as its own ``python -m dsenv.workloads.cli smoke WORKLOAD`` process with
the options given here: a fresh process keeps one workload's torch.distributed group and
DeepSpeed / accelerate state out of the next. Its output goes to OUTPUT_DIR/WORKLOAD/
smoke.log, its JSON report to OUTPUT_DIR/WORKLOAD/report.json; the table is read from the
reports. Under a launcher every rank runs the same sequence: the children inherit the
rank variables, and each workload's process group gets its own port (MASTER_PORT + 1 +
its index), so a port the previous one still holds never collides.

Exit 0 when every smoke passes, 1 when a verdict failed or a run did not finish, 2 for
bad input. Light: no torch here.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dsenv import proc, targetlock
from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.launch.env import DEFAULT_PORT, discover
from dsenv.workloads.training import dsconfig

SMOKE_TIMEOUT_S = 1800  # a first run may JIT-build DeepSpeed ops (minutes on 2 cores)
# options that belong to one workload, refused for all of them at once
SINGLE_WORKLOAD_OPTIONS = {"data_dir": "--data-dir", "no_sync_gradients": "--no-sync-gradients",
                           "shuffle_labels": "--shuffle-labels",
                           "html": "--html"}  # all: each page beside its workload's report


def child_arguments(args) -> list[str]:
    """The options of this command, for each workload's own smoke."""
    given = [("--preset", args.preset), ("--deepspeed-config", args.deepspeed_config),
             ("--micro-batch", args.micro_batch), ("--grad-accum", args.grad_accum),
             ("--lr", args.lr), ("--lr-scaling", args.lr_scaling), ("--seed", args.seed),
             ("--references", args.references), ("--examples", args.examples),
             ("--steps", getattr(args, "steps", None))]
    out = [item for flag, value in given if value is not None for item in (flag, str(value))]
    return out + (["--verbose"] if args.verbose else []) + (
        ["--no-html"] if getattr(args, "no_html", False) else [])


def child_env(index: int, env=None) -> dict:
    """This environment with the workload's own MASTER_PORT (when one is set, or several
    ranks need one), and no torchrun agent store (each group makes its own)."""
    env = dict(os.environ if env is None else env)
    ranks = discover(env)
    if "MASTER_PORT" in env or ranks.world_size > 1:
        base = int(env.get("MASTER_PORT") or DEFAULT_PORT)
        env["MASTER_PORT"] = str(base + 1 + index)
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return env


def row_of(workload: str, report_path: Path, result) -> dict:
    """One table row from a workload's report (or why there is none)."""
    row = {"workload": workload, "status": "FAIL", "sanity": "-", "performance": "-",
           "metrics": "", "detail": "", "wall_s": result.seconds, "report": str(report_path)}
    if result.timed_out:
        row["metrics"] = f"did not finish within {SMOKE_TIMEOUT_S} s"
        return row
    try:
        doc = read_json(report_path, "smoke report")
    except JsonFileError:
        row["metrics"] = f"no report (exit {result.returncode})"
        return row
    verdicts = {v["name"]: v for v in doc.get("verdicts", [])}
    checks = [c for c in verdicts.get("sanity", {}).get("checks", []) if c["check"] != "loss drop"]
    row.update(status=doc.get("status", "FAIL") if result.returncode in (0, 1) else "FAIL",
               sanity=verdicts.get("sanity", {}).get("status", "-"),
               performance=verdicts.get("performance", {}).get("status", "-"),
               metrics=", ".join(f"{c['check']} {c['value']:.1f}" for c in checks
                                 if isinstance(c.get("value"), (int, float))),
               detail=verdicts.get("sanity", {}).get("detail", ""),
               wall_s=doc.get("wall_s", result.seconds))
    return row


def print_table(console, rows: list[dict], total_s: float) -> None:
    from rich.table import Table  # rich: kept off dsenv --help

    colours = {"PASS": "green", "FAIL": "red", "REPORTED": "yellow", "INCONCLUSIVE": "yellow"}
    table = Table(title=f"dsenv smoke all: {len(rows)} workloads in {total_s:.0f} s",
                  title_justify="left")
    for column in ("workload", "status", "sanity", "performance", "metrics", "wall s"):
        table.add_column(column, justify="right" if column == "wall s" else "left")
    for row in rows:
        shown = [f"[{colours.get(row[k], 'white')}]{row[k]}[/]"
                 for k in ("status", "sanity", "performance")]
        table.add_row(row["workload"], *shown, row["metrics"], f"{row['wall_s']:.1f}")
    console.print(table)


def run_all(args, workloads: list[str]) -> int:
    from rich.console import Console  # rich: kept off dsenv --help

    for dest, flag in SINGLE_WORKLOAD_OPTIONS.items():
        if getattr(args, dest, None):
            raise WorkloadError(f"{flag} belongs to one workload; run `dsenv smoke WORKLOAD "
                                f"{flag} ...` instead of all")
    dsconfig.check_inputs(args.preset, args.deepspeed_config)  # once, not four times
    ranks = discover()
    console = Console(quiet=ranks.rank != 0, highlight=False)
    out_dir = Path(args.output_dir).resolve()
    lock = targetlock.TargetLock(out_dir, "dsenv smoke all", advice="wait for it to finish, "
                                 "or pass another --output-dir")
    if ranks.rank == 0:  # one `smoke all` per output folder: their logs would interleave
        lock.acquire(wait=0)
    try:
        return _run_all(args, workloads, ranks, console, out_dir)
    finally:
        lock.release()


def _run_all(args, workloads: list[str], ranks, console, out_dir: Path) -> int:
    common = child_arguments(args)
    rows = []
    started = time.perf_counter()
    for index, workload in enumerate(workloads):
        folder = out_dir / workload
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "smoke.log"
        log.write_text("")
        report_path = folder / "report.json"
        report_path.unlink(missing_ok=True)
        console.print(f"[{index + 1}/{len(workloads)}] dsenv smoke {workload} (log {log})",
                      highlight=False)
        result = proc.run([sys.executable, "-m", "dsenv.workloads.cli", "smoke", workload,
                           *common, "--output-dir", str(folder), "--report", str(report_path)],
                          timeout=SMOKE_TIMEOUT_S, env=child_env(index), output=log)
        row = row_of(workload, report_path, result)
        rows.append(row)
        console.print(f"    {row['status']} in {row['wall_s']:.1f} s"
                      + (f": {row['metrics']}" if row["metrics"] else ""), highlight=False)
        if row["status"] != "PASS" and row["detail"]:
            console.print(f"    sanity: {row['detail']}", highlight=False, markup=False)
        elif row["status"] != "PASS":  # no report: the end of what it said
            tail = log.read_text(errors="replace").strip().splitlines()[-6:]
            console.print("\n".join(f"    | {line}" for line in tail), highlight=False,
                          markup=False)
    total = time.perf_counter() - started
    print_table(console, rows, total)
    if ranks.rank == 0 and args.report:
        write_json_atomically(args.report, {"workloads": rows, "wall_s": total}, indent=2)
    return 0 if all(row["status"] in ("PASS", "INCONCLUSIVE") for row in rows) else 1

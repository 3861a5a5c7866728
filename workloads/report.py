"""Verdicts, the JSON run report and the one-screen summary (no torch here).

Two verdicts end every run, as ReFrame separates them:

* sanity: did it learn? the loss dropped by a threshold AND the task metric is above one;
* performance: samples/s per device after warm-up against references.toml for this device
  type, with a tolerance; a device with no reference is "reported only" (never a failure).
  Beside it the summary shows the run's efficiency (workloads/efficiency.py), so a slow
  node (a low figure on a GPU whose reference others meet) and a slow configuration (a low
  fraction of the device's peak) can be told apart.

The run passes when sanity passes and performance does not fail.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from dsenv.data import load_table
from dsenv.jsonfiles import write_json_atomically
from dsenv.workloads import efficiency
from dsenv.workloads.errors import WorkloadError

PASS, FAIL, REPORTED = "PASS", "FAIL", "REPORTED"
INCONCLUSIVE = "INCONCLUSIVE"  # below the reference while others used the node: no judgement
# Others' share of the run's cores (CPU time they and the hypervisor took, over the cores'
# capacity during the timed steps) above which a slow result is not the node's fault to
# judge: a quarter of the cores is more than a CPU smoke's throughput can lose to noise.
BUSY_SHARE = 0.25
REPORT_VERSION = 1


@dataclass(frozen=True)
class Verdict:
    name: str  # sanity | performance
    status: str  # PASS | FAIL | REPORTED | INCONCLUSIVE
    detail: str
    checks: tuple[dict, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self) | {"checks": list(self.checks)}


def _window_mean(values: list[float], window: int, head: bool) -> float:
    part = values[:window] if head else values[-window:]
    return sum(part) / len(part) if part else float("nan")


def loss_drop(loss_curve: list[float], window: int = 10) -> tuple[float, float, float]:
    """(first, last, drop): means of the first and last ``window`` steps, drop = 1-last/first."""
    window = max(1, min(window, len(loss_curve) // 4 or 1))
    first = _window_mean(loss_curve, window, head=True)
    last = _window_mean(loss_curve, window, head=False)
    drop = 1.0 - last / first if first and first == first and first > 0 else 0.0
    return first, last, drop


def sanity_verdict(loss_curve: list[float], metrics: dict[str, float],
                   thresholds: dict[str, float]) -> Verdict:
    """``thresholds``: ``min_loss_drop`` (fraction), ``min_<metric>`` for task metrics that
    must reach a floor (exact match, ROUGE, accuracy) and ``max_<metric>`` for those that
    must stay under a ceiling (perplexity)."""
    checks = []
    first, last, drop = loss_drop(loss_curve)
    need = thresholds.get("min_loss_drop", 0.0)
    checks.append({"check": "loss drop", "value": round(drop, 4), "threshold": need,
                   "ok": drop >= need, "detail": f"loss {first:.3f} -> {last:.3f}"})
    for key, need in thresholds.items():
        if key == "min_loss_drop" or not key.startswith(("min_", "max_")):
            continue
        bound, metric = key.split("_", 1)
        value = metrics.get(metric)
        ok = value is not None and value == value and (
            value >= need if bound == "min" else value <= need)
        checks.append({"check": metric, "value": value, "threshold": need, "bound": bound,
                       "ok": ok})
    failed = [c for c in checks if not c["ok"]]
    parts = [f"{c['check']} {_fmt(c['value'])} {_relation(c)} {_fmt(c['threshold'])}"
             for c in checks]
    return Verdict("sanity", FAIL if failed else PASS, "; ".join(parts), tuple(checks))


def _relation(check: dict) -> str:
    if check.get("bound") == "max":
        return "<=" if check["ok"] else ">"
    return ">=" if check["ok"] else "<"


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- references
def load_references(path: str | Path | None = None) -> dict:
    """The shipped references.toml, or a site's own table (``--references FILE``)."""
    if path is None:
        return load_table("dsenv.workloads", "references.toml")
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"references {path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"references {path}: not valid TOML ({exc})") from None


def find_reference(references: dict, key: str, device_type: str, world_size: int,
                   preset: str) -> dict | None:
    """The most specific entry of ``references[key]`` matching the device (a glob, or a list
    of globs), and the world size and preset (a name, or a list) where the entry names them."""
    best, best_score = None, -1
    for entry in references.get(key, []):
        if matched_device(entry, device_type) is None:
            continue
        if "world_size" in entry and entry["world_size"] != world_size:
            continue
        if "preset" in entry and preset not in _names(entry["preset"]):
            continue
        exact = not any("*" in glob for glob in _names(entry.get("device", "")))
        score = ("world_size" in entry) + ("preset" in entry) + exact
        if score > best_score:
            best, best_score = entry, score
    return best


def matched_device(entry: dict, device_type: str) -> str | None:
    """The first of an entry's device globs that ``device_type`` matches (case-insensitive)."""
    return next((glob for glob in _names(entry.get("device", ""))
                 if fnmatch.fnmatchcase(device_type.lower(), str(glob).lower())), None)


def _names(value) -> tuple[str, ...]:
    """An entry's ``device`` or ``preset``: one, or a list of them."""
    return (value,) if isinstance(value, str) else tuple(value)


def busy(contention) -> str:
    """Why the node was too busy to judge a throughput ("" when it was not)."""
    if contention is None:
        return ""
    reasons = []
    if contention.others_share >= BUSY_SHARE:
        top = ", ".join(f"{name} (pid {pid}, {cpu:.1f} s)" for name, pid, cpu in contention.top)
        reasons.append(f"other processes took {contention.others_share:.0%} of the run's "
                       f"{contention.cores} core(s) while it was timed ({contention.others_cpu_s:.1f}"
                       f" CPU-s of {contention.seconds * contention.cores:.1f}; the run got "
                       f"{contention.run_share:.0%})" + (f": {top}" if top else ""))
    if contention.gpu_others:
        reasons.append(f"other processes hold the run's GPU(s): {', '.join(contention.gpu_others)}")
    return "; ".join(reasons)


def performance_verdict(samples_per_s: float, world_size: int, device_type: str,
                        preset: str, key: str, references: dict,
                        contention=None) -> Verdict:
    per_device = samples_per_s / max(world_size, 1)
    ref = find_reference(references, key, device_type, world_size, preset)
    measured = f"{samples_per_s:.1f} samples/s ({per_device:.1f} per device)"
    if ref is None:
        return Verdict("performance", REPORTED, f"{measured}; no reference for {device_type!r}"
                       f" (world size {world_size}, preset {preset}): reported only",
                       ({"check": "samples/s per device", "value": per_device},))
    reference = float(ref["samples_per_s"])
    tolerance = float(ref.get("tolerance", 0.2))
    floor = reference * (1.0 - tolerance)
    ok = per_device >= floor
    basis = ref.get("basis", "measured")
    check = {"check": "samples/s per device", "value": per_device, "reference": reference,
             "tolerance": tolerance, "threshold": floor, "ok": ok,
             "reference_source": ref.get("source"), "reference_basis": basis,
             "reference_method": ref.get("method")}
    against = (f"{floor:.1f} (reference {reference:g} - {tolerance:.0%} for "
               f"{matched_device(ref, device_type)}, {basis}: {ref.get('source')})")
    if contention is not None:
        check["contention"] = contention.to_json()
    crowded = busy(contention)
    if not ok and crowded:  # a slow idle node still fails; a busy one cannot be judged
        return Verdict("performance", INCONCLUSIVE,
                       f"{measured} < {against}, but the node was busy: {crowded}; run it "
                       "again on an idle or exclusive node (e.g. `srun --exclusive`) to judge "
                       "the throughput", (check,))
    return Verdict("performance", PASS if ok else FAIL,
                   f"{measured} {'>=' if ok else '<'} {against}", (check,))


def overall(verdicts: list[Verdict]) -> str:
    """FAIL if a verdict failed, else INCONCLUSIVE if one could not judge, else PASS."""
    statuses = {v.status for v in verdicts}
    return FAIL if FAIL in statuses else INCONCLUSIVE if INCONCLUSIVE in statuses else PASS


def exit_code(status: str) -> int:
    """0 unless a verdict failed: an inconclusive throughput with a passed sanity is no
    failure of the stack."""
    return 1 if status == FAIL else 0


# ----------------------------------------------------------------------------- report
def write_report(path: str | Path, report: dict) -> Path:
    return write_json_atomically(path, report, indent=2, default=str)


def summary_rows(report: dict) -> list[tuple[str, str]]:
    """What ran where and the numbers, as (label, text): the terminal's summary and the
    HTML page's show the same rows."""
    run, batch, train = report["run"], report["batch"], report["training"]
    rows = [("workload", f"{report['workload']} ({report['mode']})"),
            ("launcher", f"{run['launcher']}, world size {run['world_size']}, "
                         f"{run['backend']} on {run['device_type']}")]
    if len(run.get("hosts", [])) > 1:
        rows.append(("hosts", ", ".join(f"{h} ({n} rank{'s' if n > 1 else ''})"
                                        for h, n in run["ranks_per_host"].items())))
    rows.append(("preset", f"{batch['preset']}"
                 + (f" + {batch['user_config']}" if batch.get("user_config") else "")))
    rows.append(("global batch", f"{batch['train_batch_size']} = micro-batch "
                 f"{batch['micro_batch']} x grad-accum {batch['grad_accum']} x world size "
                 f"{batch['world_size']}"))
    rows.append(("learning rate", f"{batch['lr']:g}" + (
        f" ({batch['lr_scaling']} scaling of {batch['base_lr']:g})"
        if batch["lr_scaling"] != "none" else "")))
    rows.append(("training", f"{train['steps']} steps in {train['seconds']:.1f} s, "
                 f"loss {train['loss_first']:.3f} -> {train['loss_last']:.3f}"))
    rows.append(("throughput", f"{train['samples_per_s']:.1f} samples/s after "
                 f"{train['warmup_steps']} warm-up steps"))
    load = train.get("contention")
    if load:  # what else ran on the node while the steps were timed
        rows.append(("node load", f"others took {load['others_share']:.0%} of the run's "
                     f"{load['cores']} core(s), the run {load['run_share']:.0%}"
                     + (f"; {len(load['gpu_others'])} other process(es) on the GPUs"
                        if load["gpu_others"] else "")))
    if train.get("efficiency"):
        rows.append(("efficiency", efficiency.describe(train["efficiency"])))
    rows.append(("metrics", ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in report["metrics"].items())))
    return rows


def print_summary(console, report: dict) -> None:
    """One screen: what ran where, the numbers, and the two verdicts."""
    from rich.panel import Panel  # rich: only once a run reports
    from rich.table import Table  # rich: likewise

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for label, text in summary_rows(report):
        table.add_row(label, text)
    for verdict in report["verdicts"]:
        colour = {"PASS": "green", "FAIL": "red"}.get(verdict["status"], "yellow")
        table.add_row(verdict["name"], f"[{colour}]{verdict['status']}[/] {verdict['detail']}")
    if report.get("model_dir"):
        table.add_row("model", str(report["model_dir"]))
    table.add_row("report", str(report.get("report_path", "")))
    if report.get("html_path"):
        table.add_row("html", str(report["html_path"]))
    table.add_row("wall time", f"{report['wall_s']:.1f} s")
    status = report["status"]
    console.print(Panel(table, title=f"dsenv {report['mode']} {report['workload']}: "
                        f"[{'green' if status == PASS else 'red'}]{status}[/]",
                        title_align="left", expand=False))

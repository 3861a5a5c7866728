"""The HTML page of a smoke or a full run, from its report.json (the same dict): the verdicts
with their thresholds, the environment line, the loss per step (train; eval where the run
has an eval loss), samples/s per device per step with the warm-up marked and the performance
verdict's reference band, the printed examples (an answer highlighted in its paragraph,
summaries beside references, classified pairs, continuations) and where the step's time went.
"""

from __future__ import annotations

from dsenv.htmlreport import svg
from dsenv.htmlreport.page import badge, esc, facts, page, section, table
from dsenv.workloads.report import summary_rows

SMOOTH = 20  # steps in the throughput plot's moving mean
EXAMPLE_TITLES = {"qa": "Answers in their paragraphs", "summaries": "Generated summaries",
                  "pairs": "Classified pairs", "continuations": "Continuations"}


def render(report: dict) -> str:
    """The page's text."""
    title = f"dsenv {report['mode']} {report['workload']}"
    verdicts = report.get("verdicts", [])
    headline = "; ".join(f"{v['name']} {v['status']}" for v in verdicts)
    body = [_environment(report),
            section("Verdicts", _verdicts(verdicts), name="verdicts"),
            section("Training", '<div class="plots">', _loss_plot(report),
                    _throughput_plot(report), "</div>", facts(summary_rows(report), "summary"),
                    _split(report.get("training", {})), name="training")]
    examples = report.get("examples") or {}
    if examples.get("rows"):
        body.append(section(EXAMPLE_TITLES.get(examples.get("kind"), "Examples"),
                            _examples(examples), name="examples"))
    body.append(section("Files", facts([("report", report.get("report_path", "")),
                                        ("model", report.get("model_dir") or "not saved")],
                                       "files"), name="files"))
    return page(title, report.get("status", "?"), headline, body)


def _environment(report: dict) -> str:
    """One line: stack and versions, device, launcher and world size, and the environment
    the run exercised (and why that one)."""
    versions, run, env = report.get("versions", {}), report.get("run", {}), \
        report.get("environment", {})
    stack = ", ".join(f"{name} {versions[name]}" for name in
                      ("torch", "deepspeed", "transformers", "python") if versions.get(name))
    accel = f"CUDA {versions['cuda']}" if versions.get("cuda") else \
        f"HIP {versions['hip']}" if versions.get("hip") else "no GPU runtime"
    line = (f"{stack}; {accel}; {run.get('device_type', '?')}; launcher "
            f"{run.get('launcher', '?')}, world size {run.get('world_size', '?')} on "
            f"{', '.join(run.get('hosts') or []) or '?'}")
    return (f'<p class="environment" data-environment>{esc(line)}</p>'
            f'<p class="note">environment {esc(env.get("prefix", "?"))}: '
            f'{esc(env.get("why") or env.get("chosen_by") or "")}</p>')


def _verdicts(verdicts: list[dict]) -> str:
    rows = []
    for verdict in verdicts:
        checks = "".join(
            f"<li>{esc(c.get('check'))}: {esc(_fmt(c.get('value')))}"
            + (f" (threshold {esc(_fmt(c['threshold']))})" if "threshold" in c else "")
            + (f", {'ok' if c['ok'] else 'not met'}" if "ok" in c else "") + "</li>"
            for c in verdict.get("checks", []))
        rows.append((esc(verdict["name"]), badge(verdict["status"]),
                     f'<span data-detail="{esc(verdict["name"])}">{esc(verdict["detail"])}'
                     f"</span><ul>{checks}</ul>"))
    return table(("verdict", "status", "detail and thresholds"), rows, name="verdicts",
                 raw=True)


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _warmup(train: dict) -> list[tuple[float, str]]:
    warmup = train.get("warmup_steps") or 0
    return [(warmup + 0.5, f"warm-up ends (step {warmup})")] if warmup else []


def _loss_plot(report: dict) -> str:
    train = report.get("training", {})
    curve = train.get("loss_curve") or []
    series = [svg.Series("train loss", [(i + 1, v) for i, v in enumerate(curve)])]
    metrics = report.get("metrics", {})
    if isinstance(metrics.get("eval_loss"), (int, float)) and curve:
        series.append(svg.Series("eval loss", [(len(curve), metrics["eval_loss"])], dots=True))
    return svg.line_chart(svg.Chart("loss", "Loss per step", "step", "loss", series,
                                    vlines=_warmup(train)))


def _throughput_plot(report: dict) -> str:
    """Samples/s per device for each step; the band runs from the verdict's threshold to its
    reference (none when there is no reference)."""
    train, run = report.get("training", {}), report.get("run", {})
    world = max(int(run.get("world_size") or 1), 1)
    batch = report.get("batch", {}).get("train_batch_size") or 0
    seconds = train.get("step_seconds") or []
    points = [(i + 1, batch / s / world) for i, s in enumerate(seconds) if s > 0]
    perf = next((v for v in report.get("verdicts", []) if v["name"] == "performance"), {})
    check = next(iter(perf.get("checks", [])), {})
    band, hlines = None, []
    if "reference" in check:
        band = (check["threshold"], check["reference"],
                f"passes above {check['threshold']:.1f} (reference {check['reference']:g} - "
                f"{check['tolerance']:.0%}, {check.get('reference_source') or 'no source'})")
        hlines.append((check["reference"], f"reference {check['reference']:g}"))
    per_device = train.get("samples_per_s_per_device")
    measured = [(per_device, f"after warm-up: {per_device:.1f} (the verdict's value)")] \
        if per_device else []
    series = [svg.Series("each step", points)]
    if len(points) >= 2 * SMOOTH:  # a trend through the noise of single steps
        series.append(svg.Series(f"mean of {SMOOTH} steps", [
            (points[i][0], sum(p[1] for p in points[i - SMOOTH + 1:i + 1]) / SMOOTH)
            for i in range(SMOOTH - 1, len(points))]))
    return svg.line_chart(svg.Chart("throughput", "Samples/s per device, each step", "step",
                                    "samples/s per device", series, band=band, hlines=hlines,
                                    vlines=_warmup(train), measured=measured))


def _split(train: dict) -> str:
    split = train.get("split_ms") or {}
    rows = [(name[:-3], f"{split[name]:.2f} ms") for name in
            ("forward_ms", "backward_ms", "optimizer_ms", "other_ms", "wall_ms") if name in split]
    if not rows:
        return ""
    return (f"<h3>Where a step's time went ({esc(split.get('source', ''))})</h3>"
            + table(("phase", "per step"), rows, name="split"))


def _examples(examples: dict) -> str:
    kind, rows = examples.get("kind"), examples["rows"]
    if kind == "qa":
        return "".join(_answer(row) for row in rows)
    columns = {"summaries": ("document", "generated", "reference"),
               "pairs": ("sentence1", "sentence2", "predicted", "label"),
               "continuations": ("prompt", "generated", "actual")}.get(kind)
    if columns is None:
        return "<p>(examples of an unknown kind)</p>"
    judged = {"summaries": "generated", "pairs": "predicted", "continuations": "generated"}[kind]
    cells = [[(f'<span class="{"right" if row.get("correct") else "wrong"}">'
               f"{esc(row.get(c))}</span>") if c == judged else esc(row.get(c))
              for c in columns] for row in rows]
    return table(columns, cells, name="examples", raw=True)


def _answer(row: dict) -> str:
    """The paragraph with the predicted answer highlighted where the model found it."""
    context, start, answer = row["context"], row.get("start", -1), row.get("answer", "")
    if start is not None and 0 <= start and answer and context[start:start + len(answer)]:
        end = start + len(answer)
        paragraph = (f"{esc(context[:start])}<mark>{esc(context[start:end])}</mark>"
                     f"{esc(context[end:])}")
    else:
        paragraph = esc(context)
    verdict = ('<span class="right">right</span>' if row.get("correct") else
               f'<span class="wrong">wrong</span>, expected <q>{esc(row.get("expected"))}</q>')
    return (f'<div class="example" data-example><h3>{esc(row.get("title"))}</h3>'
            f"<p>{paragraph}</p><p><b>Q:</b> {esc(row.get('question'))}<br><b>A:</b> "
            f"{esc(answer or '(no answer)')} ({verdict})</p></div>")

"""Renderers: the grouped ✓ / ! / ✗ table for people, versioned JSON for programs.

Both return text that has been through the redactor: no report prints a secret.
"""

from __future__ import annotations

import io
import json
import platform
import socket
from collections import Counter
from datetime import datetime, timezone

from dsenv import __version__
from dsenv.redact import Redactor

from .probes.context import Context
from .probes.result import Result, Status
from .registry import AREAS

SCHEMA_ID = "dsenv.doctor/1"
SYMBOLS = {Status.OK: "✓", Status.INFO: "·", Status.WARN: "!", Status.FAIL: "✗",
           Status.SKIP: "–", Status.ERROR: "✗"}
STYLES = {Status.OK: "green", Status.INFO: "cyan", Status.WARN: "yellow", Status.FAIL: "red",
          Status.SKIP: "dim", Status.ERROR: "bold red"}
COUNT_WORDS = {Status.OK: "ok", Status.INFO: "info", Status.WARN: "warning",
               Status.FAIL: "failure", Status.SKIP: "skipped", Status.ERROR: "error"}


def exit_code(results: list[Result], strict: bool = False) -> int:
    failing = any(r.status.failing for r in results)
    if strict:
        failing = failing or any(r.status is Status.WARN for r in results)
    return 1 if failing else 0


def summary_line(results: list[Result]) -> str:
    counts = Counter(r.status for r in results)
    parts = []
    for status in Status:
        n = counts.get(status, 0)
        if n:
            word = COUNT_WORDS[status]
            plural = "s" if n > 1 and word in ("warning", "failure", "error") else ""
            parts.append(f"{n} {word}{plural}")
    return ", ".join(parts) or "no checks ran"


def render_text(results: list[Result], ctx: Context, *, color: bool | None = None,
                width: int = 100) -> str:
    # rich: only the text report needs it (`dsenv doctor --json` never imports it)
    from rich.console import Console  # rich, as above
    from rich.markup import escape  # rich, as above
    from rich.padding import Padding  # rich, as above
    from rich.table import Table  # rich, as above

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=color is False,
                      width=width, highlight=False, soft_wrap=False)
    console.print(f"[bold]dsenv doctor {__version__}[/] — target [bold]{ctx.target}[/] "
                  f"({escape(ctx.target_reason)})")
    by_area = {area: [r for r in results if r.area == area] for area in AREAS}
    for area, area_results in by_area.items():
        if not area_results:
            continue
        table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1))
        table.add_column(width=1)
        table.add_column(min_width=30, max_width=38, no_wrap=True)
        table.add_column(overflow="fold")
        for r in area_results:
            style = STYLES[r.status]
            table.add_row(f"[{style}]{SYMBOLS[r.status]}[/]", escape(r.title), escape(r.summary))
        console.print(f"\n[bold]{area}[/]")
        console.print(table)

    shown = {Status.WARN, Status.FAIL, Status.ERROR}
    if ctx.options.verbose:
        shown |= {Status.INFO, Status.SKIP}
    attention = [r for r in results if r.status in shown]
    if attention:
        console.print("\n[bold]Findings[/]")
    for r in attention:
        style = STYLES[r.status]
        console.print()
        console.print(f"[{style}]{SYMBOLS[r.status]} {r.id}[/]  [bold]{escape(r.title)}[/]")
        console.print(Padding(escape(r.summary), (0, 0, 0, 4)))
        for line in r.evidence:
            console.print(Padding(escape(line), (0, 0, 0, 4)))
        if r.fix:
            console.print(Padding(f"[bold]fix:[/] {escape(r.fix)}", (0, 0, 0, 4)))
        if ctx.options.verbose and r.traceback:
            console.print(Padding(escape(r.traceback.rstrip()), (0, 0, 0, 4)))
    console.print(f"\n{summary_line(results)}")
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    return Redactor(ctx.env).scrub(text)


def report_dict(results: list[Result], ctx: Context, extra: dict | None = None) -> dict:
    """The report; ``extra``: optional top-level sections (``distributed``)."""
    o = ctx.options
    return {
        "schema": SCHEMA_ID,
        "dsenv_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "target": ctx.target,
        "target_reason": ctx.target_reason,
        "options": {
            "launcher": o.launcher, "nodes": o.nodes, "gpus_per_node": o.gpus_per_node,
            "deepspeed_config": str(o.deepspeed_config) if o.deepspeed_config else None,
            "workload": o.workload, "probe_timeout": o.probe_timeout,
        },
        "summary": {s.value: sum(r.status is s for r in results) for s in Status},
        "exit_code": exit_code(results),
        "results": [r.to_json() for r in results],
        **(extra or {}),
    }


def render_json(results: list[Result], ctx: Context, extra: dict | None = None) -> str:
    return json.dumps(Redactor(ctx.env).scrub_obj(report_dict(results, ctx, extra)), indent=2)

"""Renderers: the screen people read, and versioned JSON for programs.

The screen opens and closes with one verdict line ("ready to submit: 0 failures, 2
warnings"); in between, the checks grouped by area, with the skipped checks of an area
folded into one line unless ``--verbose``, then every warning and failure with its evidence
and one fix. Colour only on a terminal, and never with NO_COLOR or TERM=dumb: piped or
redirected output is plain text, no escape sequences, no markup. ``--json`` keeps every check.

Both go through the redactor: no report prints a secret.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import TextIO

from dsenv import __version__
from dsenv.doctor.context import Context
from dsenv.doctor.registry import AREAS
from dsenv.doctor.verdict import (
    COUNT_WORDS,
    Folded,
    exit_code,
    fold_skipped,
    skipped_note,
    summary_line,
    verdict_line,
)
from dsenv.facts.python import target_env
from dsenv.redact import Redactor
from dsenv.verdicts.findings import Result, Status

__all__ = ["COUNT_WORDS", "SCHEMA_ID", "exit_code", "render_json", "render_text", "report_dict",
           "summary_line", "use_color", "verdict_line"]

SCHEMA_ID = "dsenv.doctor/1"
SYMBOLS = {Status.OK: "✓", Status.INFO: "·", Status.WARN: "!", Status.FAIL: "✗",
           Status.SKIP: "–", Status.ERROR: "✗"}
STYLES = {Status.OK: "green", Status.INFO: "cyan", Status.WARN: "yellow", Status.FAIL: "red",
          Status.SKIP: "dim", Status.ERROR: "bold red"}
SGR = {"green": "32", "cyan": "36", "yellow": "33", "red": "31", "dim": "2", "bold": "1",
       "bold red": "1;31", "bold green": "1;32"}
TITLE_MIN, TITLE_MAX = 24, 38
DEFAULT_WIDTH = 100
INDENT = "    "


def use_color(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """Colour only for a terminal, and not when NO_COLOR is set (no-color.org) or TERM=dumb."""
    env = os.environ if env is None else env
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def screen_width(color: bool) -> int:
    """The terminal's width (60 to 120 columns) on a terminal; 100 for a file or a pipe."""
    if not color:
        return DEFAULT_WIDTH
    return max(60, min(120, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns))


class _Screen:
    """Lines of text, painted with SGR codes only when colour is on."""

    def __init__(self, color: bool, width: int):
        self.color, self.width, self.lines = color, width, []

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{SGR[style]}m{text}\x1b[0m" if self.color and text else text

    def add(self, line: str = "") -> None:
        self.lines.append(line)

    def wrap(self, text: str, width: int) -> list[str]:
        lines: list[str] = []
        for part in text.splitlines() or [""]:
            lines += textwrap.wrap(part, max(20, width), break_long_words=False,
                                   break_on_hyphens=False) or [""]
        return lines

    def paragraph(self, text: str, indent: str = INDENT, style: str | None = None,
                  lead: str = "") -> None:
        """``text`` wrapped under ``indent``; ``lead`` (painted bold) opens its first line."""
        for i, line in enumerate(self.wrap(lead + text, self.width - len(indent))):
            if i == 0 and lead:
                line = self.paint(lead.rstrip(), "bold") + " " + line[len(lead):]
            elif style:
                line = self.paint(line, style)
            self.add(indent + line)

    def row(self, status: Status, title: str, summary: str, title_width: int,
            dim: bool = False) -> None:
        """``✓  Title            summary``, the summary wrapped in its own column."""
        if len(title) > title_width:
            title = title[:title_width - 1] + "…"
        gap = " " * (3 + title_width + 2)
        body = self.wrap(summary, self.width - len(gap))
        symbol = SYMBOLS[status] if dim else self.paint(SYMBOLS[status], STYLES[status])
        first = f"{symbol}  {title.ljust(title_width)}  {body[0]}"
        self.add(self.paint(first, "dim") if dim else first)
        for line in body[1:]:
            self.add(gap + (self.paint(line, "dim") if dim else line))

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.lines) + "\n"


def _scrubbed(results: list[Result], redactor: Redactor) -> list[Result]:
    """Secrets masked before wrapping (a wrapped secret would be split across two lines)."""
    return [replace(r, title=redactor.scrub(r.title), summary=redactor.scrub(r.summary),
                    evidence=[redactor.scrub(e) for e in r.evidence],
                    fix=redactor.scrub(r.fix) if r.fix else r.fix,
                    traceback=redactor.scrub(r.traceback) if r.traceback else r.traceback)
            for r in results]


def render_text(results: list[Result], ctx: Context, *, color: bool | None = None,
                width: int | None = None, strict: bool = False) -> str:
    """The screen. ``color`` None: decide from stdout and the environment (:func:`use_color`)."""
    if color is None:
        color = use_color(sys.stdout, ctx.env)
    redactor = Redactor(ctx.env)
    results = _scrubbed(results, redactor)
    verbose = ctx.options.verbose
    screen = _Screen(color, width or screen_width(color))
    verdict = verdict_line(results, ctx.target, strict)
    verdict_style = "bold green" if exit_code(results, strict) == 0 else "bold red"
    screen.add(screen.paint(verdict, verdict_style))
    screen.add(f"{screen.paint(f'dsenv doctor {__version__}', 'bold')} — target "
               f"{screen.paint(ctx.target, 'bold')} ({redactor.scrub(ctx.target_reason)})")
    screen.add(redactor.scrub(target_env.header_line(ctx)))

    areas: list[tuple[str, list[Result | Folded]]] = []
    folded = folded_lines = 0
    for area in AREAS:
        area_results = [r for r in results if r.area == area]
        if not area_results:
            continue
        if verbose:
            areas.append((area, list(area_results)))
            continue
        rows, n = fold_skipped(area_results)
        areas.append((area, rows))
        folded += n
        folded_lines += sum(isinstance(r, Folded) for r in rows)
    titles = [r.title for _, rows in areas for r in rows]
    title_width = max(TITLE_MIN, min(TITLE_MAX, max(map(len, titles), default=0)))
    for area, rows in areas:
        screen.add()
        screen.add(screen.paint(area, "bold"))
        for r in rows:
            if isinstance(r, Folded):
                screen.row(Status.SKIP, r.title, r.reasons, title_width, dim=True)
            else:
                screen.row(r.status, r.title, r.summary, title_width)

    shown = {Status.WARN, Status.FAIL, Status.ERROR}
    if verbose:
        shown |= {Status.INFO, Status.SKIP}
    attention = [r for r in results if r.status in shown]
    if attention:
        screen.add()
        screen.add(screen.paint("Findings", "bold"))
    for r in attention:
        screen.add()
        style = STYLES[r.status]
        screen.add(f"{screen.paint(f'{SYMBOLS[r.status]} {r.id}', style)}  "
                   f"{screen.paint(r.title, 'bold')}")
        screen.paragraph(r.summary)
        for line in r.evidence:
            screen.paragraph(line)
        if r.fix:
            screen.paragraph(r.fix, lead="fix: ")
        if r.action is not None and r.action.applicable:
            screen.paragraph(r.action.change, lead="dsenv doctor --fix: ")
        if verbose and r.traceback:
            for line in r.traceback.rstrip().splitlines():
                screen.add(INDENT + line)

    screen.add()
    screen.add(summary_line(results) + skipped_note(results, folded, folded_lines))
    screen.add(screen.paint(verdict, verdict_style))
    return redactor.scrub(screen.text())


def report_dict(results: list[Result], ctx: Context, extra: dict | None = None,
                strict: bool = False) -> dict:
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
        "environment": target_env.report_section(ctx),
        "options": {
            "launcher": o.launcher, "nodes": o.nodes, "gpus_per_node": o.gpus_per_node,
            "deepspeed_config": str(o.deepspeed_config) if o.deepspeed_config else None,
            "workload": o.workload, "probe_timeout": o.probe_timeout, "strict": strict,
        },
        "summary": {s.value: sum(r.status is s for r in results) for s in Status},
        "verdict": {"ready": exit_code(results, strict) == 0,
                    "line": verdict_line(results, ctx.target, strict)},
        "exit_code": exit_code(results),  # as schema 1 defines it: --strict not applied
        "results": [r.to_json() for r in results],
        **(extra or {}),
    }


def redacted_report(results: list[Result], ctx: Context, extra: dict | None = None,
                    strict: bool = False) -> dict:
    """The report with secrets masked: what --json prints and --html draws."""
    return Redactor(ctx.env).scrub_obj(report_dict(results, ctx, extra, strict))


def render_json(results: list[Result], ctx: Context, extra: dict | None = None,
                strict: bool = False) -> str:
    """Every check, whatever the screen folds."""
    return json.dumps(redacted_report(results, ctx, extra, strict), indent=2)

"""The doctor's HTML page (``dsenv doctor --html FILE``): the verdict, then every area's checks
as the terminal lists them (skipped ones folded into a closed ``<details>``), then the
findings that need attention with their evidence and fix: a file to attach to a ticket.

It reads the report as ``--json`` writes it (already redacted), so the page and the JSON can
never disagree. ``dsenv doctor --distributed --html`` adds its plots and tables
(:mod:`dsenv.doctor.distributed.page`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dsenv.doctor.registry import AREAS
from dsenv.htmlreport.page import badge, esc, facts, page, section, table, write_page

ATTENTION = ("warn", "fail", "error")


def write(path: Path, report: dict, extra_sections: list[str] | None = None) -> bool:
    """The page at ``path``; False (and one line on stderr) when it cannot be written."""
    try:
        write_page(path, render(report, extra_sections))
        return True
    except OSError as exc:
        print(f"dsenv doctor: --html {path}: not written: {exc.strerror or exc}",
              file=sys.stderr)
        return False


def render(report: dict, extra_sections: list[str] | None = None) -> str:
    verdict = report.get("verdict", {})
    summary = report.get("summary", {})
    counts = ", ".join(f"{n} {status}" for status, n in summary.items() if n)
    body = [facts([("host", report.get("host")), ("target", f"{report.get('target')} "
                                                           f"({report.get('target_reason')})"),
                   ("environment", _environment(report.get("environment") or {})),
                   ("checks", counts), ("written", report.get("created"))], "about"),
            *(extra_sections or []), _areas(report.get("results", [])),
            _findings(report.get("results", []))]
    return page(f"dsenv doctor on {report.get('host')}",
                "READY" if verdict.get("ready") else "NOT READY", verdict.get("line", ""), body)


def _environment(env: dict) -> str:
    return f"{env.get('prefix', '?')} (Python {env.get('version', '?')}; " \
           f"{env.get('chosen_by', '')})"


def _areas(results: list[dict]) -> str:
    parts = []
    for area in AREAS:
        rows = [r for r in results if r.get("area") == area]
        if not rows:
            continue
        shown = [r for r in rows if r.get("status") != "skip"]
        skipped = [r for r in rows if r.get("status") == "skip"]
        cells = [(badge(r["status"]), esc(r.get("title")), esc(r.get("summary"))) for r in shown]
        html = table(("status", "check", "result"), cells, name=f"area-{area}", raw=True) \
            if cells else ""
        if skipped:
            folded = table(("check", "why skipped"), [(r.get("title"), r.get("summary"))
                                                     for r in skipped])
            html += (f"<details><summary>{len(skipped)} skipped</summary>{folded}</details>")
        parts.append(f'<h3 data-area="{esc(area)}">{esc(area)}</h3>{html}')
    return section("Checks by area", *parts, name="areas")


def _findings(results: list[dict]) -> str:
    attention = [r for r in results if r.get("status") in ATTENTION]
    if not attention:
        return section("Findings", "<p>Nothing needs attention.</p>", name="findings")
    parts = []
    for r in attention:
        evidence = "".join(f"<li>{esc(line)}</li>" for line in r.get("evidence") or [])
        fix = f'<p class="fix"><b>fix:</b> {esc(r["fix"])}</p>' if r.get("fix") else ""
        parts.append(f'<div class="finding" data-finding="{esc(r.get("id"))}">'
                     f'<h3>{badge(r["status"])} {esc(r.get("id"))}: {esc(r.get("title"))}</h3>'
                     f"<p>{esc(r.get('summary'))}</p><ul>{evidence}</ul>{fix}</div>")
    return section("Findings", *parts, name="findings")

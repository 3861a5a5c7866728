"""HTML pages of what the workloads report: :mod:`.run` draws a smoke's or a full run's
report.json as one self-contained page (``--html FILE``; by default report.html beside
report.json, ``--no-html`` for none)."""

from __future__ import annotations

from pathlib import Path

from dsenv.htmlreport.page import write_page
from dsenv.workloads.pages.run import render

HTML_NAME = "report.html"


def html_path(args, report_path: Path) -> Path | None:
    """Where the run's page goes: ``--html FILE``, else beside the report; None with
    ``--no-html``."""
    if getattr(args, "no_html", False):
        return None
    chosen = getattr(args, "html", None)
    return Path(chosen) if chosen else report_path.with_name(HTML_NAME)


def write_run_page(report: dict, path: Path) -> Path:
    return write_page(path, render(report))

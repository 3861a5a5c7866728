"""One self-contained HTML page: inline CSS, inline SVG, no script, no font, no URL to fetch,
so it opens from a scratch folder, on a compute node or on a laptop behind a VPN.

Everything that comes from data, logs, host names or the environment is escaped by
:func:`esc` (a data set's ``<script>`` shows as text); the finished page goes through the
:class:`~dsenv.redact.Redactor` of this process's environment, as every other output does.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dsenv import __version__
from dsenv.redact import Redactor
from dsenv.staging import write_file_atomically

STATUS_CLASS = {"PASS": "pass", "ok": "pass", "FAIL": "fail", "fail": "fail",
                "error": "fail", "INCONCLUSIVE": "warn", "warn": "warn",
                "REPORTED": "info", "info": "info", "skip": "skip", "READY": "pass",
                "NOT READY": "fail"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;
color:#1d1d1f;max-width:1100px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f6}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;color:#fff}
.pass{background:#2e7d32}.fail{background:#c62828}.warn{background:#ef8f00}
.info{background:#1565c0}.skip{background:#888}
tr.odd td{background:#fff3e0}td.differs{background:#ffcdd2;font-weight:600}
.frame{fill:none;stroke:#999}.grid{stroke:#eee}.tick{font-size:11px;fill:#555}
.axis{font-size:12px;fill:#333}.legend{font-size:12px;font-weight:600}
.band{fill:#c8e6c9;opacity:.6}.ref{stroke:#2e7d32;stroke-dasharray:6 4;stroke-width:1.5}
.measured{stroke:#333;stroke-width:1.5;stroke-dasharray:10 3}.vline{stroke:#777;stroke-dasharray:2 3}.mark{fill:none;stroke:#c62828;stroke-width:2}
.cell.slow rect{stroke:#000;stroke-width:3}.value{font-size:10px;fill:#111}
.nodata{fill:#888;font-style:italic}
mark{background:#fff176}.wrong{color:#c62828}.right{color:#2e7d32}
.note{color:#555}.plots{display:flex;flex-wrap:wrap;gap:12px}.plots svg{margin:8px 0}pre{white-space:pre-wrap}
footer{margin-top:32px;color:#888;font-size:12px}
"""


def esc(value: object) -> str:
    """``value`` as HTML text (attributes included): ``<``, ``>``, ``&`` and quotes escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def badge(status: str) -> str:
    return (f'<span class="badge {STATUS_CLASS.get(status, "info")}" data-status="{esc(status)}">'
            f'{esc(status)}</span>')


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, name: str = "",
          raw: bool = False, row_class: Sequence[str] | None = None) -> str:
    """A table; cells escaped unless ``raw`` (cells this package built from escaped parts)."""
    out = [f'<table{f" data-table={chr(34)}{esc(name)}{chr(34)}" if name else ""}>',
           "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    for i, row in enumerate(rows):
        css = f' class="{esc(row_class[i])}"' if row_class and row_class[i] else ""
        out.append(f"<tr{css}>" + "".join(
            f"<td>{cell if raw else esc(cell)}</td>" for cell in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def facts(pairs: Iterable[tuple[str, object]], name: str = "facts") -> str:
    """A two-column table of label and value."""
    return (f'<table data-table="{esc(name)}">' + "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in pairs) + "</table>")


def section(title: str, *parts: str, name: str = "") -> str:
    attr = f' data-section="{esc(name)}"' if name else ""
    return f"<section{attr}><h2>{esc(title)}</h2>{''.join(parts)}</section>"


def page(title: str, verdict: str, headline: str, body: Sequence[str],
         env: Mapping[str, str] | None = None) -> str:
    """The whole document; ``verdict`` a status for the badge beside ``headline``."""
    text = "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        # no request of any kind: a policy the browser enforces, not only a habit of ours
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="verdict" data-verdict="{esc(verdict)}">{badge(verdict)} '
        f'<span class="headline">{esc(headline)}</span></p>',
        *body,
        f"<footer>Written by dsenv {esc(__version__)}; a self-contained file (no script, no "
        "network).</footer></body></html>"])
    env = os.environ if env is None else env
    # a secret's value as it stands in the page: escaped, when it holds & < > or quotes
    escaped = {f"{k}_ESCAPED": html.escape(v, quote=True) for k, v in env.items()}
    return Redactor({**env, **escaped}).scrub(text)


def write_page(path: str | os.PathLike, text: str) -> Path:
    """The page at ``path``, written whole (a temporary file beside it, then a rename)."""
    return write_file_atomically(path, text)

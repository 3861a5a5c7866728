"""A real browser for the HTML reports: Debian's headless Chromium, driven by Playwright (its
Python package only: no browser download), started inside a network namespace of its own
(``unshare --net``: not even loopback is up), so a page that tried to fetch anything would
fail to, and every request it makes is recorded.

    with offline_browser() as browser:
        seen = look_at(browser, path, screenshot="smoke")   # what a person would see
        assert seen.requests == [path.as_uri()]

Screenshots are kept as test artefacts in ``$DSENV_TEST_ARTIFACTS`` (default
``.ci/artifacts/html`` in the checkout, git-ignored).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("DSENV_TEST_ARTIFACTS", ROOT / ".ci" / "artifacts" / "html"))

# What the page shows, read by the browser after layout: every plot with its drawn size,
# the texts a reader reads first, and any element that could run or fetch something.
LOOK = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const text = sel => Array.from(document.querySelectorAll(sel), e => e.textContent.trim());
  const attr = (sel, name) => Array.from(document.querySelectorAll(sel),
                                         e => e.getAttribute(name));
  return {
    title: document.title,
    verdict: document.querySelector('[data-verdict]')?.getAttribute('data-verdict'),
    headline: text('.headline')[0] || '',
    plots: Object.fromEntries(Array.from(document.querySelectorAll('svg[data-plot]'),
                                         e => [e.getAttribute('data-plot'), box(e)])),
    series: Object.fromEntries(Array.from(document.querySelectorAll('polyline[data-series]'),
        e => [e.closest('svg').getAttribute('data-plot') + '/' + e.getAttribute('data-series'),
              e.getAttribute('points').trim().split(/\\s+/).length])),
    bands: attr('rect[data-band]', 'data-band'),
    refs: attr('line[data-ref]', 'data-ref'),
    measured: attr('line[data-measured]', 'data-measured'),
    vlines: attr('line[data-vline]', 'data-vline'),
    marks: attr('circle[data-mark]', 'data-mark'),
    slow_cells: attr('g.cell.slow', 'data-pair'),
    cells: attr('g.cell', 'data-pair'),
    details: Object.fromEntries(Array.from(document.querySelectorAll('[data-detail]'),
                                           e => [e.getAttribute('data-detail'),
                                                 e.textContent.trim()])),
    marked: text('[data-example] mark'),
    examples: text('[data-example]'),
    environment: text('[data-environment]')[0] || '',
    findings: attr('[data-finding]', 'data-finding'),
    odd_hosts: text('[data-table=hosts] tr.odd td:first-child'),
    differing: Array.from(document.querySelectorAll('[data-table=differences] tr'),
                          tr => Array.from(tr.querySelectorAll('td'), td =>
                              [td.textContent.trim(), td.classList.contains('differs')]))
                    .filter(row => row.length),
    areas: attr('[data-area]', 'data-area'),
    scripts: document.querySelectorAll('script, iframe, object, embed, link, img').length,
    body: document.body.innerText,
  };
}"""


@dataclass
class Seen:
    """What the browser showed (LOOK's fields), and the URLs the page asked for."""

    data: dict
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def _offline_chromium(folder: Path) -> Path:
    """A launcher for Chromium in a fresh network namespace (Playwright talks to it over
    pipes, which the namespace does not cut)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium here: install Debian's chromium package (.ci/run does)")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace for the browser: "
                    f"{probe.stderr.decode(errors='replace').strip()}")
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "chromium-offline"
    wrapper.write_text(f'#!/bin/sh\nexec unshare --net {chromium} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@contextmanager
def offline_browser(folder: Path):
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright drives the browser: pip install playwright")
    wrapper = _offline_chromium(folder)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(wrapper),
                                             args=["--no-sandbox"], timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def look_at(browser, path: Path, screenshot: str | None = None) -> Seen:
    """Open ``path`` from the file system, let it lay out, read what it shows; keep a
    full-page screenshot under ARTIFACTS/<screenshot>.png."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests: list[str] = []
    failed: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("requestfailed", lambda request: failed.append(request.url))
    try:
        page.goto(path.resolve().as_uri(), wait_until="load", timeout=30_000)
        data = page.evaluate(LOOK)
        if screenshot:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{screenshot}.png"), full_page=True)
    finally:
        page.close()
    return Seen(data, requests, failed)


def static_requests(text: str) -> list[str]:
    """Anything in the file that names something to fetch: src/href attributes, CSS url()
    and @import (the browser test proves none was fetched; this proves none is asked)."""
    import re

    return re.findall(r"""(?:\bsrc\s*=|\bhref\s*=|url\(|@import)[^>]{0,60}""", text, re.I)

"""report.html in a real browser: headless Chromium renders it at 1280 x 900 (``tests/browser.py``,
shared with the README's screenshot) and a probe script, added to a copy of the page, reports
what a reader would see.

Checked on the committed report of the default experiment and on a small synthetic one:

- no horizontal overflow at 1280 px;
- every image decodes, every audio element decodes its metadata without an error;
- the first viewport shows the decision table (its header and first row);
- every image has alt text.

Skipped, saying why, where no Chromium is installed (``.ci/run`` installs the Debian package
``chromium`` when it is missing).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, chromium

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install "
                             "chromium; .ci/run installs it): report.html not checked in a browser")

PROBE = """<script>
window.addEventListener('load', () => {
  const doc = document.documentElement;
  const heads = [...document.querySelectorAll('h2')].filter(h => h.textContent === 'Decision');
  let table = heads.length ? heads[0].nextElementSibling : null;
  while (table && table.tagName !== 'TABLE') table = table.nextElementSibling;
  const rows = table ? table.querySelectorAll('tr') : [];
  const out = {
    scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, innerHeight: window.innerHeight,
    decisionBottom: rows.length > 1 ? rows[1].getBoundingClientRect().bottom : null,
    images: [...document.images].map(i => ({alt: i.getAttribute('alt') || '',
                                            ok: i.complete && i.naturalWidth > 0})),
    audio: [...document.querySelectorAll('audio')].map(a => ({
      ok: a.error === null, state: a.readyState})),
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def probe(page: Path, tmp_path: Path) -> dict:
    """Render a copy of ``page`` with the probe and return what it measured."""
    copy = tmp_path / f"probe-{page.name}"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                    encoding="utf-8")
    done = chromium(copy, tmp_path / "chromium", "--dump-dom")
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"no probe output from Chromium (exit {done.returncode}): {done.stderr[-800:]}"
    return json.loads(html.unescape(found.group(1)))


def check(seen: dict) -> None:
    assert seen["scrollWidth"] <= seen["clientWidth"], \
        f"horizontal overflow: {seen['scrollWidth']} px of content in {seen['clientWidth']} px"
    assert seen["decisionBottom"] is not None, "no Decision table"
    assert seen["decisionBottom"] <= seen["innerHeight"], \
        f"the decision table's first row ends at {seen['decisionBottom']} px, below the first " \
        f"viewport ({seen['innerHeight']} px)"
    assert seen["images"], "no image"
    assert all(i["ok"] for i in seen["images"]), "an image does not decode"
    assert all(i["alt"].strip() for i in seen["images"]), "an image has no alt text"
    assert all(a["ok"] and a["state"] >= 1 for a in seen["audio"]), \
        f"an audio element does not decode: {seen['audio']}"


def test_the_default_experiments_report_reads_in_a_browser(tmp_path):
    page = ROOT / "reports" / "report.html"
    assert page.stat().st_size < 10 * 2**20, "report.html must stay under 10 MB"
    check(probe(page, tmp_path))


def test_a_small_experiments_report_reads_in_a_browser(tmp_path):
    from tests.stages.test_report import make_inputs, report, write_params

    p = make_inputs(tmp_path)
    report(tmp_path, write_params(tmp_path), p)
    check(probe(p.html_out, tmp_path))


def test_the_probe_sees_what_a_reader_would_miss(tmp_path):
    """A page that overflows, hides its decision below the fold and has an image without alt
    text fails each check."""
    import base64

    from pipeline.render.figures import piano_roll_png

    png = base64.b64encode(piano_roll_png({"onset": [0.0], "duration": [1.0],
                                           "pitch": [60]})).decode()
    page = tmp_path / "bad.html"
    page.write_text(f'<!DOCTYPE html><html><body><div style="width:2000px">wide</div>'
                    f'<div style="height:1200px"></div><h2>Decision</h2>'
                    f'<table><tr><th>a</th></tr><tr><td>b</td></tr></table>'
                    f'<img src="data:image/png;base64,{png}"></body></html>')
    seen = probe(page, tmp_path)
    assert seen["scrollWidth"] > seen["clientWidth"]
    assert seen["decisionBottom"] > seen["innerHeight"]
    assert seen["images"] == [{"alt": "", "ok": True}]
    with pytest.raises(AssertionError, match="horizontal overflow"):
        check(seen)

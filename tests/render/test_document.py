"""pipeline.render.document: one document, two renderings with the same facts; Markdown for a git
forge, HTML self-contained (no scripts, no network), both pure."""

from __future__ import annotations

import base64
import math
import re

import numpy as np
import pytest

from pipeline.render.document import (
    NA,
    Audio,
    Details,
    Document,
    Figure,
    Heading,
    Para,
    Table,
    fmt,
    render_html,
    render_markdown,
    with_captions,
)

PNG = b"\x89PNG\r\n\x1a\nnot really a picture"


def sample() -> Document:
    doc = Document("Report <1>")
    doc.add(Heading("Decision"),
            Para("Deviation: the split changed", kind="warn"),
            Table(["rule", "status"], [["beats_ngram", "PASS"], ["a|b", "FAIL"]], status_col=1),
            Figure("NLL per piece", png=PNG, path="figures/nll.png"),
            Audio("sample 1", flac=b"fLaC\x00", path="audio/s1.flac"),
            Details("All metrics", [Para("small print", kind="note"), Table(["k"], [])]))
    return doc


@pytest.mark.parametrize(("value", "text"), [
    (None, NA), (float("nan"), NA), (math.inf, NA), (np.float64("nan"), NA),
    (True, "true"), (np.int64(7), "7"), (0.123456, "0.1235"), (12345.678, "1.235e+04"),
    (np.float64(2.5), "2.5"), ("as is", "as is"),
])
def test_fmt_gives_stable_cell_text(value, text):
    assert fmt(value) == text


def test_long_metric_names_may_wrap_in_html_only():
    doc = Document("t")
    doc.add(Table(["metric", "value"], [["memorisation.transformer.flag_excess", "0.5"]]))
    html, md = render_html(doc), render_markdown(doc)
    assert "memorisation.<wbr>transformer.<wbr>flag_<wbr>excess" in html
    assert ">0.5<" in html  # numbers are never split
    assert "<wbr>" not in md and "memorisation.transformer.flag_excess" in md


def test_markdown_shows_every_block():
    md = render_markdown(sample())
    assert md.startswith("# Report <1>\n\n## Decision\n\n> **⚠** Deviation: the split changed\n")
    assert "| rule | status |\n|---|---|\n| beats_ngram | PASS |\n| a\\|b | FAIL |\n" in md
    assert "![NLL per piece](figures/nll.png)" in md
    assert "[Listen: sample 1](audio/s1.flac)" in md
    assert "<details><summary>All metrics</summary>\n\n_small print_\n\n_(no rows)_\n" in md
    assert md.endswith("</details>\n") and not md.endswith("\n\n")
    loose = Document("t", [Figure("f", png=PNG), Audio("a", flac=b"x")])
    assert render_markdown(loose) == ("# t\n\n_Figure: f (embedded in report.html)_\n\n"
                                      "_Audio: a (embedded in report.html)_\n")


def test_html_is_escaped_self_contained_and_colours_the_status_column():
    html = render_html(sample())
    assert "<title>Report &lt;1&gt;</title>" in html and "<h1>Report &lt;1&gt;</h1>" in html
    assert '<p class="warn">Deviation: the split changed</p>' in html
    assert '<td class="PASS">PASS</td>' in html and '<td class="FAIL">FAIL</td>' in html
    assert "<td>beats_<wbr>ngram</td>" in html
    assert f'src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in html
    assert 'src="data:audio/flac;base64,ZkxhQwA="' in html
    assert "<details><summary>All metrics</summary>" in html and '(no rows)' in html
    assert not re.search(r"<script|https?://|@import|url\(", html)  # nothing fetched or run
    assert '<p class="note">Figure not available: f</p>' in render_html(
        Document("t", [Figure("f", path="figures/f.png")]))


def test_rendering_is_pure():
    assert render_html(sample()) == render_html(sample())
    assert render_markdown(sample()) == render_markdown(sample())
    doc = sample()
    render_html(doc), render_markdown(doc)
    assert doc == sample()  # the blocks are left as they were


def test_a_linked_figure_s_caption_is_repeated_under_it_for_markdown():
    linked, embedded = Figure("linked", path="f.png"), Figure("embedded", png=PNG)
    blocks = [linked, embedded, Details("more", [linked])]
    assert with_captions(blocks) == [linked, Para("linked", kind="note"), embedded,
                                     Details("more", [linked, Para("linked", kind="note")])]
    assert with_captions([]) == []

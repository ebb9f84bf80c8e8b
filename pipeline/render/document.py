"""Render a report document (a list of blocks) as Markdown and as one self-contained HTML file.

Blocks are plain dataclasses, so the report's content is decided once (``pipeline.stages.report``)
and both renderings show the same facts. The HTML embeds figures as base64 PNG data URIs and inline
CSS: no scripts, no fonts, no network. Both renderers are pure: same blocks, same bytes.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NA = "not available"
"""What a table cell says when a value is missing."""


def fmt(v: Any, digits: int = 4) -> str:
    """Stable text for a table cell."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return NA
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        return f"{float(v):.{digits}g}"
    return str(v)


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str
    kind: str = "p"
    """``p`` | ``warn`` (deviations, shown prominently) | ``note`` (small print)."""


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    status_col: int | None = None
    """Column whose PASS/FAIL/INCONCLUSIVE cells are coloured in HTML."""


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes | None = None
    """Embedded in HTML; Markdown points to report.html for it."""
    path: str | None = None
    """Relative path (from the report's folder) of a PNG already on disk, used by Markdown."""


@dataclass(frozen=True)
class Audio:
    """A sound to listen to: embedded in HTML as an ``<audio>`` player (FLAC data URI); in
    Markdown a link to the file at ``path`` (relative to the report), which a forge offers for
    download or plays."""

    caption: str
    flac: bytes
    path: str | None = None


@dataclass(frozen=True)
class Details:
    """Blocks folded away under a one-line summary: ``<details>`` in both renderings (a git
    forge's Markdown shows it folded too). For reference material: flat metric dumps, raw
    tables."""

    summary: str
    blocks: Sequence[Any] = ()


@dataclass
class Document:
    title: str
    blocks: list = field(default_factory=list)

    def add(self, *blocks) -> None:
        self.blocks.extend(blocks)


def with_captions(blocks: Sequence[Any]) -> list[Any]:
    """``blocks`` with each linked figure's caption repeated as a note under it, for Markdown: a
    git forge shows an image's alt text only when the image fails to load."""
    out: list[Any] = []
    for b in blocks:
        if isinstance(b, Details):
            out.append(Details(b.summary, with_captions(b.blocks)))
            continue
        out.append(b)
        if isinstance(b, Figure) and b.path:
            out.append(Para(b.caption, kind="note"))
    return out


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", "", *_markdown_blocks(doc.blocks)]
    return "\n".join(out).rstrip() + "\n"


def _markdown_blocks(blocks: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Details):
            out += [f"<details><summary>{html.escape(b.summary)}</summary>", "",
                    *_markdown_blocks(b.blocks), "</details>", ""]
        elif isinstance(b, Heading):
            out += [f"{'#' * b.level} {b.text}", ""]
        elif isinstance(b, Para):
            prefix = {"warn": "> **⚠** ", "note": "_"}.get(b.kind, "")
            suffix = "_" if b.kind == "note" else ""
            out += [f"{prefix}{b.text}{suffix}", ""]
        elif isinstance(b, Table):
            if not b.rows:
                out += ["_(no rows)_", ""]
                continue
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "---|" * len(b.headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Audio):
            out += [f"[Listen: {b.caption}]({b.path})" if b.path
                    else f"_Audio: {b.caption} (embedded in report.html)_", ""]
        elif isinstance(b, Figure):
            if b.path:
                out += [f"![{b.caption}]({b.path})", ""]
            else:
                out += [f"_Figure: {b.caption} (embedded in report.html)_", ""]
    return out


def _breakable(html_text: str) -> str:
    """Let long dotted or underscored names (metric keys) wrap after ``.`` and ``_`` only when a
    line is full, so a table fits the page without breaking words elsewhere."""
    return re.sub(r"(?<=[A-Za-z][._])(?=[A-Za-z])", "<wbr>", html_text)


_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #333}h2{border-bottom:1px solid #ccc;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2}.warn{background:#fff3cd;border:2px solid #d39e00;padding:.6em 1em;
font-weight:600}.note{color:#666;font-size:.85em}
.PASS{background:#d4edda;font-weight:600}.FAIL{background:#f8d7da;font-weight:600}
.INCONCLUSIVE{background:#fff3cd;font-weight:600}figure{margin:1em 0}
figcaption{color:#555;font-size:.85em}img{max-width:100%}audio{width:100%;max-width:560px}
details{margin:.6em 0}summary{cursor:pointer;color:#333}
@media print{details{display:block}body{max-width:none}}
""".strip()


def render_html(doc: Document) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(doc.title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{e(doc.title)}</h1>", *_html_blocks(doc.blocks), "</body></html>"]
    return "\n".join(out) + "\n"


def _html_blocks(blocks: Sequence[Any]) -> list[str]:
    e = html.escape
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Details):
            out += [f"<details><summary>{e(b.summary)}</summary>", *_html_blocks(b.blocks),
                    "</details>"]
        elif isinstance(b, Heading):
            out.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = f' class="{b.kind}"' if b.kind != "p" else ""
            out.append(f"<p{cls}>{e(b.text)}</p>")
        elif isinstance(b, Table):
            if not b.rows:
                out.append('<p class="note">(no rows)</p>')
                continue
            rows = ["<tr>" + "".join(f"<th>{_breakable(e(str(h)))}</th>" for h in b.headers)
                    + "</tr>"]
            for row in b.rows:
                cells = []
                for i, c in enumerate(row):
                    cls = f' class="{e(str(c))}"' if i == b.status_col else ""
                    cells.append(f"<td{cls}>{_breakable(e(str(c)))}</td>")
                rows.append("<tr>" + "".join(cells) + "</tr>")
            out.append("<table>" + "".join(rows) + "</table>")
        elif isinstance(b, Audio):
            data = base64.b64encode(b.flac).decode("ascii")
            out.append(f'<figure><audio controls preload="metadata" title="{e(b.caption)}" '
                       f'src="data:audio/flac;base64,{data}"></audio>'
                       f"<figcaption>{e(b.caption)}</figcaption></figure>")
        elif isinstance(b, Figure):
            if b.png:
                data = base64.b64encode(b.png).decode("ascii")
                out.append(f'<figure><img alt="{e(b.caption)}" src="data:image/png;base64,{data}">'
                           f"<figcaption>{e(b.caption)}</figcaption></figure>")
            else:
                out.append(f'<p class="note">Figure not available: {e(b.caption)}</p>')
    return out

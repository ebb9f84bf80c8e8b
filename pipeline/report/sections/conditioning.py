"""The report's conditioning section: does the conditioned model use and follow its condition?

Shown only when a model is conditioned (``eval.json``'s ``conditioning``, ``audit.json``'s
``adherence``), so an unconditioned experiment's report is unchanged. Two tables: the
shuffled-condition diagnostic on val (NLL per note with each piece's own, shuffled and removed
conditions, and the gaps; docs/conditioning.md) and adherence of the conditioned samples against
the floor, shuffled and ceiling references.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.render.document import Document, Heading, Para, Table, fmt
from pipeline.report.context import ReportContext

NA = "n/a"


def _interval(block: Any, d: int) -> str:
    if not isinstance(block, Mapping) or block.get("value") is None:
        return NA
    return (f"{fmt(block['value'], d)} [{fmt(block.get('ci_low'), d)}, "
            f"{fmt(block.get('ci_high'), d)}]")


def render(doc: Document, ctx: ReportContext) -> None:
    """Append the section when a model is conditioned; nothing otherwise."""
    reports = ctx.reports
    ev = reports.get("eval") if isinstance(reports.get("eval"), Mapping) else {}
    audit = reports.get("audit") if isinstance(reports.get("audit"), Mapping) else {}
    diag = ev.get("conditioning") or {}
    adh = audit.get("adherence") or {}
    if not diag and not adh:
        return
    d = ctx.digits
    doc.add(Heading("Conditioning"))
    for name, block in sorted(diag.items()):
        nll = block.get("nll_per_note") or {}
        conds = ", ".join(block.get("conditions") or [])
        rows = [[variant, _interval(nll.get(variant), d)]
                for variant in ("correct", "shuffled", "removed")]
        gaps = [[f"{other} − correct", _interval(block.get(f"{other}_minus_correct"), d),
                 str((block.get(f"{other}_minus_correct") or {}).get("verdict", NA))]
                for other in ("shuffled", "removed")]
        doc.add(Para(f"Does the {name} use its condition? It is conditioned on {conds}. "
                     f"Its val pieces ({block.get('groups')} groups) were scored with their own "
                     "conditions, with conditions shuffled among the pieces and with every "
                     "condition removed (NLL per note, seeds averaged, 95% group-bootstrap "
                     "intervals). A model that ignores its condition shows no gap; one that "
                     "follows it scores worse without its own. Whether the condition helps "
                     "NLL is a question for an unconditioned run of the same pieces, e.g. the "
                     "committed experiment, which the command symkit compare HEAD workspace "
                     "pairs with this run piece by piece (docs/compare.md)."),
                Table(["conditions", "NLL per note (val)"], rows),
                Table(["gap", "nats per note", "verdict"], gaps))
    for name, block in sorted(adh.items()):
        names = block.get("conditions") or []
        rows = []
        for cond in names:
            b = block.get(cond) or {}
            if not b.get("measurable"):
                rows.append([cond, "not measurable from a sample", "", "", ""])
                continue
            rows.append([cond, *(_interval(b.get(k), d)
                                 for k in ("rate", "floor", "shuffled", "ceiling"))])
        doc.add(Para(f"Does the {name} follow its condition? {block.get('n_conditioned')} "
                     "samples were drawn under the labels of held-out pieces; each sample's "
                     f"first {block.get('window')} generated tokens were measured as the "
                     "conditions stage measures a piece. Share whose measured label equals the "
                     "request, against the same model's unconditional samples (floor), "
                     "shuffled requests, and held-out human windows of the same length against "
                     "their own piece's label (ceiling); 95% bootstrap intervals."),
                Table(["condition", "conditioned samples", "floor (unconditional)",
                       "shuffled requests", "ceiling (human windows)"], rows))

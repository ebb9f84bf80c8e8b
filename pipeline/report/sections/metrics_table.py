"""The report's metrics section: the table of the labelled metrics of the metric table
(:data:`pipeline.decision.metrics.METRICS`), in its order, with their intervals."""

from __future__ import annotations

from pipeline.decision.metrics import labelled
from pipeline.render.document import Details, Document, Heading, Table, fmt
from pipeline.report.context import ReportContext


def render(doc: Document, ctx: ReportContext) -> None:
    """The metric table's labelled metrics with their intervals, and every value of
    reports/eval.json folded away."""
    d, metrics = ctx.digits, ctx.metrics
    doc.add(Heading("Metrics"))
    rows = []
    for m in labelled():  # the metric table's labelled metrics, in its order
        digits = d if m.digits is None else m.digits
        rows.append([m.row_label, *(fmt(metrics.get(m.key + suffix), digits)
                                    for suffix in ("", ".ci_low", ".ci_high"))])
    level = metrics.get("eval.protocol.bootstrap.ci_level")  # evaluate.ci_level, as scored
    level = level if isinstance(level, float) else 0.95
    doc.add(Table(["metric", "value", f"{level:.0%} CI low", f"{level:.0%} CI high"], rows),
            Details(f"Every value in reports/eval.json "
                    f"({sum(k.startswith('eval.') for k in metrics)})",
                    [Table(["key", "value"], [[k, fmt(v, d)] for k, v in metrics.items()
                                              if k.startswith("eval.")])]))

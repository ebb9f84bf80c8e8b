"""The report's metrics section (pipeline.report.sections.metrics_table): the metric table's
labelled metrics in its order, with their intervals at the level evaluate scored, and every
value of reports/eval.json folded away."""

from __future__ import annotations

from pipeline.decision import metrics as metric_table
from pipeline.decision.metrics import Metric, labelled
from pipeline.render.document import NA, Details, Document, Table
from pipeline.report.sections import metrics_table
from tests.report.test_context import make_context, rendered

GAIN = "test.nll_per_note.rel_improvement"


def _tables(ctx) -> tuple[Table, Details]:
    doc = Document("t")
    metrics_table.render(doc, ctx)
    _, table, details = doc.blocks
    return table, details


def test_without_metrics_every_row_is_not_available(tmp_path):
    table, details = _tables(make_context(tmp_path))
    assert [r[0] for r in table.rows] == [m.row_label for m in labelled()]
    assert all(cell == NA for r in table.rows for cell in r[1:])
    assert details.summary == "Every value in reports/eval.json (0)"
    assert table.headers == ["metric", "value", "95% CI low", "95% CI high"]


def test_values_and_intervals_at_the_scored_level_and_the_eval_values_folded(tmp_path):
    metrics = {GAIN: 0.0512345, f"{GAIN}.ci_low": 0.01, f"{GAIN}.ci_high": 0.09,
               "eval.protocol.bootstrap.ci_level": 0.9, "eval.models.ngram.test.n": 10,
               "audit.flag_rate.excess": 0.0}
    table, details = _tables(make_context(tmp_path, metrics=metrics, digits=3))
    assert table.headers[2:] == ["90% CI low", "90% CI high"]
    row = next(r for r in table.rows if r[0] == "relative gain of the transformer")
    assert row == ["relative gain of the transformer", "0.0512", "0.01", "0.09"]
    assert details.summary == "Every value in reports/eval.json (2)"
    (folded,) = details.blocks
    assert folded.rows == [["eval.protocol.bootstrap.ci_level", "0.9"],
                           ["eval.models.ngram.test.n", "10"]]


def test_a_metric_s_own_digits_and_a_new_labelled_metric_get_their_row(tmp_path, monkeypatch):
    toy = Metric("toy.ratio", "eval.toy.ratio", label="toy ratio", unit="x", digits=2)
    monkeypatch.setattr(metric_table, "METRICS", (*metric_table.METRICS, toy))
    md = rendered(metrics_table.render, make_context(tmp_path, metrics={"toy.ratio": 1.23456},
                                                     digits=6))
    assert f"| toy ratio (x) | 1.2 | {NA} | {NA} |" in md

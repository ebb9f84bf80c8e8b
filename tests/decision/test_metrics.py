"""The flat metrics of reports/metrics.json (pipeline.decision.metrics): flattening the stage
reports, the canonical keys of the metric table, and adding a metric through that table alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core import artifacts
from pipeline.core.config import load_section
from pipeline.decision import metrics
from pipeline.decision.criteria import CriteriaConfig, evaluate_all
from pipeline.decision.metrics import (
    METRICS,
    Metric,
    build_metrics,
    flatten,
    labelled,
    metric_aliases,
)

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


def test_flatten_and_build_metrics_from_stage_reports():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": [{"x": 1}]}) == {"a.b": 1, "a.c.0": 1,
                                                                      "a.c.1": 2}
    eval_json = {"models": {m: {"test": {"nats_per_note": {"value": v, "ci_low": v - 0.1,
                                                           "ci_high": v + 0.1}}}
                            for m, v in (("ngram", 2.0), ("transformer", 1.9))},
                 "paired": {"ngram_minus_transformer": {"test": {"nats_per_note": {
                     "value": 0.1, "ci_low": 0.04, "ci_high": 0.16}}}}}
    m = build_metrics({"eval": eval_json, "train": {"best_val_loss": 1.5,
                                                    "final_train_loss": 1.2}, "ingest": None})
    assert m["test.nll_per_note.diff"] == 0.1
    # without eval's bootstrapped ratio: the point value only, never a rescaled interval
    assert m["test.nll_per_note.rel_improvement"] == pytest.approx(0.05)
    assert "test.nll_per_note.rel_improvement.ci_low" not in m
    assert "train.overfit_gap" not in m  # the last training batch is noise, not evidence
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    assert {v.name: v.status for v in evaluate_all(cfg, m)}["transformer_beats_ngram"] == \
        "INCONCLUSIVE"
    eval_json["paired"]["ngram_minus_transformer"]["test"]["rel_improvement"] = {
        "value": 0.05, "ci_low": 0.025, "ci_high": 0.075, "median_piece_effect": 0.04,
        "without_top3_groups": {"value": 0.03, "dropped_groups": ["a", "b", "c"]}}
    m = build_metrics({"eval": eval_json, "train": {"best_val_loss": 1.5,
                                                    "final_train_loss": 1.2}, "ingest": None})
    assert m["test.nll_per_note.rel_improvement.ci_low"] == 0.025
    assert m["test.nll_per_note.rel_improvement.without_top3_groups"] == 0.03
    assert m["eval.models.ngram.test.nats_per_note.value"] == 2.0
    verdicts = {v.name: v.status for v in evaluate_all(cfg, m)}
    assert verdicts["transformer_beats_ngram"] == "PASS"
    assert verdicts["no_test_near_copies"] == "INCONCLUSIVE"  # leakage.json missing


def test_quality_margin_is_the_score_minus_its_calibrated_band():
    metrics = build_metrics({"audit": {"judged": {"transformer": {"quality": {
        "score": 5 / 7, "score_band_low": 6 / 7}}}}})
    assert metrics["quality.transformer.margin"] == pytest.approx(-1 / 7)
    assert "quality.ngram.margin" not in metrics


def test_the_metric_table_gives_every_canonical_key_its_interval_and_its_row():
    keys = [m.key for m in METRICS]
    assert len(keys) == len(set(keys))
    aliases = metric_aliases()
    gap = "generalisation.gap_per_note.transformer"
    assert aliases[gap] == ("eval.gap.transformer.nats_per_note.value",)
    assert aliases[f"{gap}.ci_high"] == ("eval.gap.transformer.nats_per_note.ci_high",)
    assert aliases["leakage.crossing_groups"] == ("leakage.grouped_crossing_groups",
                                                  "leakage.crossing_groups")
    assert "quality.transformer.margin" not in aliases  # derived, read from no report
    assert [m.row_label for m in labelled()][:2] == ["n-gram NLL per note, test (nats)",
                                                     "transformer NLL per note, test"]


def test_a_metric_added_in_the_table_reaches_metrics_json_the_report_and_the_criteria(
        tmp_path, monkeypatch):
    """CONTRIBUTING.md's "How to add a metric", step by step, on a toy metric."""
    from tests.stages.test_report import RULES, make_inputs, report, write_params

    p = make_inputs(tmp_path)
    # 1. evaluate computes it into eval.json, a block with its interval
    ev = artifacts.read_json(p.eval)
    ev["toy"] = {"pieces_per_group": {"value": 2.5, "ci_low": 2.25, "ci_high": 2.75}}
    artifacts.write_json(p.eval, ev)
    # 2. one entry in the metric table
    toy = Metric("toy.pieces_per_group", "eval.toy.pieces_per_group", interval=True,
                 label="pieces per test group", unit="pieces", digits=2)
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, toy))
    # 3. a rule in params.yaml's criteria names it
    rule = {"name": "toy_groups_hold_two_pieces", "metric": "toy.pieces_per_group", "op": ">=",
            "threshold": 2.0, "judge": "interval", "rationale": "a group holds two pieces"}
    params = write_params(tmp_path, rules=[*RULES, rule])
    report(tmp_path, params, p)

    flat = artifacts.read_json(p.metrics_out)
    assert (flat["toy.pieces_per_group"], flat["toy.pieces_per_group.ci_low"],
            flat["toy.pieces_per_group.ci_high"]) == (2.5, 2.25, 2.75)
    assert flat["decision.criteria.toy_groups_hold_two_pieces"] == "PASS"
    md = p.md_out.read_text()
    table = md[md.index("## Metrics"):md.index("### Training seeds")]
    assert "| pieces per test group (pieces) | 2.5 | 2.2 | 2.8 |" in table
    assert "| toy_groups_hold_two_pieces | toy.pieces_per_group | >= 2 (whole interval) |" in md
    # without the entry, the criterion has no metric to judge
    monkeypatch.undo()
    report(tmp_path, params, p)
    flat = artifacts.read_json(p.metrics_out)
    assert "toy.pieces_per_group" not in flat
    assert flat["decision.criteria.toy_groups_hold_two_pieces"] == "INCONCLUSIVE"


def test_the_guards_seed_blocks_reach_metrics_json_from_the_stage_reports():
    """Each seed's own block of a metric judged per seed sits beside the metric as
    ``<key>.seed.<seed>``; only the metric table's ``per_seed`` entries are read that way."""
    def ci(v):
        return {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}

    audit = {"judged": {"transformer": {
        "membership_auc": ci(0.7), "flag_rate": {"excess": ci(0.0)},
        "per_seed": {s: {"membership_auc": {**ci(v), "tpr": ci(0.3)},
                         "flag_rate": {"excess": ci(v - 0.7)},
                         "extraction_rate": {"excess": ci(0.0)}}
                     for s, v in (("1234", 0.8), ("1235", 0.6))}}}}
    eval_json = {"gap": {"transformer": {"nats_per_note": ci(0.4),
                                         "per_seed": {"7": {"nats_per_note": ci(0.5),
                                                            "nats_per_token": ci(0.45)}}}}}
    m = build_metrics({"audit": audit, "eval": eval_json})
    auc = "memorisation.transformer.membership_auc"
    assert (m[f"{auc}.seed.1234"], m[f"{auc}.seed.1234.ci_low"],
            m[f"{auc}.seed.1234.ci_high"]) == (0.8, 0.8 - 0.1, 0.8 + 0.1)
    assert metrics.seed_blocks(m, auc) == {"1234": ci(0.8), "1235": ci(0.6)}
    assert list(metrics.seed_blocks(m, "memorisation.transformer.flag_excess")) == ["1234",
                                                                                   "1235"]
    assert metrics.seed_blocks(m, "generalisation.gap_per_note.transformer") == {"7": ci(0.5)}
    assert metrics.seed_blocks(m, "generalisation.gap.transformer") == {"7": ci(0.45)}
    assert not any(k.startswith("memorisation.transformer.membership_tpr.seed") for k in m)
    assert metrics.seed_blocks(m, "memorisation.ngram.membership_auc") == {}
    assert metrics.judged_per_seed() == {
        f"memorisation.{model}.{k}" for model in metrics.MODELS
        for k in ("membership_auc", "flag_excess", "extraction_excess")} | {
        "generalisation.gap.transformer", "generalisation.gap_per_note.transformer"}


def test_a_per_seed_pattern_needs_an_interval_and_a_seed():
    with pytest.raises(ValueError, match="per_seed needs interval=True"):
        Metric("x", "a.x", per_seed="a.per_seed.{seed}.x")
    with pytest.raises(ValueError, match=r"with \{seed\} in it"):
        Metric("x", "a.x", interval=True, per_seed="a.per_seed.x")

"""The flat metrics of reports/metrics.json (pipeline.decision.metrics): flattening the stage
reports, the canonical keys of the metric table, and adding a metric through that table alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.config import load_section
from pipeline.decision.criteria import CriteriaConfig, evaluate_all
from pipeline.decision.metrics import build_metrics, flatten

REPO_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


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

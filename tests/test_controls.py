"""Positive and negative controls of the shipped criteria (pipeline.report.controls): each rule
judged on simulated evidence from a model that should pass and one that should fail, at the
default experiment's sizes. The rates are in docs/evaluation.md (`symkit controls`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main as cli
from pipeline.core.config import load_section
from pipeline.report.controls import CONTROLS, pass_rate, rates
from pipeline.report.criteria import CriteriaConfig, Criterion

REPO_PARAMS = Path(__file__).resolve().parent.parent / "params.yaml"
DRAWS = 300


@pytest.fixture(scope="module")
def shipped() -> dict[tuple[str, str, str], float]:
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    return {(r.rule, r.case, r.truth): r.pass_rate for r in rates(cfg, draws=DRAWS, seed=1)}


def _rates(shipped, rule: str, case: str) -> list[float]:
    return [v for (r, c, _), v in shipped.items() if r == rule and c == case]


@pytest.mark.parametrize("rule", ["transformer_beats_ngram", "no_test_near_copies",
                                  "transformer_gap_bounded", "transformer_gap_not_negative"])
def test_the_redesigned_and_sound_rules_pass_good_models_and_fail_bad_ones(shipped, rule):
    good, bad = _rates(shipped, rule, "good"), _rates(shipped, rule, "bad")
    assert good and bad
    assert min(good) >= 0.80, good
    assert max(bad) <= 0.05, bad


def test_quality_judged_by_its_calibrated_band_rejects_human_like_music_about_5_percent(shipped):
    good = _rates(shipped, "transformer_samples_human_like", "good")
    assert good and 0.90 <= good[0] <= 0.99  # 1 - P(2+ of 7 outside at 5% each) = 95.6%
    mostly_off = shipped[("transformer_samples_human_like", "bad",
                          "each statistic outside its band with 60%")]
    assert mostly_off <= 0.05


def test_the_harness_fails_the_old_gap_rule_a_model_at_zero_gap_could_not_pass():
    """The old `transformer_gap_not_negative` (whole interval >= 0) passed a model whose val is
    exactly as predictable as its training pieces about 2% of the time: the harness must see
    it, or it could not tell a redesign from none."""
    old = Criterion(name="old", metric="generalisation.gap.transformer", op=">=", threshold=0.0,
                    judge="interval", rationale="old rule")
    at_zero = next(c for c in CONTROLS if c.metric == old.metric and "gap of 0:" in c.truth)
    assert pass_rate(old, at_zero, DRAWS, seed=1) < 0.05
    new = old.model_copy(update={"judge": "refute"})
    assert pass_rate(new, at_zero, DRAWS, seed=1) > 0.9


@pytest.mark.parametrize(("rule", "case"), [
    ("transformer_membership_near_chance", "good"),  # about 42% at a true AUC of 0.5
    ("transformer_copies_no_more_than_humans", "good"),  # about 33% at the human rate
    ("transformer_extraction_at_chance", "good"),  # never: 0 of 64 allows up to 5.7% > 5%
])
def test_the_documented_misses_still_miss(shipped, rule, case):
    """docs/evaluation.md names these rules as not yet meeting the standard at the default
    sizes; when a redesign makes one pass, this test fails so the docs are updated with it."""
    assert max(_rates(shipped, rule, case)) < 0.80


def test_the_rates_are_reproducible(shipped):
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    again = {(r.rule, r.case, r.truth): r.pass_rate for r in rates(cfg, draws=DRAWS, seed=1)}
    assert again == shipped


def test_cli_prints_a_table_and_fails_while_a_rule_misses(capsys):
    assert cli(["controls", "--params", str(REPO_PARAMS), "--draws", "50"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("| criterion | control | planted truth | passes (of 50) |")
    assert "transformer_membership_near_chance | good | true AUC 0.5 (chance)" in out
    assert "MISSED" in out

"""pipeline.stats.power: the closed forms against simulated experiments, and monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.stats.bootstrap import bootstrap_weights, paired_rel_ci
from pipeline.stats.power import (
    detectable_effect,
    minimum_detectable_effect,
    one_sided_alpha,
    pass_probability,
    power_summary,
    rel_improvement_se,
)


def groups(rng: np.random.Generator, n: int, rel: float, sd_effect: float = 0.08
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per-group NLL sums ``(A_g, B_g)``: sizes and difficulties vary, each group's relative
    effect is ``rel`` plus independent noise, so the population effect is exactly ``rel``."""
    a = rng.integers(200, 3000, n) * rng.lognormal(math.log(2.0), 0.3, n)
    return a, a * (1 - rel - sd_effect * rng.standard_normal(n))


def test_the_issue_figures():
    """An MDE of 3.9% at 80% power (95% interval) means a true 2% gain clears 0 ~30% of the
    time, and a true gain of threshold + MDE clears the threshold 80% of the time."""
    se = 0.039 / (1.959964 + 0.841621)
    assert minimum_detectable_effect(se) == pytest.approx(0.039, rel=1e-5)
    assert pass_probability(0.02, se) == pytest.approx(0.30, abs=0.005)
    assert pass_probability(0.02 + 0.039, se, threshold=0.02) == pytest.approx(0.8, rel=1e-5)
    assert pass_probability(0.02, se, threshold=0.02) == pytest.approx(0.025, rel=1e-4)
    assert one_sided_alpha(0.9) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="level"):
        one_sided_alpha(1.5)


def test_delta_method_matches_the_group_bootstrap_spread():
    a, b = groups(np.random.default_rng(0), 60, 0.03)
    w = bootstrap_weights(60, 4000, np.random.default_rng(1))
    reps = 1 - (w @ b) / (w @ a)
    se = rel_improvement_se(a, b)
    assert np.std(reps) == pytest.approx(se * math.sqrt(59 / 60), rel=0.05)
    assert rel_improvement_se(a, b, 240) == pytest.approx(se / 2)
    assert math.isnan(rel_improvement_se(a[:1], b[:1]))
    assert paired_rel_ci(a, a, b, a, w, 0.95)["value"] == pytest.approx(1 - b.sum() / a.sum())


def test_more_groups_give_a_smaller_mde():
    a, b = groups(np.random.default_rng(2), 50, 0.03)
    mdes = [detectable_effect(a, b, n)["mde"] for n in (9, 16, 36, 100, 400)]
    assert np.all(np.diff(mdes) < 0)
    assert mdes[0] / mdes[2] == pytest.approx(2.0)  # 1 / sqrt(G)
    more_power = detectable_effect(a, b, 36, power=0.9)["mde"]
    assert more_power > mdes[2]
    record = detectable_effect(a, b, 36, level=0.9)
    assert record["alpha"] == pytest.approx(0.05) and record["n_groups_observed"] == 50
    assert record["mde"] < mdes[2]  # a 90% interval is a less demanding rule


@pytest.mark.parametrize(("true_rel", "threshold"), [(0.02, 0.0), (0.06, 0.02)],
                         ids=["2pct_vs_0", "6pct_vs_2pct"])
def test_pass_probability_matches_simulated_experiments(true_rel, threshold):
    """Val (60 groups) predicts how often test (36 groups) passes "the 95% group-bootstrap
    interval's lower bound ≥ threshold"; 400 simulated test splits agree within three binomial
    standard errors plus 0.03 for the val estimate of se and the percentile bootstrap's
    small-sample narrowness. Run against ``threshold + 0.03`` the same check fails."""
    rng = np.random.default_rng(5)
    val_a, val_b = groups(rng, 60, true_rel)
    se = rel_improvement_se(val_a, val_b, 36)
    predicted = pass_probability(true_rel, se, threshold, 0.95)
    n = 400
    lows = []
    for _ in range(n):
        a, b = groups(rng, 36, true_rel)
        w = bootstrap_weights(36, 400, rng)
        lows.append(paired_rel_ci(a, a, b, a, w, 0.95)["ci_low"])
    observed = np.mean(np.array(lows) >= threshold)
    tol = 3 * math.sqrt(predicted * (1 - predicted) / n) + 0.03
    assert abs(observed - predicted) <= tol, (observed, predicted, tol)
    wrong = pass_probability(true_rel, se, threshold + 0.03, 0.95)
    assert abs(observed - wrong) > tol


def _eval_json(se: float | None, n_groups: int = 36) -> dict:
    """The ``power`` block of eval.json as ``symkit evaluate`` writes it (NaN becomes null)."""
    return {"power": {"ngram_minus_transformer": {
        "se": se, "mde": None if se is None else minimum_detectable_effect(se),
        "n_groups": n_groups, "n_groups_observed": 22, "power": 0.8, "alpha": 0.025,
        "estimated_from": "val", "n_groups_of": "test (scored)"}}}


def test_power_summary_states_the_issue_figures():
    se = 0.039 / (1.959964 + 0.841621)
    s = power_summary(_eval_json(se), "ngram_minus_transformer", 0.02, 0.95)
    assert s is not None and s.mde == pytest.approx(0.039, rel=1e-5)
    assert s.p_clear_zero == pytest.approx(0.30, abs=0.005)
    assert s.effect_for_power == pytest.approx(0.059, rel=1e-4)
    assert pass_probability(s.effect_for_power, s.se, 0.02, 0.95) == pytest.approx(0.8)
    assert s.warning is not None and "\n" not in s.warning
    assert "0.02" in s.warning and "0.039" in s.warning and "0.30" in s.warning


@pytest.mark.parametrize("factor", [0.5, 0.999, 1.0, 1.001, 2.0])
def test_power_summary_warns_exactly_below_the_mde(factor):
    se = 0.01
    mde = minimum_detectable_effect(se, 0.8, 0.9)
    s = power_summary(_eval_json(se), "ngram_minus_transformer", factor * mde, 0.9)
    assert s is not None and s.mde == pytest.approx(mde)
    assert (s.warning is not None) == (factor * mde < mde)


def test_power_summary_rescales_and_handles_missing_blocks():
    block = _eval_json(0.01, n_groups=16)
    s = power_summary(block, "ngram_minus_transformer", 0.02, n_groups=64)
    assert s is not None and s.n_groups == 64
    assert s.se == pytest.approx(0.005)  # 1 / sqrt(G)
    assert s.mde == pytest.approx(minimum_detectable_effect(0.005))
    wider = power_summary(block, "ngram_minus_transformer", 0.02, 0.99)
    assert wider is not None and wider.mde > power_summary(block, "ngram_minus_transformer",
                                                           0.02, 0.95).mde
    assert power_summary(block, "a_minus_b", 0.02) is None
    assert power_summary({}, "ngram_minus_transformer", 0.02) is None
    assert power_summary(_eval_json(None), "ngram_minus_transformer", 0.02) is None

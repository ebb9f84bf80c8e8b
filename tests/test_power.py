"""pipeline.scoring.power: the closed forms against simulated experiments, and monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.scoring.bootstrap import bootstrap_weights, paired_rel_ci
from pipeline.scoring.power import (
    detectable_effect,
    minimum_detectable_effect,
    one_sided_alpha,
    pass_probability,
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

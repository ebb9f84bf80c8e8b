"""Group bootstrap for ratio metrics (NLL per token / note / second), vectorised and seeded.

Pieces of one group (``group_id`` in ``data/splits.parquet``: the same work, arrangement or
composer cluster) are not independent, so resampling pieces would make intervals too narrow.
We resample whole groups with replacement: replicate ``b`` draws ``G`` groups, i.e. a count vector
``W[b]`` with ``sum(W[b]) == G`` (one multinomial draw), and every statistic is a ratio of sums,
``(W @ numerator_g) / (W @ denominator_g)``, so one matrix product evaluates all replicates.
Paired differences between two models reuse the same ``W`` for both, which is what makes them
paired. Intervals are percentile intervals.

Hand-written rather than ``scipy.stats.bootstrap``: that resamples observations, not groups, and
would re-draw per statistic instead of sharing one set of replicates across models.
"""

from __future__ import annotations

import numpy as np


def bootstrap_weights(n_groups: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_groups)`` float64 counts: how often each group is drawn in each replicate."""
    if n_groups == 0:
        return np.zeros((n_boot, 0))
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(
        np.float64)


def group_sums(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum ``values`` (one per piece) within each group; ``codes`` are group indices ``0..G-1``."""
    return np.bincount(codes, weights=np.asarray(values, dtype=np.float64), minlength=n_groups)


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Central ``level`` percentile interval, ignoring replicates whose ratio is undefined."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(finite, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def ratio_ci(num_g: np.ndarray, den_g: np.ndarray, weights: np.ndarray,
             level: float) -> dict[str, float]:
    """``sum(num) / sum(den)`` over groups with its group-bootstrap interval."""
    value = _ratio(np.asarray(num_g.sum()), np.asarray(den_g.sum()))
    lo, hi = percentile_interval(_ratio(weights @ num_g, weights @ den_g), level)
    return {"value": float(value), "ci_low": lo, "ci_high": hi}


def paired_diff_ci(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray,
                   weights: np.ndarray, level: float) -> dict[str, float]:
    """Difference of two ratio metrics (A − B) over the same groups and the same replicates.

    ``share_a_lower`` is the fraction of replicates in which A's ratio is below B's (for an NLL,
    how often A looks better).
    """
    value = _ratio(np.asarray(num_a.sum()), np.asarray(den_a.sum())) - _ratio(
        np.asarray(num_b.sum()), np.asarray(den_b.sum()))
    diffs = _ratio(weights @ num_a, weights @ den_a) - _ratio(weights @ num_b, weights @ den_b)
    lo, hi = percentile_interval(diffs, level)
    finite = diffs[np.isfinite(diffs)]
    share = float(np.mean(finite < 0)) if finite.size else float("nan")
    return {"value": float(value), "ci_low": lo, "ci_high": hi, "share_a_lower": share}

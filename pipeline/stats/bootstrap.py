"""Group bootstrap for ratio metrics (NLL per token / note / second), vectorised and seeded.

Pieces of one group (``group_id`` in ``data/splits.parquet``: the same work, arrangement or
composer cluster) are not independent, so resampling pieces would make intervals too narrow.
We resample whole groups with replacement: replicate ``b`` draws ``G`` groups, i.e. a count vector
``W[b]`` with ``sum(W[b]) == G`` (one multinomial draw), and every statistic is a ratio of sums,
``(W @ numerator_g) / (W @ denominator_g)``, so one matrix product evaluates all replicates.
Paired differences between two models reuse the same ``W`` for both, which is what makes them
paired. Intervals are percentile intervals. A relative improvement ``(A − B) / A`` is formed
inside each replicate (:func:`paired_rel_ci`), never as the difference's interval over a point
value. Training seeds enter the intervals ``symkit evaluate`` judges as a Student-t term over
the per-seed statistics (:func:`seed_t_paired_ci`, :func:`seed_half_width`,
:func:`with_seed_term`); :func:`hierarchical_paired_ci` resamples them instead (the
computation ``symkit compare`` uses). Two robustness summaries of a paired effect need no
resampling: :func:`median_piece_effect` and :func:`effect_without_top_groups`.

Two different sets of groups (val against a train subset, for the generalisation gap) share no
pieces and are resampled independently, each with its own replicates
(:func:`independent_diff_ci`).

Hand-written rather than ``scipy.stats.bootstrap``: that resamples observations, not groups, and
would re-draw per statistic instead of sharing one set of replicates across models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats


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


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` elementwise, NaN where ``den <= 0`` (an empty resample has no ratio)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


# One implementation of each statistic, on ratio values and their replicates; the functions
# below only form the ratios from group sums and replicate counts.
def value_interval(value: Any, reps: np.ndarray, level: float) -> dict[str, float]:
    """``{value, ci_low, ci_high}``: a statistic and the percentile interval of its replicates."""
    lo, hi = percentile_interval(reps, level)
    return {"value": float(value), "ci_low": lo, "ci_high": hi}


def _difference(ratio_a: Any, ratio_b: Any, reps_a: np.ndarray, reps_b: np.ndarray,
                level: float) -> dict[str, float]:
    """``A − B`` with its interval and ``share_a_lower``: the fraction of replicates in which A's
    ratio is below B's (for an NLL, how often A looks better)."""
    diffs = reps_a - reps_b
    finite = diffs[np.isfinite(diffs)]
    share = float(np.mean(finite < 0)) if finite.size else float("nan")
    return {**value_interval(ratio_a - ratio_b, diffs, level), "share_a_lower": share}


def _rel(ratio_a: Any, ratio_b: Any) -> Any:
    """``(A − B) / A`` of two ratios (NaN where A ≤ 0)."""
    return safe_ratio(ratio_a - ratio_b, ratio_a)


def _relative(ratio_a: Any, ratio_b: Any, reps_a: np.ndarray, reps_b: np.ndarray,
              level: float) -> dict[str, float]:
    """``(A − B) / A``, formed inside each replicate."""
    return value_interval(_rel(ratio_a, ratio_b), _rel(reps_a, reps_b), level)


def _sum_ratio(num_g: np.ndarray, den_g: np.ndarray) -> np.ndarray:
    return safe_ratio(np.asarray(num_g.sum()), np.asarray(den_g.sum()))


def ratio_ci(num_g: np.ndarray, den_g: np.ndarray, weights: np.ndarray,
             level: float) -> dict[str, float]:
    """``sum(num) / sum(den)`` over groups with its group-bootstrap interval."""
    return value_interval(_sum_ratio(num_g, den_g), safe_ratio(weights @ num_g, weights @ den_g),
                          level)


def paired_diff_ci(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray,
                   weights: np.ndarray, level: float) -> dict[str, float]:
    """Difference of two ratio metrics (A − B) over the same groups and the same replicates.

    ``share_a_lower`` is the fraction of replicates in which A's ratio is below B's (for an NLL,
    how often A looks better).
    """
    return _difference(_sum_ratio(num_a, den_a), _sum_ratio(num_b, den_b),
                       safe_ratio(weights @ num_a, weights @ den_a),
                       safe_ratio(weights @ num_b, weights @ den_b), level)


def independent_diff_ci(num_a: np.ndarray, den_a: np.ndarray, weights_a: np.ndarray,
                        num_b: np.ndarray, den_b: np.ndarray, weights_b: np.ndarray,
                        level: float) -> dict[str, float]:
    """Difference of two ratio metrics (A − B) over *different* groups, each resampled on its own.

    ``num_a``/``den_a`` are group sums of one set of pieces (e.g. val) and ``num_b``/``den_b`` of
    another (e.g. a train subset), with their own replicate counts ``weights_a`` (n_boot, G_a)
    and ``weights_b`` (n_boot, G_b), drawn by independent generators: replicate ``b`` is
    ``ratio_a[b] − ratio_b[b]``. Nothing is shared between the sets, so nothing cancels (unlike
    :func:`paired_diff_ci`); the interval holds the sampling spread of both.
    """
    if len(weights_a) != len(weights_b):
        raise ValueError(f"replicate counts differ: {len(weights_a)} and {len(weights_b)}")
    out = _difference(_sum_ratio(num_a, den_a), _sum_ratio(num_b, den_b),
                      safe_ratio(weights_a @ num_a, weights_a @ den_a),
                      safe_ratio(weights_b @ num_b, weights_b @ den_b), level)
    return {k: out[k] for k in ("value", "ci_low", "ci_high")}


def paired_rel_ci(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray,
                  weights: np.ndarray, level: float) -> dict[str, float]:
    """Relative improvement of B over A, ``(A − B) / A`` of two ratio metrics, with its interval.

    The ratio is formed inside each replicate from that replicate's group sums, so the interval
    is the relative improvement's own; dividing the difference's interval by A's point value
    would ignore that A varies with the groups drawn. Positive when B's NLL is lower. When both
    models are scored on the same pieces (``den_a == den_b``) the units cancel: the value is
    ``1 − sum(num_b) / sum(num_a)`` per token, note or second alike.
    """
    return _relative(_sum_ratio(num_a, den_a), _sum_ratio(num_b, den_b),
                     safe_ratio(weights @ num_a, weights @ den_a),
                     safe_ratio(weights @ num_b, weights @ den_b), level)


# ---- several training seeds ----------------------------------------------------------------
def seed_weights(n_seeds: int, n_boot: int, rng: np.random.Generator) -> np.ndarray | None:
    """``(n_boot, n_seeds)`` counts of each training seed per replicate, or None for one seed
    (nothing to resample; no draw is made, so a single-seed model leaves ``rng`` untouched)."""
    return None if n_seeds <= 1 else bootstrap_weights(n_seeds, n_boot, rng)


def replicate_sums(group_w: np.ndarray, per_seed: np.ndarray,
                   seed_w: np.ndarray | None) -> np.ndarray:
    """Per replicate, the total over resampled groups of the NLL averaged over resampled seeds.

    ``group_w`` (n_boot, G) and ``seed_w`` (n_boot, S) are counts; ``per_seed`` (S, G) group
    sums. One seed (``seed_w`` None) needs no mixing and gives exactly the plain bootstrap's
    ``group_w @ sums``.
    """
    per_seed = np.atleast_2d(per_seed)
    n_seeds = per_seed.shape[0]
    mean = per_seed.mean(axis=0)
    if n_seeds == 1 or seed_w is None:
        return group_w @ mean
    drawn = (seed_w @ per_seed) / n_seeds  # (n_boot, G): mean over the drawn seeds
    # The mean of S draws from S seeds varies (S − 1) / S times as much as a mean of S new seeds
    # would; widen the deviation by sqrt(S / (S − 1)) so seed variance is not understated.
    return np.sum(group_w * (mean + np.sqrt(n_seeds / (n_seeds - 1)) * (drawn - mean)), axis=1)


def ratio_summary(num: float, den: float, rep_num: np.ndarray, rep_den: np.ndarray,
                  level: float) -> dict[str, float]:
    """``num / den`` with the percentile interval of the replicate ratios ``rep_num / rep_den``
    (replicate totals from :func:`replicate_sums`; as :func:`ratio_ci` for one seed)."""
    return value_interval(safe_ratio(np.asarray(num), np.asarray(den)),
                          safe_ratio(rep_num, rep_den), level)


def diff_summary(num_a: float, num_b: float, den: float, rep_a: np.ndarray, rep_b: np.ndarray,
                 rep_den: np.ndarray, level: float) -> dict[str, float]:
    """Paired ``A − B`` of two ratios over the same units, replicates given (as
    :func:`paired_diff_ci` for one seed)."""
    d, r = np.asarray(den), rep_den
    return _difference(safe_ratio(np.asarray(num_a), d), safe_ratio(np.asarray(num_b), d),
                       safe_ratio(rep_a, r), safe_ratio(rep_b, r), level)


def rel_summary(num_a: float, num_b: float, den: float, rep_a: np.ndarray, rep_b: np.ndarray,
                rep_den: np.ndarray, level: float) -> dict[str, float]:
    """Relative improvement ``(A − B) / A`` of two ratios over the same units, formed inside each
    replicate (as :func:`paired_rel_ci` for one seed)."""
    d, r = np.asarray(den), rep_den
    return _relative(safe_ratio(np.asarray(num_a), d), safe_ratio(np.asarray(num_b), d),
                     safe_ratio(rep_a, r), safe_ratio(rep_b, r), level)


def seed_half_width(per_seed: Sequence[Sequence[float]], level: float) -> float:
    """Half-width of the training seeds' Student-t term at ``level``.

    ``per_seed``: for each model with several seeds, the statistic computed with each of its
    seeds in turn (every other model at its seed average). The variance of the seed-averaged
    statistic is ``sum(var_m / S_m)`` over those models, with Welch–Satterthwaite degrees of
    freedom (``S − 1`` for one model), and the half-width is ``t_{df} · sqrt(variance)``. 0
    when no model has two seeds or the seeds agree exactly; NaN when a value is not finite.
    A Student-t quantile rather than resampling the seeds: 3 seeds have 10 distinct means, and
    their bootstrap covered a 90% interval's truth 82.7% of the time where seeds dominate
    (``benchmarks/bench_seed_coverage.py``; the t term 92.0%).
    """
    parts = [np.asarray(x, dtype=np.float64) for x in per_seed if len(x) > 1]
    if not parts:
        return 0.0
    if not all(np.isfinite(x).all() for x in parts):
        return float("nan")
    terms = [(float(np.var(x, ddof=1)) / x.size, x.size) for x in parts]
    var = sum(v for v, _ in terms)
    if var <= 0:
        return 0.0
    df = var * var / sum(v * v / (n - 1) for v, n in terms if v > 0)
    return float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(var)


def with_seed_term(summary: Mapping[str, float], half: float) -> dict[str, float]:
    """``summary`` (``{value, ci_low, ci_high, ...}`` from the group bootstrap of the
    seed-averaged model) with its interval widened by the seeds' term ``half``
    (:func:`seed_half_width`), in quadrature on each side: ``value − sqrt((value − ci_low)² +
    half²)`` and the same above, so the groups' skew is kept. The group interval stays as
    ``groups_ci_low``/``groups_ci_high`` and the term as ``seed_half_width``."""
    v, lo, hi = summary["value"], summary["ci_low"], summary["ci_high"]
    return {**summary, "ci_low": v - math.hypot(v - lo, half),
            "ci_high": v + math.hypot(hi - v, half),
            "groups_ci_low": lo, "groups_ci_high": hi, "seed_half_width": half}


def hierarchical_paired_ci(nll_a: np.ndarray, nll_b: np.ndarray, units: np.ndarray,
                           codes: np.ndarray, n_groups: int, n_boot: int,
                           rng: np.random.Generator, level: float) -> dict[str, Any]:
    """Paired A − B over groups *and* training seeds, so the interval includes seed variance.

    ``nll_a`` (S_a, n_pieces) and ``nll_b`` (S_b, n_pieces): per-piece NLL under each training
    seed (a 1-D array is one seed); ``units`` (n_pieces,) the tokens, notes or seconds of the
    pieces, shared by both models; ``codes`` the pieces' group indices ``0..G-1``.

    Replicate ``b`` draws ``G`` groups with replacement and, independently, ``S_a`` of A's seeds
    and ``S_b`` of B's seeds with replacement (a model with one seed draws nothing); each model's
    NLL is the mean over its drawn seeds, summed over the drawn groups, and the statistics are
    ratios of those sums. The group weights
    are drawn first, so with one seed per model the result equals :func:`paired_diff_ci` and
    :func:`paired_rel_ci` on ``bootstrap_weights(G, n_boot, rng)`` from the same generator state.

    ``value`` is the statistic of the seed-averaged NLL (the replicate statistic with every group
    and seed drawn once), not the mean of per-seed statistics: for the difference the two agree,
    for the relative improvement the seed-averaged form is the one the replicates estimate.
    ``per_seed`` lists each B seed against A averaged over its seeds (the training spread).

    Resampling few seeds understates their variance by a factor ``(S − 1) / S`` and gives coarse
    tails (3 seeds have 10 distinct means); the interval is an approximation that is closer to
    nominal the more seeds there are.

    Returns ``{"diff": {value, ci_low, ci_high, share_a_lower, per_seed},
    "rel_improvement": {value, ci_low, ci_high, per_seed}, "n_seeds_a", "n_seeds_b"}``.
    """
    per_a = np.atleast_2d(np.asarray(nll_a, dtype=np.float64))
    per_b = np.atleast_2d(np.asarray(nll_b, dtype=np.float64))
    ga = np.stack([group_sums(codes, s, n_groups) for s in per_a])  # (S_a, G)
    gb = np.stack([group_sums(codes, s, n_groups) for s in per_b])  # (S_b, G)
    gu = group_sums(codes, units, n_groups)
    group_w = bootstrap_weights(n_groups, n_boot, rng)  # first: one seed == plain bootstrap
    rep_a = replicate_sums(group_w, ga, seed_weights(len(ga), n_boot, rng))
    rep_b = replicate_sums(group_w, gb, seed_weights(len(gb), n_boot, rng))
    rep_u = group_w @ gu

    total_u = float(gu.sum())
    mean_a, mean_b = float(ga.sum(axis=1).mean()), float(gb.sum(axis=1).mean())
    b_totals = gb.sum(axis=1)
    out: dict[str, Any] = {"n_seeds_a": len(ga), "n_seeds_b": len(gb)}
    u = np.asarray(total_u)
    out["diff"] = {**diff_summary(mean_a, mean_b, total_u, rep_a, rep_b, rep_u, level),
                   "per_seed": [float(safe_ratio(np.asarray(mean_a), u)
                                      - safe_ratio(np.asarray(t), u)) for t in b_totals]}
    out["rel_improvement"] = {
        **rel_summary(mean_a, mean_b, total_u, rep_a, rep_b, rep_u, level),
        "per_seed": [float(_rel(safe_ratio(np.asarray(mean_a), u), safe_ratio(np.asarray(t), u)))
                     for t in b_totals]}
    return out


def seed_t_paired_ci(nll_a: np.ndarray, nll_b: np.ndarray, units: np.ndarray,
                     codes: np.ndarray, n_groups: int, n_boot: int, rng: np.random.Generator,
                     level: float) -> dict[str, Any]:
    """Paired A − B over groups, with the training seeds as a Student-t term: what
    ``symkit evaluate`` judges.

    Arguments as :func:`hierarchical_paired_ci`. The group bootstrap of the seed-averaged models
    (``bootstrap_weights(G, n_boot, rng)``, the only draw) gives the groups' interval; each
    model's per-seed statistics (its seeds in turn, the other model at its seed average) give
    :func:`seed_half_width`, and :func:`with_seed_term` combines the two. With one seed per
    model it equals :func:`paired_diff_ci` and :func:`paired_rel_ci`.
    """
    per_a = np.atleast_2d(np.asarray(nll_a, dtype=np.float64))
    per_b = np.atleast_2d(np.asarray(nll_b, dtype=np.float64))
    ga = np.stack([group_sums(codes, s, n_groups) for s in per_a])
    gb = np.stack([group_sums(codes, s, n_groups) for s in per_b])
    gu = group_sums(codes, units, n_groups)
    w = bootstrap_weights(n_groups, n_boot, rng)
    ma, mb = ga.mean(axis=0), gb.mean(axis=0)
    u = np.asarray(gu.sum())
    ra, rb = safe_ratio(np.asarray(ma.sum()), u), safe_ratio(np.asarray(mb.sum()), u)
    seeds_a = [safe_ratio(np.asarray(t), u) for t in ga.sum(axis=1)]
    seeds_b = [safe_ratio(np.asarray(t), u) for t in gb.sum(axis=1)]
    out: dict[str, Any] = {"n_seeds_a": len(ga), "n_seeds_b": len(gb)}
    for key, stat in (("diff", lambda x, y: x - y), ("rel_improvement", _rel)):
        group = (_difference if key == "diff" else _relative)(
            ra, rb, safe_ratio(w @ ma, w @ gu), safe_ratio(w @ mb, w @ gu), level)
        sets = [[float(stat(x, rb)) for x in seeds_a], [float(stat(ra, y)) for y in seeds_b]]
        half = seed_half_width(sets, level)
        out[key] = ({**with_seed_term(group, half), "per_seed": sets[1]}
                    if max(len(ga), len(gb)) > 1 else group)
    return out


# ---- robustness of a paired effect ---------------------------------------------------------
def median_piece_effect(nll_a: np.ndarray, nll_b: np.ndarray) -> float:
    """Median over pieces of the per-piece relative effect ``(A − B) / A``.

    A piece's units (notes, tokens, seconds) are the same for both models and cancel, so this is
    the per-note effect too. Pieces with ``A ≤ 0`` have no relative effect and are skipped; NaN
    when none is left. Unlike the ratio of sums it weighs every piece equally, so a gain carried
    by a few long pieces shows as a median far from the aggregate.
    """
    a, b = np.asarray(nll_a, dtype=np.float64), np.asarray(nll_b, dtype=np.float64)
    ok = a > 0
    return float(np.median((a[ok] - b[ok]) / a[ok])) if ok.any() else float("nan")


def effect_without_top_groups(nll_a_g: np.ndarray, nll_b_g: np.ndarray,
                              k: int = 3) -> dict[str, Any]:
    """Relative improvement ``1 − sum(B) / sum(A)`` after dropping the ``k`` groups that
    contribute most to the observed difference.

    Group ``g`` contributes ``A_g − B_g`` to ``sum(A) − sum(B)``; the dropped groups are those with
    the largest contribution in the direction of the observed difference (the groups most in
    B's favour when B is better, most in A's favour otherwise), ties broken by group index.
    Returns ``{"value", "dropped"}`` (``dropped``: the group indices, in order of contribution);
    ``value`` is NaN when no group is left.
    """
    a, b = np.asarray(nll_a_g, dtype=np.float64), np.asarray(nll_b_g, dtype=np.float64)
    contrib = a - b
    direction = 1.0 if contrib.sum() >= 0 else -1.0
    order = np.lexsort((np.arange(len(a)), -direction * contrib))  # largest first, then index
    dropped, kept = order[:k], np.sort(order[k:])
    value = _rel(np.asarray(a[kept].sum()), np.asarray(b[kept].sum())) if kept.size else np.nan
    return {"value": float(value), "dropped": [int(g) for g in dropped]}

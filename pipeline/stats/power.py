"""Power of a paired model comparison on the relative improvement ``r = (A − B) / A``.

A decision rule "the interval's lower bound clears ``threshold``" at interval level ``L`` is a
one-sided test at ``alpha = (1 − L) / 2``. With ``se`` the standard error of ``r̂`` on the split
the rule is applied to (test), and ``r̂`` roughly normal:

- :func:`pass_probability`: ``P(pass | true r) = Φ((r − threshold) / se − z_{1−alpha})``;
- :func:`minimum_detectable_effect`: ``MDE = (z_{1−alpha} + z_power) · se``, the margin over the
  threshold by which a true effect must exceed it to pass with probability ``power``.

``se`` comes from another split's groups (val, at registration) by the delta method for a ratio
of sums (:func:`rel_improvement_se`). Per group ``g`` let ``A_g``, ``B_g`` be the summed NLL of
the two models (the pieces' units are the same for both and cancel in ``r``, so they are not
needed), ``R = ΣB / ΣA`` and ``r = 1 − R``. Linearising, ``r̂ − r ≈ −Σ_g (B_g − R·A_g) / ΣA``,
so for ``G`` groups drawn like the observed ones::

    se(r̂) ≈ sd_g(B_g − R·A_g) / (mean_g(A_g) · sqrt(G))

``(R·A_g − B_g) / mean(A)`` is group ``g``'s effect weighted by its size; its between-group
standard deviation scales with ``1 / sqrt(G)``. This assumes the test groups resemble the val
groups (sizes, effect spread). Training-seed variance adds to it: with a model trained over
``S`` seeds, the spread of the per-seed effects on val adds ``sd_seed² / S``
(:func:`detectable_effect`). The group bootstrap of
:func:`pipeline.stats.bootstrap.paired_rel_ci` on the same groups gives nearly the same spread
(``(G − 1) / G`` of this variance).

``symkit evaluate`` records :func:`detectable_effect` from val's group sums under
``power.<a>_minus_<b>`` in ``reports/eval.json``; :func:`power_summary` reads that block back
for a registered threshold and says, in one line, when the threshold lies below the MDE.

Quantiles come from ``scipy.stats.norm``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats
from scipy.stats import norm


def one_sided_alpha(level: float) -> float:
    """The one-sided error rate of "the central ``level`` interval's lower bound clears it"."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level} must be in (0, 1)")
    return (1.0 - level) / 2.0


def rel_improvement_se(nll_a_g: np.ndarray, nll_b_g: np.ndarray,
                       n_groups: int | None = None) -> float:
    """Delta-method standard error of ``r̂ = 1 − ΣB / ΣA`` on a split of ``n_groups`` groups
    resembling these (default: as many as given). NaN with fewer than two groups or ``ΣA ≤ 0``."""
    a, b = np.asarray(nll_a_g, dtype=np.float64), np.asarray(nll_b_g, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"per-group sums must be 1-D and aligned, got {a.shape} and {b.shape}")
    g = len(a) if n_groups is None else int(n_groups)
    if len(a) < 2 or a.sum() <= 0 or g < 1:
        return float("nan")
    resid = b - (b.sum() / a.sum()) * a
    return float(np.std(resid, ddof=1) / (a.mean() * math.sqrt(g)))


def minimum_detectable_effect(se: float, power: float = 0.8, level: float = 0.95) -> float:
    """``(z_{1−alpha} + z_power) · se``: how far a true effect must exceed the threshold for the
    lower bound of the ``level`` interval to clear it with probability ``power``."""
    if not 0.0 < power < 1.0:
        raise ValueError(f"power={power} must be in (0, 1)")
    return float((norm.ppf(1.0 - one_sided_alpha(level)) + norm.ppf(power)) * se)


def pass_probability(true_effect: float, se: float, threshold: float = 0.0,
                     level: float = 0.95) -> float:
    """Probability that the ``level`` interval's lower bound clears ``threshold`` when the true
    relative improvement is ``true_effect`` (normal approximation)."""
    z = norm.ppf(1.0 - one_sided_alpha(level))
    return float(norm.cdf((true_effect - threshold) / se - z))


def detectable_effect(nll_a_g: np.ndarray, nll_b_g: np.ndarray, n_groups: int, *,
                      power: float = 0.8, level: float = 0.95,
                      seed_effects: Sequence[float] = ()) -> dict[str, Any]:
    """The MDE on a split of ``n_groups`` groups, estimated from these groups (e.g. val's).

    ``seed_effects``: the relative improvement of each training seed of a replicated model on the
    same groups (empty or one value: no seed term). Their standard deviation ``sd_seed`` adds the
    training variance of a mean over ``S`` seeds: ``se² = se_groups² + sd_seed² / S``. The seed
    term is not rescaled with ``n_groups``: how much of a seed's effect is a shift of the whole
    model rather than group-by-group noise is unknown, and the shift does not shrink with more
    groups.

    Returns ``{"se", "se_groups", "seed_sd", "n_seeds", "mde", "n_groups", "n_groups_observed",
    "power", "alpha"}``: a flat, JSON-ready record for the pre-registration.
    """
    se_groups = rel_improvement_se(nll_a_g, nll_b_g, n_groups)
    effects = np.asarray(list(seed_effects), dtype=np.float64)
    seed_sd = float(np.std(effects, ddof=1)) if effects.size > 1 else 0.0
    se = math.sqrt(se_groups ** 2 + seed_sd ** 2 / effects.size) if effects.size > 1 else se_groups
    return {"se": se, "se_groups": se_groups, "seed_sd": seed_sd,
            "n_seeds": int(max(1, effects.size)),
            "mde": minimum_detectable_effect(se, power, level),
            "n_groups": int(n_groups), "n_groups_observed": len(nll_a_g), "power": power,
            "alpha": one_sided_alpha(level)}


@dataclass(frozen=True)
class PowerSummary:
    """What a registered threshold can detect on the split the rule judges (see
    :func:`power_summary`)."""

    pair: str
    threshold: float
    level: float
    power: float
    se: float
    mde: float
    n_groups: int
    p_clear_zero: float
    """Probability that the interval's lower bound clears 0 when the true effect equals the
    threshold (the issue's "a true 2% gain passes about 30% of the time")."""
    effect_for_power: float
    """``threshold + mde``: the true effect for which "lower bound ≥ threshold" passes with
    probability ``power``."""
    warning: str | None
    """One line when ``threshold < mde``, else None."""


def power_summary(eval_json: Mapping[str, Any], pair: str, threshold: float,
                  level: float = 0.95, *, n_groups: int | None = None) -> PowerSummary | None:
    """The power of a rule on ``pair``'s relative improvement, from eval.json's
    ``power.<pair>`` block (written by ``symkit evaluate`` from val's per-group sums).

    ``level`` is the interval level the rule uses (``evaluate.ci_level``); the MDE is recomputed
    from the block's ``se`` at that level and the block's power. ``n_groups`` rescales ``se`` by
    ``sqrt(block n_groups / n_groups)`` for a split of another size (e.g. the test groups in
    ``data/splits.parquet`` at registration). ``warning`` is set exactly when
    ``threshold < mde``. Returns None when the block is missing or its ``se`` is not a finite
    number (fewer than two val groups).
    """
    block = (eval_json.get("power") or {}).get(pair) if isinstance(eval_json, Mapping) else None
    se = block.get("se") if isinstance(block, Mapping) else None
    if isinstance(se, bool) or not isinstance(se, int | float) or not math.isfinite(se):
        return None
    groups = int(block.get("n_groups") or 0)
    if n_groups is not None:
        if groups < 1 or n_groups < 1:
            return None
        # Only the between-group part scales with the number of groups (see detectable_effect).
        se_g, seed_sd = block.get("se_groups", se), float(block.get("seed_sd") or 0.0)
        seeds = max(1, int(block.get("n_seeds") or 1))
        se_g = se_g * math.sqrt(groups / n_groups)
        se, groups = math.sqrt(se_g ** 2 + seed_sd ** 2 / seeds), int(n_groups)
    power = float(block.get("power", 0.8))
    mde = minimum_detectable_effect(se, power, level)
    p_zero = pass_probability(threshold, se, 0.0, level)
    warning = None
    if threshold < mde:
        warning = (f"{pair}: the threshold {threshold:.3g} is below the minimum detectable "
                   f"effect {mde:.3g} ({power:.0%} power, {level:.0%} interval, {groups} "
                   f"groups, se {se:.3g} from val): a true effect equal to the threshold "
                   f"clears 0 with probability {p_zero:.2f}; \"lower bound >= threshold\" "
                   f"passes with probability {power:.0%} only from a true effect of "
                   f"{threshold + mde:.3g}")
    return PowerSummary(pair, float(threshold), float(level), power, float(se), mde, groups,
                        p_zero, float(threshold + mde), warning)


def seed_t_half_width(se_groups: float, seed_sd: float, seeds: int, level: float) -> float:
    """The expected half-width of an interval judged as ``symkit evaluate`` judges a replicated
    model (:func:`pipeline.stats.bootstrap.with_seed_term`): ``z · se_groups`` and
    ``t_{S−1}`` times the seed term at its expected estimate (``c4 · seed_sd / sqrt(S)``, with
    ``c4`` the bias of a standard deviation from ``S`` draws), in quadrature."""
    z = float(norm.ppf(0.5 + level / 2))
    if seeds < 2:
        return z * se_groups
    c4 = math.sqrt(2 / (seeds - 1)) * math.exp(math.lgamma(seeds / 2)
                                               - math.lgamma((seeds - 1) / 2))
    t = float(stats.t.ppf(0.5 + level / 2, seeds - 1))
    return math.hypot(z * se_groups, t * c4 * seed_sd / math.sqrt(seeds))


def gain_pass_probability(true_gain: float, threshold: float, se_groups: float, seed_sd: float,
                          seeds: int, level: float) -> float:
    """Probability that the gain's interval, judged as evaluate judges it, lies wholly at or
    above ``threshold``: the estimate is normal around ``true_gain`` with standard error
    ``sqrt(se_groups² + seed_sd² / S)``; the half-width is ``z · se_groups`` and ``t_{S−1}``
    times the seeds' *estimated* spread over ``sqrt(S)``, in quadrature, that estimate a
    ``seed_sd · sqrt(chi²_{S−1} / (S − 1))`` draw, integrated over 400 of its quantiles."""
    z = float(norm.ppf(0.5 + level / 2))
    se = math.hypot(se_groups, seed_sd / math.sqrt(max(seeds, 1)))
    if se <= 0:
        return float(true_gain - z * se_groups >= threshold)
    if seeds < 2 or seed_sd <= 0:
        halves = np.array([z * se_groups])
    else:
        q = stats.chi2.ppf((np.arange(400) + 0.5) / 400, seeds - 1)
        sd_hat = seed_sd * np.sqrt(q / (seeds - 1))
        t = float(stats.t.ppf(0.5 + level / 2, seeds - 1))
        halves = np.hypot(z * se_groups, t * sd_hat / math.sqrt(seeds))
    return float(np.mean(norm.cdf((true_gain - threshold - halves) / se)))


def gain_at_power(threshold: float, se_groups: float, seed_sd: float, seeds: int, level: float,
                  power: float = 0.8) -> float:
    """The project's one statement of power: the true relative gain that a rule "the whole
    ``level`` interval of the gain lies at or above ``threshold``" passes with probability
    ``power`` (:func:`gain_pass_probability`, which the decision controls' simulation of the
    gain agrees with). The registration (at a val pilot's spreads), the report (at the run's)
    and docs/evaluation.md state power with it alone."""
    lo, hi = threshold, threshold + 1.0
    while gain_pass_probability(hi, threshold, se_groups, seed_sd, seeds, level) < power:
        hi += 1.0
    for _ in range(80):  # bisection: the probability rises with the true gain
        mid = (lo + hi) / 2
        if gain_pass_probability(mid, threshold, se_groups, seed_sd, seeds, level) < power:
            lo = mid
        else:
            hi = mid
    return float(hi)

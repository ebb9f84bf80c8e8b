"""Positive and negative controls of the decision criteria: how often does a rule pass a model
that should pass, and one that should fail, at the experiment's sample sizes?

A criterion that fails a good model most of the time, or passes a bad one more than the
interval's tail allows, says more than its data know. For each metric the project's criteria
use, :data:`CONTROLS` plants two truths, a *good* model (the rule's intent met with room to
spare, or exactly the null a well-behaved model sits at) and a *bad* one (the failure the rule
is there to catch), simulates the evidence the stages would produce at the sample sizes of
:class:`Sizes`, and judges each simulated draw with the rule itself
(:func:`pipeline.report.criteria.evaluate`). The standard: a rule passes its good control at
least 80% of the time and its bad control at most 5% (:data:`GOOD_AT_LEAST`,
:data:`BAD_AT_MOST`).

How each metric's evidence is simulated:

- ``test.nll_per_note.rel_improvement`` and ``generalisation.gap.transformer``: a normal
  estimate around the truth with the experiment's own standard error (evaluate's power block
  for the gain, the width of the committed gap interval for the gap), its interval the estimate
  plus and minus ``z · se`` (what the group bootstrap gives for a statistic this close to
  normal);
- ``memorisation.<m>.membership_auc``: losses of train and held-out pieces from two normals
  whose separation gives the true AUC, judged by :func:`pipeline.scoring.memorisation.
  judge_membership` (the audit's bootstrap);
- ``memorisation.<m>.extraction_excess``: binomial exact-extraction counts on train and test
  pieces, judged by :func:`~pipeline.scoring.memorisation.judge_extraction` (Newcombe);
- ``memorisation.<m>.flag_excess``: binomial flags of the samples and of human windows grouped
  in pieces, judged by :func:`~pipeline.scoring.memorisation.judge_flag_rate`;
- ``quality.<m>.score`` and ``quality.<m>.margin``: each of the statistics outside its band
  independently (probability ``quality_alpha`` for human-like music; the band's calibration
  assumes no more), the band's low score the ``1 - quality_alpha`` quantile of that count;
- ``leakage.test_near_train``: a count, 0 or planted.

Pure functions of a seed: the same ``seed`` gives the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from pipeline.report.criteria import CriteriaConfig, Criterion, evaluate
from pipeline.scoring.memorisation import (
    Extraction,
    judge_extraction,
    judge_flag_rate,
    judge_membership,
)

GOOD_AT_LEAST = 0.80
BAD_AT_MOST = 0.05


@dataclass(frozen=True)
class Sizes:
    """The default experiment's sample sizes and spreads (reports/eval.json, audit.json)."""

    gain_se: float = 0.0082
    """Standard error of the relative gain over the n-gram on test: evaluate's power block (val's
    group spread scaled to 33 test groups, plus the spread over 3 training seeds)."""
    gap_se: float = 0.087
    """Standard error of the val − train-subset gap, nats per token: the committed 95% interval
    0.58 to 0.92 is 3.92 of them wide."""
    membership_train: int = 64
    membership_test: int = 45
    extraction_train: int = 64
    extraction_test: int = 45
    samples: int = 80
    """Audited samples of a model (64 unconditional, 16 continuations)."""
    human_windows: int = 119
    human_pieces: int = 45
    human_flag_rate: float = 0.067
    quality_stats: int = 7
    quality_alpha: float = 0.05
    level: float = 0.95
    n_boot: int = 500


@dataclass(frozen=True)
class Control:
    """One planted truth for a metric, and how to draw the evidence it gives."""

    metric: str
    case: str
    """``good`` (should pass) or ``bad`` (should fail)."""
    truth: str
    """The planted truth, in words."""
    draw: Callable[[np.random.Generator, Sizes], dict[str, float]]
    """Flat metrics of one simulated experiment (the metric, and its interval)."""
    side: str = "both"
    """Which rules the control is for: ``upper`` (ops < and <=, a bound from above), ``lower``
    (> and >=) or ``both``. A gap of -0.5 is the failure a "not negative" rule must catch, not
    one that an upper bound on the gap is for."""

    def applies_to(self, rule: Criterion) -> bool:
        upper = rule.op in ("<", "<=")
        return rule.metric == self.metric and (self.side == "both"
                                               or (self.side == "upper") == upper)


def _normal(truth: float, se_of: Callable[[Sizes], float]) -> Callable[..., dict[str, float]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        se = se_of(s)
        z = NormalDist().inv_cdf(0.5 + s.level / 2)
        est = float(rng.normal(truth, se))
        return {"value": est, "ci_low": est - z * se, "ci_high": est + z * se}
    return draw


def _membership(auc: float) -> Callable[..., dict[str, float]]:
    shift = math.sqrt(2) * NormalDist().inv_cdf(auc)  # AUC of N(-shift, 1) below N(0, 1)

    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        train = rng.normal(-shift, 1.0, s.membership_train)
        held = rng.normal(0.0, 1.0, s.membership_test)
        return judge_membership(train, held, n_boot=s.n_boot, level=s.level, rng=rng)
    return draw


def _extraction(train_rate: float, test_rate: float) -> Callable[..., dict[str, float]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        a = rng.random(s.extraction_train) < train_rate
        b = rng.random(s.extraction_test) < test_rate
        out = judge_extraction(Extraction(a.size, a.mean(), a.mean(), tuple(a)),
                               Extraction(b.size, b.mean(), b.mean(), tuple(b)), level=s.level)
        return out["excess"]
    return draw


def _flags(sample_rate: float) -> Callable[..., dict[str, float]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        samples = rng.random(s.samples) < sample_rate
        kinds = np.array(["unconditional"] * (s.samples * 4 // 5)
                         + ["continuation"] * (s.samples - s.samples * 4 // 5))
        human = rng.random(s.human_windows) < s.human_flag_rate
        pieces = np.arange(s.human_windows) % s.human_pieces
        return judge_flag_rate(samples, kinds, human, pieces, n_boot=s.n_boot, level=s.level,
                               rng=rng)["excess"]
    return draw


def _quality(p_outside: float, margin: bool) -> Callable[..., dict[str, float]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        k = s.quality_stats
        score = 1 - int((rng.random(k) < p_outside).sum()) / k
        null = rng.random((4000, k)) < s.quality_alpha  # human-like sets, as audit calibrates
        band = float(np.quantile(1 - null.sum(axis=1) / k, s.quality_alpha))
        return {"value": score - band if margin else score}
    return draw


def _count(n: int) -> Callable[..., dict[str, float]]:
    return lambda rng, s: {"value": float(n)}


def _controls() -> list[Control]:
    out = [
        Control("test.nll_per_note.rel_improvement", "good", "a true gain of 6% per note",
                _normal(0.06, lambda s: s.gain_se)),
        Control("test.nll_per_note.rel_improvement", "bad", "no gain over the n-gram (0%)",
                _normal(0.0, lambda s: s.gain_se)),
        Control("generalisation.gap.transformer", "good",
                "a true gap of 0.2 nats per token (val tokens e^0.2 = 1.22 times less likely)",
                _normal(0.2, lambda s: s.gap_se)),
        Control("generalisation.gap.transformer", "good",
                "a true gap of 0: val exactly as predictable as training pieces",
                _normal(0.0, lambda s: s.gap_se)),
        Control("generalisation.gap.transformer", "bad",
                "a true gap of 1.0 (memorised training pieces)", _normal(1.0, lambda s: s.gap_se),
                "upper"),
        Control("generalisation.gap.transformer", "bad",
                "a true gap of -0.5 (val easier than training: val music leaked into training)",
                _normal(-0.5, lambda s: s.gap_se), "lower"),
        Control("leakage.test_near_train", "good", "no near copy", _count(0)),
        Control("leakage.test_near_train", "bad", "one near copy", _count(1)),
    ]
    for m in ("ngram", "transformer"):
        out += [
            Control(f"memorisation.{m}.membership_auc", "good", "true AUC 0.5 (chance)",
                    _membership(0.5)),
            Control(f"memorisation.{m}.membership_auc", "bad", "true AUC 0.8",
                    _membership(0.8)),
            Control(f"memorisation.{m}.extraction_excess", "good",
                    "never reproduces a continuation (0% on train and test)",
                    _extraction(0.0, 0.0)),
            Control(f"memorisation.{m}.extraction_excess", "bad",
                    "reproduces 20% of training continuations, 0% of test ones",
                    _extraction(0.2, 0.0)),
            Control(f"memorisation.{m}.flag_excess", "good",
                    "samples flagged at the human rate (6.7%)", _flags(0.067)),
            Control(f"memorisation.{m}.flag_excess", "bad", "30% of samples flagged",
                    _flags(0.30)),
            Control(f"quality.{m}.score", "good", "human-like: each statistic outside its "
                    "band with the calibrated 5%", _quality(0.05, margin=False)),
            Control(f"quality.{m}.score", "bad", "each statistic outside its band with 50%",
                    _quality(0.5, margin=False)),
            Control(f"quality.{m}.score", "bad", "each statistic outside its band with 60%",
                    _quality(0.6, margin=False)),
            Control(f"quality.{m}.margin", "good", "human-like: each statistic outside its "
                    "band with the calibrated 5%", _quality(0.05, margin=True)),
            Control(f"quality.{m}.margin", "bad", "each statistic outside its band with 50%",
                    _quality(0.5, margin=True)),
            Control(f"quality.{m}.margin", "bad", "each statistic outside its band with 60%",
                    _quality(0.6, margin=True)),
        ]
    return out


CONTROLS = _controls()


@dataclass(frozen=True)
class Rate:
    rule: str
    case: str
    truth: str
    pass_rate: float
    draws: int

    @property
    def meets_standard(self) -> bool:
        return (self.pass_rate >= GOOD_AT_LEAST if self.case == "good"
                else self.pass_rate <= BAD_AT_MOST)


def pass_rate(rule: Criterion, control: Control, draws: int, seed: int,
              sizes: Sizes = Sizes()) -> float:
    """Share of ``draws`` simulated experiments under ``control`` in which ``rule`` PASSes."""
    rng = np.random.default_rng([seed, draws, *control.metric.encode(), *control.case.encode(),
                                 *control.truth.encode()])
    passed = 0
    for _ in range(draws):
        got = control.draw(rng, sizes)
        metrics: Mapping[str, Any] = {rule.metric: got["value"],
                                      **{f"{rule.metric}.{k}": got[k]
                                         for k in ("ci_low", "ci_high") if k in got}}
        passed += evaluate(rule, metrics, sizes.level).status == "PASS"
    return passed / draws


def rates(cfg: CriteriaConfig, draws: int = 1000, seed: int = 0,
          sizes: Sizes = Sizes()) -> list[Rate]:
    """The pass rate of every rule of ``cfg`` under every control of its metric, in rule order
    (rules on metrics without controls are left out)."""
    out = []
    for rule in cfg.rules:
        for c in (c for c in CONTROLS if c.applies_to(rule)):
            out.append(Rate(rule.name, c.case, c.truth, pass_rate(rule, c, draws, seed, sizes),
                            draws))
    return out

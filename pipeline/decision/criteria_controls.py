"""Positive and negative controls of the decision criteria: how often does a rule pass a model
that should pass, and one that should fail, at the experiment's sample sizes?

A criterion that fails a good model most of the time, or passes a bad one more than the
interval's tail allows, says more than its data know. For each metric the project's criteria
use, :data:`CONTROLS` plants two truths, a *good* model (the rule's intent met with room to
spare, or exactly the null a well-behaved model sits at) and a *bad* one (the failure the rule
is there to catch), simulates the evidence the stages would produce at the sample sizes of
:class:`Sizes`, and judges each simulated draw with the rule itself
(:func:`pipeline.decision.criteria.evaluate`). The standard: a rule passes its good control at
least 80% of the time and its bad control at most 5% (:data:`GOOD_AT_LEAST`,
:data:`BAD_AT_MOST`).

The guards that must hold for every training seed (the metrics the metric table judges per
seed, :func:`pipeline.decision.metrics.judged_per_seed`: membership, the gap, copying and
extraction) are simulated seed by seed, as the audit and evaluate measure them: with
``seeds`` > 1 a draw gives each seed's own block (``seeds``), written into the metrics as the
report writes them (:func:`pipeline.decision.metrics.seed_metrics`), and the rule judges every
seed and combines them as the report does (:func:`pipeline.decision.criteria.evaluate`). Where
the seeds are drawn independently, the good controls meet their hardest case (every seed must
pass: a seed's pass rate to the power ``seeds``) and the bad ones their easiest (any seed
failing fails the rule); seeds sharing the pieces' noise fall between those rates and one
seed's, which is how the gap is drawn once the seeds' own spread is measured.

How each metric's evidence is simulated:

- ``test.nll_per_note.rel_improvement``: a normal estimate around the truth with a group term
  and a seed term (evaluate's power block: the groups' standard error and the spread of the
  per-seed gains over ``seeds`` training seeds); the seeds' spread is itself estimated from
  ``seeds`` draws (a chi-square), and the interval is what evaluate judges: ``z`` times the
  group term and ``t_{seeds-1}`` times the estimated seed term, added in quadrature;
- ``generalisation.gap[_per_note].transformer``: for each of ``seeds`` training seeds, a normal
  estimate around the truth: one draw of the pieces' noise, shared by every seed (all score
  the same pieces), with one seed's measured standard error, plus each seed's own draw with the
  measured spread of the seeds' gaps around each other (:mod:`pipeline.decision.spreads`: the
  val pilot's, or the run's); each interval the estimate plus and minus ``z · se`` (what the
  group bootstrap gives for a statistic this close to normal). Spreads without the seeds'
  spread (a registration stated before it was measured) draw the seeds independently;
- ``memorisation.<m>.membership_auc``: losses of train and held-out pieces from two normals
  whose separation gives the true AUC, in as many groups as the split has, for each of
  ``seeds`` training seeds, each judged alone by
  :func:`pipeline.audit.memorisation.judge_membership` (the audit's group bootstrap of one
  seed's AUC; pieces of one group drawn independently, so a corpus whose tune families share
  their difficulty gives wider intervals than these, and each seed's losses drawn afresh: real
  seeds share the pieces' difficulty and agree more);
- ``memorisation.<m>.extraction_excess``: binomial exact-extraction counts on train and test
  pieces for each seed, each judged alone by
  :func:`~pipeline.audit.memorisation.judge_extraction` (Newcombe): the seeds reproduce the
  same pieces (what makes a greedy continuation exact is mostly the piece, a repeated
  section), and one control draws them independently;
- ``memorisation.<m>.flag_excess``: binomial flags of the samples, shared out among the seeds
  as generate does, and of human windows grouped in pieces; each seed's own samples judged
  against the same windows by :func:`~pipeline.audit.memorisation.judge_flag_rate`;
- ``quality.<m>.score`` and ``quality.<m>.margin``: each of the statistics outside its band
  independently (for human-like music at the level that leaves any of them outside in
  ``quality_alpha`` of draws, as the audit calibrates its bands together), the band's score 1:
  every statistic inside;
- ``leakage.test_near_train``: a count, 0 or planted.

Pure functions of a seed: the same ``seed`` gives the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import optimize, stats

from pipeline.audit.memorisation import (
    Extraction,
    judge_extraction,
    judge_flag_rate,
    judge_membership,
)
from pipeline.decision.criteria import CriteriaConfig, Criterion, evaluate
from pipeline.decision.metrics import MODELS, judged_per_seed, seed_metrics
from pipeline.decision.spreads import Spreads, auc_for_gap
from pipeline.music.descriptors import STATS
from pipeline.stats.power import gain_at_power, seed_t_half_width

GOOD_AT_LEAST = 0.80
BAD_AT_MOST = 0.05


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """One design's sample sizes and its measured spreads (:mod:`pipeline.decision.spreads`):
    the registered split and params with a val pilot's spreads (:func:`design_sizes`), or the
    run's own (:func:`run_sizes`). No spread has a default: each is measured."""

    spreads: Spreads
    seeds: int
    """Training seeds (``transformer.replicates``)."""
    membership_train: int
    """Train pieces of membership inference (``audit.membership_pieces``, at most the split's)."""
    membership_test: int
    """Held-out pieces of membership inference (val and test)."""
    membership_train_groups: int
    membership_test_groups: int
    """The groups those pieces fall in, resampled whole."""
    extraction_train: int
    extraction_test: int
    samples: int
    """Audited samples of a model (unconditional and continuations), shared out among its
    training seeds by generate."""
    human_windows: int
    human_pieces: int
    quality_stats: int = len(STATS)
    quality_alpha: float = 0.05
    level: float = 0.95
    n_boot: int = 200
    """Bootstrap replicates of each simulated interval (the stages use more; 200 keep a
    simulation of thousands of experiments to minutes)."""

    @property
    def gain_se_groups(self) -> float:
        return self.spreads.gain_se_groups

    @property
    def gain_seed_sd(self) -> float:
        return self.spreads.gain_seed_sd

    @property
    def gap_se(self) -> float:
        return self.spreads.gap_se_token

    @property
    def gap_per_note_se(self) -> float:
        return self.spreads.gap_se_note

    @property
    def gap_seed_sd(self) -> float | None:
        return self.spreads.gap_seed_sd_token

    @property
    def gap_per_note_seed_sd(self) -> float | None:
        return self.spreads.gap_seed_sd_note

    @property
    def human_flag_rate(self) -> float:
        return self.spreads.human_flag_rate

    def scaled(self, factor: float, seeds: int | None = None,
               samples: float | None = None) -> Sizes:
        """The same design with every held-out and audited count times ``factor`` (standard
        errors over pieces and groups shrink by ``sqrt(factor)``; the seeds' spreads do not),
        the generated samples times ``samples`` (default ``factor``) and ``seeds`` training
        seeds: how large an experiment would have to be."""
        sp = self.spreads
        root = math.sqrt(factor)
        spreads = replace(sp, gain_se_groups=sp.gain_se_groups / root,
                          gap_se_note=sp.gap_se_note / root, gap_se_token=sp.gap_se_token / root)

        def up(n: int) -> int:
            return max(1, round(n * factor))

        return replace(self, spreads=spreads, seeds=seeds or self.seeds,
                       membership_test=up(self.membership_test),
                       membership_test_groups=up(self.membership_test_groups),
                       extraction_test=up(self.extraction_test),
                       samples=max(1, round(self.samples * (factor if samples is None
                                                            else samples))),
                       human_windows=up(self.human_windows), human_pieces=up(self.human_pieces))

    @property
    def gain_se(self) -> float:
        """The gain's standard error, groups and seeds: ``sqrt(se_groups² + sd² / seeds)``."""
        return math.hypot(self.gain_se_groups, self.gain_seed_sd / math.sqrt(self.seeds))

    @property
    def gain_half_width(self) -> float:
        """The expected half-width of the gain's interval
        (:func:`pipeline.stats.power.seed_t_half_width`)."""
        return seed_t_half_width(self.gain_se_groups, self.gain_seed_sd, self.seeds, self.level)


@dataclass(frozen=True)
class Control:
    """One planted truth for a metric (the metric is its key in :data:`CONTROLS`), and how to
    draw the evidence it gives."""

    case: str
    """``good`` (should pass) or ``bad`` (should fail)."""
    truth: str
    """The planted truth, in words."""
    draw: Callable[[np.random.Generator, Sizes], dict[str, Any]]
    """One simulated experiment: the metric's ``value``, its ``ci_low``/``ci_high``, and for a
    metric judged per seed with ``seeds`` > 1, ``seeds``: each seed's own block."""
    side: str = "both"
    """Which rules the control is for: ``upper`` (ops < and <=, a bound from above), ``lower``
    (> and >=) or ``both``. A gap of -0.5 is the failure a "not negative" rule must catch, not
    one that an upper bound on the gap is for."""

    def applies_to(self, rule: Criterion) -> bool:
        """Whether this control is for ``rule``'s side (its metric is the caller's to match)."""
        return self.side == "both" or (self.side == "upper") == (rule.op in ("<", "<="))


def good(truth: str, draw: Callable[..., dict[str, Any]], side: str = "both") -> Control:
    """A model the rule should pass, at least :data:`GOOD_AT_LEAST` of the time."""
    return Control("good", truth, draw, side)


def bad(truth: str, draw: Callable[..., dict[str, Any]], side: str = "both") -> Control:
    """A model the rule should fail: it may pass at most :data:`BAD_AT_MOST` of the time."""
    return Control("bad", truth, draw, side)


def _over_seeds(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One experiment's evidence from each training seed's own block: the block itself for one
    seed; else ``seeds`` (label -> block, labels 0, 1, ...) and their mean as ``value`` (no
    interval: a metric judged per seed is judged on the seeds' blocks)."""
    if len(blocks) == 1:
        return blocks[0]
    return {"value": float(np.mean([b["value"] for b in blocks])),
            "seeds": {str(i): b for i, b in enumerate(blocks)}}


def _normal(truth: float, se_of: Callable[[Sizes], float],
            seed_sd_of: Callable[[Sizes], float | None] = lambda s: None
            ) -> Callable[..., dict[str, Any]]:
    """Each seed's estimate around ``truth``, its interval ``± z · se``: the pieces' noise
    (``se``) drawn once and shared, each seed's own deviation drawn with ``seed_sd_of``; when
    that is None, each seed's whole error drawn independently with ``se``."""
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        se, seed_sd = se_of(s), seed_sd_of(s)
        z = NormalDist().inv_cdf(0.5 + s.level / 2)
        shared = float(rng.normal(0.0, se)) if seed_sd is not None else 0.0
        blocks = []
        for _ in range(max(s.seeds, 1)):
            est = (truth + shared + float(rng.normal(0.0, seed_sd)) if seed_sd is not None
                   else float(rng.normal(truth, se)))
            blocks.append({"value": est, "ci_low": est - z * se, "ci_high": est + z * se})
        return _over_seeds(blocks)
    return draw


def _gain(truth: float) -> Callable[..., dict[str, float]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        z = NormalDist().inv_cdf(0.5 + s.level / 2)
        n = max(s.seeds, 1)
        est = truth + float(rng.normal(0.0, s.gain_se_groups)) \
            + float(rng.normal(0.0, s.gain_seed_sd / math.sqrt(n)))
        seed_term = 0.0
        if n > 1:
            sd = s.gain_seed_sd * math.sqrt(float(rng.chisquare(n - 1)) / (n - 1))
            seed_term = float(stats.t.ppf(0.5 + s.level / 2, n - 1)) * sd / math.sqrt(n)
        half = math.hypot(z * s.gain_se_groups, seed_term)
        return {"value": est, "ci_low": est - half, "ci_high": est + half}
    return draw


def _membership(auc: float) -> Callable[..., dict[str, Any]]:
    shift = math.sqrt(2) * NormalDist().inv_cdf(auc)  # AUC of N(-shift, 1) below N(0, 1)

    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        blocks = []
        for _ in range(max(s.seeds, 1)):
            train = rng.normal(-shift, 1.0, s.membership_train)
            held = rng.normal(0.0, 1.0, s.membership_test)
            got = judge_membership(
                train, held, n_boot=s.n_boot, level=s.level, rng=rng,
                train_groups=np.arange(s.membership_train) % s.membership_train_groups,
                heldout_groups=np.arange(s.membership_test) % s.membership_test_groups)
            blocks.append({k: got[k] for k in ("value", "ci_low", "ci_high")})
        return _over_seeds(blocks)
    return draw


def _membership_at_gap(gap: float) -> Callable[..., dict[str, Any]]:
    """Membership at the AUC a per-note ``gap`` implies at the pieces' measured spread
    (:func:`pipeline.decision.spreads.auc_for_gap`): the gap rule and the membership rule judge
    one model, so their truths come from one number."""
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        return _membership(auc_for_gap(gap, s.spreads.piece_sd_note))(rng, s)
    return draw


def _extraction(train_rate: float, test_rate: float,
                shared: bool = True) -> Callable[..., dict[str, Any]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        k = max(s.seeds, 1)

        def hits(n: int, rate: float) -> np.ndarray:
            x = rng.random((1 if shared else k, n)) < rate
            return np.repeat(x, k, axis=0) if shared else x

        def extraction(x: np.ndarray) -> Extraction:
            return Extraction(x.size, x.mean(), x.mean(), tuple(x))

        train, test = hits(s.extraction_train, train_rate), hits(s.extraction_test, test_rate)
        return _over_seeds([judge_extraction(extraction(a), extraction(b), level=s.level)["excess"]
                            for a, b in zip(train, test, strict=True)])
    return draw


def _flags(sample_rate: float) -> Callable[..., dict[str, Any]]:
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        samples = rng.random(s.samples) < sample_rate
        kinds = np.array(["unconditional"] * (s.samples * 4 // 5)
                         + ["continuation"] * (s.samples - s.samples * 4 // 5))
        seeds = np.concatenate([np.arange(s.samples * 4 // 5),
                                np.arange(s.samples - s.samples * 4 // 5)]) % max(s.seeds, 1)
        human = rng.random(s.human_windows) < s.human_flag_rate
        pieces = np.arange(s.human_windows) % s.human_pieces
        return _over_seeds([judge_flag_rate(samples[seeds == k], kinds[seeds == k], human,
                                            pieces, n_boot=s.n_boot, level=s.level,
                                            rng=rng)["excess"]
                            for k in range(max(s.seeds, 1))])
    return draw


def _flags_times(factor: float) -> Callable[..., dict[str, Any]]:
    """Samples flagged at ``factor`` times the measured human rate."""
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, Any]:
        return _flags(min(1.0, factor * s.human_flag_rate))(rng, s)
    return draw


def _quality(p_outside: float | None, margin: bool) -> Callable[..., dict[str, float]]:
    """Each statistic outside its band with ``p_outside``, independently. None: human-like
    music, which the audit's bands, calibrated together, leave outside any of them in
    ``quality_alpha`` of draws; for independent statistics that is each at
    ``1 - (1 - quality_alpha)^(1/k)`` (correlated ones share their failures and the audit gives
    each more room, :func:`pipeline.music.descriptors.family_level`). The band's score is 1:
    a set passes with every statistic inside."""
    def draw(rng: np.random.Generator, s: Sizes) -> dict[str, float]:
        k = s.quality_stats
        p = 1 - (1 - s.quality_alpha) ** (1 / k) if p_outside is None else p_outside
        score = 1 - int((rng.random(k) < p).sum()) / k
        return {"value": score - 1.0 if margin else score}
    return draw


def _count(n: int) -> Callable[..., dict[str, float]]:
    return lambda rng, s: {"value": float(n)}


def _se(attr: str) -> Callable[[Sizes], float]:
    """The standard error that field ``attr`` of :class:`Sizes` holds."""
    return lambda s: float(getattr(s, attr))


def _gap_draw(truth: float, unit: str) -> Callable[..., dict[str, Any]]:
    """The gap per ``unit`` (``token`` or ``note``) at ``truth``, each seed's estimate with the
    pieces' shared noise and the seeds' own spread (:func:`_normal`)."""
    se_attr, sd_attr = GAP_SPREADS[unit]
    return _normal(truth, _se(se_attr), lambda s: getattr(s, sd_attr))


GAP_SPREADS = {"token": ("gap_se", "gap_seed_sd"),
               "note": ("gap_per_note_se", "gap_per_note_seed_sd")}
"""Unit -> the :class:`Sizes` fields of one seed's gap standard error and the seeds' spread."""


def _gap(unit: str) -> tuple[Control, ...]:
    """The generalisation gap per ``unit`` (token or note)."""
    return (
        good(f"a true gap of 0.2 nats per {unit} (held-out {unit}s e^0.2 = 1.22 times less "
             "likely)", _gap_draw(0.2, unit)),
        good("a true gap of 0: held-out pieces exactly as predictable as training pieces",
             _gap_draw(0.0, unit)),
        bad("a true gap of 1.0 (memorised training pieces)", _gap_draw(1.0, unit), "upper"),
        bad("a true gap of -0.5 (held-out pieces easier than training: held-out music leaked "
            "into training)", _gap_draw(-0.5, unit), "lower"),
    )


def _judged(m: str) -> dict[str, tuple[Control, ...]]:
    """The audit's judgements of model ``m`` (``audit.judged.<m>``)."""
    quality = {f"quality.{m}.{key}": (
        good("human-like: a statistic outside its band in quality_alpha of draws, as calibrated",
             _quality(None, margin=margin)),
        *(bad(f"each statistic outside its band with {p:.0%}", _quality(p, margin=margin))
          for p in (0.5, 0.6)),
    ) for key, margin in (("score", False), ("margin", True))}
    return {
        f"memorisation.{m}.membership_auc": (
            good("the AUC a per-note gap of 0.2 implies at the pieces' spread",
                 _membership_at_gap(0.2)),
            good("true AUC 0.5 (chance)", _membership(0.5)),
            bad("the AUC a per-note gap of 1.0 implies (memorised training pieces)",
                _membership_at_gap(1.0)),
        ),
        f"memorisation.{m}.extraction_excess": (
            good("never reproduces a continuation (0% on train and test)", _extraction(0.0, 0.0)),
            good("reproduces 1% of continuations, train and test alike",
                 _extraction(0.01, 0.01)),
            good("each seed reproduces its own 1% of continuations, train and test alike",
                 _extraction(0.01, 0.01, shared=False)),
            bad("reproduces 20% of training continuations, 0% of test ones",
                _extraction(0.2, 0.0)),
        ),
        f"memorisation.{m}.flag_excess": (
            good("samples flagged at the human rate", _flags_times(1.0)),
            bad("samples flagged at 3 times the human rate", _flags_times(3.0)),
            bad("30% of samples flagged", _flags(0.30)),
        ),
        **quality,
    }


CONTROLS: dict[str, tuple[Control, ...]] = {
    # a metric of reports/metrics.json (pipeline.decision.metrics.METRICS): its planted models,
    # each rule on that metric judged on every one whose side fits it
    "test.nll_per_note.rel_improvement": (
        good("a true gain of 6% per note", _gain(0.06)),
        bad("no gain over the n-gram (0%)", _gain(0.0)),
    ),
    "leakage.test_near_train": (
        good("no near copy", _count(0)),
        bad("one near copy", _count(1)),
    ),
    "generalisation.gap.transformer": _gap("token"),
    "generalisation.gap_per_note.transformer": _gap("note"),
    **{k: v for m in MODELS for k, v in _judged(m).items()},
}
"""Every metric with controls -> its good and bad models, in the order ``symkit controls``
lists them. A criterion on another metric is listed without a control."""


def controls_for(rule: Criterion) -> list[Control]:
    """The controls of ``rule``'s metric that are for its side."""
    return [c for c in CONTROLS.get(rule.metric, ()) if c.applies_to(rule)]


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
              sizes: Sizes) -> float:
    """Share of ``draws`` simulated experiments under ``control`` (one of the controls of
    ``rule``'s metric) in which ``rule`` PASSes; the draws are seeded by ``seed``, ``draws``,
    the metric, the case and the planted truth."""
    rng = np.random.default_rng([seed, draws, *rule.metric.encode(), *control.case.encode(),
                                 *control.truth.encode()])
    passed = 0
    for _ in range(draws):
        got = control.draw(rng, sizes)
        metrics: dict[str, Any] = {rule.metric: got["value"],
                                   **{f"{rule.metric}.{k}": got[k]
                                      for k in ("ci_low", "ci_high") if k in got}}
        if "seeds" in got and rule.metric not in judged_per_seed():
            raise ValueError(f"control {control.truth!r} draws every seed of {rule.metric}, "
                             "which the metric table does not judge per seed (no per_seed in "
                             "pipeline.decision.metrics.METRICS)")
        for seed, block in (got.get("seeds") or {}).items():
            metrics.update(seed_metrics(rule.metric, seed, block))
        passed += evaluate(rule, metrics, sizes.level).status == "PASS"
    return passed / draws


def rates(cfg: CriteriaConfig, sizes: Sizes, draws: int = 1000, seed: int = 0) -> list[Rate]:
    """The pass rate of every rule of ``cfg`` under every control of its metric, in rule order
    (rules on metrics without controls are left out)."""
    out = []
    for rule in cfg.rules:
        for c in controls_for(rule):
            out.append(Rate(rule.name, c.case, c.truth, pass_rate(rule, c, draws, seed, sizes),
                            draws))
    return out


# --- one good model, one bad model per failure, all rules together -----------------------------

@dataclass(frozen=True)
class Model:
    """A whole model, every metric's truth at once: what all rules together are judged on."""

    name: str
    truth: str
    draws: dict[str, Callable[[np.random.Generator, Sizes], dict[str, Any]]]


def _model(name: str, truth: str, *, gain: float = 0.06, gap: float = 0.2,
           extraction: tuple[float, float] = (0.0, 0.0), flags: float = 1.0,
           outside: float | None = None, near_copies: int = 0) -> Model:
    """A model from the rules' own rationales, with the named departures: ``gain`` over the
    n-gram, a per-note (and per-token) ``gap``, membership at the AUC that gap implies,
    ``extraction`` rates on train and test, samples flagged at ``flags`` times the human rate,
    each music statistic outside its band with ``outside`` (None: the calibrated
    ``quality_alpha``), ``near_copies`` test pieces near a train piece."""
    draws: dict[str, Callable[..., dict[str, Any]]] = {
        "test.nll_per_note.rel_improvement": _gain(gain),
        "leakage.test_near_train": _count(near_copies),
        "generalisation.gap.transformer": _gap_draw(gap, "token"),
        "generalisation.gap_per_note.transformer": _gap_draw(gap, "note"),
    }
    for m in MODELS:
        draws[f"memorisation.{m}.membership_auc"] = _membership_at_gap(gap)
        draws[f"memorisation.{m}.extraction_excess"] = _extraction(*extraction)
        draws[f"memorisation.{m}.flag_excess"] = _flags_times(flags)
        draws[f"quality.{m}.score"] = _quality(outside, margin=False)
        draws[f"quality.{m}.margin"] = _quality(outside, margin=True)
    return Model(name, truth, draws)


GOOD_MODEL = _model(
    "good", "a 6% gain over the n-gram, a per-note gap of 0.2 nats and the membership AUC it "
    "implies, samples flagged at the human rate, no continuation reproduced, human-like "
    "statistics, no test piece near a train piece")
"""The model every rule's rationale calls good, all at once."""
BAD_MODELS = (
    _model("no gain", "no gain over the n-gram; good otherwise", gain=0.0),
    _model("memorises", "memorised its training pieces: a per-note gap of 1.0, the membership "
           "AUC it implies, 20% of training continuations reproduced", gap=1.0,
           extraction=(0.2, 0.0)),
    _model("copies", "samples flagged at 3 times the human rate", flags=3.0),
    _model("leaks", "held-out music leaked into training: a gap of -0.5, one test piece near a "
           "train piece", gap=-0.5, near_copies=1),
    _model("noise", "each music statistic outside its band half the time", outside=0.5),
)
"""One bad model per failure the rules are there to catch; each must fail the rules together."""


def _draw_metrics(rules: list[Criterion], model: Model,
                  rngs: Mapping[str, np.random.Generator], sizes: Sizes) -> dict[str, Any]:
    """One simulated experiment's flat metrics: one draw per metric the rules name (two rules
    on one metric judge the same draw, as they judge the same run), each metric from its own
    generator in ``rngs``."""
    metrics: dict[str, Any] = {}
    for metric in sorted({r.metric for r in rules}):
        got = model.draws[metric](rngs[metric], sizes)
        metrics[metric] = got["value"]
        metrics.update({f"{metric}.{k}": got[k] for k in ("ci_low", "ci_high") if k in got})
        for seed, block in (got.get("seeds") or {}).items():
            metrics.update(seed_metrics(metric, seed, block))
    return metrics


def joint_rates(cfg: CriteriaConfig, model: Model, sizes: Sizes, draws: int,
                seed: int = 0) -> dict[str, Any]:
    """How often every rule of ``cfg`` passes ``model`` together (``all``), and each rule alone
    on the same draws. Rules on metrics the model does not simulate are left out (``left_out``).
    Metrics are drawn independently given the truth; a run whose gap and membership share
    pieces has correlated noise, which this leaves out.

    Each metric has its own generator, seeded by ``seed``, the model and the metric (not by
    ``draws`` or the sizes), so two designs are simulated on common random numbers: a metric
    whose sizes are the same in both is drawn the same in both, and the difference between
    their rates is what the sizes change, not simulation noise (:func:`within_corpus`); and
    more draws extend the same experiments."""
    rules = [r for r in cfg.rules if r.metric in model.draws]
    rngs = {m: np.random.default_rng([seed, *model.name.encode(), *m.encode()])
            for m in sorted({r.metric for r in rules})}
    passed = dict.fromkeys((r.name for r in rules), 0)
    together = 0
    for _ in range(draws):
        metrics = _draw_metrics(rules, model, rngs, sizes)
        verdicts = {r.name: evaluate(r, metrics, sizes.level).status == "PASS" for r in rules}
        together += all(verdicts.values())
        for name, ok in verdicts.items():
            passed[name] += ok
    return {"model": model.name, "truth": model.truth, "all": together / draws,
            "rules": {n: k / draws for n, k in passed.items()},
            "left_out": [r.name for r in cfg.rules if r.metric not in model.draws]}


def joint_block(cfg: CriteriaConfig, sizes: Sizes, draws: int, seed: int = 0) -> dict[str, Any]:
    """The good model's and every bad model's joint pass rate at ``sizes``, against the
    standard (good at least :data:`GOOD_AT_LEAST`, each bad at most :data:`BAD_AT_MOST`)."""
    good_ = joint_rates(cfg, GOOD_MODEL, sizes, draws, seed)
    bads = [joint_rates(cfg, m, sizes, draws, seed) for m in BAD_MODELS]
    judged = bool(good_["rules"])  # no rule on a simulated metric: nothing to judge together
    return {"good": good_, "bad": bads,
            "meets_standard": not judged or (good_["all"] >= GOOD_AT_LEAST
                                             and all(b["all"] <= BAD_AT_MOST for b in bads))}


FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
"""Multiples of the held-out and audited counts :func:`size_for_standard` tries."""
SAMPLE_FACTORS = (1.0, 2.0, 4.0, 8.0, 16.0)
"""Multiples of the generated samples :func:`within_corpus` tries (``generate.n_samples``)."""


def _design(rate: dict[str, Any], bigger: Sizes, factor: float, seeds: int,
            samples: float) -> dict[str, Any]:
    return {"factor": factor, "seeds": seeds, "samples_factor": samples,
            "good_all": rate["all"], "rules": rate["rules"],
            "test_groups_se": bigger.gain_se_groups, "samples": bigger.samples,
            "held_out_pieces": bigger.membership_test, "test_pieces": bigger.extraction_test,
            "human_pieces": bigger.human_pieces}


def size_for_standard(cfg: CriteriaConfig, sizes: Sizes, draws: int, seed: int = 0
                      ) -> dict[str, Any] | None:
    """The smallest design, among the held-out and audited counts (samples with them) times
    :data:`FACTORS` and the seeds as they are or doubled, at which the good model passes all
    rules together at least :data:`GOOD_AT_LEAST` of the time (fewest pieces first, then fewest
    seeds); None when none does. The factor is found by bisection, which takes the joint rate to
    grow with the pieces (every interval narrows); its ``rules`` are each rule's own rate
    there."""
    best = None
    for seeds in sorted({sizes.seeds, 2 * sizes.seeds}):
        cache: dict[int, dict[str, Any]] = {}

        def at(i: int, seeds: int = seeds, cache: dict = cache) -> dict[str, Any]:
            if i not in cache:
                cache[i] = joint_rates(cfg, GOOD_MODEL, sizes.scaled(FACTORS[i], seeds),
                                       draws, seed)
            return cache[i]

        lo, hi = 0, len(FACTORS) - 1
        if at(hi)["all"] < GOOD_AT_LEAST:
            continue
        while lo < hi:  # the first factor whose joint rate meets the standard
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if at(mid)["all"] >= GOOD_AT_LEAST else (mid + 1, hi)
        if best is None or FACTORS[lo] < best["factor"]:
            best = _design(at(lo), sizes.scaled(FACTORS[lo], seeds), FACTORS[lo], seeds,
                           FACTORS[lo])
    return best


def within_corpus(cfg: CriteriaConfig, sizes: Sizes, draws: int, seed: int = 0
                  ) -> dict[str, Any]:
    """What the recipe can do with the pieces as they are: the generated samples times
    :data:`SAMPLE_FACTORS` and the seeds as they are or doubled. The first design (fewest
    seeds, then fewest samples) at which the good model passes all rules together at least
    :data:`GOOD_AT_LEAST` of the time (``meets_standard``), else the one with the highest joint
    rate; ``limited_by``: the rules that pass it alone less than that there."""
    tried = []
    for seeds in sorted({sizes.seeds, 2 * sizes.seeds}):
        for k in SAMPLE_FACTORS:
            bigger = sizes.scaled(1.0, seeds, k)
            rate = joint_rates(cfg, GOOD_MODEL, bigger, draws, seed)
            tried.append(_design(rate, bigger, 1.0, seeds, k))
            if rate["all"] >= GOOD_AT_LEAST:
                return {**tried[-1], "draws": draws, "meets_standard": True, "limited_by": []}
    top = max(tried, key=lambda d: d["good_all"])  # the first of the highest
    return {**top, "draws": draws, "meets_standard": False,
            "limited_by": sorted(n for n, v in top["rules"].items() if v < GOOD_AT_LEAST)}


# --- sizes of a registered design and of a run -------------------------------------------------

SE_OF = {"test.nll_per_note.rel_improvement": "gain_se",
         "val.nll_per_note.rel_improvement": "gain_se",
         "generalisation.gap.transformer": "gap_se",
         "generalisation.gap_per_note.transformer": "gap_per_note_se"}
"""Metrics simulated as normal estimates, and the :class:`Sizes` field holding their standard
error: for these the smallest effect resolved has a closed form (:func:`resolved_effect`)."""


def _defaults(params: Mapping[str, Any]) -> tuple[dict, dict, dict, int]:
    # the stages' own defaults for keys a params file leaves out (library code may not import
    # the stage modules; tests/decision/test_criteria_controls.py checks that a bare params file
    # gives the sizes of params.yaml, whose values tests/test_params.py holds equal to the
    # stages' defaults)
    audit = {"membership_pieces": 256, "extraction_pieces": 256, "quality_alpha": 0.05,
             "flag_quantile": 0.95, **(params.get("audit") or {})}
    gen = {"n_samples": 4096, "n_continuations": 16, **(params.get("generate") or {})}
    evaluate = {"train_pieces": 256, "ci_level": 0.95, **(params.get("evaluate") or {})}
    seeds = int((params.get("transformer") or {}).get("replicates", 12))
    return audit, gen, evaluate, seeds


def design_sizes(params: Mapping[str, Any], counts: Mapping[str, tuple[int, int]],
                 spreads: Spreads, windows_per_piece: float) -> Sizes:
    """The :class:`Sizes` of a registered design: ``counts`` maps each split to its (pieces,
    groups); the audit's and generate's params give the audited counts; ``spreads`` come from
    the val pilot (:func:`pipeline.decision.spreads.from_pilot`); ``windows_per_piece``: the
    audit's human windows per held-out piece, from val's pieces."""
    audit, gen, evaluate, seeds = _defaults(params)
    train_n, train_g = counts.get("train", (0, 0))
    val_n, val_g = counts.get("val", (0, 0))
    test_n, _ = counts.get("test", (0, 0))
    test_g = counts.get("test", (0, 0))[1]
    mem_train = min(int(audit["membership_pieces"]), train_n)
    held = min(int(audit["membership_pieces"]), val_n + test_n)
    return Sizes(
        spreads=spreads, seeds=seeds,
        membership_train=mem_train, membership_test=held,
        membership_train_groups=max(1, round(mem_train / max(train_n, 1) * train_g)),
        membership_test_groups=max(1, round(held / max(val_n + test_n, 1) * (val_g + test_g))),
        extraction_train=min(int(audit["extraction_pieces"]), train_n),
        extraction_test=min(int(audit["extraction_pieces"]), test_n),
        samples=int(gen["n_samples"]) + min(int(gen["n_continuations"]), test_n),
        human_windows=max(1, round(windows_per_piece * test_n)), human_pieces=max(1, test_n),
        level=float(evaluate["ci_level"]), quality_alpha=float(audit["quality_alpha"]))


def run_sizes(params: Mapping[str, Any], audit_report: Mapping[str, Any], spreads: Spreads
              ) -> Sizes:
    """The :class:`Sizes` a run measured: its audit's counts (``judged.transformer``), the
    seeds trained, and its spreads (:func:`pipeline.decision.spreads.from_run`)."""
    audit, gen, evaluate, seeds = _defaults(params)
    judged = ((audit_report.get("judged") or {}).get("transformer") or {})
    mem = judged.get("membership_auc") or {}
    human = ((judged.get("flag_rate") or {}).get("human") or {})
    ext = judged.get("extraction_rate") or {}
    return Sizes(
        spreads=spreads, seeds=max(1, len(judged.get("seeds") or []) or seeds),
        membership_train=int(mem.get("n_train") or 1), membership_test=int(mem.get("n_heldout")
                                                                         or 1),
        membership_train_groups=int(mem.get("n_train_groups") or 1),
        membership_test_groups=int(mem.get("n_heldout_groups") or 1),
        extraction_train=int((ext.get("train") or {}).get("n") or audit["extraction_pieces"]),
        extraction_test=int((ext.get("test") or {}).get("n") or 1),
        samples=int((judged.get("flag_rate") or {}).get("n") or gen["n_samples"]),
        human_windows=int(human.get("n_windows") or 1), human_pieces=int(human.get("n_pieces")
                                                                         or 1),
        level=float(evaluate["ci_level"]), quality_alpha=float(audit["quality_alpha"]))


def per_seed_quantile(p: float, se: float, seed_sd: float | None, k: int) -> float:
    """The ``p`` quantile of the largest of ``k`` seeds' errors when each is the pieces' shared
    error (normal, ``se``) plus the seed's own (normal, ``seed_sd``); with ``seed_sd`` None the
    seeds' errors are independent normals with ``se`` (``Φ⁻¹(p^(1/k)) · se``). The smallest's
    ``p`` quantile is minus the largest's ``1 - p``."""
    if seed_sd is None:
        return NormalDist().inv_cdf(p ** (1 / max(k, 1))) * se
    grid = np.linspace(-8.0, 8.0, 1601)
    weight = stats.norm.pdf(grid)
    weight /= weight.sum()

    def cdf(x: float) -> float:  # P(shared + max of k seeds' own <= x)
        if seed_sd == 0:
            return float(stats.norm.cdf(x / se)) if se > 0 else float(x >= 0)
        return float(weight @ stats.norm.cdf((x - se * grid) / seed_sd) ** k)

    span = 10.0 * (se + seed_sd)
    return float(optimize.brentq(lambda x: cdf(x) - p, -span, span, xtol=1e-10))


def resolved_effect(rule: Criterion, sizes: Sizes, power: float = 0.8) -> float | None:
    """For a rule on a normally simulated metric (:data:`SE_OF`), the true value at which it
    reaches its verdict with probability ``power``: the smallest true gain an ``interval`` rule
    ``>= t`` passes (:func:`pipeline.stats.power.gain_at_power`, the project's one power
    statement), the largest true value an ``interval`` rule ``<= t`` passes, and for a
    ``refute`` rule the value beyond which it FAILs (``t`` minus the margin for ``>=``). None for
    other metrics and judges (their pass rates are in :func:`rates`).

    A metric judged per seed reaches a PASS when every seed does and a FAIL when any seed does,
    with the seeds' errors as the controls draw them (:func:`per_seed_quantile`): the pieces'
    error shared and each seed's own, or, without a measured seeds' spread, each seed's whole
    error independent (each seed must then pass with ``power ** (1 / seeds)``, or fail with
    ``1 - (1 - power) ** (1 / seeds)``)."""
    attr = SE_OF.get(rule.metric)
    if attr is None or rule.judge not in ("interval", "refute"):
        return None
    above = rule.op in (">", ">=")
    if attr == "gain_se" and rule.judge == "interval" and above:
        return gain_at_power(rule.threshold, sizes.gain_se_groups, sizes.gain_seed_sd,
                             sizes.seeds, sizes.level, power)
    se = getattr(sizes, attr)
    half = (sizes.gain_half_width if attr == "gain_se"
            else NormalDist().inv_cdf(0.5 + sizes.level / 2) * se)
    per_seed = rule.metric in judged_per_seed()
    k = max(sizes.seeds, 1) if per_seed else 1
    seed_sd = getattr(sizes, SEED_SD_OF[attr]) if per_seed and attr in SEED_SD_OF else None

    def largest(p: float) -> float:
        return per_seed_quantile(p, se, seed_sd, k)

    t = rule.threshold
    if rule.judge == "interval":
        return t + half + largest(power) if above else t - half - largest(power)
    return t - half + largest(1 - power) if above else t + half - largest(1 - power)


SEED_SD_OF = {"gap_se": "gap_seed_sd", "gap_per_note_se": "gap_per_note_seed_sd"}
"""A per-seed metric's standard-error field -> the field of the seeds' own spread."""


def _resolves(rule: Criterion) -> str:
    """What :func:`resolved_effect` is, in words, for this rule."""
    above = rule.op in (">", ">=")
    if rule.judge == "refute":
        return f"fails a true value {'below' if above else 'above'}"
    return f"passes only a true value {'of at least' if above else 'of at most'}"


SIMULATION = ("pipeline/decision/criteria_controls.py: each rule judged by its own code on "
              "simulated evidence, seeded by (seed, draws, metric, case, truth); the good and "
              "bad models of GOOD_MODEL and BAD_MODELS judged by all rules together")
"""Where the figures come from, so anyone can re-run them (``symkit controls``)."""


def power_block(cfg: CriteriaConfig, sizes: Sizes, draws: int, seed: int = 0,
                search: bool = True) -> dict[str, Any]:
    """The power statement: the sizes and the spreads (with where each was measured), each
    rule's control pass rates, where closed-form the effect it resolves at 80% power, the good
    and bad models' joint pass rates, and (``search``, when the good model misses 80%) what the
    recipe reaches with the pieces as they are (:func:`within_corpus`) and, when that misses
    too, the smallest larger design at which the good model passes all rules together at 80%
    (:func:`size_for_standard`)."""
    found = rates(cfg, sizes, draws=draws, seed=seed)
    rules = []
    for rule in cfg.rules:
        mine = [r for r in found if r.rule == rule.name]
        effect = resolved_effect(rule, sizes)
        rules.append({
            "name": rule.name, "metric": rule.metric,
            "controls": [{"case": r.case, "truth": r.truth, "pass_rate": r.pass_rate,
                          "meets_standard": r.meets_standard} for r in mine],
            "resolved_at_80_percent": effect, "resolves": _resolves(rule)})
    joint = joint_block(cfg, sizes, draws, seed)
    out = {"draws": draws, "seed": seed, "simulation": SIMULATION,
           "standard": {"good_at_least": GOOD_AT_LEAST, "bad_at_most": BAD_AT_MOST},
           "spreads": sizes.spreads.to_dict(),
           "sizes": {f.name: getattr(sizes, f.name) for f in fields(sizes)
                     if f.name != "spreads"},
           "rules": rules, "joint": joint}
    if search and joint["good"]["all"] < GOOD_AT_LEAST:
        # on the first quarter of the joint's draws (minutes, not an hour, for the doubled
        # seeds): common random numbers make the designs differ by what their sizes change,
        # not by simulation noise, though each rate is as uncertain as its draws (±4 points
        # at 100)
        few = max(draws // 4, 50)
        out["within_corpus"] = within_corpus(cfg, sizes, few, seed)
        out["size_for_standard"] = (None if out["within_corpus"]["meets_standard"]
                                    else size_for_standard(cfg, sizes, few, seed))
    elif search:
        out["size_for_standard"] = None
    return out


def power_lines(block: Mapping[str, Any]) -> list[str]:
    """One sentence per rule of a :func:`power_block`, then the joint rates: for the
    preregister output and the report."""
    out = []
    for r in block.get("rules") or []:
        parts = [f"{c['case']} ({c['truth']}) passes {c['pass_rate']:.0%}"
                 + ("" if c["meets_standard"] else " [misses the standard]")
                 for c in r.get("controls") or []]
        effect = r.get("resolved_at_80_percent")
        if effect is not None:
            parts.append(f"with 80% probability it {r['resolves']} {effect:.3g}")
        out.append(f"{r['name']}: " + ("; ".join(parts) if parts else "no control for its metric"))
    joint = block.get("joint")
    if joint:
        g = joint["good"]
        out.append(f"all rules together: the good model ({g['truth']}) passes {g['all']:.0%}"
                   + ("" if g["all"] >= GOOD_AT_LEAST else " [misses the standard]") + "; "
                   + "; ".join(f"{b['model']} passes {b['all']:.0%}"
                               + ("" if b["all"] <= BAD_AT_MOST else " [misses the standard]")
                               for b in joint["bad"]))
    out += size_lines(block)
    return out


def size_lines(block: Mapping[str, Any]) -> list[str]:
    """What a :func:`power_block` found when the good model misses the standard: what the
    recipe reaches with the pieces as they are, and the smallest larger design that would."""
    out = []
    within = block.get("within_corpus")
    sizes = block.get("sizes") or {}
    if within:
        design = (f"{within['samples']} samples ({within['samples_factor']:g} times) and "
                  f"{within['seeds']} seeds")
        draws = within.get("draws")  # recorded from amendment 2 on
        if within["meets_standard"]:
            out.append(f"with these pieces the good model passes all rules together at 80% "
                       f"given {design} ({within['good_all']:.0%} of "
                       f"{f'{draws} draws' if draws else 'the draws'})")
        else:
            limits = (", ".join(f"{n} {within['rules'][n]:.0%}" for n in within["limited_by"])
                      or "no rule alone (each passes it at least 80% of the time; their "
                         "misses add up)")
            out.append(f"with these pieces no recipe tried reaches 80%"
                       f"{f' ({draws} draws)' if draws else ''}: at best {design} pass the "
                       f"good model {within['good_all']:.0%} of the time, held back by {limits}")
    good = ((block.get("joint") or {}).get("good") or {}).get("all")
    good_misses = good is None or good < GOOD_AT_LEAST  # a bad model missing needs no size
    if "size_for_standard" in block and good_misses and (not within
                                                         or not within["meets_standard"]):
        size = block["size_for_standard"]
        test = sizes.get("extraction_test")
        out.append("the good model passes all rules together at 80% only at a larger design: "
                   + (f"{size['factor']:g} times the held-out and audited pieces ("
                      f"{size['test_pieces']} test pieces"
                      + (f" where there are {test}" if test else "")
                      + f", {size['held_out_pieces']} held-out, {size['samples']} samples) "
                      f"with {size['seeds']} seeds ({size['good_all']:.0%})" if size else
                      f"none up to {FACTORS[-1]:g} times the pieces and twice the seeds"))
    return out

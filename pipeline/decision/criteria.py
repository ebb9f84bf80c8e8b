"""Decision criteria: parsed from params.yaml, checked against ``reports/metrics.json``.

A criterion names a metric by its dotted key in ``reports/metrics.json``, a comparison and a
threshold, optionally a confidence-interval requirement, and why it is there::

    - name: transformer_beats_ngram
      metric: test.nll_per_note.rel_improvement
      op: ">="
      threshold: 0.02
      ci: lower>0                       # the CI of ci_metric must lie above 0
      ci_metric: test.nll_per_note.diff # reads <ci_metric>.ci_low / <ci_metric>.ci_high
      rationale: ...

A rule with ``judge: refute`` is a guard that the data must *contradict* to fail: FAIL when no
value in the metric's interval meets the rule, PASS otherwise (e.g. "the gap is not negative"
fails only when the whole interval lies below 0, so a model with a true gap of 0 passes at the
interval's coverage, not at its tail). A rule with ``judge: interval`` compares the metric's
whole interval (``<metric>.ci_low`` and
``.ci_high``) with the threshold: PASS when the whole interval meets it (for ``>=``, the lower
bound), FAIL when no value in it does, INCONCLUSIVE when it straddles the threshold. An interval
of zero width (a resampling that saw no variation: no events, perfect separation) cannot show a
rule is met, so it never PASSes (INCONCLUSIVE); its single value on the failing side still
FAILs, since that value is the failure itself (every continuation copied, every piece told
apart). A rule with
``judge: point`` (the default) compares the point value, then checks the optional ``ci`` sign
requirement. A missing metric or interval is INCONCLUSIVE. Each verdict carries one plain sentence
of evidence. Overall: FAIL if any criterion fails, PASS if all pass, otherwise INCONCLUSIVE.

A guard must hold for every training seed: a rule on a metric the metric table judges per seed
(:func:`pipeline.decision.metrics.judged_per_seed`: membership, the generalisation gap, copying,
extraction), whose metrics hold each seed's own block, is judged on each seed's block with the
rule's own judge. It FAILs when any seed fails, PASSes only when every seed passes, and is
INCONCLUSIVE otherwise; its value and interval are the deciding seed's (the first failing one,
else the one nearest to failing). Judging the seeds' mean instead, its interval widened by the
seeds' spread, would let more disagreement between seeds make a FAIL *less* likely. Without
seed blocks (a model trained once, older reports) the rule is judged on the metric itself.

The metrics a rule may name, and how ``reports/metrics.json`` is built from the stage reports,
are in :mod:`pipeline.decision.metrics` (its table :data:`~pipeline.decision.metrics.METRICS`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.core.config import StageConfig
from pipeline.decision.metrics import number, seed_blocks

Op = Literal["<", "<=", ">", ">=", "=="]
CiRule = Literal["lower>0", "upper<0", "excludes_zero"]

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq}


class Criterion(StageConfig):
    """One pre-registered decision rule (its keys are documented in params.yaml's ``criteria``
    comment)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    metric: str = Field(min_length=1)
    op: Op
    threshold: float
    judge: Literal["point", "interval", "refute"] = "point"
    ci: CiRule | None = None
    ci_metric: str | None = None
    rationale: str = Field(min_length=1)

    @model_validator(mode="after")
    def _interval_needs_an_order(self) -> Criterion:
        if self.judge != "point" and self.op == "==":
            raise ValueError(f"judge: {self.judge} needs op <, <=, > or >= (an interval cannot "
                             "equal a threshold)")
        if self.judge != "point" and self.ci is not None:
            raise ValueError(f"judge: {self.judge} already judges the metric's own interval; "
                             "drop ci and ci_metric")
        return self

    @model_validator(mode="after")
    def _ci_metric_needs_ci(self) -> Criterion:
        if self.ci_metric is not None and self.ci is None:
            raise ValueError(f"ci_metric: {self.ci_metric!r} is set but ci is not; "
                             "set ci to lower>0, upper<0 or excludes_zero, or drop ci_metric")
        return self


class CriteriaConfig(StageConfig):
    """``criteria`` section of params.yaml: the decision rules (documented there). Every rule
    must PASS for an overall PASS."""

    SECTION: ClassVar[str] = "criteria"

    rules: list[Criterion] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> CriteriaConfig:
        unique_rule_names(self.rules)
        return self


def unique_rule_names(rules: list[Any]) -> None:
    """ValueError naming the first rule name used twice (criteria and comparison rules)."""
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"rules: name {dupes[0]!r} is used twice; names must be unique")


# --- verdicts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedVerdict:
    """One training seed's verdict on a rule judged per seed."""

    seed: str
    status: Literal["PASS", "FAIL", "INCONCLUSIVE"]
    value: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class Verdict:
    name: str
    status: Literal["PASS", "FAIL", "INCONCLUSIVE"]
    metric: str
    value: float | None
    op: str
    threshold: float
    ci_metric: str
    """Whose interval ``ci_low``/``ci_high`` are (the rule's ``ci_metric`` or ``metric``)."""
    ci_low: float | None
    ci_high: float | None
    evidence: str
    """One plain sentence: the value, its interval when used, and why that gives ``status``."""
    judge: str = "point"
    """The rule's ``judge`` (point, interval or refute)."""
    seeds: tuple[SeedVerdict, ...] = ()
    """Judged per training seed: every seed's verdict, in seed order (empty otherwise)."""
    seed: str | None = None
    """Judged per training seed: the seed whose value and interval the verdict carries."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def evaluate(rule: Criterion, metrics: Mapping[str, Any], ci_level: float = 0.95) -> Verdict:
    """Judge one rule against flat metrics (never raises on missing or non-numeric values).

    ``judge: point`` compares the value with the threshold (then checks ``ci`` if set);
    ``judge: interval`` compares the metric's whole interval with it: PASS when every value in the
    interval meets the rule, FAIL when none does, INCONCLUSIVE when it straddles the threshold.
    A rule on a metric judged per seed, with seed blocks in ``metrics``, is judged on each seed
    (:func:`evaluate_per_seed`).
    """
    seeds = seed_blocks(metrics, rule.metric)
    if seeds:
        return evaluate_per_seed(rule, metrics, seeds, ci_level)
    return _evaluate(rule, metrics, ci_level)


_RANK = {"PASS": 0, "INCONCLUSIVE": 1, "FAIL": 2}


def _toward_failure(rule: Criterion, v: Verdict) -> float:
    """How near ``v`` (one seed's verdict) is to failing ``rule``, larger nearer: the bound a
    FAIL is read from (an interval rule's, a refute rule's) or the value (a point rule); -inf
    when missing."""
    upper = rule.op in ("<", "<=")
    x = v.value if rule.judge == "point" else (v.ci_low if upper else v.ci_high)
    if x is None:
        return -math.inf
    return x if upper or rule.op == "==" else -x


def evaluate_per_seed(rule: Criterion, metrics: Mapping[str, Any],
                      seeds: Mapping[str, Mapping[str, Any]], ci_level: float = 0.95) -> Verdict:
    """Judge ``rule`` on every training seed's block of its metric (``seeds``: seed -> its
    ``value``/``ci_low``/``ci_high``, as :func:`pipeline.decision.metrics.seed_blocks` gives
    them), each with the rule's own judge: FAIL when any seed fails, PASS when every seed
    passes, INCONCLUSIVE otherwise. A guard must hold for every seed, so more disagreement
    between seeds can only add FAILs. The verdict's value and interval are the deciding seed's:
    the first failing seed, else the one nearest to failing; the evidence names every seed's
    value, interval and verdict. A ``ci_metric`` judged per seed is read seed by seed too."""
    ci_key = rule.ci_metric or rule.metric
    by_key = {rule.metric: seeds}
    if ci_key != rule.metric and seed_blocks(metrics, ci_key):
        by_key[ci_key] = seed_blocks(metrics, ci_key)  # else its one interval serves every seed
    own: list[tuple[str, Verdict]] = []
    for seed in seeds:
        view = dict(metrics)
        for key, blocks in by_key.items():
            mine = blocks.get(seed) or {}
            for suffix, part in (("", "value"), (".ci_low", "ci_low"), (".ci_high", "ci_high")):
                view[key + suffix] = mine.get(part)
        own.append((seed, _evaluate(rule, view, ci_level)))
    statuses = [v.status for _, v in own]
    status = ("FAIL" if "FAIL" in statuses
              else "PASS" if set(statuses) == {"PASS"} else "INCONCLUSIVE")
    if status == "FAIL":
        seed, decider = next((s, v) for s, v in own if v.status == "FAIL")
    else:
        seed, decider = max(own, key=lambda x: (_RANK[x[1].status],
                                                 _toward_failure(rule, x[1])))
    listed = ", ".join(f"seed {s} {_fmt(v.value)} ({_fmt(v.ci_low)} to {_fmt(v.ci_high)}) "
                       f"{v.status}" for s, v in own)
    why = {"FAIL": f"seed {seed} fails, so the rule fails",
           "PASS": "every seed passes, so the rule passes",
           "INCONCLUSIVE": f"no seed fails, but seed {seed} does not pass, so the data cannot "
                           "tell"}[status]
    evidence = (f"{rule.metric} judged on each of {len(own)} training seeds alone, every one of "
                f"which must meet {rule.op} {_fmt(rule.threshold)} ({ci_level:.0%} CI): "
                f"{listed}; {why}.")
    return Verdict(rule.name, status, rule.metric, decider.value, rule.op, rule.threshold,
                   decider.ci_metric, decider.ci_low, decider.ci_high, evidence, rule.judge,
                   tuple(SeedVerdict(s, v.status, v.value, v.ci_low, v.ci_high) for s, v in own),
                   seed)


def _evaluate(rule: Criterion, metrics: Mapping[str, Any], ci_level: float) -> Verdict:
    """:func:`evaluate` on the metric itself (no seed blocks)."""
    value = number(metrics.get(rule.metric))
    ci_key = rule.ci_metric or rule.metric
    lo, hi = number(metrics.get(f"{ci_key}.ci_low")), number(metrics.get(f"{ci_key}.ci_high"))
    level = f"{ci_level:.0%} CI"

    def verdict(status: Any, evidence: str) -> Verdict:
        return Verdict(rule.name, status, rule.metric, value, rule.op, rule.threshold, ci_key,
                       lo, hi, evidence, rule.judge)

    if value is None:
        raw = metrics.get(rule.metric)
        why = "is not available" if raw is None else f"is not a number ({raw!r})"
        return verdict("INCONCLUSIVE", f"{rule.metric} {why}, so the rule cannot be judged.")
    rule_text = f"{rule.op} {_fmt(rule.threshold)}"
    meets = _OPS[rule.op]
    if rule.judge == "refute":
        if lo is None or hi is None:
            return verdict("INCONCLUSIVE", f"{rule.metric} is {_fmt(value)}, but its interval is "
                                           "not available, and this rule judges the interval.")
        said = f"{rule.metric} is {_fmt(value)} ({level} {_fmt(lo)} to {_fmt(hi)})"
        best = lo if rule.op in ("<", "<=") else hi
        if not meets(best, rule.threshold):
            return verdict("FAIL", f"{said}: no value in the interval meets {rule_text}, so the "
                                   "data refute the rule.")
        return verdict("PASS", f"{said}: values in the interval meet {rule_text}, so the data "
                               "do not refute the rule.")
    if rule.judge == "interval":
        if lo is None or hi is None:
            return verdict("INCONCLUSIVE", f"{rule.metric} is {_fmt(value)}, but its interval is "
                                           "not available, and this rule judges the interval.")
        said = f"{rule.metric} is {_fmt(value)} ({level} {_fmt(lo)} to {_fmt(hi)})"
        upper_side = rule.op in ("<", "<=")
        best, worst = (lo, hi) if upper_side else (hi, lo)
        if lo == hi and meets(worst, rule.threshold):
            return verdict("INCONCLUSIVE", f"{said}: an interval of zero width means the "
                                           "resampling saw no variation (e.g. no events at "
                                           "all), a certainty a finite sample cannot give, so "
                                           "it cannot show the rule is met.")
        if meets(worst, rule.threshold):
            return verdict("PASS", f"{said}: the whole interval meets {rule_text}.")
        if not meets(best, rule.threshold):
            return verdict("FAIL", f"{said}: no value in the interval meets {rule_text}.")
        return verdict("INCONCLUSIVE", f"{said}: the interval straddles {_fmt(rule.threshold)}, "
                                       "so the data cannot tell.")
    said = f"{rule.metric} is {_fmt(value)}"
    if not meets(value, rule.threshold):
        return verdict("FAIL", f"{said}, which fails {rule_text}.")
    if rule.ci is None:
        return verdict("PASS", f"{said}, which meets {rule_text}.")
    if lo is None or hi is None:
        return verdict("INCONCLUSIVE", f"{said}, which meets {rule_text}, but the interval of "
                                       f"{ci_key} is not available.")
    ci = f"the {level} of {ci_key} ({_fmt(lo)} to {_fmt(hi)})"
    above, below = lo > 0, hi < 0
    wanted = {"lower>0": above, "upper<0": below, "excludes_zero": above or below}[rule.ci]
    if wanted:
        side = "above" if above else "below"
        return verdict("PASS", f"{said}, which meets {rule_text}, and {ci} lies {side} 0.")
    if (rule.ci == "lower>0" and below) or (rule.ci == "upper<0" and above):
        return verdict("FAIL", f"{said}, which meets {rule_text}, but {ci} lies on the wrong "
                               "side of 0.")
    return verdict("INCONCLUSIVE", f"{said}, which meets {rule_text}, but {ci} includes 0.")


def evaluate_all(cfg: CriteriaConfig, metrics: Mapping[str, Any],
                 ci_level: float = 0.95) -> list[Verdict]:
    return [evaluate(r, metrics, ci_level) for r in cfg.rules]


def overall(verdicts: list[Verdict]) -> str:
    """FAIL if any rule fails, PASS if all pass, otherwise INCONCLUSIVE."""
    statuses = {v.status for v in verdicts}
    if "FAIL" in statuses:
        return "FAIL"
    return "PASS" if statuses == {"PASS"} else "INCONCLUSIVE"


def rules_as_dicts(cfg: CriteriaConfig) -> list[dict[str, Any]]:
    """Plain, JSON-able form of the rules (what pre-registration freezes)."""
    return [r.model_dump(mode="json") for r in cfg.rules]

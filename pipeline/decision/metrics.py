"""The flat metrics of ``reports/metrics.json``, and the one table that declares their names.

``reports/metrics.json`` holds every stage report flattened under its stem
(``eval.models.ngram.test.nats_per_note.value``, ``audit.flag_rate.samples``, ...) plus the
canonical keys that criteria name. Each canonical key is one :class:`Metric` of :data:`METRICS`:
where its value comes from (the first present flattened stage-report key of its ``source``, or a
``derive`` function of the metrics before it), and, when it has a ``label``, its row in the
report's metrics table. From that table alone come the metric's key in metrics.json
(:func:`build_metrics`), the aliases criteria are judged through (:func:`metric_aliases`) and
the report's metrics table (:func:`labelled`). Add a metric that evaluate or audit already
writes by adding its entry here (CONTRIBUTING.md, "How to add a metric").

A guard that must hold for every training seed (membership, the generalisation gap, copying,
extraction) also names, in ``per_seed``, where one seed's own block is: ``build_metrics`` then
writes each seed's block beside the metric as ``<key>.seed.<seed>`` (with ``.ci_low`` and
``.ci_high``), and the criteria judge a rule on that metric on every seed
(:func:`pipeline.decision.criteria.evaluate`). That field is the one place declaring which
metrics are judged per seed (:func:`seed_blocks` reads only those).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MODELS = ("ngram", "transformer")
"""The models the audit judges one by one (``audit.judged.<model>``)."""


@dataclass(frozen=True)
class Metric:
    """One canonical key of ``reports/metrics.json``.

    ``source`` names flattened stage-report keys (``<report stem>.<path>``), tried in order: the
    first present and not null gives the value. With ``interval``, each source names a block
    holding ``value``, ``ci_low`` and ``ci_high``: the metric is the block's ``value`` and
    ``<key>.ci_low``/``<key>.ci_high`` its interval. ``derive`` computes the value from the
    metrics already filled (every source first, then the derived metrics in table order), when
    no source gives a number; it returns None when it cannot.
    """

    key: str
    source: str | tuple[str, ...] = ()
    interval: bool = False
    derive: Callable[[Mapping[str, Any]], float | None] | None = None
    label: str | None = None
    """Its row in the report's metrics table, in table order (None: not shown there)."""
    unit: str = ""
    """Said after the label, in parentheses ("" where the label or the row above says it)."""
    digits: int | None = None
    """Significant digits in the metrics table (None: ``report.digits``)."""
    per_seed: str | None = None
    """For a guard every training seed must meet: the flattened stage-report key of one seed's
    own block (``value``, ``ci_low``, ``ci_high``), ``{seed}`` standing for the seed, e.g.
    ``audit.judged.transformer.per_seed.{seed}.membership_auc``. A metric with it is judged
    seed by seed wherever its stage report has such blocks (a model trained over several
    seeds), and on the value above otherwise (None: always on that value)."""

    def __post_init__(self) -> None:
        if self.per_seed is not None and (not self.interval or "{seed}" not in self.per_seed):
            raise ValueError(f"metric {self.key!r}: per_seed needs interval=True and a pattern "
                             f"with {{seed}} in it, got {self.per_seed!r}")

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,) if isinstance(self.source, str) else self.source

    @property
    def row_label(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else str(self.label)


def number(v: Any) -> float | None:
    """``v`` as a finite float; None for a bool, a non-number or a non-finite value."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _diff(m: Mapping[str, Any]) -> float | None:
    # without eval's paired block: the difference of the two models' means
    tr = number(m.get("test.nll_per_note.transformer"))
    ng = number(m.get("test.nll_per_note.ngram"))
    return ng - tr if tr is not None and ng is not None else None


def _rel_improvement(m: Mapping[str, Any]) -> float | None:
    # no interval: dividing the difference's interval by a point value would not be one
    diff, ng = number(m.get("test.nll_per_note.diff")), number(m.get("test.nll_per_note.ngram"))
    return diff / ng if diff is not None and ng else None


def _margin(model: str) -> Callable[[Mapping[str, Any]], float | None]:
    """The quality score against its calibrated band: ``score - score_band_low``."""
    def derive(m: Mapping[str, Any]) -> float | None:
        score = number(m.get(f"quality.{model}.score"))
        band = number(m.get(f"quality.{model}.score_band_low"))
        return score - band if score is not None and band is not None else None
    return derive


def _judged(model: str) -> tuple[Metric, ...]:
    """Per-model audit judgements (audit.json ``judged.<model>``), each with its interval; the
    memorisation guards also with every training seed's own judgement (``per_seed.<seed>``)."""
    judged = f"audit.judged.{model}"
    seed = f"{judged}.per_seed.{{seed}}"
    return (
        Metric(f"memorisation.{model}.flag_excess", f"{judged}.flag_rate.excess", interval=True,
               per_seed=f"{seed}.flag_rate.excess"),
        Metric(f"memorisation.{model}.membership_auc", f"{judged}.membership_auc",
               interval=True, per_seed=f"{seed}.membership_auc"),
        Metric(f"memorisation.{model}.membership_tpr", f"{judged}.membership_auc.tpr",
               interval=True),
        Metric(f"memorisation.{model}.extraction_excess", f"{judged}.extraction_rate.excess",
               interval=True, per_seed=f"{seed}.extraction_rate.excess"),
        Metric(f"quality.{model}.score", f"{judged}.quality.score"),
        Metric(f"quality.{model}.score_band_low", f"{judged}.quality.score_band_low"),
        # the score minus score_band_low, the score that held-out human sets of the samples'
        # size reach in 1 − audit.quality_alpha of draws (>= 0 judges quality by its band)
        Metric(f"quality.{model}.margin", derive=_margin(model)),
    )


METRICS: tuple[Metric, ...] = (
    Metric("data.pieces_ok", "ingest.by_status.ok"),
    Metric("data.pieces_quarantined", "ingest.by_status.quarantined"),
    Metric("data.pieces_duplicate", "ingest.by_status.duplicate"),
    Metric("data.pieces_split", "split.pieces"),
    Metric("data.groups", "split.groups"),
    Metric("leakage.crossing_groups", ("leakage.grouped_crossing_groups",
                                       "leakage.crossing_groups")),
    Metric("leakage.crossing_metadata_groups", ("leakage.grouped_crossing_metadata_groups",
                                                "leakage.crossing_metadata_groups")),
    Metric("leakage.crossing_pairs", ("leakage.grouped_crossing_pairs",
                                      "leakage.crossing_pairs")),
    Metric("split.hash", "split.split_hash"),
    Metric("test.nll_per_note.ngram", "eval.models.ngram.test.nats_per_note", interval=True,
           label="n-gram NLL per note, test", unit="nats"),
    Metric("test.nll_per_note.transformer", "eval.models.transformer.test.nats_per_note",
           interval=True, label="transformer NLL per note, test"),
    # paired difference n-gram minus transformer on the same pieces and bootstrap replicates
    # (positive: the transformer is better)
    Metric("test.nll_per_note.diff", "eval.paired.ngram_minus_transformer.test.nats_per_note",
           interval=True, derive=_diff, label="n-gram − transformer, per note"),
    # (n-gram − transformer) / n-gram per note, the ratio formed in each bootstrap replicate
    Metric("test.nll_per_note.rel_improvement",
           "eval.paired.ngram_minus_transformer.test.rel_improvement", interval=True,
           derive=_rel_improvement, label="relative gain of the transformer"),
    Metric("test.nll_per_note.rel_improvement.median_piece",
           "eval.paired.ngram_minus_transformer.test.rel_improvement.median_piece_effect"),
    Metric("test.nll_per_note.rel_improvement.without_top3_groups",
           "eval.paired.ngram_minus_transformer.test.rel_improvement.without_top3_groups.value"),
    # test pieces with a near copy in train, found by exhaustive comparison (not dedupe's LSH)
    Metric("leakage.test_near_train", "leakage.independent.test_near_train"),
    Metric("leakage.test_near_train_share", "leakage.independent.test_near_train_share"),
    Metric("leakage.random_split_test_near_train_share",
           "leakage.independent.random_split.test_near_train_share"),
    # val NLL − NLL of a train subset (evaluate.train_pieces), both scored by evaluate (eval
    # mode), per token and per note: BPE fitted on train tokenises train more densely than
    # held-out pieces, so the gap per token mixes the tokenizer with the model
    # judged on every training seed's own gap (a seed's model on both sides), each with its
    # groups' interval, where eval.json has them
    Metric("generalisation.gap.transformer", "eval.gap.transformer.nats_per_token",
           interval=True, per_seed="eval.gap.transformer.per_seed.{seed}.nats_per_token",
           label="held-out − train gap of the transformer", unit="nats/token"),
    Metric("generalisation.gap_per_note.transformer", "eval.gap.transformer.nats_per_note",
           interval=True, per_seed="eval.gap.transformer.per_seed.{seed}.nats_per_note"),
    Metric("train.best_val_loss", "train.best_val_loss"),
    Metric("train.final_train_loss", "train.final_train_loss"),
    Metric("memorisation.flag_rate_samples", "audit.flag_rate.samples"),
    Metric("memorisation.flag_rate_human", "audit.flag_rate.human_test"),
    Metric("memorisation.flag_rate_excess", "audit.flag_rate.excess"),
    *(m for model in MODELS for m in _judged(model)),
)
"""Every canonical metric, in the order the report's metrics table shows the labelled ones."""


def metric_aliases(table: tuple[Metric, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """Canonical key -> the flattened stage-report keys it is read from, first present wins
    (an interval metric's ``.ci_low``/``.ci_high`` beside it). ``table``: :data:`METRICS`."""
    out: dict[str, tuple[str, ...]] = {}
    for m in METRICS if table is None else table:
        if not m.interval:
            if m.sources:
                out[m.key] = m.sources
            continue
        for part, suffix in (("value", ""), ("ci_low", ".ci_low"), ("ci_high", ".ci_high")):
            out[m.key + suffix] = tuple(f"{s}.{part}" for s in m.sources)
    return out


def judged_per_seed(table: tuple[Metric, ...] | None = None) -> frozenset[str]:
    """The canonical keys judged on every training seed (those with ``per_seed``).
    ``table``: :data:`METRICS`."""
    return frozenset(m.key for m in (METRICS if table is None else table) if m.per_seed)


def seed_metrics(key: str, seed: str, block: Mapping[str, Any]) -> dict[str, Any]:
    """One seed's block of metric ``key`` as flat metrics: ``<key>.seed.<seed>`` (its value),
    ``.ci_low`` and ``.ci_high`` beside it (those the block has)."""
    out = {f"{key}.seed.{seed}": block.get("value")}
    out.update({f"{key}.seed.{seed}.{k}": block[k] for k in ("ci_low", "ci_high") if k in block})
    return out


def _seed_order(seed: str) -> tuple[int, int | str]:
    return (0, int(seed)) if seed.isdigit() else (1, seed)


def seed_blocks(metrics: Mapping[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """Every training seed's block of ``key`` in flat metrics (:func:`seed_metrics`' keys), as
    seed -> ``{"value", "ci_low", "ci_high"}`` (None where missing), in seed order; empty when
    ``key`` is not judged per seed (:func:`judged_per_seed`) or the metrics hold no seed of
    it."""
    if key not in judged_per_seed():
        return {}
    head = f"{key}.seed."
    seeds = {k[len(head):] for k in metrics if k.startswith(head) and "." not in k[len(head):]}
    return {s: {"value": metrics.get(f"{head}{s}"),
                "ci_low": metrics.get(f"{head}{s}.ci_low"),
                "ci_high": metrics.get(f"{head}{s}.ci_high")}
            for s in sorted(seeds, key=_seed_order)}


def _per_seed_sources(m: Metric, flat: Mapping[str, Any]) -> dict[str, Any]:
    """The flat metrics of every seed block ``m.per_seed`` finds in ``flat``."""
    head, _, tail = str(m.per_seed).partition("{seed}")
    pattern = re.compile(re.escape(head) + r"([^.]+)" + re.escape(tail) + r"\.value")
    out: dict[str, Any] = {}
    for k in flat:
        hit = pattern.fullmatch(k)
        if hit is not None and flat[k] is not None:
            block = f"{head}{hit.group(1)}{tail}"
            out.update(seed_metrics(m.key, hit.group(1), {
                part: flat[f"{block}.{part}"] for part in ("value", "ci_low", "ci_high")
                if f"{block}.{part}" in flat}))
    return out


def labelled() -> list[Metric]:
    """The metrics the report's metrics table shows, in table order."""
    return [m for m in METRICS if m.label is not None]


def flatten(obj: Any, prefix: str = "", max_list: int = 50) -> dict[str, Any]:
    """Nested dicts -> ``{"a.b.c": leaf}``; short lists of scalars get index keys, long lists and
    lists of containers are left out (they belong in tables, not metrics)."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for k in sorted(obj, key=str):
            out.update(flatten(obj[k], f"{prefix}.{k}" if prefix else str(k), max_list))
    elif isinstance(obj, list | tuple):
        if len(obj) <= max_list and all(not isinstance(v, Mapping | list | tuple) for v in obj):
            for i, v in enumerate(obj):
                out[f"{prefix}.{i}"] = v
    elif obj is None or isinstance(obj, bool | int | float | str):
        out[prefix] = obj
    return out


def build_metrics(reports: Mapping[str, Any]) -> dict[str, Any]:
    """Flat metrics from stage reports (``{"eval": {...}, "audit": {...}, ...}``, missing = None).

    Every report flattened under its stem, then the canonical keys of :data:`METRICS`: first
    from their sources (:func:`metric_aliases`), then every training seed's block of the
    metrics judged per seed (:func:`seed_metrics`), then the derived ones. When eval.json lacks
    the paired blocks, ``test.nll_per_note.diff`` and ``test.nll_per_note.rel_improvement`` are
    derived from the two models' means, without an interval.
    """
    flat: dict[str, Any] = {}
    for stem in sorted(reports):
        if reports[stem] is not None:
            flat.update(flatten(reports[stem], stem))
    for key, candidates in metric_aliases().items():
        for c in candidates:
            if c in flat and flat[c] is not None:
                flat[key] = flat[c]
                break
    for m in METRICS:
        if m.per_seed is not None:
            flat.update(_per_seed_sources(m, flat))
    for m in METRICS:
        if m.derive is not None and number(flat.get(m.key)) is None:
            value = m.derive(flat)
            if value is not None:
                flat[m.key] = value
    return dict(sorted(flat.items()))

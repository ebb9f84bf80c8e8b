"""Aggregates of the per-piece scores: the blocks of ``reports/eval.json``.

From ``reports/eval/per_piece.parquet``'s rows (one per piece, model and training seed): each
model's ratios of sums per split, its NLL averaged over its seeds (``models``), paired
differences and the relative improvement on the same replicates (``paired``), the generalisation
gap of the held-out pieces against a subset of train pieces (``gap``) and the minimum detectable
effect (``power``). Intervals: the group bootstrap of the seed-averaged model, widened for a
model trained with several seeds by a Student-t term over its per-seed statistics
(:func:`~pipeline.stats.bootstrap.seed_half_width`,
:func:`~pipeline.stats.bootstrap.with_seed_term`). Every random draw comes from
a Generator seeded by (``evaluate.seed``, a fixed label), so each block is a pure function of the
table and the plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from pipeline.stats.bootstrap import (
    bootstrap_weights,
    diff_summary,
    effect_without_top_groups,
    group_sums,
    median_piece_effect,
    percentile_interval,
    ratio_summary,
    rel_summary,
    seed_half_width,
    with_seed_term,
)
from pipeline.stats.power import detectable_effect


class BootstrapPlan(Protocol):
    """What the aggregates need of the ``evaluate`` params (``EvaluateConfig`` is one)."""

    splits: Sequence[str]
    n_boot: int
    ci_level: float
    seed: int


TRAIN_SUBSET_STREAM = int.from_bytes(b"train_subset", "big")
"""Label of the gap's random streams: ``default_rng([seed, TRAIN_SUBSET_STREAM, 0])`` draws the
train subset's pieces, ``[seed, TRAIN_SUBSET_STREAM, 1]`` its bootstrap replicates and ``[...,
2]`` those of the pooled held-out pieces. The splits use ``[seed, split index]``, so the gap
changes none of their draws."""
MDE_POWER = 0.8
"""Power at which ``power.<pair>.mde`` is stated."""



UNITS = (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes"),
         ("nats_per_second", "duration_s"))
"""eval.json's per-unit keys and the per-piece columns they divide by."""


def _seed_key(seed: Any) -> str:
    return "none" if seed is None else str(int(seed))


@dataclass(frozen=True)
class _Scores:
    """One model on one set of pieces: NLL per training seed, and its bootstrap replicates.

    ``pieces`` (S, n_pieces) per-piece NLL in the design's ``shas`` order, one row per seed
    (``seeds``; ``[None]`` for a model without training seeds, e.g. the n-gram); ``units`` the
    first seed's rows (tokens, notes, seconds: the same for every seed); ``groups`` (S, G) NLL
    sums per group; ``rep`` (n_boot,) the replicate NLL totals of the seed-averaged model (the
    groups resampled; the seeds enter as a t term). Means over one seed are that seed's values
    exactly."""

    seeds: list[Any]
    pieces: np.ndarray
    units: pd.DataFrame
    groups: np.ndarray
    rep: np.ndarray

    @property
    def total(self) -> float:
        """Summed NLL of the seed-averaged model (every group and seed once)."""
        return float(self.groups.sum(axis=1).mean())

    @property
    def mean_pieces(self) -> np.ndarray:
        return self.pieces.mean(axis=0)

    @property
    def mean_groups(self) -> np.ndarray:
        return self.groups.mean(axis=0)

    @property
    def seed_sums(self) -> np.ndarray:
        """Each seed's summed NLL, in ``seeds`` order."""
        return self.groups.sum(axis=1)

    @property
    def seed_totals(self) -> dict[str, float]:
        """Each seed's summed NLL, by seed label."""
        return {_seed_key(s): float(t) for s, t in zip(self.seeds, self.groups.sum(axis=1),
                                                        strict=True)}


def seed_effects(a: _Scores, b: _Scores) -> tuple[str, dict[str, float]] | None:
    """The spread of B's relative improvement over A across training seeds: each seed of the
    replicated model against the other model's seed average, as ``("a" | "b", seed -> effect)``;
    None when neither model has several seeds (B's seeds are taken when both have)."""
    if len(b.seeds) > 1:
        return "b", {k: 1.0 - t / a.total for k, t in b.seed_totals.items()}
    if len(a.seeds) > 1:
        return "a", {k: 1.0 - b.total / t for k, t in a.seed_totals.items()}
    return None


def _seeded(summary: dict[str, float], per_seed: Sequence[Sequence[float]],
            level: float) -> dict[str, float]:
    """``summary`` widened by the seeds' t term when any model in ``per_seed`` has several
    seeds; unchanged otherwise (a model without training seeds keeps its group bootstrap)."""
    if not any(len(x) > 1 for x in per_seed):
        return summary
    return with_seed_term(summary, seed_half_width(per_seed, level))


def _per_seed_sets(a: _Scores, b: _Scores,
                   stat: Callable[[float, float], float]) -> list[list[float]]:
    """``stat(A, B)`` of summed NLL with each of A's seeds in turn (B at its seed average), and
    with each of B's (A at its average): the spreads :func:`seed_half_width` combines."""
    return [[float(stat(float(x), b.total)) for x in a.seed_sums],
            [float(stat(a.total, float(y))) for y in b.seed_sums]]


def split_metrics(sc: _Scores, weights: np.ndarray, codes: np.ndarray, n_groups: int,
                  level: float) -> dict[str, Any]:
    """Aggregates of one model on one split (seed-averaged NLL; ``per_seed`` when it has several
    training seeds)."""
    pp = sc.units
    out: dict[str, Any] = {
        "n_pieces": len(pp), "n_groups": int(np.count_nonzero(np.bincount(codes,
                                                                           minlength=n_groups))),
        "n_tokens": int(pp["n_tokens"].sum()), "n_notes": int(pp["n_notes"].sum()),
        "duration_s": float(pp["duration_s"].sum()), "nll_nats": sc.total,
        "n_seeds": len(sc.seeds),
    }
    for key, col in UNITS:
        den = group_sums(codes, pp[col], n_groups)
        out[key] = _seeded(ratio_summary(sc.total, float(den.sum()), sc.rep, weights @ den,
                                         level),
                           [list(sc.seed_sums / den.sum())] if den.sum() > 0 else [], level)
    npt = {k: out["nats_per_token"][k] for k in ("value", "ci_low", "ci_high")}
    out["bits_per_token"] = {k: v / math.log(2) for k, v in npt.items()}
    out["perplexity"] = {k: math.exp(v) if math.isfinite(v) else v for k, v in npt.items()}
    if len(sc.seeds) > 1:
        out["per_seed"] = {
            _seed_key(s): {key: float(sc.groups[i].sum() / pp[col].sum()) for key, col in UNITS
                           if pp[col].sum() > 0}
            for i, s in enumerate(sc.seeds)}
    return out


def paired_metrics(a: _Scores, b: _Scores, weights: np.ndarray, codes: np.ndarray,
                   group_names: np.ndarray, level: float) -> dict[str, Any]:
    """A − B on the same pieces and the same bootstrap replicates (the seeds as a t term), and B's
    relative improvement over A, ``(A − B) / A``, formed inside each replicate."""
    n_groups = len(group_names)
    out: dict[str, Any] = {"n_pieces": len(a.units)}
    for key, col in UNITS:
        den = group_sums(codes, a.units[col], n_groups)
        total = float(den.sum())
        out[key] = _seeded(diff_summary(a.total, b.total, total, a.rep, b.rep, weights @ den,
                                        level),
                           _per_seed_sets(a, b, lambda x, y, d=total: (x - y) / d)
                           if total > 0 else [], level)
    # Both models score the same pieces, so notes, seconds or tokens cancel in (A − B) / A:
    # one relative improvement serves every unit (per note is computed).
    den = group_sums(codes, a.units["n_notes"], n_groups)
    rel = _seeded(rel_summary(a.total, b.total, float(den.sum()), a.rep, b.rep, weights @ den,
                              level),
                  _per_seed_sets(a, b, lambda x, y: 1.0 - y / x if x > 0 else math.nan), level)
    rel["median_piece_effect"] = median_piece_effect(a.mean_pieces, b.mean_pieces)
    top = effect_without_top_groups(a.mean_groups, b.mean_groups, k=3)
    rel["without_top3_groups"] = {"value": top["value"],
                                  "dropped_groups": [str(group_names[i]) for i in top["dropped"]]}
    spread = seed_effects(a, b)
    if spread is not None:
        rel["per_seed_of"], rel["per_seed"] = spread
    out["rel_improvement"] = rel
    return out


@dataclass(frozen=True)
class _Design:
    """The pieces of one split (sorted sha256s), their groups and the bootstrap replicates."""

    part: pd.DataFrame
    shas: list[str]
    group_names: np.ndarray
    codes: np.ndarray
    weights: np.ndarray

    def seeds(self, name: str) -> list[Any]:
        """Model ``name``'s training seeds in this table, sorted (``[None]`` when it has none)."""
        rows = self.part[self.part["model"] == name]
        if "seed" not in rows or rows["seed"].isna().all():
            return [None]
        return sorted(int(s) for s in rows["seed"].dropna().unique())

    def aligned(self, name: str, seed: Any = None) -> pd.DataFrame:
        """Model ``name``'s rows of one seed, in ``shas`` order (every model scores the same
        pieces)."""
        rows = self.part[self.part["model"] == name]
        if seed is not None:
            rows = rows[rows["seed"] == seed]
        return rows.set_index("sha256").loc[self.shas]

    def sums(self, df: pd.DataFrame, col: str) -> np.ndarray:
        return group_sums(self.codes, df[col], len(self.group_names))

    def scores(self, name: str) -> _Scores:
        """Model ``name``'s :class:`_Scores` on this design's replicates."""
        seeds = self.seeds(name)
        rows = [self.aligned(name, s) for s in seeds]
        pieces = np.stack([r["nll_nats"].to_numpy(dtype=np.float64) for r in rows])
        groups = np.stack([self.sums(r, "nll_nats") for r in rows])
        return _Scores(seeds, pieces, rows[0], groups, self.weights @ groups.mean(axis=0))


def _design(per_piece: pd.DataFrame, split: str | Sequence[str], n_boot: int,
            rng: np.random.Generator | None) -> _Design:
    """The design of a split (or of several, pooled); no replicates (``weights`` of shape
    ``(0, G)``) when ``rng`` is None."""
    part = per_piece[per_piece["split"].isin([split] if isinstance(split, str) else split)]
    shas = sorted(set(part["sha256"]))
    groups = part.drop_duplicates("sha256").set_index("sha256").loc[shas, "group_id"]
    group_names, codes = np.unique(groups.to_numpy(dtype=str), return_inverse=True)
    weights = (np.zeros((0, len(group_names))) if rng is None
               else bootstrap_weights(len(group_names), n_boot, rng))
    return _Design(part, shas, group_names, codes, weights)


def _split_rng(cfg: BootstrapPlan, split: str) -> np.random.Generator:
    """One Generator per split, from (seed, split index): adding a split changes no other."""
    return np.random.default_rng([cfg.seed, cfg.splits.index(split)])


def _split_scores(per_piece: pd.DataFrame, cfg: BootstrapPlan, split: str,
                  names: Sequence[str]) -> tuple[_Design, dict[str, _Scores]]:
    """A split's design and every model's scores: the group counts are the split's
    Generator's only draw, shared by every model."""
    d = _design(per_piece, split, cfg.n_boot, _split_rng(cfg, split))
    return d, {n: d.scores(n) for n in names}


def aggregate(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(models, paired)`` blocks of eval.json from the per-piece table (``cfg.splits`` only)."""
    models: dict[str, Any] = {n: {} for n in names}
    paired: dict[str, Any] = {f"{a}_minus_{b}": {} for a, b in itertools.combinations(names, 2)}
    for split in cfg.splits:
        d, scores = _split_scores(per_piece, cfg, split, names)
        for n in names:
            models[n][split] = split_metrics(scores[n], d.weights, d.codes, len(d.group_names),
                                             cfg.ci_level)
        for a, b in itertools.combinations(names, 2):
            paired[f"{a}_minus_{b}"][split] = paired_metrics(
                scores[a], scores[b], d.weights, d.codes, d.group_names, cfg.ci_level)
    return models, paired


# ---- generalisation gap and power --------------------------------------------------------------
def draw_train_subset(train_shas: Sequence[str], n: int, seed: int) -> list[str]:
    """The train pieces scored for the generalisation gap, sorted: the first ``n`` of a seeded
    permutation of the sorted, distinct ``train_shas`` (all of them when there are fewer).

    The permutation comes from ``default_rng([seed, TRAIN_SUBSET_STREAM, 0])``, so it depends on
    ``evaluate.seed`` and the set of train pieces only, never on input order, and no other
    stream of the stage moves. Taking a prefix keeps the subset nested: one more val piece adds
    one train piece and changes none of the others.
    """
    shas = sorted(set(train_shas))
    order = np.random.default_rng([seed, TRAIN_SUBSET_STREAM, 0]).permutation(len(shas))
    return sorted(shas[i] for i in order[:max(0, n)])


HELDOUT = ("val", "test")
"""The splits whose pieces, pooled, are the gap's held-out side (those ``evaluate.splits``
scores)."""


def generalisation(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str]
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(train_subset metrics by model, gap block)`` from the held-out and ``train`` rows.

    ``gap.<model>``: the held-out pieces (val and test, those scored, pooled) minus the train
    subset, per note and per token. Each side's groups are resampled by its own generator
    (``[seed, TRAIN_SUBSET_STREAM, 2]`` and ``[seed, TRAIN_SUBSET_STREAM, 1]``), independently:
    the two sets share no pieces, so there is nothing to pair, and no split's draws move. A model
    trained with several seeds is a set of models, each with its own gap (seed ``s`` on both
    sides): those gaps give the mean's interval its t term (``<unit>.per_seed`` lists them),
    and ``gap.<model>.per_seed.<seed>.<unit>`` holds each seed's gap with its own interval, from
    the same replicates (the same groups drawn) applied to that seed's scores alone, with no
    seed term: what a guard on the gap, which must hold for every seed, is judged on. Both
    empty when no held-out split is scored or the train subset is empty.
    """
    heldout = [s for s in HELDOUT if s in cfg.splits]
    if not heldout or not (per_piece["split"] == "train").any():
        return {}, {}
    held = _design(per_piece, heldout, cfg.n_boot,
                   np.random.default_rng([cfg.seed, TRAIN_SUBSET_STREAM, 2]))
    if not held.shas:
        return {}, {}
    trn = _design(per_piece, "train", cfg.n_boot,
                  np.random.default_rng([cfg.seed, TRAIN_SUBSET_STREAM, 1]))
    metrics, gap = {}, {}
    for n in names:
        v, t = held.scores(n), trn.scores(n)
        metrics[n] = split_metrics(t, trn.weights, trn.codes, len(trn.group_names),
                                   cfg.ci_level)
        gap[n] = {"heldout": heldout, "n_pieces_heldout": len(v.units),
                  "n_pieces_train": len(t.units)}
        for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes")):
            den_v, den_t = held.sums(v.units, col), trn.sums(t.units, col)
            dens = (float(den_v.sum()), float(den_t.sum()), held.weights @ den_v,
                    trn.weights @ den_t)
            block = _gap_block((v.total, t.total), (v.rep, t.rep), dens, cfg.ci_level)
            if len(v.seeds) > 1:
                per_seed = v.seed_sums / den_v.sum() - t.seed_sums / den_t.sum()
                block = {**with_seed_term(block, seed_half_width([list(per_seed)],
                                                                 cfg.ci_level)),
                         "per_seed": {_seed_key(s): float(g)
                                      for s, g in zip(v.seeds, per_seed, strict=True)}}
                for i, s in enumerate(v.seeds):
                    own = gap[n].setdefault("per_seed", {}).setdefault(_seed_key(s), {})
                    own[key] = _gap_block(
                        (float(v.seed_sums[i]), float(t.seed_sums[i])),
                        (held.weights @ v.groups[i], trn.weights @ t.groups[i]), dens,
                        cfg.ci_level)
            gap[n][key] = block
    return metrics, gap


def _gap_block(sums: tuple[float, float], reps: tuple[np.ndarray, np.ndarray],
               dens: tuple[float, float, np.ndarray, np.ndarray], level: float
               ) -> dict[str, float]:
    """Held-out minus train NLL per unit: ``sums`` the two sides' summed NLL, ``reps`` their
    replicate totals, ``dens`` the two sides' unit totals and their replicate totals; the
    percentile interval of the replicates' differences."""
    lo, hi = percentile_interval(reps[0] / dens[2] - reps[1] / dens[3], level)
    return {"value": float(sums[0] / dens[0] - sums[1] / dens[1]), "ci_low": lo, "ci_high": hi}


def power_blocks(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str],
                 n_test_groups_listed: int) -> dict[str, Any]:
    """``power.<a>_minus_<b>``: the minimum detectable effect of the relative improvement
    ``(A − B) / A`` at ``MDE_POWER`` and ``evaluate.ci_level``, estimated from val's per-group
    NLL sums (seed-averaged) and, for a model trained with several seeds, the spread of the
    per-seed effect on val, for a split of ``n_groups`` groups: test's scored groups when test is
    scored, else the test groups listed in ``data/splits.parquet`` (``n_test_groups_listed``),
    else val's. Empty when val is not scored."""
    val = per_piece[per_piece["split"] == "val"]
    if "val" not in cfg.splits or val.empty:
        return {}
    test = per_piece[per_piece["split"] == "test"]
    if "test" in cfg.splits and not test.empty:
        n_groups, source = test["group_id"].nunique(), "test (scored)"
    elif n_test_groups_listed > 0:
        n_groups, source = n_test_groups_listed, "test (data/splits.parquet)"
    else:
        n_groups, source = val["group_id"].nunique(), "val"
    d = _design(per_piece, "val", 0, None)
    scores = {n: d.scores(n) for n in names}
    out = {}
    for a, b in itertools.combinations(names, 2):
        sa, sb = scores[a], scores[b]
        spread = seed_effects(sa, sb)
        record = detectable_effect(sa.mean_groups, sb.mean_groups, int(n_groups),
                                   power=MDE_POWER, level=cfg.ci_level,
                                   seed_effects=list(spread[1].values()) if spread else [])
        out[f"{a}_minus_{b}"] = {**record, "estimated_from": "val", "n_groups_of": source}
    return out

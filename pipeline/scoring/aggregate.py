"""Aggregates of the per-piece scores: the blocks of ``reports/eval.json``.

From ``reports/eval/per_piece.parquet``'s rows (one per piece and model): each model's ratios of
sums per split with group-bootstrap intervals (``models``), paired differences and the relative
improvement on the same replicates (``paired``), the generalisation gap against a same-sized
train subset (``gap``) and the minimum detectable effect (``power``). Every random draw comes from
a Generator seeded by (``evaluate.seed``, a fixed label), so each block is a pure function of the
table and the plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from pipeline.scoring.bootstrap import (
    bootstrap_weights,
    effect_without_top_groups,
    group_sums,
    independent_diff_ci,
    median_piece_effect,
    paired_diff_ci,
    paired_rel_ci,
    ratio_ci,
)
from pipeline.scoring.power import detectable_effect


class BootstrapPlan(Protocol):
    """What the aggregates need of the ``evaluate`` params (``EvaluateConfig`` is one)."""

    splits: Sequence[str]
    n_boot: int
    ci_level: float
    seed: int


TRAIN_SUBSET_STREAM = int.from_bytes(b"train_subset", "big")
"""Label of the train subset's random streams: ``default_rng([seed, TRAIN_SUBSET_STREAM, 0])``
draws its pieces, ``[seed, TRAIN_SUBSET_STREAM, 1]`` its bootstrap replicates. The splits use
``[seed, split index]``, so the train subset changes none of their draws."""
MDE_POWER = 0.8
"""Power at which ``power.<pair>.mde`` is stated."""



def split_metrics(pp: pd.DataFrame, weights: np.ndarray, codes: np.ndarray, n_groups: int,
                  level: float) -> dict[str, Any]:
    """Aggregates of one model on one split (``pp`` rows follow ``codes``)."""
    nll = group_sums(codes, pp["nll_nats"], n_groups)
    out: dict[str, Any] = {
        "n_pieces": len(pp), "n_groups": int(np.count_nonzero(np.bincount(codes,
                                                                           minlength=n_groups))),
        "n_tokens": int(pp["n_tokens"].sum()), "n_notes": int(pp["n_notes"].sum()),
        "duration_s": float(pp["duration_s"].sum()), "nll_nats": float(pp["nll_nats"].sum()),
    }
    for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes"),
                     ("nats_per_second", "duration_s")):
        out[key] = ratio_ci(nll, group_sums(codes, pp[col], n_groups), weights, level)
    npt = out["nats_per_token"]
    out["bits_per_token"] = {k: v / math.log(2) for k, v in npt.items()}
    out["perplexity"] = {k: math.exp(v) if math.isfinite(v) else v for k, v in npt.items()}
    return out


def paired_metrics(a: pd.DataFrame, b: pd.DataFrame, weights: np.ndarray, codes: np.ndarray,
                   group_names: np.ndarray, level: float) -> dict[str, Any]:
    """A − B on the same pieces (rows aligned) and the same bootstrap replicates, and B's relative
    improvement over A, ``(A − B) / A``, formed inside each replicate."""
    n_groups = len(group_names)

    def g(df: pd.DataFrame, col: str) -> np.ndarray:
        return group_sums(codes, df[col], n_groups)

    out: dict[str, Any] = {"n_pieces": len(a)}
    for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes"),
                     ("nats_per_second", "duration_s")):
        out[key] = paired_diff_ci(g(a, "nll_nats"), g(a, col), g(b, "nll_nats"), g(b, col),
                                  weights, level)
    # Both models score the same pieces, so notes, seconds or tokens cancel in (A − B) / A:
    # one relative improvement serves every unit (per note is computed).
    rel = paired_rel_ci(g(a, "nll_nats"), g(a, "n_notes"), g(b, "nll_nats"), g(b, "n_notes"),
                        weights, level)
    rel["median_piece_effect"] = median_piece_effect(a["nll_nats"].to_numpy(),
                                                     b["nll_nats"].to_numpy())
    top = effect_without_top_groups(g(a, "nll_nats"), g(b, "nll_nats"), k=3)
    rel["without_top3_groups"] = {"value": top["value"],
                                  "dropped_groups": [str(group_names[i]) for i in top["dropped"]]}
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

    def aligned(self, name: str) -> pd.DataFrame:
        """Model ``name``'s rows, in ``shas`` order (every model scores the same pieces)."""
        return self.part[self.part["model"] == name].set_index("sha256").loc[self.shas]

    def sums(self, df: pd.DataFrame, col: str) -> np.ndarray:
        return group_sums(self.codes, df[col], len(self.group_names))


def _design(per_piece: pd.DataFrame, split: str, n_boot: int,
            rng: np.random.Generator | None) -> _Design:
    """The split's design; no replicates (``weights`` of shape ``(0, G)``) when ``rng`` is None."""
    part = per_piece[per_piece["split"] == split]
    shas = sorted(set(part["sha256"]))
    groups = part.drop_duplicates("sha256").set_index("sha256").loc[shas, "group_id"]
    group_names, codes = np.unique(groups.to_numpy(dtype=str), return_inverse=True)
    weights = (np.zeros((0, len(group_names))) if rng is None
               else bootstrap_weights(len(group_names), n_boot, rng))
    return _Design(part, shas, group_names, codes, weights)


def _split_rng(cfg: BootstrapPlan, split: str) -> np.random.Generator:
    """One Generator per split, from (seed, split index): adding a split changes no other."""
    return np.random.default_rng([cfg.seed, cfg.splits.index(split)])


def aggregate(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(models, paired)`` blocks of eval.json from the per-piece table (``cfg.splits`` only)."""
    models: dict[str, Any] = {n: {} for n in names}
    paired: dict[str, Any] = {f"{a}_minus_{b}": {} for a, b in itertools.combinations(names, 2)}
    for split in cfg.splits:
        d = _design(per_piece, split, cfg.n_boot, _split_rng(cfg, split))
        weights, codes, group_names = d.weights, d.codes, d.group_names
        aligned = {n: d.aligned(n) for n in names}
        for n in names:
            models[n][split] = split_metrics(aligned[n], weights, codes, len(group_names),
                                             cfg.ci_level)
        for a, b in itertools.combinations(names, 2):
            paired[f"{a}_minus_{b}"][split] = paired_metrics(
                aligned[a], aligned[b], weights, codes, group_names, cfg.ci_level)
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


def generalisation(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str]
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(train_subset metrics by model, gap block)`` from the val and ``train`` rows.

    ``gap.<model>``: val minus train subset, per note and per token. Val reuses its replicates
    (``[seed, val's index]``, the same as ``models.<m>.val``); the train subset's groups are
    resampled by their own generator (``[seed, TRAIN_SUBSET_STREAM, 1]``), independently: the
    two sets share no pieces, so there is nothing to pair. Both empty when val is not scored or
    the train subset is empty.
    """
    if "val" not in cfg.splits or not (per_piece["split"] == "train").any():
        return {}, {}
    val = _design(per_piece, "val", cfg.n_boot, _split_rng(cfg, "val"))
    trn = _design(per_piece, "train", cfg.n_boot,
                  np.random.default_rng([cfg.seed, TRAIN_SUBSET_STREAM, 1]))
    if not val.shas:
        return {}, {}
    metrics, gap = {}, {}
    for n in names:
        v, t = val.aligned(n), trn.aligned(n)
        metrics[n] = split_metrics(t, trn.weights, trn.codes, len(trn.group_names),
                                   cfg.ci_level)
        gap[n] = {"n_pieces_val": len(v), "n_pieces_train": len(t)}
        for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes")):
            gap[n][key] = independent_diff_ci(
                val.sums(v, "nll_nats"), val.sums(v, col), val.weights,
                trn.sums(t, "nll_nats"), trn.sums(t, col), trn.weights, cfg.ci_level)
    return metrics, gap


def power_blocks(per_piece: pd.DataFrame, cfg: BootstrapPlan, names: Sequence[str],
                 n_test_groups_listed: int) -> dict[str, Any]:
    """``power.<a>_minus_<b>``: the minimum detectable effect of the relative improvement
    ``(A − B) / A`` at ``MDE_POWER`` and ``evaluate.ci_level``, estimated from val's per-group
    NLL sums for a split of ``n_groups`` groups: test's scored groups when test is scored, else
    the test groups listed in ``data/splits.parquet`` (``n_test_groups_listed``), else val's.
    Empty when val is not scored."""
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
    out = {}
    for a, b in itertools.combinations(names, 2):
        record = detectable_effect(d.sums(d.aligned(a), "nll_nats"),
                                   d.sums(d.aligned(b), "nll_nats"), int(n_groups),
                                   power=MDE_POWER, level=cfg.ci_level)
        out[f"{a}_minus_{b}"] = {**record, "estimated_from": "val", "n_groups_of": source}
    return out

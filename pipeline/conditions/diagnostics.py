"""Does the model use its condition? The shuffled-condition diagnostic.

A conditioned model can learn to ignore its condition while its loss still falls, and a broken
conditioning pipeline (conditions misaligned with pieces, dropped in batching) looks the same from
the loss alone. The diagnostic scores the same held-out pieces three times:

- **correct**: each piece with its own conditions;
- **shuffled**: each piece with another piece's conditions (a seeded permutation of the pieces'
  condition rows, so the labels keep their frequencies);
- **removed**: every slot "none" (the unconditioned model condition dropout trains).

and reports the NLL per note of each and the paired differences *shuffled − correct* and
*removed − correct*, with a group-bootstrap interval (the same groups drawn for both sides). A
model that follows its condition shows a positive gap; one that ignores it, none (the interval
covers 0); a negative gap means the conditions hurt, e.g. they were attached to the wrong pieces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.stats.bootstrap import bootstrap_weights, group_sums, paired_diff_ci, ratio_ci

VARIANTS = ("correct", "shuffled", "removed")


def shuffle_conditions(cond: np.ndarray, seed: int) -> np.ndarray:
    """(N, K) condition rows permuted among the pieces by a generator seeded with ``seed``."""
    cond = np.asarray(cond, dtype=np.int64)
    return cond[np.random.default_rng(seed).permutation(len(cond))]


def variant_sums(scorer: Any, seqs: Sequence[np.ndarray], cond: np.ndarray,
                 none_ids: np.ndarray, seed: int = 0,
                 correct: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each sequence's summed NLL under its own (``correct``), shuffled and removed conditions,
    for a conditioned ``scorer`` (``token_nll(seqs, conds=...)``). ``correct``: those sums when
    the caller has already scored the sequences with their own conditions (evaluate has)."""
    cond = np.asarray(cond, dtype=np.int64)
    if len(seqs) != len(cond):
        raise ValueError(f"{len(seqs)} sequences but {len(cond)} condition rows")
    removed = np.broadcast_to(np.asarray(none_ids, dtype=np.int64), cond.shape).copy()
    variants = {"correct": cond, "shuffled": shuffle_conditions(cond, seed), "removed": removed}
    out = {} if correct is None else {"correct": np.asarray(correct, dtype=np.float64)}
    for name in VARIANTS:
        if name not in out:
            out[name] = np.array([math.fsum(v) for v in
                                  scorer.token_nll(list(seqs), conds=variants[name])])
    return out


def gap_summary(sums: dict[str, np.ndarray], groups: Sequence[str], notes: Sequence[float], *,
                seed: int = 0, n_boot: int = 2000, level: float = 0.95) -> dict[str, Any]:
    """NLL per note of each variant and the paired gaps, from per-sequence sums (e.g. averaged
    over training seeds) with each sequence's group and notes (a piece's notes on one of its
    sequences, 0 on the others)."""
    labels, codes = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    den = group_sums(codes, np.asarray(notes, dtype=np.float64), len(labels))
    num = {k: group_sums(codes, sums[k], len(labels)) for k in VARIANTS}
    weights = bootstrap_weights(len(labels), n_boot, np.random.default_rng(seed))
    out: dict[str, Any] = {
        "sequences": len(groups), "groups": len(labels), "n_boot": n_boot, "ci_level": level,
        "nll_per_note": {k: ratio_ci(num[k], den, weights, level) for k in VARIANTS},
    }
    for other in ("shuffled", "removed"):
        gap = paired_diff_ci(num[other], den, num["correct"], den, weights, level)
        out[f"{other}_minus_correct"] = {**gap, "verdict": verdict(gap)}
    return out


def condition_gap(scorer: Any, seqs: Sequence[np.ndarray], cond: np.ndarray,
                  none_ids: np.ndarray, groups: Sequence[str], notes: Sequence[float], *,
                  seed: int = 0, n_boot: int = 2000, level: float = 0.95) -> dict[str, Any]:
    """The diagnostic of one scorer on ``seqs`` (one row of condition ids, one group and one
    note count each): :func:`gap_summary` of :func:`variant_sums`, plus ``changed_share``, the
    share of sequences whose shuffled conditions differ from their own (with few labels many keep
    theirs, which shrinks the gap a shuffle can show)."""
    if not len(seqs) == len(groups) == len(notes):
        raise ValueError(f"{len(seqs)} sequences, {len(groups)} groups and {len(notes)} note "
                         "counts: one each per sequence")
    sums = variant_sums(scorer, seqs, cond, none_ids, seed)
    out = gap_summary(sums, groups, notes, seed=seed, n_boot=n_boot, level=level)
    cond = np.asarray(cond, dtype=np.int64)
    out["changed_share"] = (float(np.mean((shuffle_conditions(cond, seed) != cond).any(axis=1)))
                            if len(cond) else 0.0)
    return out


def verdict(gap: dict[str, float]) -> str:
    """``follows`` when the whole interval of a gap lies above 0, ``hurt`` when below, else
    ``no gap shown``."""
    if gap["ci_low"] > 0:
        return "follows"
    if gap["ci_high"] < 0:
        return "hurt"
    return "no gap shown"

"""Statistics of ``symkit compare``: is one run's NLL really lower than another's, same pieces?

Pure functions, no I/O (:mod:`pipeline.tools.runs` reads the arms for the command):

- :func:`arm_scores` turns one arm's per-piece rows (``reports/eval/per_piece.parquet``, one model
  on one split) into per-seed NLL arrays; :func:`pair` lines two arms up on the same pieces and
  refuses (:class:`Refusal`) when they scored different pieces or put a piece in different groups.
- :func:`compare_pair`: the paired difference ``A − B`` of ratio-of-sums NLL (per note, second or
  token) and the relative improvement ``(A − B) / A`` formed inside every bootstrap replicate,
  with percentile intervals from the bootstrap over ``group_id`` that also resamples training
  seeds (:func:`pipeline.stats.bootstrap.replicate_sums`: group counts first, then seed counts),
  a two-sided bootstrap p-value (:func:`bootstrap_p_value`) and the equivalence check.
- :func:`comparable_metrics` says which metrics two arms can be compared on (per token only with
  one tokenizer); :func:`holm` (through :func:`apply_holm`) adjusts the p-values of several
  comparisons with the same baseline, and :func:`conclusion` names each metric's outcome.
- :func:`flatten_params`, :func:`params_diff` and :func:`design_label` say which parameters
  differ between two runs and whether the comparison is ``identical``, ``controlled`` (one
  parameter) or ``confounded`` (several).

Seeds: when both arms list the same training seeds (the usual controlled comparison, where seed
``s`` of each arm starts from the same initialisation and data order), a replicate draws one set
of seed counts and applies it to both arms: seeds are paired like groups, so a run compared with
itself differs by exactly 0 in every replicate. Otherwise each arm's seeds are drawn on their
own, as :func:`pipeline.stats.bootstrap.hierarchical_paired_ci` does (an arm with one seed draws
nothing).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from pipeline.stats.bootstrap import (
    bootstrap_weights,
    group_sums,
    median_piece_effect,
    ratio_summary,
    replicate_sums,
    safe_ratio,
    seed_weights,
    value_interval,
)

METRICS: tuple[tuple[str, str], ...] = (("nats_per_note", "n_notes"),
                                        ("nats_per_second", "duration_s"),
                                        ("nats_per_token", "n_tokens"))
"""Output key of each metric and the per-piece column its NLL is divided by."""
UNIT_COLUMNS = tuple(col for _, col in METRICS)
IGNORED_SECTIONS = ("runtime", "report", "criteria", "compare")
"""params.yaml sections that never change scores (knobs, the report, decision rules), left out of
the params diff."""
SeedPairing = Literal["paired", "independent", "none"]


class Refusal(ValueError):
    """The arms cannot be compared (different split, pieces or groups); the message says why."""


# ---- one arm, one pair ----------------------------------------------------------------------
@dataclass(frozen=True)
class ArmScores:
    """One model of one arm on one split.

    ``shas`` (n,) sorted sha256s; ``group_ids`` (n,); ``nll`` (S, n) per-piece NLL, one row per
    training seed in ``seeds`` order (``seeds`` is ``[]`` for a model without training seeds, such
    as the n-gram: then ``nll`` has one row); ``units`` column -> (n,) notes, seconds, tokens.
    """

    shas: np.ndarray
    group_ids: np.ndarray
    nll: np.ndarray
    units: Mapping[str, np.ndarray]
    seeds: list[int]

    @property
    def n_seeds(self) -> int:
        return len(self.nll)


def arm_scores(rows: pd.DataFrame, label: str) -> ArmScores:
    """An :class:`ArmScores` from one model's rows on one split (columns as per_piece.parquet).

    Every training seed must have scored the same pieces, each once; ``label`` names the arm in
    the errors (:class:`Refusal`).
    """
    if rows.empty:
        raise Refusal(f"arm {label!r}: no rows to compare")
    seed_col = rows["seed"]
    seeds = sorted(int(s) for s in seed_col.dropna().unique())
    if seeds and seed_col.isna().any():
        raise Refusal(f"arm {label!r}: some rows have a training seed and some have none; "
                      "per_piece.parquet mixes two kinds of model under one name")
    per_seed = [rows] if not seeds else [rows[seed_col == s] for s in seeds]
    frames = []
    for s, part in zip(seeds or [None], per_seed, strict=True):
        dup = part["sha256"].duplicated()
        if dup.any():
            raise Refusal(f"arm {label!r}: piece {part['sha256'][dup].iloc[0][:12]} is scored "
                          f"{int(dup.sum()) + 1} times" + ("" if s is None else f" by seed {s}"))
        frames.append(part.sort_values("sha256", kind="stable").reset_index(drop=True))
    first = frames[0]
    for s, f in zip(seeds[1:], frames[1:], strict=True):
        if not np.array_equal(f["sha256"].to_numpy(), first["sha256"].to_numpy()):
            raise Refusal(f"arm {label!r}: seed {s} scored {len(f)} pieces and seed {seeds[0]} "
                          f"{len(first)}, not the same set; every seed must score every piece")
    return ArmScores(
        shas=first["sha256"].to_numpy(dtype=str),
        group_ids=first["group_id"].to_numpy(dtype=str),
        nll=np.stack([f["nll_nats"].to_numpy(dtype=np.float64) for f in frames]),
        units={c: first[c].to_numpy(dtype=np.float64) for c in UNIT_COLUMNS},
        seeds=seeds)


@dataclass(frozen=True)
class Paired:
    """Two arms on their common pieces: group names and codes (``0..G-1``) of the pieces, the
    pieces' NLL per seed of A and of B, and each arm's units."""

    a: ArmScores
    b: ArmScores
    group_names: np.ndarray
    codes: np.ndarray

    @property
    def n_pieces(self) -> int:
        return len(self.codes)

    @property
    def n_groups(self) -> int:
        return len(self.group_names)

    @property
    def seed_pairing(self) -> SeedPairing:
        """``paired`` when both arms list the same training seeds (two or more), ``none`` when
        neither has several, else ``independent``."""
        if self.a.n_seeds > 1 and self.a.seeds == self.b.seeds:
            return "paired"
        return "none" if self.a.n_seeds <= 1 and self.b.n_seeds <= 1 else "independent"


def _examples(shas: Sequence[str], k: int = 5) -> str:
    shown = ", ".join(s[:12] for s in sorted(shas)[:k])
    return shown + (", ..." if len(shas) > k else "")


def pair(a: ArmScores, b: ArmScores, label_a: str, label_b: str, split: str) -> Paired:
    """Line ``b`` up with ``a``; :class:`Refusal` when they scored different pieces on ``split``
    or a shared piece lies in different groups."""
    set_a, set_b = set(a.shas), set(b.shas)
    if set_a != set_b:
        only_a, only_b = sorted(set_a - set_b), sorted(set_b - set_a)
        parts = [f"{len(only_a)} only in {label_a!r}" + (f" ({_examples(only_a)})" if only_a
                                                         else ""),
                 f"{len(only_b)} only in {label_b!r}" + (f" ({_examples(only_b)})" if only_b
                                                         else "")]
        raise Refusal(
            f"arms {label_a!r} and {label_b!r} scored different {split} pieces: "
            f"{label_a!r} {len(set_a)}, {label_b!r} {len(set_b)}, {len(set_a & set_b)} shared; "
            f"{'; '.join(parts)}. A paired comparison needs the same pieces: evaluate both "
            "runs with the same split and the same exclusions")
    differ = a.shas[a.group_ids != b.group_ids]  # both sorted by sha256
    if differ.size:
        raise Refusal(
            f"arms {label_a!r} and {label_b!r} put {differ.size} shared {split} pieces in "
            f"different groups (e.g. {_examples(list(differ))}); the group bootstrap needs "
            "one grouping: compare runs made from the same dedupe and split")
    group_names, codes = np.unique(a.group_ids, return_inverse=True)
    return Paired(a, b, group_names, codes)


# ---- statistics -----------------------------------------------------------------------------
def bootstrap_p_value(diffs: np.ndarray) -> float:
    """Two-sided bootstrap p-value of ``H0: A − B = 0`` from the replicate differences.

    ``min(1, 2 · min(1 + #(d ≤ 0), 1 + #(d ≥ 0)) / (n + 1))`` over the ``n`` finite replicates:
    twice the smaller tail share, so ``p ≤ alpha`` when the central ``1 − alpha`` percentile
    interval excludes 0 (up to the ``+1``s). The ``+1`` counts the observed data as one replicate
    (Davison & Hinkley 1997, eq. 4.11), so p is never 0: its floor is ``2 / (n + 1)``. When
    every replicate difference is 0 (a run against itself) p is 1. NaN without finite replicates.
    """
    d = diffs[np.isfinite(diffs)]
    if d.size == 0:
        return float("nan")
    low, high = int(np.count_nonzero(d <= 0)), int(np.count_nonzero(d >= 0))
    return min(1.0, 2.0 * (1 + min(low, high)) / (d.size + 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``m`` p-values (family-wise error rate at most alpha).

    Sorted ascending, the ``i``-th smallest (``i = 1..m``) becomes ``max_{j ≤ i} min(1, (m − j + 1)
    · p_(j))``; ties keep input order. NaN values are left out of ``m`` and stay NaN. With one
    p-value the result is that p-value. Written here because scipy has no Holm
    (``scipy.stats.false_discovery_control`` is Benjamini–Hochberg, which controls another error
    rate) and statsmodels is not a dependency.
    """
    p = [float(x) for x in pvalues]
    finite = [i for i, x in enumerate(p) if math.isfinite(x)]
    order = sorted(finite, key=lambda i: (p[i], i))
    out = [float("nan")] * len(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        out[i] = running
    return out


def compare_pair(p: Paired, metrics: Sequence[tuple[str, str]], *, n_boot: int, level: float,
                 rng: np.random.Generator, margin: float) -> dict[str, Any]:
    """Baseline A against arm B on their common pieces, for each ``(key, column)`` metric.

    ``rng`` draws, in this order: the group counts (``bootstrap_weights``), A's seed counts, and
    B's seed counts unless seeds are paired (then B reuses A's); an arm with one seed draws
    nothing, so with single-seed arms the replicates are the plain group bootstrap's. Per metric:
    ``baseline`` and ``arm`` (the ratio of sums with its interval), ``diff`` (``A − B``: value,
    interval, ``share_a_lower``), ``rel_improvement`` (``(A − B) / A`` formed inside each
    replicate; positive when B is better), ``p_value`` (:func:`bootstrap_p_value` of the
    difference) and ``equivalent`` (the relative improvement's whole interval lies within
    ``[−margin, margin]``). Each arm's own units divide its NLL, so the result holds when two
    arms count a piece's notes differently; with equal units it equals
    :func:`pipeline.stats.bootstrap.diff_summary` and
    :func:`pipeline.stats.bootstrap.rel_summary`.
    """
    g = p.n_groups
    ga = np.stack([group_sums(p.codes, s, g) for s in p.a.nll])  # (S_a, G)
    gb = np.stack([group_sums(p.codes, s, g) for s in p.b.nll])  # (S_b, G)
    group_w = bootstrap_weights(g, n_boot, rng)  # first: one seed == plain group bootstrap
    seed_a = seed_weights(len(ga), n_boot, rng)
    seed_b = seed_a if p.seed_pairing == "paired" else seed_weights(len(gb), n_boot, rng)
    rep_a = replicate_sums(group_w, ga, seed_a)
    rep_b = replicate_sums(group_w, gb, seed_b)
    total_a, total_b = float(ga.sum(axis=1).mean()), float(gb.sum(axis=1).mean())
    out: dict[str, Any] = {}
    for key, col in metrics:
        den_a = group_sums(p.codes, p.a.units[col], g)
        den_b = group_sums(p.codes, p.b.units[col], g)
        rd_a, rd_b = group_w @ den_a, group_w @ den_b
        ra = safe_ratio(np.asarray(total_a), np.asarray(den_a.sum()))
        rb = safe_ratio(np.asarray(total_b), np.asarray(den_b.sum()))
        reps_a, reps_b = safe_ratio(rep_a, rd_a), safe_ratio(rep_b, rd_b)
        d = reps_a - reps_b
        finite = d[np.isfinite(d)]
        rel = value_interval(safe_ratio(ra - rb, ra), safe_ratio(d, reps_a), level)
        out[key] = {
            "baseline": ratio_summary(total_a, float(den_a.sum()), rep_a, rd_a, level),
            "arm": ratio_summary(total_b, float(den_b.sum()), rep_b, rd_b, level),
            "diff": {**value_interval(ra - rb, d, level),
                     "share_a_lower": float(np.mean(finite < 0)) if finite.size else math.nan},
            "rel_improvement": rel,
            "p_value": bootstrap_p_value(d),
            "equivalent": bool(rel["ci_low"] >= -margin and rel["ci_high"] <= margin),
        }
    return out


def pair_summary(p: Paired) -> dict[str, Any]:
    """Counts and the median per-piece relative effect of a pair (no resampling)."""
    return {"n_pieces": p.n_pieces, "n_groups": p.n_groups,
            "n_seeds_baseline": p.a.n_seeds, "n_seeds_arm": p.b.n_seeds,
            "seed_pairing": p.seed_pairing,
            "median_piece_effect": median_piece_effect(p.a.nll.mean(axis=0),
                                                       p.b.nll.mean(axis=0))}


# ---- which parameters differ ----------------------------------------------------------------
def canonical(value: Any) -> str:
    """A value's canonical JSON (sorted keys, compact): how two leaves are compared."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def flatten_params(params: Mapping[str, Any],
                   ignore: Sequence[str] = IGNORED_SECTIONS) -> dict[str, Any]:
    """params.yaml as dotted keys (``transformer.train.max_steps``) -> leaf value.

    Mappings are descended; anything else (a list, a scalar, an empty mapping) is a leaf, compared
    whole through :func:`canonical`. Top-level sections in ``ignore`` are left out.
    """
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for k in sorted(node, key=str):
            v, key = node[k], f"{prefix}{k}"
            if isinstance(v, Mapping) and v:
                walk(v, key + ".")
            else:
                out[key] = v

    walk({k: v for k, v in params.items() if str(k) not in ignore}, "")
    return out


def params_diff(baseline: Mapping[str, Any], arm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Keys of two flattened param sets whose values differ, sorted: ``{key, baseline, arm,
    absent}`` where ``absent`` is ``"baseline"`` or ``"arm"`` for a key only one side has (its
    value there is None) and None otherwise."""
    rows = []
    for key in sorted(set(baseline) | set(arm)):
        in_a, in_b = key in baseline, key in arm
        if in_a and in_b and canonical(baseline[key]) == canonical(arm[key]):
            continue
        rows.append({"key": key, "baseline": baseline.get(key), "arm": arm.get(key),
                     "absent": None if in_a and in_b else ("arm" if in_a else "baseline")})
    return rows


def design_label(n_differ: int) -> Literal["identical", "controlled", "confounded"]:
    """``identical`` (no parameter differs), ``controlled`` (one) or ``confounded`` (several)."""
    return "identical" if n_differ == 0 else "controlled" if n_differ == 1 else "confounded"


PROTOCOL_KEYS = ("transformer_stride", "bootstrap")
"""eval.json ``protocol`` entries that change scores or their intervals, listed when they differ."""


def protocol_diff(baseline: Mapping[str, Any], arm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """:data:`PROTOCOL_KEYS` entries of two eval.json ``protocol`` blocks that differ, flattened
    and in :func:`params_diff`'s form (``bootstrap.n_boot``, ...)."""
    def pick(p: Mapping[str, Any]) -> dict[str, Any]:
        return flatten_params({k: p[k] for k in PROTOCOL_KEYS if k in p}, ignore=())

    return params_diff(pick(baseline), pick(arm))


def comparable_metrics(baseline: Mapping[str, Any], arm: Mapping[str, Any]
                       ) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The :data:`METRICS` two arms are compared on, given their eval.json ``protocol`` blocks,
    and those left out with the reason: per token only when both use the same tokenizer."""
    tok_a, tok_b = baseline.get("tokenizer_hash"), arm.get("tokenizer_hash")
    metrics = [m for m in METRICS if m[0] != "nats_per_token"]
    if tok_a and tok_a == tok_b:
        return [*metrics, ("nats_per_token", "n_tokens")], {}
    return metrics, {"nats_per_token": (
        f"tokenizer_hash differs ({str(tok_a)[:12]} vs {str(tok_b)[:12]}): token counts are "
        "not comparable across tokenizers; per note and per second are")}


def apply_holm(stats: Sequence[Mapping[str, dict[str, Any]]], alpha: float) -> None:
    """Add ``p_holm`` and ``significant`` (``p_holm ≤ alpha``) to every metric of every
    comparison, in place: per metric, Holm over the comparisons that report that metric."""
    keys = sorted({k for s in stats for k in s})
    for key in keys:
        blocks = [s[key] for s in stats if key in s]
        for block, adj in zip(blocks, holm([b["p_value"] for b in blocks]), strict=True):
            block["p_holm"] = adj
            block["significant"] = bool(math.isfinite(adj) and adj <= alpha)


def conclusion(block: Mapping[str, Any]) -> str:
    """A metric's conclusion once :func:`apply_holm` has run: ``arm_lower`` / ``arm_higher``
    (significant after Holm), else ``equivalent`` or ``inconclusive``."""
    if block["significant"]:
        return "arm_lower" if block["diff"]["value"] > 0 else "arm_higher"
    return "equivalent" if block["equivalent"] else "inconclusive"

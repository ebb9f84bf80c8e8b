"""Leakage audit of a split (run inside the ``split`` stage).

Checks, from the raw evidence rather than from the split's own bookkeeping:

- ``crossing_groups``: split groups (``group_id``) present in more than one split;
- ``crossing_metadata_groups``: metadata ``group`` labels whose kept pieces span splits;
- ``crossing_pairs``: dedupe's confirmed pairs whose kept ends lie in different splits.
  These three are 0 *by construction* (the split is a function of groups built from those labels
  and pairs): they are invariants the split stage asserts, reported as counts, not evidence;
- nearest-training-neighbour similarity of each test piece (exact shingle Jaccard, the measure
  dedupe uses), against the nearest *other test* piece for scale;
- ``independent``: the evidence. Each test and val piece is compared with *every* train piece,
  without dedupe's pairs or candidates, by the exhaustive near-copy search of
  :mod:`pipeline.similarity.neighbours`: a **near copy** is a train piece that meets one of
  dedupe's near rules (:class:`pipeline.similarity.rule.NearCopyRule`, read from dedupe's
  ``fingerprint.json``), within the audit's length caps on alignments. Within-train neighbours
  of *other* groups show how often the rule fires between pieces the split may separate;
- the same numbers for a plain seeded random split of the same pieces, for contrast
  (:class:`pipeline.similarity.splitters.PieceHashSplit`: each piece by a seeded hash of its
  sha256, so a piece keeps its side when pieces are added).

:func:`audit_passes` lays out the comparisons, :func:`audit` runs them (through a
:class:`PassRunner` such as :class:`pipeline.similarity.leakage_cache.AuditCache` when given)
and assembles the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from pipeline.core.arrays import isin
from pipeline.core.splits import SPLIT_NAMES, unit_hashes
from pipeline.similarity.neighbours import (
    CAPS,
    NEAREST_CONTAINMENT,
    NEAREST_JACCARD,
    LengthCaps,
    Melodies,
    Neighbours,
    ShingleMatrix,
    TokenStrings,
    neighbours,
    pair_record,
)
from pipeline.similarity.rule import NearCopyRule
from pipeline.similarity.splitters import PieceHashSplit

MAX_EXAMPLES = 10


def _sample(idx: np.ndarray, cap: int, u: np.ndarray) -> np.ndarray:
    """``idx`` when it has at most ``cap`` rows, else the ``cap`` rows of smallest ``u`` (a
    per-piece hash): a uniform sample that keeps its pieces when pieces are added, except those
    a new piece displaces. Sorted."""
    if idx.size <= cap:
        return idx
    return np.sort(idx[np.argsort(u[idx], kind="stable")[:cap]])


def _share(count: int, n: int) -> float | None:
    return round(float(count / n), 6) if n else None


@dataclass(frozen=True)
class AuditPass:
    """One comparison of the audit: each ``query`` row against every ``pool`` row, skipping the
    pairs whose pieces share ``exclude`` (None: none; "self": the piece itself; "group": its
    split group). ``align`` False: the shingle measures only."""

    name: str
    query: np.ndarray
    pool: np.ndarray
    exclude: str | None
    align: bool


def audit_passes(pieces: pd.DataFrame, seed: int, max_test: int) -> list[AuditPass]:
    """The audit's comparisons. ``pieces``: rows in sha256 order with ``split`` and ``random``.

    Test pieces of the grouped and the random split (every one, or a sample of ``max_test``)
    against train, and against the other test pieces for scale; val pieces against train; and
    train pieces against the train pieces of other groups. Samples are the pieces of smallest
    :func:`pipeline.core.splits.unit_hash` (seeded), so adding pieces leaves them in place
    except where a new piece enters."""
    sha = pieces["sha256"].tolist()
    u_test, u_val, u_train = (unit_hashes(seed, sha, f"audit-{s}") for s in SPLIT_NAMES[::-1])
    out = []
    for name, col in (("grouped", "split"), ("random", "random")):
        splits = pieces[col].to_numpy()
        train, test = np.flatnonzero(splits == "train"), np.flatnonzero(splits == "test")
        query = _sample(test, max_test, u_test)
        out += [AuditPass(f"{name}_test", query, train, None, True),
                AuditPass(f"{name}_test_test", query, test, "self", False)]
    splits = pieces["split"].to_numpy()
    train = np.flatnonzero(splits == "train")
    out += [AuditPass("val", _sample(np.flatnonzero(splits == "val"), max_test, u_val), train,
                      None, True),
            AuditPass("within_train", _sample(train, max_test, u_train), train, "group", True)]
    return out


def _independent(pieces: pd.DataFrame, found: dict[str, Neighbours], passes: dict[str, AuditPass],
                 sm: ShingleMatrix, mel: Melodies, tok: TokenStrings, rule: NearCopyRule,
                 caps: LengthCaps, max_test: int) -> dict:
    """The ``independent`` block of the report: near copies in train of held-out pieces, every
    test piece unless there are more than ``max_test`` (then the audit's sample); val pieces and
    train pieces (for within-train, other-group neighbours) are capped and sampled the same
    way."""
    out: dict = {
        "method": "each test/val piece vs every train piece, exhaustively, no dedupe pairs or "
                  "candidates: exact shingle Jaccard/containment (sparse incidence product), or "
                  "Indel similarity (rapidfuzz) of the whole note-token sequences or of the "
                  "top-voice interval sequences, for pieces under the length caps",
        "jaccard_threshold": rule.jaccard, "containment_threshold": rule.containment,
        "alignment_threshold": round(rule.alignment, 6), "min_shingles": rule.min_shingles,
        "alignment_min_onsets": rule.min_align_onsets,
        "alignment_max_tokens": caps.max_align_tokens,
        "melody_min_notes": rule.min_melody_notes, "melody_max_notes": caps.max_melody_notes,
        "max_pieces_per_split": max_test,
    }
    for name, col, key in (("test", "split", "grouped_test"), ("val", "split", "val"),
                           ("random", "random", "random_test")):
        rows = passes[key].query
        copies = found[key].near_copies(rule)
        n_all = int((pieces[col].to_numpy() == ("val" if name == "val" else "test")).sum())
        n_near = int(copies.near.sum())
        if name == "random":
            out["random_split"] = {"test_pieces": n_all, "test_measured": int(rows.size),
                                   "test_near_train": n_near,
                                   "test_near_train_share": _share(n_near, rows.size)}
            continue
        out.update({f"{name}_pieces": n_all, f"{name}_measured": int(rows.size),
                    f"{name}_near_train": n_near,
                    f"{name}_near_train_share": _share(n_near, rows.size)})
        if name == "test":
            too_short = ((sm.sizes[rows] < rule.min_shingles)
                         & (tok.onsets[rows] < rule.min_align_onsets)
                         & (mel.lengths[:, rows].max(axis=0) < rule.min_melody_notes - 1))
            out["test_near_train_by_shingles"] = int((copies.shingle_partner >= 0).sum())
            out["test_near_train_by_alignment"] = int((copies.alignment_partner >= 0).sum())
            out["test_near_train_by_melody"] = int((copies.melody_partner >= 0).sum())
            out["test_too_short_to_measure"] = int(too_short.sum())
            hits = np.flatnonzero(copies.near)
            records = sorted((pair_record(sm, mel, tok, int(rows[h]), int(copies.partner[h]),
                                          rule, caps) for h in hits),
                             key=lambda x: (x["test_sha256"], x["train_sha256"]))
            out["examples"] = records[:MAX_EXAMPLES]
    # how often the rule fires between train pieces the split may separate (other groups)
    copies = found["within_train"].near_copies(rule)
    n_near = int(copies.near.sum())
    out["within_train"] = {
        "pieces": int(passes["within_train"].pool.size),
        "measured": int(passes["within_train"].query.size),
        "near_other_group": n_near,
        "near_other_group_share": _share(n_near, passes["within_train"].query.size),
        "jaccard_max": round(float(copies.jaccard.max(initial=0.0)), 6),
        "alignment_max": round(float(copies.alignment.max(initial=0.0)), 6),
        "melody_max": round(float(copies.melody.max(initial=0.0)), 6),
    }
    return out


def crossing_counts(pieces: pd.DataFrame, pairs: pd.DataFrame, split_col: str = "split"
                    ) -> dict[str, int]:
    """Groups, metadata groups and confirmed pairs that span splits (all must be 0)."""
    out = {}
    if "group_id" in pieces:
        out["crossing_groups"] = int((pieces.groupby("group_id")[split_col].nunique() > 1).sum())
    labelled = pieces[pieces["group"] != ""]
    out["crossing_metadata_groups"] = int((labelled.groupby("group")[split_col].nunique() > 1)
                                          .sum())
    # lists first: iterating pandas' Arrow-backed strings costs about 1 us a value
    where = dict(zip(pieces["sha256"].tolist(), pieces[split_col].tolist(), strict=True))
    sa = pairs["a"].map(where)
    sb = pairs["b"].map(where)
    both = sa.notna() & sb.notna()
    out["crossing_pairs"] = int((both & (sa != sb)).sum())
    out["pairs_with_a_dropped_piece"] = int((~both).sum())
    return out


def partner_in_train(pieces: pd.DataFrame, pairs: pd.DataFrame, split_col: str) -> dict[str, int]:
    """Test pieces with a confirmed-pair partner, a dedupe cluster-mate or a metadata group-mate in
    train."""
    split = dict(zip(pieces["sha256"].tolist(), pieces[split_col].tolist(), strict=True))
    test = set(pieces.loc[pieces[split_col] == "test", "sha256"].tolist())
    hit: set[str] = set()
    for a, b in zip(pairs["a"], pairs["b"], strict=True):
        if a in test and split.get(b) == "train":
            hit.add(a)
        if b in test and split.get(a) == "train":
            hit.add(b)
    out = {"test_with_pair_in_train": len(hit)}
    for col, name in (("cluster_id", "cluster"), ("group", "metadata_group")):
        train_keys = set(pieces.loc[pieces[split_col] == "train", col].tolist()) - {""}
        is_test = pieces[split_col] == "test"
        out[f"test_with_{name}_mate_in_train"] = int(isin(pieces.loc[is_test, col],
                                                          train_keys).sum())
    return out


Measure = Callable[[AuditPass, np.ndarray, np.ndarray], Neighbours]
"""``measure(audit_pass, query, pool)``: the pass's measures of rows ``query`` over rows
``pool``."""


class PassRunner(Protocol):
    def run(self, sha256: np.ndarray, group_id: np.ndarray, passes: list[AuditPass],
            measure: Measure) -> dict[str, Neighbours]: ...


def audit(pieces: pd.DataFrame, pairs: pd.DataFrame, sm: ShingleMatrix, mel: Melodies,
          tok: TokenStrings, *, seed: int, ratios: tuple[float, float, float], max_test: int,
          rule: NearCopyRule, caps: LengthCaps = CAPS, workers: int = 1,
          cache: PassRunner | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """Leakage metrics, and the curves the figure draws: label -> each audited test piece's
    exact shingle Jaccard with its nearest neighbour (the split stage draws them).

    ``pieces``: one row per kept piece in ``sm`` order with ``sha256``, ``split``, ``group_id``,
    ``group`` (metadata label, "" if none) and ``cluster_id``. ``pairs``: dedupe's pairs (used
    for the crossing counts and the ``*_with_pair_in_train`` counts only, never by
    ``independent``). ``workers``: threads for the alignments. ``cache``
    (:class:`pipeline.similarity.leakage_cache.AuditCache`): runs the passes from an earlier run's
    results, comparing them only with what changed. Neither changes the result.
    """
    shas = pieces["sha256"].tolist()
    if any(shas != list(x.sha256) for x in (sm, mel, tok)):
        raise ValueError("audit: pieces, shingle matrix, melodies and token strings must list "
                         "the same sha256 in order")
    pieces = pieces.assign(random=PieceHashSplit(ratios, seed).assign(shas))
    report: dict = {}
    for name, col in (("grouped", "split"), ("random", "random")):
        counts = crossing_counts(pieces, pairs, col)
        if name == "random":
            counts.pop("crossing_groups", None)
        report.update({f"{name}_{k}": v for k, v in counts.items()})
        report.update({f"{name}_{k}": v for k, v in partner_in_train(pieces, pairs, col).items()})

    passes = audit_passes(pieces, seed, max_test)
    group_id = pieces["group_id"].to_numpy().astype(str)
    codes = {"self": np.arange(len(pieces)), "group": np.unique(group_id, return_inverse=True)[1]}

    def measure(p: AuditPass, query: np.ndarray, pool: np.ndarray) -> Neighbours:
        return neighbours(sm, mel, tok, query, pool, rule, caps=caps,
                          groups=codes.get(p.exclude), workers=workers, align=p.align)

    if cache is not None:
        found = cache.run(np.asarray(shas, dtype=object), group_id, passes, measure)
    else:
        found = {p.name: measure(p, p.query, p.pool) for p in passes}

    curves = {}
    for name in ("grouped", "random"):
        train = found[f"{name}_test"].values
        j_train, c_train = train[:, NEAREST_JACCARD], train[:, NEAREST_CONTAINMENT]
        j_test = found[f"{name}_test_test"].values[:, NEAREST_JACCARD]
        near = (j_train >= rule.jaccard) | (c_train >= rule.containment)
        report[f"{name}_test_audited"] = int(j_train.size)
        report[f"{name}_test_near_duplicate_in_train"] = int(near.sum())
        for label, v in (("nearest_train", j_train), ("nearest_test", j_test)):
            report[f"{name}_{label}_jaccard_mean"] = float(v.mean()) if v.size else None
            report[f"{name}_{label}_jaccard_median"] = float(np.median(v)) if v.size else None
            report[f"{name}_{label}_jaccard_max"] = float(v.max()) if v.size else None
        curves[f"{name}: test → nearest train"] = j_train
        if name == "grouped":
            curves["grouped: test → nearest other test"] = j_test
    report = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in report.items()}
    report["independent"] = _independent(pieces, found, {p.name: p for p in passes}, sm, mel,
                                         tok, rule, caps, max_test)
    return report, curves

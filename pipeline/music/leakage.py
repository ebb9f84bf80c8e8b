"""Leakage audit of a split (run inside the ``split`` stage).

Checks, from the raw evidence rather than from the split's own bookkeeping:

- ``crossing_groups``: split groups (``group_id``) present in more than one split — must be 0;
- ``crossing_metadata_groups``: metadata ``group`` labels whose kept pieces span splits — must be 0;
- ``crossing_pairs``: dedupe's confirmed pairs whose kept ends lie in different splits — must be 0;
- nearest-training-neighbour similarity of each test piece (exact shingle Jaccard, the measure
  dedupe uses), against the nearest *other test* piece for scale;
- the same numbers for a plain seeded random split of the same pieces, for contrast.

Similarity is exact: pieces are rows of a sparse piece × shingle incidence matrix and one sparse
product gives every intersection size, processed in blocks of test rows to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.sparse import csr_array

from pipeline.core.splits import SPLIT_NAMES
from pipeline.music import fingerprints as fp
from pipeline.report.figures import histograms_png

BLOCK_ROWS = 256


@dataclass(frozen=True)
class ShingleMatrix:
    """Rows = pieces (in ``sha256`` order), columns = distinct shingles, values 1."""

    sha256: np.ndarray
    matrix: csr_array
    sizes: np.ndarray  # distinct shingles per piece

    @classmethod
    def build(cls, notes: fp.NoteArrays, k: int, ioi_resolution: int) -> ShingleMatrix:
        offsets, values = fp.shingles(notes, k, ioi_resolution)
        _, column = np.unique(values, return_inverse=True)
        n_cols = int(column.max()) + 1 if column.size else 0
        m = csr_array((np.ones(column.size, dtype=np.float32), column.astype(np.int64), offsets),
                      shape=(notes.n_pieces, n_cols))
        return cls(notes.sha256, m, np.diff(offsets))


def nearest(sm: ShingleMatrix, query: np.ndarray, pool: np.ndarray, exclude_self: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """For each query row, the highest exact Jaccard and containment against any ``pool`` row.

    Returns zeros where the pool is empty or nothing is shared; ``exclude_self`` ignores a
    query's own row when it is also in the pool.
    """
    best_j = np.zeros(query.size)
    best_c = np.zeros(query.size)
    if query.size == 0 or pool.size == 0:
        return best_j, best_c
    pool_t = sm.matrix[pool].T.tocsc()
    pool_sizes = sm.sizes[pool].astype(np.float64)
    for start in range(0, query.size, BLOCK_ROWS):
        rows = query[start : start + BLOCK_ROWS]
        inter = (sm.matrix[rows] @ pool_t).tocoo()
        r, c, v = inter.row, inter.col, inter.data.astype(np.float64)
        if exclude_self:
            mine = rows[r] == pool[c]
            r, c, v = r[~mine], c[~mine], v[~mine]
        qs = sm.sizes[rows][r].astype(np.float64)
        ps = pool_sizes[c]
        jac = v / np.maximum(qs + ps - v, 1.0)
        con = v / np.maximum(np.minimum(qs, ps), 1.0)
        np.maximum.at(best_j, start + r, jac)
        np.maximum.at(best_c, start + r, con)
    return best_j, best_c


def crossing_counts(pieces: pd.DataFrame, pairs: pd.DataFrame, split_col: str = "split"
                    ) -> dict[str, int]:
    """Groups, metadata groups and confirmed pairs that span splits (all must be 0)."""
    out = {}
    if "group_id" in pieces:
        out["crossing_groups"] = int((pieces.groupby("group_id")[split_col].nunique() > 1).sum())
    labelled = pieces[pieces["group"] != ""]
    out["crossing_metadata_groups"] = int((labelled.groupby("group")[split_col].nunique() > 1)
                                          .sum())
    where = dict(zip(pieces["sha256"], pieces[split_col], strict=True))
    sa = pairs["a"].map(where)
    sb = pairs["b"].map(where)
    both = sa.notna() & sb.notna()
    out["crossing_pairs"] = int((both & (sa != sb)).sum())
    out["pairs_with_a_dropped_piece"] = int((~both).sum())
    return out


def partner_in_train(pieces: pd.DataFrame, pairs: pd.DataFrame, split_col: str) -> dict[str, int]:
    """Test pieces with a confirmed-pair partner, a dedupe cluster-mate or a metadata group-mate in
    train."""
    split = dict(zip(pieces["sha256"], pieces[split_col], strict=True))
    test = set(pieces.loc[pieces[split_col] == "test", "sha256"])
    hit: set[str] = set()
    for a, b in zip(pairs["a"], pairs["b"], strict=True):
        if a in test and split.get(b) == "train":
            hit.add(a)
        if b in test and split.get(a) == "train":
            hit.add(b)
    out = {"test_with_pair_in_train": len(hit)}
    for col, name in (("cluster_id", "cluster"), ("group", "metadata_group")):
        train_keys = set(pieces.loc[pieces[split_col] == "train", col]) - {""}
        is_test = pieces[split_col] == "test"
        out[f"test_with_{name}_mate_in_train"] = int(pieces.loc[is_test, col]
                                                     .isin(train_keys).sum())
    return out


def random_split(n: int, ratios: tuple[float, float, float], seed: int) -> np.ndarray:
    """Plain per-piece random split (the leaky baseline), seeded."""
    u = np.random.default_rng(seed).random(n)
    cut = np.cumsum(ratios)
    return np.asarray(SPLIT_NAMES, dtype=object)[np.searchsorted(cut[:-1], u, side="right")]


def audit(pieces: pd.DataFrame, pairs: pd.DataFrame, sm: ShingleMatrix, *, seed: int,
          ratios: tuple[float, float, float], max_test: int, near_jaccard: float,
          near_containment: float) -> tuple[dict, bytes]:
    """Leakage metrics and the figure (PNG bytes).

    ``pieces``: one row per kept piece in ``sm`` order with ``sha256``, ``split``, ``group_id``,
    ``group`` (metadata label, "" if none) and ``cluster_id``. ``pairs``: dedupe's pairs.
    """
    if list(pieces["sha256"]) != list(sm.sha256):
        raise ValueError("audit: pieces and shingle matrix rows must list the same sha256 in order")
    rng = np.random.default_rng(seed)
    pieces = pieces.assign(random=random_split(len(pieces), ratios, seed + 1))
    report: dict = {}
    curves = {}
    for name, col in (("grouped", "split"), ("random", "random")):
        counts = crossing_counts(pieces, pairs, col)
        if name == "random":
            counts.pop("crossing_groups", None)
        report.update({f"{name}_{k}": v for k, v in counts.items()})
        report.update({f"{name}_{k}": v for k, v in partner_in_train(pieces, pairs, col).items()})
        splits = pieces[col].to_numpy()
        test = np.flatnonzero(splits == "test")
        if test.size > max_test:
            test = np.sort(rng.choice(test, size=max_test, replace=False))
        train = np.flatnonzero(splits == "train")
        all_test = np.flatnonzero(splits == "test")
        j_train, c_train = nearest(sm, test, train)
        j_test, _ = nearest(sm, test, all_test, exclude_self=True)
        near = (j_train >= near_jaccard) | (c_train >= near_containment)
        report[f"{name}_test_audited"] = int(test.size)
        report[f"{name}_test_near_duplicate_in_train"] = int(near.sum())
        for label, v in (("nearest_train", j_train), ("nearest_test", j_test)):
            report[f"{name}_{label}_jaccard_mean"] = float(v.mean()) if v.size else None
            report[f"{name}_{label}_jaccard_median"] = float(np.median(v)) if v.size else None
            report[f"{name}_{label}_jaccard_max"] = float(v.max()) if v.size else None
        curves[f"{name}: test → nearest train"] = j_train
        if name == "grouped":
            curves["grouped: test → nearest other test"] = j_test
    report = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in report.items()}
    png = histograms_png(curves, xlabel="exact shingle Jaccard of the nearest neighbour",
                         title="Leakage: similarity of test pieces to their nearest neighbour")
    return report, png

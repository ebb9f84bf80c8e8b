"""Per-piece scores: each sequence's summed NLL (checked against the protocol's target count),
summed per piece with the facts the aggregates divide by, and pieces whose facts do not match."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.inference.pieces import (
    PER_PIECE_SCHEMA,
    match_facts,
    piece_facts,
    piece_table,
    score_rows,
)


class Fixed:
    """A model giving each target the NLL 0.1 × (its position + 1); ``short`` drops one."""

    def __init__(self, short: bool = False):
        self.short, self.conds = short, []

    def token_nll(self, seqs, conds=None):
        self.conds.append(conds)
        out = [0.1 * np.arange(1, len(s) + 2) for s in seqs]
        if self.short:
            out[-1] = out[-1][:-1]
        return out


def test_score_rows_sums_each_sequence_and_checks_the_target_count():
    seqs = [np.array([3, 4]), np.array([], dtype=np.int64), np.array([5] * 9)]
    model = Fixed()
    got = score_rows(model, seqs)
    assert got.dtype == np.float64
    assert got.tolist() == [math.fsum(0.1 * np.arange(1, n + 2)) for n in (2, 0, 9)]
    conds = np.array([[1], [2], [3]])
    score_rows(model, seqs, conds)
    assert model.conds[0] is None and model.conds[1] is conds
    with pytest.raises(ValueError, match=r"Fixed\.token_nll returned 9 values for a sequence "
                                         r"of 9 tokens \(row 2\); the protocol needs len \+ 1"):
        score_rows(Fixed(short=True), seqs)


def _facts() -> pd.DataFrame:
    return pd.DataFrame({"sha256": ["a", "b"], "split": ["val", "test"], "group_id": ["g1", "g2"],
                         "n_notes": [10, 20], "duration_s": [5.0, 8.0]})


def test_piece_table_sums_the_rows_of_each_piece():
    rows = pd.DataFrame({"sha256": ["b", "a", "b", "z"],
                         "ids": [[3, 4], [5], [6, 7, 8], [9]]})  # z: no facts, left out
    out = piece_table(rows, np.array([1.0, 2.0, 3.0, 4.0]), _facts(), "ngram")
    assert list(out.columns) == PER_PIECE_SCHEMA.names
    assert out["sha256"].tolist() == ["a", "b"]
    assert out["nll_nats"].tolist() == [2.0, 4.0] and out["n_tokens"].tolist() == [2, 7]
    assert out["model"].tolist() == ["ngram"] * 2 and out["seed"].isna().all()
    assert out["n_notes"].dtype == np.int64 and out["split"].tolist() == ["val", "test"]
    pa.Table.from_pandas(out, schema=PER_PIECE_SCHEMA, preserve_index=False)  # fits the schema
    seeded = piece_table(rows, np.ones(4), _facts(), "transformer", seed=7)
    assert seeded["seed"].tolist() == [7, 7]


def test_piece_facts_prefer_the_ok_manifest_row():
    manifest = pd.DataFrame({"sha256": ["a", "a", "b"], "status": ["quarantined", "ok", "ok"],
                             "n_notes": [0, 12, 30], "duration_s": [0.0, 6.0, 9.0]})
    splits = pd.DataFrame({"sha256": ["a", "b", "c"], "split": ["val", "test", "val"],
                           "group_id": [1, 2, 3]})
    facts = piece_facts(manifest, splits)
    assert facts["sha256"].tolist() == ["a", "b", "c"]
    assert facts["n_notes"].tolist()[:2] == [12, 30] and np.isnan(facts["n_notes"].iloc[2])
    assert facts["group_id"].tolist() == ["1", "2", "3"]


def test_match_facts_keeps_rows_whose_piece_agrees_and_names_the_others():
    facts = pd.DataFrame({"sha256": ["a", "b", "c"], "split": ["val", "val", "test"],
                          "group_id": ["g"] * 3, "n_notes": [1.0, 2.0, np.nan],
                          "duration_s": [1.0, 2.0, 3.0]})
    rows = pd.DataFrame({"sha256": ["a", "b", "c", "d", "a"],
                         "split": ["val", "test", "test", "val", "val"], "track": range(5)})
    keep, bad = match_facts(rows, facts)
    assert keep["track"].tolist() == [0, 4] and list(keep.index) == [0, 1]
    assert bad == [{"sha256": "b", "reason": "split_mismatch"},
                   {"sha256": "c", "reason": "not_in_manifest"},
                   {"sha256": "d", "reason": "not_in_splits"}]

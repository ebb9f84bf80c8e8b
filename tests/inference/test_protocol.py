"""The scoring protocol's token rules: special ids are never targets, and a piece not encoded or
holding an id outside the vocabulary is excluded whole and counted."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.inference.protocol import clean_sequences
from pipeline.tokens.contract import TokenInfo

INFO = TokenInfo(vocab_size=10, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t",
                 split_hash="s")


def _rows(*rows: tuple[str, int, list[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"sha256": s, "split": "val", "track": t, "ids": ids}
                         for s, t, ids in rows])


def test_special_ids_are_removed_and_counted():
    out, excluded = clean_sequences(_rows(("a", 0, [3, 1, 4, 2]), ("b", 0, [5, 0, 0]),
                                          ("c", 0, [6, 7])), INFO)
    assert [x.tolist() for x in out["ids"]] == [[3, 4], [5], [6, 7]]
    assert all(x.dtype == np.int64 for x in out["ids"])
    assert excluded == {"pieces": [], "special_ids_removed": 4, "rows_with_special_ids": 2}


def test_a_bad_row_excludes_its_whole_piece():
    rows = _rows(("b", 0, [3, 4]), ("b", 1, [5, 10]),  # one track out of range: piece b goes
                 ("a", -1, []),  # the tokenizer's placeholder for a piece it could not encode
                 ("c", -1, [3, 4]),  # a single-stream tokenizer's real row
                 ("d", 0, [-1, 3]), ("e", 0, []))
    out, excluded = clean_sequences(rows, INFO)
    assert list(out["sha256"]) == ["c", "e"] and list(out.index) == [0, 1]
    assert excluded["pieces"] == [{"sha256": "a", "reason": "not_encoded"},
                                  {"sha256": "b", "reason": "id_out_of_range"},
                                  {"sha256": "d", "reason": "id_out_of_range"}]
    assert list(out.columns) == list(rows.columns)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 12), max_size=12), min_size=1, max_size=8))
def test_kept_rows_hold_only_ordinary_ids_of_the_vocabulary(ids):
    rows = _rows(*[(f"p{i}", 0, x) for i, x in enumerate(ids)])
    out, excluded = clean_sequences(rows, INFO)
    gone = {p["sha256"] for p in excluded["pieces"]}
    assert set(out["sha256"]) | gone == set(rows["sha256"]) and not set(out["sha256"]) & gone
    for seq in out["ids"]:
        assert all(3 <= v < 10 for v in seq.tolist())
    kept = rows[rows["sha256"].isin(out["sha256"])]
    assert [len(x) for x in out["ids"]] == [sum(v > 2 for v in x) for x in kept["ids"]]

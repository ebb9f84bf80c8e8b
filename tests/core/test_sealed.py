"""pipeline.core.sealed: the raw reader of test rows (only pipeline.decision.looks imports it,
tests/test_layers.py shows the contract that says so)."""

from __future__ import annotations

import pandas as pd

from pipeline.core.artifacts import write_parquet
from pipeline.core.sealed import read_test_tokens, select_test


def test_only_test_rows_come_back_sorted_by_piece_and_track(tmp_path):
    table = pd.DataFrame({"sha256": ["c", "a", "b", "a"], "split": ["test", "test", "val", "test"],
                          "track": [0, 1, 0, 0], "ids": [[1], [2], [3], [4]]})
    rows = select_test(table)
    assert list(zip(rows["sha256"], rows["track"], strict=True)) == [("a", 0), ("a", 1), ("c", 0)]
    write_parquet(tmp_path / "t.parquet", table)
    assert read_test_tokens(tmp_path / "t.parquet", ["sha256", "split"])["sha256"].tolist() == [
        "a", "a", "c"]

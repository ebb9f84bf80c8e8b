"""What several report sections share (pipeline.report.sections.common): a stage report's values
as rows, folded away or said to be missing, and value counts as table rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.render.document import NA, Details, Document, Para, Table
from pipeline.report.sections.common import count_rows, kv_block, kv_rows, not_available


def test_kv_rows_flatten_under_the_prefix_format_and_stop_at_the_limit():
    obj = {"b": {"y": 2.123456, "x": True}, "a": 1}
    assert kv_rows(obj, "s", 3) == [["s.a", "1"], ["s.b.x", "true"], ["s.b.y", "2.12"]]
    assert kv_rows(obj, "s", 3, limit=1) == [["s.a", "1"]]
    assert kv_rows(None, "s", 3) == []


def test_kv_block_folds_every_value_or_says_the_report_is_missing():
    block = kv_block({"pieces": 30, "groups": {"test": 5}}, "split", 4)
    assert isinstance(block, Details)
    assert block.summary == "Every value in reports/split.json (2)"
    (table,) = block.blocks
    assert isinstance(table, Table) and table.rows == [["split.groups.test", "5"],
                                                       ["split.pieces", "30"]]
    for missing in (None, {}):
        assert kv_block(missing, "split", 4) == Para(f"reports/split.json: {NA}.", "note")


def test_count_rows_are_sorted_with_missing_values_counted_as_none():
    df = pd.DataFrame({"reason": ["b", None, "a", "b", np.nan, ""]})
    assert count_rows(df, "reason") == [["(none)", "3"], ["a", "1"], ["b", "2"]]
    assert count_rows(df, "other") == [] and count_rows(None, "reason") == []


def test_not_available_adds_one_note():
    doc = Document("t")
    not_available(doc, "data/x.parquet")
    assert doc.blocks == [Para(f"data/x.parquet: {NA}.", "note")]

"""Streamed Parquet outputs (``pipeline.core.artifacts.table_writer``)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.artifacts import table_writer, write_parquet

SCHEMA = pa.schema([("k", pa.int64()), ("ids", pa.list_(pa.int32()))])


def rows(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 300, rng.integers(0, 40)).astype(np.int32).tolist() for _ in range(n)]
    return pa.table({"k": np.arange(n), "ids": ids}, schema=SCHEMA)


@pytest.mark.parametrize("cuts", [[], [1], [3, 4, 10], list(range(1, 23))])
def test_bytes_depend_only_on_the_rows(tmp_path, cuts):
    """However the rows are put, the file holds row groups of exactly 5 rows and the same
    bytes; a table of at most one group's rows is what write_parquet writes."""
    table = rows(23)
    bounds = [0, *cuts, table.num_rows]
    with table_writer(tmp_path / "t.parquet", SCHEMA, 5) as put:
        for a, b in itertools.pairwise(bounds):
            put(table.slice(a, b - a))
    with table_writer(tmp_path / "one.parquet", SCHEMA, 5) as put:
        put(table)
    assert (tmp_path / "t.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()
    meta = pq.read_metadata(tmp_path / "t.parquet")
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [5, 5, 5, 5, 3]
    assert pq.read_table(tmp_path / "t.parquet").equals(table)
    small = table.slice(0, 5)
    write_parquet(tmp_path / "plain.parquet", small)
    with table_writer(tmp_path / "small.parquet", SCHEMA, 5) as put:
        put(small.slice(0, 2))
        put(small.slice(2))
    assert (tmp_path / "small.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()


def test_empty_and_exact_tables(tmp_path):
    with table_writer(tmp_path / "empty.parquet", SCHEMA, 5):
        pass
    assert pq.read_metadata(tmp_path / "empty.parquet").num_row_groups == 1
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    with table_writer(tmp_path / "ten.parquet", SCHEMA, 5) as put:
        put(rows(10))
    assert pq.read_metadata(tmp_path / "ten.parquet").num_row_groups == 2  # no empty third


def test_a_failed_write_leaves_nothing(tmp_path):
    """An error in the caller's block, or in encoding a row group (in the writer's thread),
    leaves neither the file nor a temporary one."""
    with pytest.raises(RuntimeError, match="stopped"), \
            table_writer(tmp_path / "a.parquet", SCHEMA, 5) as put:
        put(rows(12))
        raise RuntimeError("stopped")
    wrong = pa.table({"k": ["x"] * 5, "ids": [[1]] * 5})  # a whole group: the thread refuses it
    with pytest.raises(ValueError, match="schema"), \
            table_writer(tmp_path / "b.parquet", SCHEMA, 5) as put:
        put(wrong)
    assert list(tmp_path.iterdir()) == []


def test_bytes_do_not_follow_the_chunks_where_a_dictionary_falls_back(tmp_path):
    """Over a megabyte of distinct floats per row group: the dictionary falls back to plain
    encoding part way through the column, at a point that followed the chunks the rows came
    in until each group was written as one chunk."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 150, 3000)
    values = pa.array(rng.random(int(lengths.sum())))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    table = pa.table({"k": np.arange(3000), "x": pa.ListArray.from_arrays(offsets, values)})
    written = []
    for step in (3000, 64, 7):
        path = tmp_path / f"{step}.parquet"
        with table_writer(path, table.schema, 2048) as put:
            for lo in range(0, table.num_rows, step):
                put(table.slice(lo, step))
        written.append(path.read_bytes())
        whole = tmp_path / f"whole{step}.parquet"
        write_parquet(whole, pa.concat_tables([table.slice(lo, step)
                                               for lo in range(0, table.num_rows, step)]))
        written.append(whole.read_bytes())
    assert written[0] == written[2] == written[4]
    assert written[1] == written[3] == written[5]

"""pipeline.core.row_groups: row groups read on demand, each once in order, held within a limit,
least recently used let go first."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core import row_groups
from pipeline.core.row_groups import RowGroups


def write(path: Path, n: int, size: int = 10, offset: int = 0) -> Path:
    table = pa.table({"x": list(range(offset, offset + n)),
                      "y": [f"r{i}" for i in range(offset, offset + n)]})
    pq.write_table(table, path, row_group_size=size)
    return path


def test_each_row_is_found_in_its_group(tmp_path: Path):
    path = write(tmp_path / "a.parquet", 35)
    rg = RowGroups()
    for row in (0, 9, 10, 23, 34):
        table, at = rg.row(path, row, ["x"])
        assert table.column_names == ["x"] and at == row % 10
        assert table["x"][at].as_py() == row
    for row in (35, -1):
        with pytest.raises(IndexError, match=f"row {row} is not in a.parquet"):
            rg.row(path, row, ["x"])


def test_rows_in_order_read_each_group_once(tmp_path: Path, row_group_reads):
    path = write(tmp_path / "a.parquet", 35)
    rg = RowGroups()
    converted = []
    for row in range(35):
        value, at = rg.row(path, row, ["x", "y"],
                           convert=lambda t: converted.append(1) or t.to_pydict())
        assert value["y"][at] == f"r{row}"
    assert row_group_reads == [0, 1, 2, 3] and len(converted) == 4
    rg.row(path, 3, ["x"])  # other columns are another entry
    assert row_group_reads == [0, 1, 2, 3, 0]


def test_past_the_limit_the_least_recently_used_group_is_let_go(tmp_path: Path, monkeypatch,
                                                                row_group_reads):
    path = write(tmp_path / "a.parquet", 30)
    rg = RowGroups()
    nbytes = rg.row(path, 0, ["x"])[0].nbytes
    monkeypatch.setattr(row_groups, "HELD_BYTES", 2 * nbytes)  # two groups at most
    rg.row(path, 10, ["x"])
    rg.row(path, 0, ["x"])  # group 0 used last: group 1 goes first
    rg.row(path, 20, ["x"])
    row_group_reads.clear()
    rg.row(path, 5, ["x"])
    rg.row(path, 25, ["x"])
    assert row_group_reads == []
    rg.row(path, 15, ["x"])
    assert row_group_reads == [1]
    monkeypatch.setattr(row_groups, "HELD_BYTES", 1)  # below one group: still holds the last
    rg.clear()
    row_group_reads.clear()
    rg.row(path, 16, ["x"])
    rg.row(path, 17, ["x"])
    assert row_group_reads == [1]


def test_a_held_value_stands_for_its_group_until_cleared(tmp_path: Path, row_group_reads):
    path = write(tmp_path / "a.parquet", 20)
    rg = RowGroups()
    rg.hold(path, 1, ["x"], "read elsewhere", 8)
    assert rg.row(path, 12, ["x"]) == ("read elsewhere", 2) and row_group_reads == []
    rg.hold(path, 1, ["x"], "replaced", 8)
    assert rg.row(path, 12, ["x"])[0] == "replaced"
    rg.clear()
    table, at = rg.row(path, 12, ["x"])
    assert table["x"][at].as_py() == 12 and row_group_reads == [1]


def test_more_files_than_kept_open_still_read_right(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(row_groups, "OPEN_FILES", 1)
    paths = [write(tmp_path / f"f{k}.parquet", 20, size=5, offset=100 * k) for k in range(3)]
    rg = RowGroups()
    for _ in range(2):
        for k, path in enumerate(paths):
            for row in (0, 7, 19):
                table, at = rg.row(path, row, ["x"])
                assert table["x"][at].as_py() == 100 * k + row

"""pipeline.core.segments: the append-only Parquet store behind the per-item caches."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.core.segments import SegmentStore, StoreChanged, list_column

SCHEMA = pa.schema([("key", pa.string()), ("value", pa.int64())])


def rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table({"key": [k for k, _ in pairs], "value": [v for _, v in pairs]},
                    schema=SCHEMA)


def values(store: SegmentStore, keys: set[str]) -> dict[str, int]:
    t = store.lookup(keys)
    return dict(zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True))


def test_add_lookup_and_reopen(tmp_path):
    store = SegmentStore(tmp_path / "s", SCHEMA, "key", max_segments=8)
    store.add(rows(("a", 1), ("b", 2)))
    store.add(rows(("c", 3)))
    store.add(rows())  # nothing new: no segment
    assert len(store.segments) == 2
    assert values(store, {"a", "c"}) == {"a": 1, "c": 3}  # what it added, without reopening
    again = SegmentStore(tmp_path / "s", SCHEMA, "key")
    assert set(again.keys) == {"a", "b", "c"}
    assert values(again, {"a", "c", "zz"}) == {"a": 1, "c": 3}
    assert again.lookup(set()).schema == SCHEMA


def test_appending_streams_one_segment_or_none(tmp_path):
    streamed = SegmentStore(tmp_path / "streamed", SCHEMA, "key")
    with streamed.appending() as put:
        put(rows(("a", 1), ("b", 2)))
        put(rows())
        put(rows(("c", 3)))
        assert streamed.segments == []  # not in place before the block ends
    whole = SegmentStore(tmp_path / "whole", SCHEMA, "key")
    whole.add(rows(("a", 1), ("b", 2), ("c", 3)))
    assert [p.name for p in streamed.segments] == [p.name for p in whole.segments]
    assert values(SegmentStore(tmp_path / "streamed", SCHEMA, "key"), {"a", "b", "c"}) == {
        "a": 1, "b": 2, "c": 3}
    with pytest.raises(RuntimeError), streamed.appending() as put:  # an error: nothing kept
        put(rows(("d", 4)))
        raise RuntimeError("killed")
    assert sorted(p.name for p in (tmp_path / "streamed").iterdir()) == [
        p.name for p in streamed.segments]
    assert "d" not in streamed.keys


def test_rows_put_in_small_chunks_go_in_full_row_groups(tmp_path, monkeypatch):
    """Chunks of 3 rows with row groups of 4: groups of 4, 4 and the last 2 rows, all in order
    and all found."""
    import pipeline.core.segments as segments

    monkeypatch.setattr(segments, "SEGMENT_ROWS", 4)
    store = SegmentStore(tmp_path / "s", SCHEMA, "key")
    with store.appending() as put:
        for k in range(0, 9, 3):
            put(rows(*((f"k{i}", i) for i in range(k, k + 3))))
        put(rows(("k9", 9)))
    meta = pq.read_metadata(store.segments[0])
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [4, 4, 2]
    assert values(store, {f"k{i}" for i in range(10)}) == {f"k{i}": i for i in range(10)}
    assert pq.read_table(store.segments[0])["key"].to_pylist() == [f"k{i}" for i in range(10)]


def test_merge_keeps_one_row_per_key(tmp_path):
    store = SegmentStore(tmp_path, SCHEMA, "key", max_segments=2)
    for k in ("a", "b", "c"):
        store.add(rows((k, ord(k)), ("a", ord("a"))))
    assert len(store.segments) == 1 and len(list(tmp_path.glob("seg-*.parquet"))) == 1
    merged = pq.read_table(store.segments[0])
    assert merged["key"].to_pylist() == ["a", "b", "c"]
    assert values(store, {"a", "b", "c"}) == {"a": 97, "b": 98, "c": 99}  # keys follow the merge


def test_unreadable_or_foreign_segments_are_ignored(tmp_path):
    store = SegmentStore(tmp_path, SCHEMA, "key")
    store.add(rows(("a", 1)))
    (tmp_path / "seg-broken.parquet").write_bytes(b"PAR1 not really")
    pq.write_table(pa.table({"key": ["b"], "other": [2.0]}), tmp_path / "seg-foreign.parquet")
    again = SegmentStore(tmp_path, SCHEMA, "key")
    assert set(again.keys) == {"a"}
    store.segments[0].unlink()  # a segment vanishes after listing: its keys are just missing
    assert values(again, {"a"}) == {}


def test_fill_measures_each_new_key_once_and_keeps_the_order(tmp_path):
    store = SegmentStore(tmp_path, SCHEMA, "key")
    store.add(rows(("b", 20)))
    calls = []

    def measure(new: list[str], first) -> pa.Table:
        calls.append((new, first.tolist()))
        return rows(*((k, 10 * (ord(k) - ord("a") + 1)) for k in new))

    table, new = store.fill(["c", "b", "a", "c"], measure)
    assert table["key"].to_pylist() == ["c", "b", "a", "c"]
    assert table["value"].to_pylist() == [30, 20, 10, 30]
    assert new == ["c", "a"] and calls == [(["c", "a"], [0, 2])]
    table, new = SegmentStore(tmp_path, SCHEMA, "key").fill(["a", "c"], measure)
    assert table["value"].to_pylist() == [10, 30] and new == [] and len(calls) == 1


def test_take_reads_rows_in_any_order_a_row_group_at_a_time(tmp_path, monkeypatch,
                                                             row_group_reads):
    """Rows come back in the order asked, across segments, from row groups of 3 rows; asked
    in stored order each row group is read once; with room for one row group, still right."""
    import pipeline.core.row_groups as row_groups
    import pipeline.core.segments as segments

    monkeypatch.setattr(segments, "SEGMENT_ROWS", 3)
    store = SegmentStore(tmp_path, SCHEMA, "key")
    store.add(rows(*((f"k{i:02d}", i) for i in range(0, 20, 2))))
    store.add(rows(*((f"k{i:02d}", i) for i in range(1, 20, 2))))
    assert pq.read_metadata(store.segments[0]).num_row_groups == 4
    reads = row_group_reads
    reads.clear()
    ordered = sorted(store.keys)
    t = store.take(ordered, ["value"])
    assert t.schema.names == ["value"] and t["value"].to_pylist() == list(range(20))
    assert len(reads) == 8  # 4 row groups per segment, each once
    shuffled = ["k07", "k00", "k19", "k04", "k06", "k05"]
    assert store.take(shuffled, ["key", "value"])["key"].to_pylist() == shuffled
    monkeypatch.setattr(row_groups, "HELD_BYTES", 1)
    fresh = SegmentStore(tmp_path, SCHEMA, "key")
    assert fresh.take(ordered[::-1], ["value"])["value"].to_pylist() == list(range(19, -1, -1))
    assert len(fresh._groups._held) == 1
    assert fresh.take([], ["value"]).num_rows == 0
    found = fresh.lookup({"k03", "k10"}, ["value"])
    assert found.schema.names == ["key", "value"]
    assert sorted(zip(*found.to_pydict().values(), strict=True)) == [("k03", 3), ("k10", 10)]
    for seg in fresh.segments:
        seg.write_bytes(b"PAR1 gone")
    with pytest.raises(StoreChanged, match="changed during the run"):  # k00's group is held
        fresh.take(["k01"], ["value"])


def test_list_column_gives_offsets_and_values():
    col = pa.chunked_array([pa.array([[1, 2], []], pa.large_list(pa.uint64())),
                            pa.array([[3]], pa.large_list(pa.uint64()))])
    offsets, flat = list_column(col)
    assert offsets.tolist() == [0, 2, 2, 3] and flat.tolist() == [1, 2, 3]


def test_a_store_that_only_adds_never_reads_its_index(tmp_path, monkeypatch):
    """A worker's store adds segments without reading the others' keys, and with
    ``max_segments=None`` never merges; the index is read when first used, this segment in it."""
    SegmentStore(tmp_path, SCHEMA, "key").add(rows(("a", 1)))
    store = SegmentStore(tmp_path, SCHEMA, "key", max_segments=None)
    read = []
    original = SegmentStore._read_index
    monkeypatch.setattr(SegmentStore, "_read_index", lambda self: read.append(1) or original(self))
    for k in "bcdefghijklmnopqrs":  # more than the default 16 segments
        store.add(rows((k, ord(k))))
    assert read == [] and len(store.segments) == 19
    assert values(store, {"a", "s"}) == {"a": 1, "s": ord("s")} and read == [1]


def test_refresh_lists_what_other_processes_added(tmp_path):
    store = SegmentStore(tmp_path, SCHEMA, "key")
    assert store.keys == {}
    SegmentStore(tmp_path, SCHEMA, "key").add(rows(("a", 1)))
    assert store.keys == {} and len(store.refresh()) == 1 and set(store.keys) == {"a"}


def test_row_groups_stop_at_what_cannot_be_read(tmp_path, monkeypatch):
    import pipeline.core.segments as segments

    monkeypatch.setattr(segments, "SEGMENT_ROWS", 2)
    store = SegmentStore(tmp_path, SCHEMA, "key")
    seg = store.add(rows(("a", 1), ("b", 2), ("c", 3)))
    got = [(g, row, t["key"].to_pylist()) for g, row, t in store.row_groups(seg)]
    assert got == [(0, 0, ["a", "b"]), (1, 2, ["c"])]
    assert [t.column_names for _, _, t in store.row_groups(seg, ["value"])] == [["value"]] * 2
    pq.write_table(pa.table({"key": ["x"], "other": [2.0]}), tmp_path / "seg-foreign.parquet")
    (tmp_path / "seg-broken.parquet").write_bytes(b"PAR1 not really")
    assert list(store.row_groups(tmp_path / "seg-foreign.parquet")) == []
    assert list(store.row_groups(tmp_path / "seg-broken.parquet")) == []


def sorted_store(tmp_path, group_rows: int = 3) -> SegmentStore:
    return SegmentStore(tmp_path, SCHEMA, "key", max_segments=None, group_rows=group_rows)


def test_compact_merges_a_tier_streaming_and_keeps_the_first_copy(tmp_path):
    """Segments of similar size merge once ``fanout`` of them exist, into one sorted segment in
    row groups of the store's size; a key held twice keeps the row of the segment first in name
    order; an unreadable segment is deleted; a larger segment waits for its own tier."""
    store = sorted_store(tmp_path)
    big = store.add(rows(*((f"z{i:02d}", i) for i in range(9))))  # tier 2 of fanout 3
    small = [store.add(rows((f"k{i}", i), (f"k{i + 3}", i + 3))) for i in range(3)]
    (tmp_path / "seg-broken.parquet").write_bytes(b"PAR1 not really")
    assert store.compact(3) == 4  # the broken one and the three small ones
    [merged] = [s for s in store.segments if s != big]
    assert sorted(store.segments) == store.segments and big in store.segments
    table = pq.read_table(merged)
    assert table["key"].to_pylist() == [f"k{i}" for i in range(6)]
    assert pq.read_metadata(merged).num_row_groups == 2
    assert small[0] not in store.segments and store.compact(3) == 0
    # copies of k1 that differ (never in practice): the three segments of tier 1 merge
    a = store.add(rows(("k1", 100), ("k7", 7), ("k9", 9)))
    b = store.add(rows(("k1", 200), ("k2", 2), ("k8", 8)))
    first = min(a, b, merged)
    assert store.compact(3) == 3
    assert values(store, {"k1", "k9"}) == {"k1": {a: 100, b: 200, merged: 1}[first], "k9": 9}
    assert len(store.segments) == 2 and set(store.keys) == {
        *(f"k{i}" for i in (0, 1, 2, 3, 4, 5, 7, 8, 9)), *(f"z{i:02d}" for i in range(9))}


def test_retain_rewrites_only_what_drops_rows(tmp_path):
    store = sorted_store(tmp_path)
    keep_all = store.add(rows(("a", 1), ("b", 2)))
    mixed = store.add(rows(("c", 3), ("d", 4), ("e", 5), ("f", 6)))
    gone = store.add(rows(("g", 7)))
    (tmp_path / "seg-broken.parquet").write_bytes(b"PAR1 not really")
    assert store.retain({"a", "b", "d", "f"}) == 3
    assert keep_all in store.segments and mixed not in store.segments
    assert not gone.exists() and not (tmp_path / "seg-broken.parquet").exists()
    assert values(store, {"a", "b", "c", "d", "e", "f", "g"}) == {"a": 1, "b": 2, "d": 4, "f": 6}
    assert store.retain(set()) == 4 and store.refresh() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.sampled_from("abcd"), min_size=1), min_size=5, max_size=9),
       st.integers(1, 4))
def test_compact_keeps_the_first_copy_of_each_key_in_order(tmp_path_factory, key_sets,
                                                           group_rows):
    """Any five or more sorted segments of one tier (at most 4 rows, fanout 5) merge into one
    sorted segment holding each key once, with its row in the first segment in name order that
    holds it."""
    store = sorted_store(tmp_path_factory.mktemp("s"), group_rows)
    for n, keys in enumerate(key_sets):
        store.add(rows(*((k, n) for k in sorted(keys))))
    assume(len(store.segments) >= 5)  # equal key sets share a segment's name
    first: dict[str, int] = {}
    for seg in sorted(store.segments):
        table = pq.read_table(seg)
        for k, v in zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True):
            first.setdefault(k, v)
    store.compact(5)
    [merged] = store.segments
    table = pq.read_table(merged)
    assert list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == sorted(
        first.items())
    assert pq.read_metadata(merged).row_group(0).num_rows == min(group_rows, len(first))

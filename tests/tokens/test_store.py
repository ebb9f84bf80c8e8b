"""The token store (pipeline.tokens.store): entries put, read back, compacted and pruned; corrupt
entries and segments ignored; row groups read once in key order; a store changed during a run
refused."""

from __future__ import annotations

import pytest

from pipeline.tokens.entries import Encoding, pack
from pipeline.tokens.store import SEGMENT_SCHEMA, Entries, TokenCache, config_key, entry_key
from tests.tokens._encodings import assert_same, seq


def test_store_put_get_keys_and_corrupt_entries(tmp_path):
    cache = TokenCache(tmp_path, "k1")
    enc = Encoding(n_notes_input=5, seqs=(seq(-1, 12),))
    cache.put("ab" * 32, 0, enc)
    cache.put_many([("ab" * 32, -3, enc), ("cd" * 32, 0, pack(enc))])
    assert len(cache.segments) == 2
    assert cache.present() == {("ab" * 32, 0), ("ab" * 32, -3), ("cd" * 32, 0)}
    assert_same(cache.get("ab" * 32, -3), enc)
    assert cache.get("ef" * 32, 0) is None
    assert set(cache.load({("ab" * 32, 0), ("ef" * 32, 0)})) == {("ab" * 32, 0)}
    assert not list(tmp_path.rglob("*.tmp"))
    # an entry whose bytes are not an entry, and a segment that is not Parquet: recomputed
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.tokens.store import SEGMENT_SCHEMA

    bad = pa.table({"key": [entry_key("ab" * 32, 0), entry_key("11" * 32, 0)],
                    "entry": [b"not an entry", pack(enc)[:-1].tobytes()]}, schema=SEGMENT_SCHEMA)
    for seg in cache.segments:
        rows = pq.read_table(seg).to_pylist()
        if entry_key("ab" * 32, 0) in {r["key"] for r in rows}:
            pq.write_table(bad, seg)
    (cache.dir / "seg-truncated.parquet").write_bytes(b"PAR1 truncated")
    assert set(cache.load()) == {("ab" * 32, -3), ("cd" * 32, 0)}
    assert cache.get("ab" * 32, 0) is None  # unreadable -> recomputed, never trusted


def test_same_entries_give_the_same_segment(tmp_path):
    a, b = TokenCache(tmp_path / "a", "k"), TokenCache(tmp_path / "b", "k")
    e1, e2 = Encoding(n_notes_input=1, seqs=(seq(-1, 4),)), Encoding(n_notes_input=2, seqs=())
    a.put_many([("11" * 32, 0, e1), ("22" * 32, 0, e2)])
    b.put_many([("22" * 32, 0, e2), ("11" * 32, 0, e1)])
    [sa], [sb] = a.segments, b.segments
    assert sa.name == sb.name and sa.read_bytes() == sb.read_bytes()


def test_compact_merges_tiers_and_keeps_every_entry(tmp_path):
    cache = TokenCache(tmp_path, "k")
    encs = {}
    for i in range(20):  # 20 one-entry segments: tier 0 holds >= 8, merged into one
        encs[(f"{i:064x}", 0)] = Encoding(n_notes_input=i, seqs=(seq(-1, 4 + i, i),))
        cache.put(f"{i:064x}", 0, encs[(f"{i:064x}", 0)])
    cache.put_many([(k[0], 0, encs[k]) for k in [(f"{3:064x}", 0), (f"{0:064x}", 0)]])  # again
    (cache.dir / "seg-broken.parquet").write_bytes(b"not parquet")
    assert len(cache.refresh()) == 22
    removed = cache.compact(fanout=8)
    assert removed == 22 and len(cache.segments) == 1
    loaded = cache.load()
    assert set(loaded) == set(encs)
    for k, e in encs.items():
        assert_same(loaded[k], e)
    assert cache.compact(fanout=8) == 0  # nothing left to merge
    for i in range(20, 27):  # 7 small segments beside one of 20 rows: below the fanout
        cache.put(f"{i:064x}", 0, encs[(f"{0:064x}", 0)])
    assert cache.compact(fanout=8) == 0 and len(cache.segments) == 8
    cache.put(f"{99:064x}", 0, encs[(f"{0:064x}", 0)])  # the 8th small one: merged
    assert cache.compact(fanout=8) == 8 and len(cache.segments) == 2
    assert len(cache.present()) == 28


def test_prune_keeps_only_referenced(tmp_path):
    old, new = TokenCache(tmp_path, "old"), TokenCache(tmp_path, "new")
    enc = Encoding(n_notes_input=1, seqs=(seq(-1, 4),))
    old.put("11" * 32, 0, enc)
    new.put("22" * 32, 0, enc)
    new.put("33" * 32, 0, enc)
    (tmp_path / "legacy" / "ab").mkdir(parents=True)  # an older layout: one file per entry
    (tmp_path / "legacy" / "ab" / ("ab" * 32 + ".+0.i32")).write_bytes(b"x")
    assert new.prune({("22" * 32, 0)}) == 3
    assert new.present() == {("22" * 32, 0)} and len(new.segments) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
    assert new.prune(set()) == 1 and not new.dir.exists()


def test_config_key_ignores_only_encode_ids_split():
    base = {"use_programs": True, "encode_ids_split": "bar"}
    assert config_key("REMI", base) == config_key("REMI", {**base, "encode_ids_split": "no"})
    assert config_key("REMI", base) != config_key("TSD", base)
    assert config_key("REMI", base) != config_key("REMI", {**base, "use_programs": False})


def test_entries_read_each_row_group_once_in_key_order(tmp_path, monkeypatch,
                                                       row_group_reads):
    """Two overlapping segments in row groups of 4: every entry reads back, each needed row
    group is read once, and a key held twice is read from the first segment."""
    import pyarrow.parquet as pq

    import pipeline.tokens.store as store_mod

    monkeypatch.setattr(store_mod, "SEGMENT_ROWS", 4)
    cache = TokenCache(tmp_path, "k")
    encs = {(f"{i:064x}", t): Encoding(n_notes_input=i, seqs=(seq(-1, 3 + i, i),))
            for i in range(10) for t in (-2, 0)}
    items = [(s, t, e) for (s, t), e in sorted(encs.items())]
    first, second = cache.put_many(items[:14]), cache.put_many(items[10:])
    assert pq.read_metadata(first).num_row_groups == 4
    where = cache.locate()
    assert set(where) == set(encs)
    assert {where[(s, t)][0] for s, t, _ in items[10:14]} == {min(first, second)}
    assert cache.locate(set(encs), check=False, segments=[second]).keys() == \
        {(s, t) for s, t, _ in items[10:]}
    reads = row_group_reads
    reads.clear()
    entries = Entries()
    entries.where = where
    for key in sorted(encs):  # one at a time: a held row group serves the next key
        assert_same(entries.get([key])[key], encs[key])
    assert len(reads) == len({(seg, row // 4) for seg, row in where.values()})
    entries.close()
    entries = Entries()  # located with the run's row groups: a small store is read once
    entries.where = cache.locate(groups=entries.groups)
    reads.clear()
    assert_same(entries.get(sorted(encs))[items[3][:2]], items[3][2])
    assert reads == []
    entries.close()
    import pipeline.core.row_groups as row_groups_mod

    monkeypatch.setattr(row_groups_mod, "HELD_BYTES", 1)  # one row group at a time
    entries = Entries()
    entries.where = where
    for key in sorted(encs, reverse=True):
        assert_same(entries.get([key])[key], encs[key])
        assert len(entries.groups._held) == 1


def test_entries_refuse_a_store_changed_during_the_run(tmp_path):
    cache = TokenCache(tmp_path, "k")
    enc = Encoding(n_notes_input=2, seqs=(seq(-1, 5),))
    seg = cache.put_many([("ab" * 32, 0, enc)])
    entries = Entries()
    entries.where = cache.locate()
    entries.packed[("cd" * 32, 0)] = pack(enc)
    assert ("cd" * 32, 0) in entries and ("ef" * 32, 0) not in entries
    assert_same(entries.get([("cd" * 32, 0)])[("cd" * 32, 0)], enc)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"key": [entry_key("ab" * 32, 0)], "entry": [b"garbage!"]},
                            schema=SEGMENT_SCHEMA), seg)
    from pipeline.core.segments import StoreChanged

    with pytest.raises(StoreChanged, match="changed during the run"):
        entries.get([("ab" * 32, 0)])


def test_compaction_opens_a_segment_once_the_merge_reaches_its_keys(tmp_path, monkeypatch):
    """Eight segments over separate key ranges (a full run's chunks) and one across them merge
    into one sorted segment with every entry once, holding at most two segments open."""
    import pyarrow.parquet as pq

    cache = TokenCache(tmp_path, "k")
    keys = [f"{i:064x}" for i in range(40)]
    encs = {(k, 0): Encoding(n_notes_input=i, seqs=(seq(-1, 3 + i % 5),))
            for i, k in enumerate(keys)}
    encs[(keys[33], 2)] = Encoding(n_notes_input=1, seqs=())
    for lo in range(0, 40, 5):
        cache.put_many([(k, 0, encs[(k, 0)]) for k in keys[lo : lo + 5]])
    cache.put_many([(keys[7], 0, encs[(keys[7], 0)]), (keys[33], 2, encs[(keys[33], 2)])])
    open_now = most = 0
    original = TokenCache.row_groups

    def counting(self, seg, columns=None):
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        yield from original(self, seg, columns)
        open_now -= 1

    monkeypatch.setattr(TokenCache, "row_groups", counting)
    assert cache.compact(fanout=8) == 9 and most == 2
    [seg] = cache.segments
    assert pq.read_table(seg)["key"].to_pylist() == sorted(entry_key(*k) for k in encs)
    loaded = cache.load()
    for key, enc in encs.items():
        assert_same(loaded[key], enc)

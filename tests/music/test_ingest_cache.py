"""Ingest's result cache, worker isolation and streamed notes table: outputs are byte-identical
with a cold, warm, partial, damaged or missing cache, with or without the corpus stage's index,
and however the notes arrive; only new files are parsed; timeouts and crashes are not kept; a
crash inside a chunk costs only its file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import RuntimeConfig
from pipeline.music import ingest_cache, inspection
from pipeline.music import ingestion as ingest_mod
from pipeline.music.ingest_cache import ResultCache, cache_key
from pipeline.music.ingestion import run
from pipeline.music.manifest import NOTES_SCHEMA, IngestConfig
from pipeline.stages.corpus import scan_tree, write_index
from tests.midi_utils import make_midi, random_piece

OUTPUTS = ("manifest.parquet", "notes.parquet", "ingest.json")


def outputs(raw: Path, out: Path, cache: Path | None, workers: int = 1,
            cfg: IngestConfig | None = None, index: Path | None = None) -> dict[str, bytes]:
    run(cfg or IngestConfig(), RuntimeConfig(workers=workers, progress=False), raw_dir=raw,
        metadata=None, manifest=out / "manifest.parquet", notes=out / "notes.parquet",
        report=out / "ingest.json", cache_dir=cache, index=index)
    return {n: (out / n).read_bytes() for n in OUTPUTS}


def crash_on_parse(monkeypatch, marker: bytes = b"") -> None:
    """Make the parser kill its worker (on files ending in ``marker``; every file when empty)."""
    real = inspection.parse_many

    def fragile(datas: list[bytes]):
        if any(d.endswith(marker) for d in datas):
            os._exit(11)
        return real(datas)

    monkeypatch.setattr(inspection, "parse_many", fragile)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    raw = tmp_path / "raw"
    (raw / "sub").mkdir(parents=True)
    for i in range(30):
        (raw / "sub" / f"p{i:02d}.mid").write_bytes(make_midi(random_piece(rng, n=20 + i)))
    (raw / "copy.mid").write_bytes((raw / "sub" / "p03.mid").read_bytes())
    (raw / "bad.mid").write_bytes(b"MThd garbage")
    (raw / "text.mid").write_text("not MIDI")
    (raw / "empty.mid").write_bytes(b"")
    (raw / "none.mid").write_bytes(make_midi([[]]))
    return raw


def test_outputs_same_across_cache_states(corpus: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    plain = outputs(corpus, tmp_path / "plain", None)
    assert outputs(corpus, tmp_path / "cold", cache, workers=2) == plain
    (seg,) = (cache / cache_key(IngestConfig())).glob("seg-*.parquet")
    # Warm: nothing is parsed (a parse would crash its worker and quarantine the file).
    with monkeypatch.context() as m:
        crash_on_parse(m)
        assert outputs(corpus, tmp_path / "warm", cache) == plain
    # Partial: files added after the cache was filled are parsed, the rest read back.
    rng = np.random.default_rng(9)
    for i in range(3):
        (corpus / f"new{i}.mid").write_bytes(make_midi(random_piece(rng, n=15)))
    grown = outputs(corpus, tmp_path / "grown", None)
    assert outputs(corpus, tmp_path / "partial", cache) == grown
    assert len(list(seg.parent.glob("seg-*.parquet"))) == 2
    # Damaged: a segment that is not Parquet, and one deleted between listing and reading.
    seg.write_bytes(b"not parquet")
    assert outputs(corpus, tmp_path / "damaged", cache, workers=2) == grown
    real_lookup = ResultCache.lookup

    def vanishing(self, shas, columns=None):
        for p in self.dir.glob("seg-*.parquet"):
            p.unlink()
        return real_lookup(self, shas, columns)

    monkeypatch.setattr(ResultCache, "lookup", vanishing)
    assert outputs(corpus, tmp_path / "vanished", cache) == grown
    assert outputs(corpus, tmp_path / "refilled", cache) == grown

    def vanished_after(self, shas, columns=None):  # the notes are read later: gone by then
        found = real_lookup(self, shas, columns)
        for p in self.dir.glob("seg-*.parquet"):
            p.unlink()
        return found

    monkeypatch.setattr(ResultCache, "lookup", vanished_after)
    assert outputs(corpus, tmp_path / "vanished_after", cache) == grown


def test_only_new_files_are_parsed(corpus: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    outputs(corpus, tmp_path / "first", cache)
    (corpus / "late.mid").write_bytes(make_midi(random_piece(np.random.default_rng(3), n=12))
                                      + b"late")
    crash_on_parse(monkeypatch)
    outputs(corpus, tmp_path / "second", cache)

    m = pd.read_parquet(tmp_path / "second" / "manifest.parquet").set_index("path")
    assert m.loc["late.mid", "reason"] == "crash"  # the one file not in the cache was parsed
    assert (m.drop("late.mid")["reason"] != "crash").all()


def test_crashes_and_timeouts_are_not_cached(corpus: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    victim = corpus / "sub" / "p07.mid"
    victim.write_bytes(victim.read_bytes() + b"victim")
    plain = outputs(corpus, tmp_path / "plain", None)
    with monkeypatch.context() as m:
        crash_on_parse(m, marker=b"victim")
        crashed = outputs(corpus, tmp_path / "crashed", cache, workers=2)
    assert crashed != plain
    assert outputs(corpus, tmp_path / "again", cache) == plain  # re-parsed, now fine


def test_crash_inside_a_chunk_costs_only_its_file(corpus: Path, tmp_path: Path, monkeypatch):
    n = len(list(corpus.rglob("*.mid")))
    assert n > 2 * inspection.chunk_size(n, 2)  # several chunks, the victim mid-chunk
    victim = corpus / "sub" / "p12.mid"
    victim.write_bytes(victim.read_bytes() + b"victim")
    crash_on_parse(monkeypatch, marker=b"victim")
    outputs(corpus, tmp_path / "out", None, workers=2)

    m = pd.read_parquet(tmp_path / "out" / "manifest.parquet").set_index("path")
    assert m.loc["sub/p12.mid", "reason"] == "crash"
    assert (m.drop("sub/p12.mid")["reason"] != "crash").all()
    assert (m["status"] == "ok").sum() == 30 - 1 and m.loc["sub/p03.mid", "status"] == "duplicate"


def test_cache_key_ignores_timeout_only():
    base = cache_key(IngestConfig())
    assert cache_key(IngestConfig(timeout_s=5.0)) == base
    assert cache_key(IngestConfig(max_file_bytes=10)) == base  # applied before parsing
    assert cache_key(IngestConfig(max_notes=10)) != base
    assert cache_key(IngestConfig(max_gap_beats=8.0)) != base


def test_segments_are_merged(corpus: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(ingest_cache, "CACHE_SEGMENTS", 2)
    cache = tmp_path / "cache"
    rng = np.random.default_rng(11)
    for k in range(4):
        (corpus / f"round{k}.mid").write_bytes(make_midi(random_piece(rng, n=10)))
        got = outputs(corpus, tmp_path / f"r{k}", cache)
        assert len(list((cache / cache_key(IngestConfig())).glob("seg-*.parquet"))) <= 2
    assert got == outputs(corpus, tmp_path / "plain", None)


def index_of(raw: Path, path: Path) -> Path:
    write_index(raw, scan_tree(raw)[0], path, None)
    return path


def test_notes_are_streamed_in_whole_row_groups(corpus: Path, tmp_path: Path, monkeypatch):
    plain = outputs(corpus, tmp_path / "plain", None)
    n = pq.ParquetFile(tmp_path / "plain" / "notes.parquet").metadata.num_rows
    monkeypatch.setattr(ingest_mod, "ROW_GROUP_ROWS", n)  # one whole group, no empty one after
    outputs(corpus, tmp_path / "exact", None, workers=2)
    assert pq.ParquetFile(tmp_path / "exact" / "notes.parquet").metadata.num_row_groups == 1
    monkeypatch.setattr(ingest_mod, "ROW_GROUP_ROWS", 4)
    cache = tmp_path / "cache"
    small = outputs(corpus, tmp_path / "small", cache, workers=2)
    meta = pq.ParquetFile(tmp_path / "small" / "notes.parquet").metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sizes == [4] * (meta.num_rows // 4) + ([meta.num_rows % 4] if meta.num_rows % 4 else [])
    assert pq.read_table(tmp_path / "small" / "notes.parquet").equals(
        pq.read_table(tmp_path / "plain" / "notes.parquet"))
    assert small["manifest.parquet"] == plain["manifest.parquet"]
    # New files' notes fall between cached ones; chunks finish in any order.
    rng = np.random.default_rng(4)
    for i in range(9):
        (corpus / f"late{i}.mid").write_bytes(make_midi(random_piece(rng, n=12 + i)))
    grown = outputs(corpus, tmp_path / "grown", None, workers=1)
    assert outputs(corpus, tmp_path / "warm", cache, workers=2) == grown
    shas = pq.read_table(tmp_path / "warm" / "notes.parquet", columns=["sha256"])
    assert shas["sha256"].to_pylist() == sorted(set(shas["sha256"].to_pylist()))


def test_no_ok_file_gives_an_empty_notes_table(tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "text.mid").write_text("not MIDI")
    (raw / "empty.mid").write_bytes(b"")
    outputs(raw, tmp_path / "out", tmp_path / "cache", workers=2)
    table = pq.read_table(tmp_path / "out" / "notes.parquet")
    assert table.num_rows == 0 and table.schema.names == NOTES_SCHEMA.names


def test_the_corpus_index_gives_the_same_outputs(corpus: Path, tmp_path: Path):
    plain = outputs(corpus, tmp_path / "plain", None)
    index = index_of(corpus, tmp_path / "raw_index.parquet")
    assert outputs(corpus, tmp_path / "indexed", None, workers=2, index=index) == plain
    # A file whose size no longer matches its entry is hashed again.
    victim = corpus / "sub" / "p05.mid"
    victim.write_bytes(victim.read_bytes() + b"more")
    assert outputs(corpus, tmp_path / "grown", None, index=index) == \
        outputs(corpus, tmp_path / "fresh", None)
    # Changed in place (same size) after it was indexed: the workers' hash catches it.
    index = index_of(corpus, tmp_path / "raw_index.parquet")
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"sub/p05\.mid.*changed after it was indexed"):
        outputs(corpus, tmp_path / "stale", None, workers=2, index=index)
    assert not (tmp_path / "stale" / "notes.parquet").exists()  # nothing half-written


@pytest.mark.parametrize("values", [["a", "bü", None, "", "xyz"], [], [None], ["é", "e"]])
def test_strings_to_arrow(values):
    arr = inspection.to_arrow(values, pa.string())
    arr.validate(full=True)
    assert arr.to_pylist() == values


def test_numbers_round_trip_through_arrow():
    x = np.arange(10, dtype=np.int64)
    mask = x % 3 == 0
    arr = inspection.to_arrow(x, pa.int64(), mask)
    assert arr.to_pylist() == [None if m else int(v) for v, m in zip(x, mask, strict=True)]
    flags = inspection.to_arrow(x % 2 == 1, pa.bool_())
    assert flags.to_pylist() == [bool(v % 2) for v in x]
    sliced = pa.chunked_array([inspection.to_arrow(x, pa.int64()).slice(2),
                                          inspection.to_arrow(x[:3], pa.int64())])
    assert inspection.from_arrow(sliced).tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]

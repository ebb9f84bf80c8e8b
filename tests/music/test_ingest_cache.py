"""Ingest's result cache: outputs are byte-identical with a cold, warm, partial, damaged or
missing cache; only new files are parsed; timeouts and crashes are not kept; the key ignores the
settings no kept result depends on; segments are merged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.music import ingest_cache
from pipeline.music.ingest_cache import ResultCache, cache_key
from pipeline.music.manifest import IngestConfig
from tests.midi_utils import make_midi, random_piece
from tests.music.test_ingestion import crash_on_parse, outputs, write_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "raw")


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



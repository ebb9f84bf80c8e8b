"""pipeline.music.ingestion: a folder (or a list of files) hashed, parsed and judged into the
manifest, the notes table and the report; crashes cost one file, the notes table is streamed in
whole row groups, and the corpus stage's index stands in for reading the files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.core.artifacts import ArtifactError
from pipeline.core.config import RuntimeConfig
from pipeline.music import ingestion as ingest_mod
from pipeline.music import inspection
from pipeline.music.ingestion import default_group, read_metadata, run
from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA, REASONS, IngestConfig
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


def write_corpus(raw: Path) -> Path:
    """30 random pieces under ``sub/``, a byte copy of one, and a corrupt, a text, an empty and
    a note-less file."""
    rng = np.random.default_rng(5)
    (raw / "sub").mkdir(parents=True)
    for i in range(30):
        (raw / "sub" / f"p{i:02d}.mid").write_bytes(make_midi(random_piece(rng, n=20 + i)))
    (raw / "copy.mid").write_bytes((raw / "sub" / "p03.mid").read_bytes())
    (raw / "bad.mid").write_bytes(b"MThd garbage")
    (raw / "text.mid").write_text("not MIDI")
    (raw / "empty.mid").write_bytes(b"")
    (raw / "none.mid").write_bytes(make_midi([[]]))
    return raw


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "raw")


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


def test_metadata_rows_by_path_and_sources_without_a_file(tmp_path: Path):
    meta = tmp_path / "meta.csv"
    meta.write_text("path,group,license\na.mid,g1,cc0\n,lost,cc0\nb/c.mid,,cc-by\n,gone,\n",
                    encoding="utf-8")
    rows, unresolved = read_metadata(meta)
    assert unresolved == 2 and sorted(rows) == ["a.mid", "b/c.mid"]
    assert rows["a.mid"] == {"path": "a.mid", "group": "g1", "license": "cc0"}
    assert read_metadata(None) == ({}, 0) and read_metadata(tmp_path / "none.csv") == ({}, 0)
    assert default_group("b/c.mid") == "b/c.mid"  # without metadata a file is its own group


def test_a_file_list_is_judged_in_the_order_given(corpus: Path, tmp_path: Path):
    """The contamination check passes its own list: rows follow it, and the first of two equal
    files in that order is the one kept."""
    files = ["sub/p03.mid", "text.mid", "copy.mid", "sub/p01.mid"]
    out = tmp_path / "out"
    summary = run(IngestConfig(), RuntimeConfig(workers=1, progress=False), raw_dir=corpus,
                  metadata=None, manifest=out / "manifest.parquet", notes=out / "notes.parquet",
                  report=out / "ingest.json", files=files)
    m = pd.read_parquet(out / "manifest.parquet")
    assert m["path"].tolist() == files
    assert m["status"].tolist() == ["ok", "quarantined", "duplicate", "ok"]
    assert m["duplicate_of"].tolist() == ["", "", "sub/p03.mid", ""]
    assert m.columns.tolist() == MANIFEST_SCHEMA.names
    assert summary.n_files == 4 and summary.by_status == {"duplicate": 1, "ok": 2,
                                                          "quarantined": 1}
    assert summary.by_reason == {"not_midi": 1}
    report = json.loads((out / "ingest.json").read_text())
    assert report["by_reason"] == {r: int(r == "not_midi") for r in REASONS}
    assert report["n_notes_ok"] == int(m.loc[m["status"] == "ok", "n_notes"].sum())
    notes = pq.read_table(out / "notes.parquet")
    assert notes["sha256"].to_pylist() == sorted(m.loc[m["status"] == "ok", "sha256"])

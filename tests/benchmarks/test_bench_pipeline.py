"""The corpus-scale pipeline benchmark: its generated corpus is what it claims (deterministic,
distinct, multitrack, planted variants that dedupe links), and a tiny run goes end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from symusic import Score

from benchmarks import bench_pipeline as bench
from pipeline.core.config import RuntimeConfig
from pipeline.music.ingestion import run
from pipeline.music.manifest import IngestConfig
from pipeline.similarity import fingerprints as fp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench_pipeline") / "corpus"
    bench.write_corpus(root, 0, 60, seed=3)
    return root


def test_same_seed_same_files_and_more_files_keep_the_first(corpus, tmp_path):
    again = tmp_path / "again"
    bench.write_corpus(again, 0, 70, seed=3)
    for i in range(60):
        assert bench.file_path(corpus, i).read_bytes() == bench.file_path(again, i).read_bytes()
    other = tmp_path / "other"
    bench.write_corpus(other, 0, 5, seed=4)
    assert bench.file_path(other, 0).read_bytes() != bench.file_path(corpus, 0).read_bytes()


def test_pieces_are_multitrack_with_drums_sometimes(corpus):
    scores = [Score(bench.file_path(corpus, i)) for i in range(60) if i % 20 != 19]
    assert any(len(s.tracks) >= 3 for s in scores)
    assert any(t.is_drum for s in scores for t in s.tracks)
    assert not all(t.is_drum for s in scores for t in s.tracks)
    assert len({len(s.tracks[0].notes) for s in scores}) > 10  # lengths vary


def test_planted_variants_are_linked_to_their_source(corpus, tmp_path):
    """Every 20th file copies an earlier one: re-saved (same note_hash), transposed (same
    transposed key) or with 5% of pitches changed (shares most shingles)."""
    run(IngestConfig(), RuntimeConfig(workers=1, progress=False), raw_dir=corpus,
        metadata=None, manifest=tmp_path / "m.parquet", notes=tmp_path / "n.parquet",
        report=tmp_path / "r.json")
    import pandas as pd

    man = pd.read_parquet(tmp_path / "m.parquet").set_index("path")
    assert (man["status"] == "ok").all() and man["sha256"].is_unique
    notes = fp.read_notes(tmp_path / "n.parquet")
    index = {s: k for k, s in enumerate(notes.sha256)}
    keys = fp.transposed_keys(notes)
    off, vals = fp.shingles(notes, 4, 4)
    for i in (19, 39, 59):
        name = bench.file_path(corpus, i).relative_to(corpus).as_posix()
        var = man.loc[name]
        same_hash = (man["note_hash"] == var["note_hash"]).sum() > 1
        same_key = (keys == keys[index[var["sha256"]]]).sum() > 1
        k = index[var["sha256"]]
        best = max(fp.jaccard_containment(vals[off[k]:off[k + 1]], vals[off[j]:off[j + 1]])[0]
                   for j in range(notes.n_pieces) if j != k)
        assert same_hash or same_key or best >= 0.5, (i, same_hash, same_key, best)


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_pipeline.py"),
                           "--files", "40", "--baseline-files", "20", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert set(result["full"]) == set(bench.STAGES) == set(result["plus_1pct"])
    assert result["noop_seconds"] > 0

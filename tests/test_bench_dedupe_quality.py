"""The dedupe quality benchmark: generated ground truth is what it claims, and a tiny run through
the real ingest and dedupe stages finds exact copies and reports every variant kind."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_dedupe_quality as bench


@pytest.fixture(scope="module")
def tiny():
    return bench.measure(pieces=2, seed=3, workers=1)


def test_every_variant_kind_texture_and_bucket_is_reported(tiny) -> None:
    cells = {(r["kind"], r["texture"], r["bucket"]) for r in tiny["recall"]}
    buckets = [bench.bucket_label(b) for b in bench.BUCKETS]
    assert cells == {(k, t, b) for k in bench.KINDS for t in bench.TEXTURES for b in buckets}
    assert len(bench.KINDS) == 19
    assert {r["set"] for r in tiny["merges"]} == set(bench.SETS)
    assert 0.0 <= tiny["precision"]["pairwise_precision"] <= 1.0


@pytest.mark.parametrize("kind", ["re-saved", "transposed", "re-orchestrated"])
def test_exact_copies_are_found_by_an_exact_tier(tiny, kind: str) -> None:
    cells = [r for r in tiny["recall"] if r["kind"] == kind]
    assert all(r["found"] == r["n"] == 1 for r in cells), cells
    assert {t for r in cells for t in r["linked_by"]} <= {"note", "transposed"}


def test_variants_change_what_they_say() -> None:
    rng = np.random.default_rng(0)
    style = bench.make_style(0)
    piece = bench.compose(rng, style, 400, "poly")
    assert piece.n == 400 and len(piece.programs) == 4
    fns = {name: (fn, rate) for name, fn, rate in bench.VARIANTS}

    def make(kind: str) -> bench.Piece:
        fn, rate = fns[kind]
        return fn(np.random.default_rng(1), piece, rate)

    changed = make("changed 5%")
    assert (changed.notes["pitch"] != piece.notes["pitch"]).sum() == 20
    assert make("dropped 10%").n == 360 and make("inserted 2%").n == 408
    part = make("excerpt 25%")
    end = np.max(piece.notes["onset"] + piece.notes["duration"])
    assert part.notes["onset"].min() >= 0
    assert np.max(part.notes["onset"] + part.notes["duration"]) <= 0.25 * end + 1e-9
    orch = make("re-orchestrated")
    assert sorted(orch.notes["pitch"].tolist()) == sorted(piece.notes["pitch"].tolist())
    assert not set(orch.programs) & set(piece.programs)


def test_generation_is_deterministic(tmp_path) -> None:
    rows = bench.write_corpus(tmp_path / "a", 1, seed=5)
    bench.write_corpus(tmp_path / "b", 1, seed=5)
    bench.write_corpus(tmp_path / "c", 1, seed=6)
    same = [(tmp_path / "a" / r["path"]).read_bytes() == (tmp_path / "b" / r["path"]).read_bytes()
            for r in rows]
    other = [(tmp_path / "a" / r["path"]).read_bytes() == (tmp_path / "c" / r["path"]).read_bytes()
             for r in rows]
    assert all(same) and not any(other)

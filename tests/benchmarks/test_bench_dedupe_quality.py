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


# ------------------------------------------------------------------------------ the tune set
@pytest.fixture(scope="module")
def tiny_tunes():
    return bench.measure_tunes(per_cell=1, seed=3, workers=1)


def test_every_tune_cell_is_reported_with_what_the_rules_reach(tiny_tunes):
    cells = {(r["kind"], r["bucket"]) for r in tiny_tunes["recall"]}
    bands = [bench.bucket_label(b) for b in bench.TUNE_BANDS]
    assert cells == {(k, b) for k in bench.TUNE_KINDS for b in bands}
    assert len(bench.TUNE_KINDS) == 16
    for r in tiny_tunes["recall"]:
        assert 0 <= r["confirmable"] <= r["n"] == 1
        assert r["target"] == (0.95 if r["bucket"] == "100-120" and
                               float(r["kind"].rsplit(" ", 1)[1].rstrip("%")) <= 5 else 0.90)
    assert {r["set"] for r in tiny_tunes["merges"]} == set(bench.TUNE_SETS)
    closest = tiny_tunes["precision"]["closest_unrelated_melody"]
    assert closest["pairs"] == 96 * 95 // 2 and 0.0 < closest["max"] < 1.0


def test_tunes_repeat_their_parts_and_copies_edit_what_they_say():
    from benchmarks import dance_tunes as tunes

    style = tunes.make_style(0)
    for i in range(20):
        rng = np.random.default_rng([0, i])
        n = int(rng.integers(40, 121))
        tune = tunes.compose(rng, style, n, tunes.make_plan(rng))
        assert tune.n in (n, n - 1)
        # AABB: every note of a body sounds twice, with the same pitch and duration
        for s in np.unique(tune.source):
            at = np.flatnonzero(tune.source == s)
            assert at.size in (1, 2) and np.unique(tune.pitch[at]).size == 1
        assert np.mean(np.bincount(tune.source) == 2) > 0.5
        for mix, kinds in tunes.MIXES.items():
            copy, counts = tunes.edit(np.random.default_rng(i), tune, kinds, 0.08)
            assert sum(counts.values()) == max(1, round(0.08 * tune.n)), mix
            assert {k for k, v in counts.items() if v} <= set(kinds)
            grown = counts["split"] + counts["passing"] - counts["dropped"]
            assert copy.n == tune.n + grown
    twice = [tunes.edit(np.random.default_rng(1), tune, kinds, 0.05)[0] for _ in range(2)]
    assert twice[0].midi() == twice[1].midi()


def test_tune_generation_is_deterministic(tmp_path):
    rows = bench.write_tunes(tmp_path / "a", 1, seed=5)
    bench.write_tunes(tmp_path / "b", 1, seed=5)
    bench.write_tunes(tmp_path / "c", 1, seed=6)
    read = [[(tmp_path / d / r["path"]).read_bytes() for r in rows] for d in "abc"]
    assert read[0] == read[1]
    assert not any(x == y for x, y in zip(read[0], read[2], strict=True))

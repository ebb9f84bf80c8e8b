"""Content fingerprints (:mod:`pipeline.similarity.fingerprints`): invariances the tiers rely
on, datasketch-equal signatures, the integer hashes against plain-Python oracles, and the
reading of notes tables."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.music.manifest import NOTES_SCHEMA
from pipeline.similarity import fingerprints as fp
from pipeline.stages.dedupe import DedupeConfig
from tests.stages.test_dedupe import _notes, _sorted, base_piece, planted_corpus, write_corpus

M64 = (1 << 64) - 1


def _mix64_oracle(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, M64), min_size=1, max_size=20))
def test_mix64_is_the_splitmix64_finaliser(values):
    got = fp.mix64(np.array(values, dtype=np.uint64)).tolist()
    assert got == [_mix64_oracle(v) for v in values]


@pytest.mark.parametrize("x, y, want", [
    ([1, 2, 3, 4], [3, 4, 5], (2 / 5, 2 / 3)),
    ([1, 2], [1, 2], (1.0, 1.0)),
    ([1, 2], [3], (0.0, 0.0)),
    ([], [1], (0.0, 0.0)),
])
def test_jaccard_containment_by_hand(x, y, want):
    got = fp.jaccard_containment(np.array(x, np.uint64), np.array(y, np.uint64))
    assert got == pytest.approx(want)


def test_ioi_classes_by_hand():
    # one piece with onsets 0, 1, 2, 4, 5 (IOIs 1, 1, 2, 1), another from 10
    time = np.array([0.0, 1.0, 2.0, 4.0, 5.0, 10.0, 11.0, 13.0])
    first = np.array([1, 0, 0, 0, 0, 1, 0, 0], bool)
    got = fp.ioi_classes(time, first, resolution=2).tolist()
    mid = 4 * 2 + 1  # equal IOIs
    assert got == [0, 0, mid, mid + 2, mid - 2, 0, 0, mid + 2]


def test_transposed_keys_are_empty_only_for_empty_pieces():
    rng = np.random.default_rng(2)
    piece = base_piece(rng, n_events=10)
    rows = [{"sha256": s, **n} for s, n in (("a", piece), ("b", _notes([], [], [])))]
    notes = fp.notes_from_table(pa.Table.from_pandas(pd.DataFrame(rows), schema=NOTES_SCHEMA,
                                                     preserve_index=False))
    keys = fp.transposed_keys(notes)
    assert keys[0] != "" and keys[1] == ""


def test_gram_sets_stay_inside_a_piece():
    tokens = np.array([1, 2, 3, 1, 2, 3, 9, 9], np.int64)
    piece = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    off, vals = fp.gram_sets(tokens, piece, 3, k=3)
    assert np.diff(off).tolist() == [1, 1, 0]  # no gram spans two pieces; piece 2 is too short
    assert vals[0] == vals[1] < 1 << fp.SHINGLE_BITS


def test_note_arrays_chunks_cover_every_piece_once_in_order():
    notes = fp.NoteArrays(np.array(list("abcdef"), object),
                          np.array([0, 3, 3, 7, 8, 12, 20], np.int64), np.arange(20.0),
                          np.ones(20), np.arange(20, dtype=np.int16), np.zeros(20, bool),
                          np.zeros(20, np.int16))
    chunks = notes.chunks(max_notes=5, max_pieces=2)
    assert all(c.n_pieces <= 2 for c in chunks)
    assert [s for c in chunks for s in c.sha256] == list("abcdef")
    assert np.array_equal(np.concatenate([c.pitch for c in chunks]), notes.pitch)
    assert all(c.offsets[0] == 0 for c in chunks)


def test_chunked_fingerprints_equal_whole(tmp_path):
    pieces, _ = planted_corpus(seed=4, families=3, singles=5)
    _, notes, _ = write_corpus(tmp_path, pieces)
    na = fp.read_notes(notes)
    cfg = DedupeConfig()
    whole = fp.shingles(na, cfg.shingle_k, cfg.ioi_resolution)
    parts = [fp.shingles(c, cfg.shingle_k, cfg.ioi_resolution) for c in na.chunks(max_pieces=4)]
    assert np.array_equal(whole[1], np.concatenate([p[1] for p in parts]))
    assert np.array_equal(fp.transposed_keys(na),
                          np.concatenate([fp.transposed_keys(c) for c in na.chunks(max_pieces=3)]))


def test_signatures_match_datasketch():
    from datasketch import MinHash

    rng = np.random.default_rng(0)
    values = np.sort(rng.integers(0, 2**63, size=50, dtype=np.int64).astype(np.uint64))
    perms = fp.minhash_permutations(64, seed=5)
    sig = fp.minhash_signatures(np.array([0, 50]), values, perms)
    m = MinHash(num_perm=64, seed=5, scheme="affine32", hashfunc=int)
    m.update_batch(fp.to_hash32(values).tolist())
    assert np.array_equal(sig[0], m.hashvalues)


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("chunks", [1, 3])
def test_notes_from_table_picks_and_sorts_rows_as_written_plainly(shuffled, chunks):
    rng = np.random.default_rng(chunks + 2 * shuffled)
    rows = []
    for i in range(30):
        k = int(rng.integers(0, 6))
        rows.append({"sha256": f"{i * 7919 % 1000:04d}", "onset": rng.random(k),
                     "duration": rng.random(k), "pitch": rng.integers(0, 128, k, np.int16),
                     "velocity": np.full(k, 64, np.int16), "track": rng.integers(0, 3, k, np.int16),
                     "program": np.zeros(k, np.int16), "is_drum": rng.random(k) < 0.3})
    rows.sort(key=lambda r: r["sha256"])
    if shuffled:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    cut = np.linspace(0, len(rows), chunks + 1).astype(int)
    table = pa.concat_tables([pa.Table.from_pandas(pd.DataFrame(rows[a:b]), schema=NOTES_SCHEMA,
                                                   preserve_index=False)
                              for a, b in itertools.pairwise(cut)])
    table = pa.concat_tables([table, pa.table(  # a null list reads as an empty piece
        {c: [None if c != "sha256" else "zzzz"] for c in NOTES_SCHEMA.names}, NOTES_SCHEMA),
        pa.table({f.name: pa.array(["yyyy"]) if f.name == "sha256" else  # ... even one whose
                  pa.ListArray.from_arrays(  # segment holds values
                      pa.array([0, 2], pa.int32()), pa.array(np.ones(2)).cast(f.type.value_type),
                      mask=pa.array([True])) for f in NOTES_SCHEMA}, NOTES_SCHEMA)])
    if chunks == 1:  # one chunk that starts inside its buffers (Arrow slices share them)
        table = pa.concat_tables([table.slice(0, 2), table]).combine_chunks().slice(2)
    keep = {r["sha256"] for r in rows if rng.random() < 0.6} | {"yyyy", "zzzz", "absent"}
    block = set(sorted(r["sha256"] for r in rows)[5:12])  # one run of rows, unless shuffled
    for wanted in (None, keep, block):
        got = fp.notes_from_table(table, keep=None if wanted is None else sorted(wanted))
        plain = sorted((r for r in rows if wanted is None or r["sha256"] in wanted),
                       key=lambda r: r["sha256"])
        null = [] if wanted is block else ["yyyy", "zzzz"]
        assert got.sha256.tolist() == [r["sha256"] for r in plain] + null
        assert got.lengths.tolist() == [len(r["pitch"]) for r in plain] + [0] * len(null)
        for col in ("onset", "duration", "pitch", "is_drum", "track"):
            parts = [np.asarray(r[col]) for r in plain]
            assert np.array_equal(getattr(got, col), np.concatenate(parts)), col


def test_shingles_invariant_to_transposition_and_time_scale():
    rng = np.random.default_rng(1)
    base = base_piece(rng)
    moved = {**base, "pitch": (base["pitch"] + 5).astype(np.int16), "onset": base["onset"] * 3,
             "duration": base["duration"] * 3}
    other = base_piece(rng)
    na = fp.notes_from_table(pa.Table.from_pandas(pd.DataFrame(
        [{"sha256": s, **n} for s, n in (("a", base), ("b", moved), ("c", other))]),
        schema=NOTES_SCHEMA, preserve_index=False))
    off, vals = fp.shingles(na, 4, 4)
    sets = [vals[off[i] : off[i + 1]] for i in range(3)]
    assert np.array_equal(sets[0], sets[1])
    assert fp.jaccard_containment(sets[0], sets[2])[0] < 0.2
    keys = fp.transposed_keys(na)
    assert keys[0] == keys[1] != keys[2]


def test_drums_are_never_transposed():
    rng = np.random.default_rng(8)
    base = base_piece(rng)
    size = 40
    drums = {"onset": np.arange(size) * 0.5, "duration": np.full(size, 0.25),
             "pitch": np.tile(np.array([36, 38, 42, 42], np.int16), size // 4),
             "velocity": np.full(size, 90, np.int16), "track": np.full(size, 9, np.int16),
             "program": np.zeros(size, np.int16), "is_drum": np.ones(size, bool)}
    with_drums = _sorted({k: np.concatenate([base[k], drums[k]]) for k in base})
    up = {**with_drums, "pitch": np.where(with_drums["is_drum"], with_drums["pitch"],
                                          with_drums["pitch"] + 4).astype(np.int16)}
    all_up = {**with_drums, "pitch": (with_drums["pitch"] + 4).astype(np.int16)}
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": s, **_sorted(n)} for s, n in (
        ("a", with_drums), ("b", up), ("c", all_up), ("d", drums))]), schema=NOTES_SCHEMA,
        preserve_index=False)
    keys = fp.transposed_keys(fp.notes_from_table(table))
    assert keys[0] == keys[1] != keys[2]  # moving the drum kit too is another piece
    off, _ = fp.shingles(fp.notes_from_table(table), 4, 4)
    assert np.diff(off)[3] > 0  # a drums-only piece still has shingles


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_gram_hashes_chain_mix64_over_each_run(dtype):
    """gram_hashes runs in place for speed; each value must still be the chain its docstring
    names: h = mix64((h ^ token) + golden) over the run's k tokens, from h = 0."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(-(2**20) if dtype == np.int64 else 0, 2**20, 40).astype(dtype)
    for k in (1, 3, 6):
        want = []
        for start in range(tokens.size - k + 1):
            h = np.zeros(1, np.uint64)
            for t in tokens[start:start + k]:
                with np.errstate(over="ignore"):
                    h = fp.mix64((h ^ np.asarray([t]).astype(np.uint64)) + fp._GOLDEN)
            want.append(int(h[0]))
        assert fp.gram_hashes(tokens, k).tolist() == want
    assert fp.gram_hashes(tokens[:2], 6).size == 0

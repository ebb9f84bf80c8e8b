"""Token cache: entry format, store operations, note matching used by the round-trip check."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from symusic import Note, Score, Track

from pipeline.tokens.cache import (
    Encoding,
    SeqEncoding,
    SourceError,
    TokenCache,
    config_key,
    encode_file,
    f1_from_counts,
    match_counts,
    multiset_matches,
    pack,
    transposition_allowed,
    unpack,
)


def seq(track: int, n: int, seed: int = 0) -> SeqEncoding:
    rng = np.random.default_rng(seed)
    return SeqEncoding(track=track, program=track, is_drum=track == 2, n_notes=n // 2,
                       ids=rng.integers(0, 500, n).astype(np.int32),
                       bar_starts=np.array([0, n // 2], np.int32),
                       beat_starts=np.arange(0, n, 3, dtype=np.int32), rt_matched=n // 2,
                       rt_decoded=n // 2)


def assert_same(a: Encoding, b: Encoding) -> None:
    assert (a.n_notes_input, a.out_of_range, len(a.seqs)) == (b.n_notes_input, b.out_of_range,
                                                              len(b.seqs))
    for x, y in zip(a.seqs, b.seqs, strict=True):
        for field in ("ids", "bar_starts", "beat_starts"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
        assert (x.track, x.program, x.is_drum, x.n_notes, x.rt_matched, x.rt_decoded) == (
            y.track, y.program, y.is_drum, y.n_notes, y.rt_matched, y.rt_decoded)


@pytest.mark.parametrize("enc", [
    Encoding(n_notes_input=7, seqs=(seq(-1, 40),)),
    Encoding(n_notes_input=9, seqs=(seq(0, 10), seq(1, 0), seq(2, 33, 1))),
    Encoding(n_notes_input=3, seqs=(), out_of_range=True),
], ids=["one-stream", "per-track", "out-of-range"])
def test_pack_roundtrip(enc):
    arr = pack(enc)
    assert arr.dtype == np.int32
    assert_same(unpack(arr), enc)
    with pytest.raises(ValueError):
        unpack(arr[:-1] if len(arr) > 4 else np.append(arr, 1).astype(np.int32))


def test_store_put_get_keys_and_corrupt_entries(tmp_path):
    cache = TokenCache(tmp_path, "k1")
    enc = Encoding(n_notes_input=5, seqs=(seq(-1, 12),))
    cache.put("ab" * 32, 0, enc)
    cache.put("ab" * 32, -3, enc)
    assert cache.keys() == {("ab" * 32, 0), ("ab" * 32, -3)}
    assert_same(cache.get("ab" * 32, -3), enc)
    assert cache.get("cd" * 32, 0) is None
    Path(cache.path("ab" * 32, 0)).write_bytes(b"not an entry")
    assert cache.get("ab" * 32, 0) is None  # unreadable -> recomputed, never trusted
    assert not list(tmp_path.rglob("*.tmp"))


def test_prune_keeps_only_referenced(tmp_path):
    old, new = TokenCache(tmp_path, "old"), TokenCache(tmp_path, "new")
    enc = Encoding(n_notes_input=1, seqs=(seq(-1, 4),))
    old.put("11" * 32, 0, enc)
    new.put("22" * 32, 0, enc)
    new.put("33" * 32, 0, enc)
    assert new.prune({("22" * 32, 0)}) == 2
    assert new.keys() == {("22" * 32, 0)} and not (tmp_path / "old").exists()


def test_config_key_ignores_only_encode_ids_split():
    base = {"use_programs": True, "encode_ids_split": "bar"}
    assert config_key("REMI", base) == config_key("REMI", {**base, "encode_ids_split": "no"})
    assert config_key("REMI", base) != config_key("TSD", base)
    assert config_key("REMI", base) != config_key("REMI", {**base, "use_programs": False})


rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows, rows)
def test_multiset_matches_equals_counter_intersection(a, b):
    arr = lambda x: np.array(x, np.int64).reshape(-1, 2)  # noqa: E731
    expected = sum((Counter(a) & Counter(b)).values())
    assert multiset_matches(arr(a), arr(b)) == expected


def test_f1_from_counts():
    assert f1_from_counts(3, 3, 3) == 1.0
    assert f1_from_counts(0, 0, 0) == 1.0
    assert f1_from_counts(1, 2, 2) == 0.5
    assert np.isnan(f1_from_counts(-1, 3, 3))


def score_with(tpq: int, notes: list[tuple[int, int, int]], program: int = 0) -> Score:
    s = Score(tpq)
    t = Track(name="x", program=program, is_drum=False)
    for onset, dur, pitch in notes:
        t.notes.append(Note(onset, dur, pitch, 80))
    s.tracks.append(t)
    return s


def test_match_counts_compares_across_time_divisions():
    a = score_with(8, [(0, 4, 60), (4, 4, 62), (8, 2, 64)])
    b = score_with(480, [(0, 240, 60), (240, 240, 62), (480, 60, 64)])  # last duration differs
    assert match_counts(a, b) == (2, 3)
    assert match_counts(a, score_with(16, [(0, 8, 60), (8, 8, 62), (16, 4, 64)])) == (3, 3)
    assert match_counts(a, score_with(8, [(0, 4, 60)], program=5)) == (0, 1)  # program counts


def test_transposition_allowed_uses_inclusive_range():
    import miditok

    tok = miditok.REMI()  # pitch_range (21, 109), inclusive
    s = score_with(8, [(0, 4, 107), (4, 4, 23)])
    assert transposition_allowed(tok, s, 2) and transposition_allowed(tok, s, -2)
    assert not transposition_allowed(tok, s, 3) and not transposition_allowed(tok, s, -3)


def test_encode_file_verifies_content(tmp_path):
    import miditok

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=True))
    path = tmp_path / "a.mid"
    score_with(480, [(0, 480, 60), (480, 480, 64)]).dump_midi(path)
    from pipeline.core.artifacts import sha256_file

    encs = encode_file(tok, path, sha256_file(path), (0, 5))
    assert encs[0].seqs[0].roundtrip_f1 == 1.0 and encs[0].n_notes_input == 2
    assert encs[5].seqs[0].rt_matched == -1  # augmented copies are not round-trip checked
    with pytest.raises(SourceError, match="sha_mismatch"):
        encode_file(tok, path, "0" * 64, (0,))
    with pytest.raises(SourceError, match="read_error"):
        encode_file(tok, tmp_path / "missing.mid", "0" * 64, (0,))

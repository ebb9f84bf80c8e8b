"""The token cache: the entry format (pipeline.tokens.entries), the store (store), the round-trip
check and its REMI reader (roundtrip, remi_keys) and encoding in workers (encoding)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from symusic import Note, Score, Track

from pipeline.tokens.encoding import MidiFileError, encode_file, transposition_allowed
from pipeline.tokens.entries import (
    FORMAT,
    HEADER,
    Encoding,
    SeqEncoding,
    entry_ok,
    f1_from_counts,
    pack,
    unpack,
)
from pipeline.tokens.roundtrip import match_counts, multiset_matches, same_per_owner
from pipeline.tokens.store import SEGMENT_SCHEMA, Entries, TokenCache, config_key, entry_key


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


rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows, rows)
def test_multiset_matches_equals_counter_intersection(a, b):
    arr = lambda x: np.array(x, np.int64).reshape(-1, 2)  # noqa: E731
    expected = sum((Counter(a) & Counter(b)).values())
    assert multiset_matches(arr(a), arr(b)) == expected


def same_multisets(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """:func:`same_per_owner` of pairs of row arrays (pair ``k``: ``a[k]`` and ``b[k]``)."""
    def columns(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        owner = np.repeat(np.arange(len(rows)), [len(x) for x in rows])
        if not len(owner):
            return owner, np.zeros((0, 0), np.int64)
        return owner, np.concatenate(rows).astype(np.int64).T.copy()

    return same_per_owner(len(a), *columns(a), *columns(b))


small_rows = st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 3), st.integers(0, 2),
                                st.integers(0, 2)), max_size=12)


@settings(max_examples=80, deadline=None)
@given(small_rows, small_rows, st.randoms())
def test_same_multiset_is_equality_of_counters(a, b, rnd):
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    assert same_multisets([arr(a)], [arr(b)]).tolist() == [Counter(a) == Counter(b)]
    shuffled = list(a)
    rnd.shuffle(shuffled)
    assert same_multisets([arr(a)], [arr(shuffled)]).tolist() == [True]


wide = st.lists(st.tuples(st.sampled_from([-1, 0, 2**40, -(2**40)]), st.integers(0, 2),
                          st.integers(-3, 3), st.sampled_from([0, 7, 2**35])), max_size=20)


@settings(max_examples=60, deadline=None)
@given(wide, wide)
def test_multiset_matches_wide_rows(a, b):
    """Rows too wide for one 62-bit code take the exact fallback; same answer either way."""
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    assert multiset_matches(arr(a), arr(b)) == sum((Counter(a) & Counter(b)).values())


def walk(times: list[int], ticks: list[int]) -> list[int]:
    """miditok's ``_split_per_ticks`` walk, as a reference."""
    idxs, ti = [0], 0
    for tick in ticks[1:]:
        while ti < len(times) and times[ti] < tick:
            ti += 1
        if ti == len(times):
            break
        idxs.append(ti)
    return idxs


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.lists(st.integers(0, 50), max_size=12),
       st.booleans())
def test_chunk_starts_equals_the_walk(times, ticks, sort_times):
    from pipeline.tokens.encoding import chunk_starts

    times = sorted(times) if sort_times else times
    ticks = sorted(ticks)
    assert chunk_starts(times, ticks).tolist() == walk(times, ticks)


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
    with pytest.raises(MidiFileError, match="sha_mismatch"):
        encode_file(tok, path, "0" * 64, (0,))
    with pytest.raises(MidiFileError, match="read_error"):
        encode_file(tok, tmp_path / "missing.mid", "0" * 64, (0,))


@pytest.fixture(scope="module")
def remi():
    import miditok

    return miditok.REMI(miditok.TokenizerConfig(use_programs=True))


def decoded_keys(tok, ids: list[int]) -> list[tuple[int, ...]]:
    from miditok import TokSequence

    from pipeline.tokens.roundtrip import note_keys

    score = tok.decode(TokSequence(ids=list(ids)))
    return sorted(map(tuple, note_keys(score, int(score.ticks_per_quarter)).tolist()))


def token_events(tok):
    """Hypothesis strategy: REMI id sequences, well formed or not."""
    v = tok.vocab
    by_type: dict[str, list[int]] = {}
    for token, i in v.items():
        by_type.setdefault(token.split("_")[0], []).append(i)
    pick = lambda typ: st.sampled_from(sorted(by_type[typ]))  # noqa: E731
    note = st.tuples(st.sampled_from(sorted(by_type["Pitch"] + by_type["PitchDrum"])),
                     pick("Velocity"), pick("Duration")).map(list)
    one = st.one_of(pick("Bar").map(lambda i: [i]), pick("Position").map(lambda i: [i]),
                    pick("TimeSig").map(lambda i: [i]),
                    pick("Program").map(lambda i: [i]), note, note,
                    st.sampled_from(sorted(v.values())).map(lambda i: [i]))
    return st.lists(one, max_size=40).map(lambda xs: [i for x in xs for i in x])


def test_remi_note_keys_equal_miditok_decode(remi):
    from hypothesis import HealthCheck

    from pipeline.tokens.remi_keys import remi_note_keys

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(token_events(remi))
    def check(ids):
        fast = remi_note_keys(remi, np.asarray(ids, np.int64))
        assert sorted(map(tuple, fast.tolist())) == decoded_keys(remi, ids)

    check()


@pytest.mark.parametrize("kwargs", [
    {"use_programs": False}, {"use_programs": True, "use_rests": True},
    {"use_programs": True, "use_velocities": False}, {"use_programs": True, "use_chords": True},
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_remi_note_keys_refuses_other_configurations(kwargs):
    import miditok

    from pipeline.tokens.remi_keys import remi_note_keys

    tok = miditok.REMI(miditok.TokenizerConfig(**kwargs))
    assert remi_note_keys(tok, np.zeros(3, np.int64)) is None
    assert remi_note_keys(miditok.TSD(miditok.TokenizerConfig(use_programs=True)),
                          np.zeros(3, np.int64)) is None


def test_remi_note_keys_batch_equals_one_at_a_time(remi):
    """Read together, every sequence gives what it gives alone: no look-back (time signature,
    bar, position, program) and no Pitch-Velocity-Duration triple crosses into a neighbour, and
    ids outside the vocabulary spoil only their own sequence."""
    from hypothesis import HealthCheck

    from pipeline.tokens.remi_keys import remi_note_keys, remi_note_keys_batch

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(token_events(remi), max_size=6), st.integers(0, 6))
    def check(seqs, spoil):
        arrays = [np.asarray(s, np.int64) for s in seqs]
        if spoil < len(arrays):
            arrays[spoil] = np.append(arrays[spoil], len(remi.vocab))
        batch = remi_note_keys_batch(remi, arrays)
        assert len(batch) == len(arrays)
        for k, (ids, got) in enumerate(zip(arrays, batch, strict=True)):
            alone = remi_note_keys(remi, ids)
            if k == spoil:
                assert got is None and alone is None
            else:
                np.testing.assert_array_equal(got, alone)

    check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(small_rows, small_rows), max_size=5), st.randoms())
def test_same_multisets_is_same_multiset_per_pair(pairs, rnd):
    """Pairs settled together give what each gives alone (no row of one pair meets another)."""
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    a = [arr(x) for x, _ in pairs]
    b = [arr(y) if rnd.random() < 0.5 else arr(rnd.sample(x, len(x))) for x, y in pairs]
    together = same_multisets(a, b).tolist()
    assert together == [same_multisets([x], [y]).tolist()[0] for x, y in zip(a, b, strict=True)]
    assert together == [Counter(map(tuple, x.tolist())) == Counter(map(tuple, y.tolist()))
                        for x, y in zip(a, b, strict=True)]


def test_roundtrip_batch_equals_miditok_decode_per_check(remi):
    """The batched check gives miditok's decode counts, whether the fast reader agrees with the
    reference (most checks) or not (a reference that is not the encoded score, so the batch
    falls back to decoding those): a mismatch in one check never leaks into another."""
    from pipeline.tokens.roundtrip import RoundTrip, roundtrip_batch, roundtrip_counts

    scores = [score_with(480, [(0, 480, 60 + k), (480, 240, 64), (960, 480, 67 - k)])
              for k in range(4)]
    pre = [remi.preprocess_score(s) for s in scores]
    checks = []
    for k, p in enumerate(pre):
        ts = remi.encode(p, encode_ids=False, no_preprocess_score=True)
        reference = pre[(k + 1) % len(pre)] if k % 2 else p  # odd checks: the wrong score
        checks.append(RoundTrip(k, 0, np.asarray(ts.ids, np.int32), reference, True,
                                (-1, False)))
    got = roundtrip_batch(remi, checks)
    want = [roundtrip_counts(remi, c.ids, c.reference, c.index, c.one_stream, c.program)
            for c in checks]
    assert got == want
    assert [g[0] == 3 for g in got] == [True, False, True, False]


def test_settle_writes_each_checks_counts_into_its_own_entry(remi):
    """Settled together, each encoding gets the (matched, decoded) counts of miditok's decode
    of its own sequence: odd checks hold another score, with more notes than theirs, so their
    two counts differ and a swap or a shift between entries shows."""
    from dataclasses import replace

    from pipeline.tokens.encoding import encode_score, settle
    from pipeline.tokens.roundtrip import RoundTrip, roundtrip_counts

    pre = [remi.preprocess_score(score_with(480, [(240 * j, 240, 60 + j + k)
                                                  for j in range(2 + k)]))
           for k in range(4)]
    checks: list[RoundTrip] = []
    encodings = [encode_score(remi, p, p.note_num(), check=True, checks=checks, file=k)
                 for k, p in enumerate(pre)]
    checks = [replace(c, reference=pre[c.file + 1]) if c.file % 2 == 0 else c for c in checks]
    settled = settle(remi, checks[::-1], encodings)
    for c, enc in zip(checks, settled, strict=True):
        want = roundtrip_counts(remi, c.ids, c.reference, c.index, c.one_stream, c.program)
        assert (enc.seqs[0].rt_matched, enc.seqs[0].rt_decoded) == want
    assert [enc.seqs[0].rt_matched < enc.seqs[0].rt_decoded for enc in settled] == [
        True, False, True, False]


def test_settle_writes_each_tracks_counts_into_its_own_sequence():
    """Per-track sequences: each track's counts land in its own sequence of the entry."""
    import miditok

    from pipeline.tokens.encoding import encode_score

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=False))
    score = score_with(480, [(0, 480, 60), (480, 480, 62)])
    other = score_with(480, [(0, 240, 70), (240, 240, 71), (480, 240, 72)], program=33)
    score.tracks.append(other.tracks[0])
    pre = tok.preprocess_score(score)
    enc = encode_score(tok, pre, pre.note_num(), check=True)
    assert [(s.n_notes, s.rt_matched, s.rt_decoded) for s in enc.seqs] == [(2, 2, 2), (3, 3, 3)]


@pytest.mark.parametrize("batch_fails", [False, True], ids=["batched", "batch-fails"])
def test_chunk_settles_checks_like_one_file_at_a_time(tmp_path, monkeypatch, batch_fails):
    """A chunk's entries (checks settled together) equal each file encoded alone; a bad file
    in the chunk is flagged on its own; when settling the chunk's checks together fails, they
    are settled one file at a time."""
    from pipeline.core.artifacts import sha256_file
    from pipeline.tokens import encoding
    from pipeline.tokens.tokenizer import make_tokenizer

    jobs = []
    for k in range(5):
        path = tmp_path / f"{k}.mid"
        score_with(480, [(0, 480, 60 + k), (480 * k, 240, 70), (960, 120, 50 + k)]).dump_midi(path)
        jobs.append((sha256_file(path), str(path), (0, 2)))
    jobs[3] = (*jobs[3][:2], (2,))  # its base entry is cached already: only a copy to encode
    (tmp_path / "bad.mid").write_bytes(b"not midi")
    jobs.insert(2, (sha256_file(tmp_path / "bad.mid"), str(tmp_path / "bad.mid"), (0,)))
    encoding._init_worker((make_tokenizer, "REMI", {"use_programs": True}), None, "")
    if batch_fails:
        whole = encoding.roundtrip_batch

        def one_only(tokenizer, checks):
            if len(checks) > 1:
                raise RuntimeError("batch")
            return whole(tokenizer, checks)

        monkeypatch.setattr(encoding, "roundtrip_batch", one_only)
    out, seconds = encoding._encode_chunk(tuple(jobs))
    assert out[2][0] == "read_error" and seconds["check"] > 0
    assert [isinstance(r, tuple) for r in out] == [k == 2 for k in range(len(jobs))]
    tok = encoding._WORKER["tokenizer"]
    for (sha, path, transposes), got in zip(jobs, out, strict=True):
        if isinstance(got, tuple):
            continue
        alone = encode_file(tok, Path(path), sha, transposes)
        assert got.keys() == alone.keys()
        for t in alone:
            np.testing.assert_array_equal(got[t], pack(alone[t]))
        if 0 in got:
            assert unpack(got[0]).seqs[0].roundtrip_f1 == 1.0


def test_a_file_failing_after_its_base_encoding_leaves_no_check_behind(tmp_path, monkeypatch):
    """A file whose augmented copy cannot be made is flagged on its own, and the other files'
    checks are still settled in one batch (its base encoding's check is not left over)."""
    import miditok.data_augmentation

    from pipeline.core.artifacts import sha256_file
    from pipeline.tokens import encoding
    from pipeline.tokens.tokenizer import make_tokenizer

    jobs = []
    for k in range(4):
        path = tmp_path / f"{k}.mid"
        score_with(480, [(0, 480, 60 + k), (480, 240, 70), (960, 120, 50 + k)]).dump_midi(path)
        jobs.append((sha256_file(path), str(path), (0, 2) if k == 1 else (0,)))
    encoding._init_worker((make_tokenizer, "REMI", {"use_programs": True}), None, "")

    def broken(*args, **kwargs):
        raise RuntimeError("no copy")

    monkeypatch.setattr(miditok.data_augmentation, "augment_score", broken)
    batches = []
    whole = encoding.roundtrip_batch
    monkeypatch.setattr(encoding, "roundtrip_batch",
                        lambda tok, checks: batches.append(len(checks)) or whole(tok, checks))
    out, _ = encoding._encode_chunk(tuple(jobs))
    assert out[1] == ("encode_error", "RuntimeError: no copy")
    assert batches == [3]
    assert all(unpack(out[k][0]).seqs[0].roundtrip_f1 == 1.0 for k in (0, 2, 3))


@given(st.integers(1, 100_000), st.integers(1, 16))
def test_chunk_size_stays_within_bounds(n_jobs, workers):
    from pipeline.tokens.encoding import MAX_CHUNK, MIN_CHUNK, chunk_size

    size = chunk_size(n_jobs, workers)
    assert MIN_CHUNK <= size <= MAX_CHUNK
    if n_jobs <= MIN_CHUNK * workers * 8:  # a small run: as few chunks as MIN_CHUNK allows
        assert size == MIN_CHUNK
    if n_jobs >= MAX_CHUNK * workers * 8:
        assert size == MAX_CHUNK


@given(st.integers(1, 100_000), st.integers(1, 16))
def test_chunks_cover_the_jobs_evenly_in_a_multiple_of_the_workers(n_jobs, workers):
    from pipeline.tokens.encoding import chunk_bounds, chunk_size

    bounds = chunk_bounds(n_jobs, workers)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n_jobs and sizes.min() >= 1
    assert sizes.max() - sizes.min() <= 1 and sizes.max() <= chunk_size(n_jobs, workers)
    assert len(sizes) % workers == 0 or len(sizes) == n_jobs


def test_small_run_writes_few_segments_and_matches_any_worker_count(tmp_path):
    """Twenty files: one chunk per worker (a cache segment each, not one per file or two);
    the entries are the same for one and two workers, with or without a store (then returned
    packed, else left in the store), and equal each file encoded alone. The workers' seconds
    come back summed per phase."""
    from pipeline.core.artifacts import sha256_file
    from pipeline.core.parallel import join_all
    from pipeline.tokens.encoding import encode_missing
    from pipeline.tokens.tokenizer import make_tokenizer

    jobs = []
    for k in range(20):
        path = tmp_path / f"{k:02d}.mid"
        score_with(480, [(0, 480, 50 + k), (480, 240, 70), (240 * k, 120, 40 + k)]).dump_midi(path)
        jobs.append((sha256_file(path), str(path), (0,)))
    factory = (make_tokenizer, "REMI", {"use_programs": True})
    runs = {}
    for workers in (1, 2):
        store = TokenCache(tmp_path / f"cache{workers}", "k")
        closing = []
        got, seconds = encode_missing(jobs, factory, store, workers=workers, timeout_s=60,
                                      show_progress=False, closing=closing)
        join_all(closing)
        assert got == {sha: {0: None} for sha, _, _ in jobs}
        assert seconds["encode"] > seconds["check"] > 0 and seconds["cache_write"] > 0
        assert len(store.refresh()) == workers
        runs[workers] = {sha: enc for (sha, _), enc in store.load().items()}
    got, seconds = encode_missing(jobs, factory, None, workers=2, timeout_s=60,
                                  show_progress=False)
    assert seconds["cache_write"] == 0 and seconds.keys() == {"encode", "check", "cache_write"}
    runs[0] = {sha: unpack(r[0]) for sha, r in got.items()}
    tok = make_tokenizer(*factory[1:])
    for sha, path, transposes in jobs:
        alone = encode_file(tok, Path(path), sha, transposes)[0]
        for run in runs.values():
            assert_same(run[sha], alone)


def unpacks(a: np.ndarray) -> bool:
    """Whether :func:`unpack` accepts ``a``."""
    try:
        unpack(a)
    except ValueError:
        return False
    return True


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 9), max_size=3), st.booleans(),
                          st.sampled_from(["ok", "short", "long", "magic", "negative", "dtype"])),
                max_size=6))
def test_block_reads_entries_as_unpack_does(entries):
    """A block of packed entries gives back each entry as packed; a damaged entry (truncated,
    extended, wrong magic, a negative length with the same total, wrong dtype) is refused by
    :func:`entries_ok`, :func:`unpack` and :func:`parse_block`, which names it."""
    from pipeline.tokens.entries import BadEntry, entries_ok, parse_block

    arrays, encodings = [], []
    for lengths, out_of_range, damage in entries:
        enc = Encoding(n_notes_input=len(lengths), out_of_range=out_of_range,
                       seqs=tuple(seq(k, n, k) for k, n in enumerate(lengths)))
        arr = pack(enc)
        if damage == "short":
            arr = arr[:-1]
        elif damage == "long":
            arr = np.append(arr, 7).astype(np.int32)
        elif damage == "magic":
            arr = arr.copy()
            arr[0] += 1
        elif damage == "negative" and lengths:  # a negative length, the same total
            arr = arr.copy()
            arr[HEADER + 4] -= lengths[0] + 1
            arr[HEADER + 5] += lengths[0] + 1
        elif damage == "dtype":
            arr = arr.astype(np.int64)
        arrays.append(arr)
        encodings.append(enc)

    ok = [damage == "ok" or (damage == "negative" and not lengths)
          for lengths, _, damage in entries]
    assert entries_ok(arrays).tolist() == ok == [unpacks(a) for a in arrays]
    keys = [(f"{k:064x}", 0) for k in range(len(arrays))]
    if all(ok):
        block = parse_block(keys, arrays)
        for e, (arr, enc) in enumerate(zip(arrays, encodings, strict=True)):
            assert_same(block.encoding(e), unpack(arr))
            assert_same(block.encoding(e), enc)
    else:
        with pytest.raises(BadEntry) as bad:
            parse_block(keys, arrays)
        assert not ok[bad.value.index]


@pytest.mark.parametrize("arr", [
    np.zeros(0, np.int32), np.array([FORMAT, 0, 1], np.int32), np.array([1, 0, 0, 0], np.int32),
    np.array([FORMAT, -1, 0, 0], np.int32), np.array([FORMAT, 5, 0, 0], np.int32),
    np.array([FORMAT, 0, 0, 0], np.int64), np.array([FORMAT, 0, 3, 0], np.int32),
], ids=["empty", "short", "magic", "negative", "too-many", "dtype", "empty-ok"])
def test_entry_ok_agrees_with_unpack(arr):
    valid = arr.dtype == np.int32 and arr.tolist() == [FORMAT, 0, 3, 0]  # only "empty-ok"
    assert entry_ok(arr) == unpacks(arr) == valid
    good = pack(Encoding(n_notes_input=9, seqs=(seq(0, 10), seq(1, 0), seq(2, 33, 1))))
    assert entry_ok(good) and unpacks(good)
    for bad in (good[:-1], np.append(good, 0).astype(np.int32)):
        assert not entry_ok(bad) and not unpacks(bad)
    negative = good.copy()
    negative[HEADER + 4], negative[HEADER + 5] = -1, negative[HEADER + 5] + 1  # same total
    assert not entry_ok(negative) and not unpacks(negative)


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

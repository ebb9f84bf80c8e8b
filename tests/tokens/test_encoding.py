"""Encoding files into entries (pipeline.tokens.encoding): bar and beat starts against miditok's
walk, transpositions in range, a file checked against its sha256, round-trip checks settled per
chunk, chunk sizes, and the worker pool filling the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokens.encoding import MidiFileError, encode_file, transposition_allowed
from pipeline.tokens.entries import pack, unpack
from pipeline.tokens.store import TokenCache
from tests.tokens._encodings import assert_same, score_with


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


def test_a_transposition_out_of_range_gives_an_empty_refused_entry(tmp_path):
    """A copy that would push a pitch past the tokenizer's range (21..109) is an entry without
    sequences, marked out of range; one that stays inside is encoded."""
    import miditok

    from pipeline.core.artifacts import sha256_file
    from pipeline.tokens.entries import Encoding

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=True))
    path = tmp_path / "a.mid"
    score_with(480, [(0, 480, 100), (480, 480, 60)]).dump_midi(path)
    encs = encode_file(tok, path, sha256_file(path), (0, -12, 12))
    assert encs[12] == Encoding(n_notes_input=2, seqs=(), out_of_range=True)
    assert not encs[-12].out_of_range and encs[-12].seqs[0].n_notes == 2


def test_an_unreadable_file_is_flagged_without_a_machine_path(tmp_path):
    import miditok

    from pipeline.core.artifacts import sha256_bytes

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=True))
    with pytest.raises(MidiFileError) as missing:
        encode_file(tok, tmp_path / "missing.mid", "0" * 64, (0,))
    assert missing.value.flag == "read_error"
    assert missing.value.detail.startswith("FileNotFoundError")
    assert str(tmp_path) not in str(missing.value)
    (tmp_path / "bad.mid").write_bytes(b"MThd not midi")
    with pytest.raises(MidiFileError, match=r"^read_error: ") as unparsable:
        encode_file(tok, tmp_path / "bad.mid", sha256_bytes(b"MThd not midi"), (0,))
    assert unparsable.value.flag == "read_error"

"""Encodings and scores built by hand, shared by the token tests."""

from __future__ import annotations

import numpy as np
from symusic import Note, Score, Track

from pipeline.tokens.entries import Encoding, SeqEncoding


def seq(track: int, n: int, seed: int = 0) -> SeqEncoding:
    rng = np.random.default_rng(seed)
    return SeqEncoding(track=track, program=track, is_drum=track == 2, n_notes=n // 2,
                       ids=rng.integers(0, 500, n).astype(np.int32),
                       bar_starts=np.array([0, n // 2], np.int32),
                       beat_starts=np.arange(0, n, 3, dtype=np.int32), rt_matched=n // 2,
                       rt_decoded=n // 2)


def assert_same(a: Encoding, b: Encoding) -> None:
    assert (a.n_notes_input, a.out_of_range, a.truncated_bars, len(a.seqs)) == (
        b.n_notes_input, b.out_of_range, b.truncated_bars, len(b.seqs))
    for x, y in zip(a.seqs, b.seqs, strict=True):
        for field in ("ids", "bar_starts", "beat_starts"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
        assert (x.track, x.program, x.is_drum, x.n_notes, x.rt_matched, x.rt_decoded) == (
            y.track, y.program, y.is_drum, y.n_notes, y.rt_matched, y.rt_decoded)


def score_with(tpq: int, notes: list[tuple[int, int, int]], program: int = 0) -> Score:
    s = Score(tpq)
    t = Track(name="x", program=program, is_drum=False)
    for onset, dur, pitch in notes:
        t.notes.append(Note(onset, dur, pitch, 80))
    s.tracks.append(t)
    return s

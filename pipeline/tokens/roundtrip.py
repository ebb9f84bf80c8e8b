"""The round-trip check: do a sequence's base ids decode to the notes they encode?

Notes are compared as multisets of (program, onset, pitch, duration) rows on a common time grid
(:func:`note_keys`, :func:`multiset_matches`). A chunk's checks are settled together
(:func:`roundtrip_batch`): one-stream REMI sequences are read by
:mod:`pipeline.tokens.remi_keys` and compared in one sort (:func:`same_per_owner`); any other
sequence, or one whose notes differ, is decoded by miditok (:func:`roundtrip_counts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import lcm
from typing import Any

import numpy as np

from pipeline.tokens.remi_keys import remi_note_columns
from pipeline.tokens.tokenizer import miditok_ids


def note_keys(score: Any, grid: int, program: int | None = None) -> np.ndarray:
    """(program, onset, pitch, duration) rows of every note, times on a ``grid`` ticks/quarter.

    ``grid`` must be a multiple of the score's time division, so two scores with different
    divisions (miditok decodes at its own) compare exactly. Drums use program -1; ``program``
    overrides every track's program.
    """
    return notes_keys_batch([score], grid, program)[0]


def notes_keys_batch(scores: list[Any], grid: int, program: int | None = None
                     ) -> list[np.ndarray]:
    """:func:`note_keys` of each score (``grid`` a multiple of every score's division):
    :func:`note_columns`, rows split per score."""
    owner, cols = note_columns(scores, grid, program)
    if not scores:
        return []
    return np.split(cols.T, np.cumsum(np.bincount(owner, minlength=len(scores)))[:-1])


def note_columns(scores: list[Any], grid: int, program: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The notes of all ``scores`` as ``(owner, columns)``: ``owner`` the score of each note
    (nondecreasing) and ``columns`` a (4, notes) array of program, onset, pitch and duration,
    times on ``grid`` ticks per quarter (a multiple of every score's division); drums are
    program -1 and ``program`` overrides every track's program. Built with a few array
    operations for all scores together."""
    owners, progs, factors, cols = [], [], [], {"time": [], "pitch": [], "duration": []}
    for k, score in enumerate(scores):
        factor = grid // int(score.ticks_per_quarter)
        for track in score.tracks:
            notes = track.notes.numpy()
            n = len(notes["time"])
            if n == 0:
                continue
            for name, values in cols.items():
                values.append(notes[name])
            prog = program if program is not None else (-1 if track.is_drum
                                                        else int(track.program))
            owners.append(k)
            progs.append(prog)
            factors.append(factor)
    if not progs:
        return np.zeros(0, np.int64), np.zeros((4, 0), np.int64)
    counts = np.fromiter((len(t) for t in cols["time"]), np.int64, count=len(progs))
    factor = np.repeat(np.asarray(factors, np.int64), counts)
    out = np.empty((4, int(counts.sum())), np.int64)
    out[0] = np.repeat(np.asarray(progs, np.int64), counts)
    out[1] = np.concatenate(cols["time"])
    out[1] *= factor
    out[2] = np.concatenate(cols["pitch"])
    out[3] = np.concatenate(cols["duration"])
    out[3] *= factor
    return np.repeat(np.asarray(owners, np.int64), counts), out


def match_counts(reference: Any, decoded: Any, program: int | None = None) -> tuple[int, int]:
    """(matched, decoded) note counts of ``decoded`` against ``reference`` (multisets)."""
    grid = lcm(int(reference.ticks_per_quarter), int(decoded.ticks_per_quarter))
    ref = note_keys(reference, grid, program)
    dec = note_keys(decoded, grid, program)
    return multiset_matches(ref, dec), len(dec)


def multiset_matches(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the multiset intersection of the rows of ``a`` and ``b``.

    Rows are first mapped to one int64 code each (mixed radix over the columns' joint ranges),
    so the common case, equal multisets, is two 1-D sorts; ``np.unique(axis=0)`` on the rows
    cost more than the decode it checks.
    """
    if len(a) == 0 or len(b) == 0:
        return 0
    ka, kb = _row_codes(a, b)
    ka, kb = np.sort(ka), np.sort(kb)
    if len(ka) == len(kb) and np.array_equal(ka, kb):
        return len(ka)
    _, codes = np.unique(np.concatenate([ka, kb]), return_inverse=True)
    codes = codes.reshape(-1)
    n = int(codes.max()) + 1
    return int(np.minimum(np.bincount(codes[: len(ka)], minlength=n),
                          np.bincount(codes[len(ka) :], minlength=n)).sum())


def same_per_owner(n: int, owner_a: np.ndarray, cols_a: np.ndarray, owner_b: np.ndarray,
                   cols_b: np.ndarray) -> np.ndarray:
    """Per owner ``0..n-1``: whether its rows in ``a`` and in ``b`` are the same multiset. Rows
    are given as columns (``cols_a[:, j]`` is row ``j``, owned by ``owner_a[j]``). Every pair
    is settled in one sort: each row becomes one code, with its owner as the most significant
    digit (:func:`_column_codes`), so after sorting both sides position ``p`` holds a row of
    the same owner in both wherever the owners' row counts agree. Cheaper than
    :func:`multiset_matches` per pair on the tens of rows of a short piece."""
    same = np.bincount(owner_a, minlength=n) == np.bincount(owner_b, minlength=n)
    keep_a, keep_b = same[owner_a], same[owner_b]
    if not keep_a.any():
        return same
    rows_a = [owner_a, *cols_a] if keep_a.all() else [c[keep_a] for c in (owner_a, *cols_a)]
    rows_b = [owner_b, *cols_b] if keep_b.all() else [c[keep_b] for c in (owner_b, *cols_b)]
    code_a, code_b = _column_codes(rows_a, rows_b)
    differ = np.sort(code_a) != np.sort(code_b)
    if differ.any():
        same[np.unique(np.sort(rows_a[0])[differ])] = False
    return same


def _row_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_column_codes` of rows ``a`` and ``b``."""
    return _column_codes(list(a.T), list(b.T))


def _column_codes(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One code per row of ``a`` and of ``b``, each given as its columns (row ``j`` of ``a`` is
    ``[col[j] for col in a]``), equal exactly when rows are equal and ordered as the rows are
    (first column most significant): mixed radix when the joint ranges fit in 62 bits, else
    the rank of each distinct row."""
    lo = [min(int(x.min()), int(y.min())) for x, y in zip(a, b, strict=True)]
    spans = [max(int(x.max()), int(y.max())) - v + 1 for x, y, v in zip(a, b, lo, strict=True)]
    if math.prod(spans) < 2**62:
        codes_a, codes_b = np.zeros(len(a[0]), np.int64), np.zeros(len(b[0]), np.int64)
        for col_a, col_b, low, span in zip(a, b, lo, spans, strict=True):
            codes_a *= span
            codes_a += col_a - low
            codes_b *= span
            codes_b += col_b - low
        return codes_a, codes_b
    both = np.concatenate([np.stack(a, axis=1), np.stack(b, axis=1)]).astype(np.int64)
    codes = np.unique(both, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return codes[: len(a[0])], codes[len(a[0]) :]


@dataclass(frozen=True)
class RoundTrip:
    """A round-trip check to settle: the base ``ids`` of sequence ``index`` of the encoding of
    file ``file`` (its position in a chunk), against the preprocessed ``reference`` score.
    Holds no ``TokSequence``: a chunk's worth of their events kept alive tripled the garbage
    collector's work."""

    file: int
    index: int  # position of the sequence in the encoding (= its track, per-track mode)
    ids: np.ndarray
    reference: Any
    one_stream: bool
    program: tuple[int, bool]



def roundtrip_batch(tokenizer: Any, checks: list[RoundTrip]) -> list[tuple[int, int]]:
    """(matched, decoded) note counts of each check's ``decode(seq)`` against its reference.

    One-stream REMI sequences are read together (:func:`remi_note_columns`) and compared with
    their references' notes (:func:`note_columns`) in one sort (:func:`same_per_owner`):
    numpy's per-call cost on a short piece exceeded the work, so a few calls per chunk of
    files replace a dozen per file. A sequence whose notes differ from the reference, or that
    the reader does not cover, is decoded by miditok (:func:`roundtrip_counts`), which gives
    the exact counts."""
    out: list[tuple[int, int] | None] = [None] * len(checks)
    fast_at = [k for k, c in enumerate(checks) if c.one_stream]
    read = remi_note_columns(tokenizer, [checks[k].ids for k in fast_at]) if fast_at \
        else None
    if read is not None:
        owner_d, cols_d, bad = read
        references = [checks[k].reference for k in fast_at]
        division = int(tokenizer.time_division)
        grid = lcm(division, *(int(r.ticks_per_quarter) for r in references))
        if grid != division:
            cols_d[[1, 3]] *= grid // division
        owner_r, cols_r = note_columns(references, grid)
        n = len(fast_at)
        same = same_per_owner(n, owner_r, cols_r, owner_d, cols_d) & ~bad
        n_ref = np.bincount(owner_r, minlength=n).tolist()
        for j in np.flatnonzero(same).tolist():
            out[fast_at[j]] = (n_ref[j], n_ref[j])
    return [o if o is not None else roundtrip_counts(tokenizer, c.ids, c.reference, c.index,
                                                     c.one_stream, c.program)
            for o, c in zip(out, checks, strict=True)]


def roundtrip_counts(tokenizer: Any, ids: np.ndarray, reference: Any, track: int,
                     one_stream: bool, program: tuple[int, bool]) -> tuple[int, int]:
    """(matched, decoded) note counts of miditok's ``decode`` of base ``ids`` against the
    preprocessed reference (miditok maps the ids back to their tokens, a bijection). Per-track
    sequences are compared with their own track, programs ignored (the stream does not encode
    them; they are passed back to the decoder). A compound tokenizer's ``ids`` are its steps
    one after the other, as the store packs them (:func:`miditok_ids`).
    """
    from miditok import TokSequence

    fresh = TokSequence(ids=miditok_ids(tokenizer, ids))
    if one_stream:
        return match_counts(reference, tokenizer.decode(fresh))
    decoded = tokenizer.decode([fresh], programs=[program])
    ref = reference.copy()
    keep = ref.tracks[track].copy() if track < len(ref.tracks) else None
    ref.tracks.clear()
    if keep is not None:
        ref.tracks.append(keep)
    return match_counts(ref, decoded, program=0)


"""Melody fingerprints (tier ``melody``): the top voice of each piece as a transposition-invariant
interval sequence, vectorised over many pieces like :mod:`pipeline.similarity.fingerprints`.

Two views of the top voice, because each fails where the other holds: the *skyline* (highest
sounding non-drum note, robust to any track layout) and the *top track* (the track with the
highest mean pitch, robust to an inner voice crossing above the melody, as a chorale's alto does).
"""

from __future__ import annotations

import numpy as np

from pipeline.similarity.fingerprints import (
    Events,
    NoteArrays,
    ioi_classes,
    note_events,
    piece_digests,
)


def _first_event_at_or_after(ev: Events, piece: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each query (piece, t), the global index of the first event of that piece with time ≥ t
    (the piece's end offset if none).

    One searchsorted over a globally increasing key ``piece + (time - start) / (span + 1)`` instead
    of one per piece; the same float operations on equal times give equal keys, so ties resolve
    exactly as ``>=``.
    """
    n_pieces = ev.offsets.size - 1
    start = np.zeros(n_pieces)
    has = np.diff(ev.offsets) > 0
    start[has] = ev.time[ev.offsets[:-1][has]]
    last = np.zeros(n_pieces)
    last[has] = ev.time[ev.offsets[1:][has] - 1]
    if piece.size:  # queries come piece-sorted: per-piece max by reduceat over their runs
        runs = np.flatnonzero(np.diff(piece, prepend=-1))
        last[piece[runs]] = np.maximum(last[piece[runs]], np.maximum.reduceat(t, runs))
    span = last - start + 1.0  # fractions stay below 1, so keys never reach the next piece

    def key(p: np.ndarray, x: np.ndarray) -> np.ndarray:
        return p + (x - start[p]) / span[p]

    ev_key = key(ev.piece, ev.time)
    return np.searchsorted(ev_key, key(piece, t), side="left")


def _range_max(n: int, lo: np.ndarray, hi: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``out[j] = max(value[k] for k with lo[k] <= j < hi[k])`` (-1 where none), vectorised.

    Each interval is written as two overlapping power-of-two blocks of a sparse table, which is
    then pushed down level by level: O((n + intervals) log n) numpy work.
    """
    out = np.full(n, -1, dtype=np.int32)
    ok = hi > lo
    lo, hi, value = lo[ok], hi[ok], value[ok].astype(np.int32)
    if lo.size == 0:
        return out
    level = np.floor(np.log2(hi - lo)).astype(np.int64)
    table = np.full((int(level.max()) + 1, n), -1, dtype=np.int32)
    # scatter-max without ufunc.at: sort writes by (cell, value) and keep each cell's last write
    cell = np.concatenate([level * n + lo, level * n + hi - (np.int64(1) << level)])
    value = np.concatenate([value, value])
    order = np.lexsort((value, cell))
    cell, value = cell[order], value[order]
    last = np.ones(cell.size, dtype=bool)
    last[:-1] = cell[1:] != cell[:-1]
    table.reshape(-1)[cell[last]] = value[last]
    for k in range(table.shape[0] - 1, 0, -1):
        half = 1 << (k - 1)
        np.maximum(table[k - 1], table[k], out=table[k - 1])
        np.maximum(table[k - 1][half:], table[k][:-half], out=table[k - 1][half:])
    return table[0]


def skyline(notes: NoteArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top voice of the non-drum notes: ``(offsets, time, pitch)`` flat per piece.

    A note is in the skyline if it is the highest note starting at its onset and no note that
    started earlier and still sounds is higher (equal pitch counts as the top voice re-striking).
    """
    seg = notes.segment()
    keep = ~notes.is_drum
    seg, onset = seg[keep], notes.onset[keep]
    pitch = notes.pitch[keep].astype(np.int32)
    end = onset + notes.duration[keep]
    ev, event_of_note = note_events(seg, onset, pitch, notes.n_pieces)
    end_event = _first_event_at_or_after(ev, seg, end)
    held = _range_max(ev.time.size, event_of_note + 1, end_event, pitch)
    top = ev.top >= held
    offsets = np.zeros(notes.n_pieces + 1, dtype=np.int64)
    np.cumsum(np.bincount(ev.piece[top], minlength=notes.n_pieces), out=offsets[1:])
    return offsets, ev.time[top], ev.top[top]


def top_track_mask(notes: NoteArrays) -> np.ndarray:
    """Notes of each piece's top voice track: the non-drum track with the highest mean pitch
    (ties: the lower track number). Voice crossings fool a skyline, not a track (a chorale's
    alto rising above the soprano stays in the alto track)."""
    seg = notes.segment()
    nd = ~notes.is_drum
    key = seg * 65536 + (notes.track.astype(np.int64) + 32768)
    uniq, inverse = np.unique(key[nd], return_inverse=True)
    if uniq.size == 0:
        return nd
    mean = (np.bincount(inverse, weights=notes.pitch[nd].astype(np.float64))
            / np.bincount(inverse))
    piece = uniq // 65536
    order = np.lexsort((uniq, -mean, piece))
    first = np.ones(order.size, dtype=bool)
    first[1:] = piece[order][1:] != piece[order][:-1]
    return nd & np.isin(key, uniq[order][first])


def _top_voice(notes: NoteArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Skyline with repeated pitches merged: ``(offsets, time, interval, first)`` flat per piece;
    ``interval`` is 0 at a piece's first note (``first``)."""
    offsets, time, pitch = skyline(notes)
    piece = np.repeat(np.arange(notes.n_pieces), np.diff(offsets))
    first = np.zeros(pitch.size, dtype=bool)
    first[offsets[:-1][np.diff(offsets) > 0]] = True
    keep = first.copy()
    keep[1:] |= pitch[1:] != pitch[:-1]
    piece, time, pitch, first = piece[keep], time[keep], pitch[keep], first[keep]
    counts = np.bincount(piece, minlength=notes.n_pieces)
    m_off = np.zeros(notes.n_pieces + 1, dtype=np.int64)
    np.cumsum(counts, out=m_off[1:])
    interval = np.diff(pitch, prepend=0).astype(np.int64)
    interval[first] = 0
    return m_off, time, interval, first


def _melody_key(voice: tuple[np.ndarray, ...], *, min_notes: int, rhythm: bool,
                ioi_resolution: int) -> np.ndarray:
    """The key of each piece's top voice (``_top_voice``'s output)."""
    m_off, time, interval, first = voice
    counts = np.diff(m_off)
    cols = [interval]
    if rhythm:
        cols.append(ioi_classes(time, first, ioi_resolution))
    rows = np.stack(cols, axis=1).astype("<i8")
    return piece_digests(rows, m_off, counts >= max(min_notes, 2))


def _intervals(voice: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, intervals)`` of each piece's top voice (``_top_voice``'s output): a melody of
    ``n`` notes gives ``n - 1`` intervals."""
    m_off, _, interval, first = voice
    counts = np.diff(m_off) - (np.diff(m_off) > 0)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets, interval[~first]


def melody_keys(notes: NoteArrays, *, min_notes: int, rhythm: bool, ioi_resolution: int
                ) -> np.ndarray:
    """Per piece two melody keys ``(P, 2)``: of the skyline of all non-drum notes and of the
    skyline of the top voice track (see :func:`top_track_mask`).

    Repeated pitches are merged (harmonisations tie or re-strike the same tune differently), then
    a key hashes the sequence of pitch intervals — plus inter-onset-ratio classes when ``rhythm``.
    A melody with fewer than ``min_notes`` notes gets "" (too short to tell tunes apart).
    """
    return melody_keys_and_skyline(notes, min_notes=min_notes, rhythm=rhythm,
                                   ioi_resolution=ioi_resolution)[0]


def melody_keys_and_skyline(notes: NoteArrays, *, min_notes: int, rhythm: bool,
                            ioi_resolution: int
                            ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """:func:`melody_keys` and the skyline's intervals (the first view of
    :func:`melody_intervals`), from one pass over the skyline."""
    kw = dict(min_notes=min_notes, rhythm=rhythm, ioi_resolution=ioi_resolution)
    sky = _top_voice(notes)
    top = _melody_key(_top_voice(notes.select(top_track_mask(notes))), **kw)
    return np.stack([_melody_key(sky, **kw), top], axis=1), _intervals(sky)


def melody_intervals(notes: NoteArrays) -> list[tuple[np.ndarray, np.ndarray]]:
    """The two top-voice views of :func:`melody_keys` (skyline, top track) as pitch-interval
    sequences: per view ``(offsets, intervals)``, piece ``i``'s melody of ``n`` notes (repeated
    pitches merged) giving ``n - 1`` intervals ``intervals[offsets[i]:offsets[i+1]]``."""
    return [_intervals(_top_voice(view))
            for view in (notes, notes.select(top_track_mask(notes)))]

"""What the per-piece caches share: the identity of a piece's notes, and a selection of pieces.

Dedupe's verdict store (:class:`pipeline.music.duplicates.VerdictStore`) keys a pair's measures
by the digests of its two pieces, and the leakage audit's cache
(:mod:`pipeline.music.leakage_cache`) matches pieces by sha256 and digest, so a result is reused
only for the same notes, whatever ingest code produced them.
"""

from __future__ import annotations

import hashlib

import numpy as np

from pipeline.music.fingerprints import NoteArrays, NotesTable

DIGEST_COLUMNS = (("onset", "<f8"), ("duration", "<f8"), ("pitch", "<i2"), ("is_drum", "?"),
                  ("track", "<i2"))
"""The note columns a piece's digest covers, in order, with the bytes each is hashed as."""


def note_digests(notes: NoteArrays | NotesTable) -> list[str]:
    """Per piece, a digest (128 bits, hex) of exactly the note columns dedupe's tiers and the
    leakage audit read: onset, duration, pitch, is_drum and track, in order
    (:data:`DIGEST_COLUMNS`). A :class:`~pipeline.music.fingerprints.NotesTable` is hashed
    where Arrow holds its notes, a record batch at a time, never copied whole."""
    if isinstance(notes, NoteArrays):
        span = (notes.offsets[:-1], notes.offsets[1:])
        return _hash_spans([span] * len(DIGEST_COLUMNS),
                           [getattr(notes, c) for c, _ in DIGEST_COLUMNS])
    out: dict[int, str] = {}
    wanted = np.sort(notes.rows)
    first = 0
    for batch in notes.table.select([c for c, _ in DIGEST_COLUMNS]).to_batches():
        last = first + batch.num_rows
        rows = wanted[np.searchsorted(wanted, first) : np.searchsorted(wanted, last)]
        if rows.size:
            spans, values = [], []
            for c, _ in DIGEST_COLUMNS:
                lists = batch.column(c)
                off = np.asarray(lists.offsets, dtype=np.int64)
                end = off[1:]
                if lists.null_count:  # a null list is an empty piece, whatever its segment
                    valid = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), bool)
                    end = np.where(valid, end, off[:-1])
                spans.append((off[:-1][rows - first], end[rows - first]))
                values.append(lists.values.to_numpy(zero_copy_only=False))
            out.update(zip(rows.tolist(), _hash_spans(spans, values), strict=True))
        first = last
    return [out[r] for r in notes.rows.tolist()]


def _hash_spans(spans: list[tuple[np.ndarray, np.ndarray]], values: list[np.ndarray]
                ) -> list[str]:
    """One digest per row: row ``k`` hashes ``values[c][start[k]:end[k]]`` of each column ``c``
    in turn (``spans[c] = (start, end)``), as the bytes :data:`DIGEST_COLUMNS` names."""
    bounds, views = [], []
    for (start, end), v, (_, dtype) in zip(spans, values, DIGEST_COLUMNS, strict=True):
        width = np.dtype(dtype).itemsize
        bounds.append(((start * width).tolist(), (end * width).tolist()))
        views.append(memoryview(np.ascontiguousarray(v, dtype)).cast("B"))
    out = []
    for k in range(len(bounds[0][0]) if bounds else 0):
        h = hashlib.sha256()
        for (lo, hi), v in zip(bounds, views, strict=True):
            h.update(v[lo[k] : hi[k]])
        out.append(h.hexdigest()[:32])
    return out


def take_pieces(notes: NoteArrays | NotesTable, idx: np.ndarray) -> NoteArrays:
    """Pieces ``idx`` of ``notes``, in that order (the pieces a cache did not have)."""
    if isinstance(notes, NotesTable):
        return notes.take(idx)
    if idx.size == notes.n_pieces and np.array_equal(idx, np.arange(notes.n_pieces)):
        return notes
    counts = notes.lengths[idx]
    offsets = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    take = np.repeat(notes.offsets[idx] - offsets[:-1], counts) + np.arange(offsets[-1])
    return NoteArrays(notes.sha256[idx], offsets, notes.onset[take], notes.duration[take],
                      notes.pitch[take], notes.is_drum[take], notes.track[take])

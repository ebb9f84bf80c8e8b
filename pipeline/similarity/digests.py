"""What the per-piece caches share: the identity of a piece's notes, and a selection of pieces.

Dedupe's verdict store (:class:`pipeline.similarity.duplicates.VerdictStore`) keys a pair's measures
by the digests of its two pieces, and the leakage audit's cache
(:mod:`pipeline.similarity.leakage_cache`) matches pieces by sha256 and digest, so a result is
reused
only for the same notes, whatever ingest code produced them.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np

from pipeline.similarity.fingerprints import NoteArrays


def note_digests(notes: NoteArrays) -> list[str]:
    """Per piece, a digest (128 bits, hex) of exactly the note columns dedupe's tiers and the
    leakage audit read: onset, duration, pitch, is_drum and track, in order."""
    cols = [np.ascontiguousarray(notes.onset, "<f8"), np.ascontiguousarray(notes.duration, "<f8"),
            np.ascontiguousarray(notes.pitch, "<i2"), np.ascontiguousarray(notes.is_drum, "?"),
            np.ascontiguousarray(notes.track, "<i2")]
    views = [memoryview(c).cast("B") for c in cols]
    widths = [c.itemsize for c in cols]
    out = []
    bounds = notes.offsets.tolist()
    for lo, hi in itertools.pairwise(bounds):
        h = hashlib.sha256()
        for v, w in zip(views, widths, strict=True):
            h.update(v[lo * w : hi * w])
        out.append(h.hexdigest()[:32])
    return out


def take_pieces(notes: NoteArrays, idx: np.ndarray) -> NoteArrays:
    """Pieces ``idx`` of ``notes``, in that order (the pieces a cache did not have)."""
    if idx.size == notes.n_pieces and np.array_equal(idx, np.arange(notes.n_pieces)):
        return notes
    counts = notes.lengths[idx]
    offsets = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    take = np.repeat(notes.offsets[idx] - offsets[:-1], counts) + np.arange(offsets[-1])
    return NoteArrays(notes.sha256[idx], offsets, notes.onset[take], notes.duration[take],
                      notes.pitch[take], notes.is_drum[take], notes.track[take])

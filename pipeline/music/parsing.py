"""MIDI bytes -> note table, and the content hash that ingest and dedupe share.

Times are in quarter-note beats (``tick / ticks_per_quarter``), so the same music saved at another
resolution or under another tempo map gives the same onsets. ``note_hash`` additionally drops
velocity, track layout, programs and meta events, and quantises timing to 1/``GRID`` beat, so it is
identical for the same music saved differently.

Ingest's workers parse and judge a chunk of files at once (:func:`parse_many`,
:func:`note_hashes`, :func:`max_gaps_beats`): one sort over all their notes instead of one per
file, where numpy's per-call cost on a few hundred notes outweighs the sorting itself. The
one-file functions are the same code on a chunk of one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.arrays import lex_order

GRID = 48
"""Beat subdivisions for hashing: divisible by 16 (64th notes at 4) and 3 (triplets)."""

NOTE_COLUMNS = ("onset", "duration", "pitch", "velocity", "track", "program", "is_drum")


@dataclass
class ParsedMidi:
    """What ingest keeps of one parsed file. ``notes`` maps NOTE_COLUMNS to equal-length arrays."""

    tpq: int
    n_tracks: int
    duration_s: float
    notes: dict[str, np.ndarray] = field(repr=False)


@dataclass
class ParsedBatch:
    """Several files parsed at once. Per file (arrays in file order): ``tpq``, ``n_tracks`` (with
    notes), ``duration_s``, ``counts`` (notes) and ``errors`` (the parser's message, None when it
    parsed; such a file has no notes and zero facts). ``notes``: every file's notes, each file's
    in canonical order, concatenated in file order."""

    tpq: np.ndarray
    n_tracks: np.ndarray
    duration_s: np.ndarray
    counts: np.ndarray
    errors: list[str | None]
    notes: dict[str, np.ndarray] = field(repr=False)

    def one(self, k: int) -> ParsedMidi:
        """File ``k`` alone (raises ``RuntimeError`` with the parser's message if it failed)."""
        if self.errors[k] is not None:
            raise RuntimeError(self.errors[k])
        a = int(self.counts[:k].sum())
        b = a + int(self.counts[k])
        return ParsedMidi(int(self.tpq[k]), int(self.n_tracks[k]), float(self.duration_s[k]),
                          {c: v[a:b] for c, v in self.notes.items()})


def looks_like_midi(head: bytes) -> bool:
    """Standard MIDI files start with an ``MThd`` chunk."""
    return head[:4] == b"MThd"


def parse_midi(data: bytes) -> ParsedMidi:
    """Parse MIDI bytes with symusic (raises ``RuntimeError`` on corrupt input)."""
    return parse_many([data]).one(0)


def parse_many(datas: Sequence[bytes]) -> ParsedBatch:
    """Parse several files' MIDI bytes with symusic. A file the parser rejects (``RuntimeError``,
    ``ValueError``, ``OverflowError``, or a resolution of zero ticks) gets its message in
    ``errors``; the others go on.

    Notes are put in canonical order, independent of track order: (onset, pitch, duration,
    track). All files' notes are ordered by one sort (file first), on the integer ticks, which
    give the order of the beats (``tick / tpq`` is monotonic and exact here); one file at a time,
    the numpy calls per file cost more than the sorting itself."""
    import symusic

    n = len(datas)
    tpq = np.zeros(n, np.int64)
    n_tracks = np.zeros(n, np.int64)
    duration_s = np.zeros(n, np.float64)
    counts = np.zeros(n, np.int64)
    errors: list[str | None] = [None] * n
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ("tick", "ticks", "pitch", "velocity")}
    per_track: list[tuple[int, int, int, int]] = []  # (track, program, is_drum, notes)
    for k, data in enumerate(datas):
        try:
            score = symusic.Score.from_midi(data)
            tpq[k] = int(score.ticks_per_quarter)
            if tpq[k] <= 0:
                raise ValueError(f"ticks per quarter note is {tpq[k]}")
            tracks = [(i, t, t.notes.numpy()) for i, t in enumerate(score.tracks)]
            tracks = [(i, t, arr) for i, t, arr in tracks if arr["pitch"].size]
            duration_s[k] = float(score.to("second").end()) if tracks else 0.0
        except (RuntimeError, ValueError, OverflowError) as e:
            errors[k] = str(e) or type(e).__name__
            tpq[k] = duration_s[k] = 0
            continue
        n_tracks[k] = len(tracks)
        for i, track, arr in tracks:
            size = arr["pitch"].size
            counts[k] += size
            parts["tick"].append(arr["time"])
            parts["ticks"].append(arr["duration"])
            parts["pitch"].append(arr["pitch"])
            parts["velocity"].append(arr["velocity"])
            per_track.append((i, int(track.program), int(track.is_drum), size))
    if not parts["tick"]:
        return ParsedBatch(tpq, n_tracks, duration_s, counts, errors,
                           {c: _empty(c) for c in NOTE_COLUMNS})
    cat = {c: np.concatenate(v) for c, v in parts.items()}
    meta = np.array(per_track, np.int64)  # each track's values, repeated once per note
    for j, c in enumerate(("track", "program", "is_drum")):
        cat[c] = np.repeat(meta[:, j].astype(_empty(c).dtype), meta[:, 3])
    file = np.repeat(np.arange(n), counts)
    # Ties in (onset, pitch, duration) keep track order: the sort is stable and each file's
    # tracks are concatenated in order.
    order = lex_order(file, cat["tick"], cat["pitch"], cat["ticks"])
    per_note = tpq[file].astype(np.float64)  # file[order] == file: each file's block stays put
    notes = {
        "onset": cat["tick"][order].astype(np.float64) / per_note,
        "duration": cat["ticks"][order].astype(np.float64) / per_note,
        **{c: cat[c][order].astype(_empty(c).dtype, copy=False) for c in NOTE_COLUMNS[2:]},
    }
    return ParsedBatch(tpq, n_tracks, duration_s, counts, errors, notes)


def _empty(col: str) -> np.ndarray:
    dtype = {"onset": np.float64, "duration": np.float64, "is_drum": bool}.get(col, np.int16)
    return np.zeros(0, dtype=dtype)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of the concatenated pieces starts (``counts`` items each)."""
    return np.cumsum(counts) - counts


def durations_beats(notes: dict[str, np.ndarray], counts: Sequence[int]) -> np.ndarray:
    """Each piece's end in beats (its notes' latest offset; 0 without notes), for pieces whose
    notes are concatenated (``counts`` notes each)."""
    counts = np.asarray(counts, np.int64)
    out = np.zeros(counts.size)
    has = counts > 0
    if has.any():
        out[has] = np.maximum.reduceat(notes["onset"] + notes["duration"], _starts(counts)[has])
    return out


def max_gaps_beats(notes: dict[str, np.ndarray], counts: Sequence[int]) -> np.ndarray:
    """Each piece's longest stretch without any sounding note, including the lead-in before its
    first note, for pieces whose notes (sorted by onset) are concatenated, ``counts`` notes
    each."""
    counts = np.asarray(counts, np.int64)
    onset = notes["onset"]
    end = onset + notes["duration"]
    starts = _starts(counts)
    covered = np.empty_like(end)
    for a, size in zip(starts.tolist(), counts.tolist(), strict=True):
        np.maximum.accumulate(end[a:a + size], out=covered[a:a + size])
    gap = np.empty_like(onset)
    gap[1:] = onset[1:] - covered[:-1]
    has = counts > 0
    gap[starts[has]] = onset[starts[has]]  # a piece's lead-in, not the gap after the last one
    out = np.zeros(counts.size)
    if has.any():
        out[has] = np.maximum.reduceat(gap, starts[has])
    return out


def quantise(beats: np.ndarray, grid: int = GRID) -> np.ndarray:
    return np.rint(beats * grid).astype(np.int64)


def note_hash(notes: dict[str, np.ndarray], grid: int = GRID) -> str:
    """sha256 of the quantised (onset, pitch, duration, is_drum) multiset.

    Drops velocity, track, program and everything that is not a note, so re-saving at another
    resolution, tempo map or track layout keeps the hash.
    """
    return note_hashes(notes, [notes["pitch"].size], grid)[0]


def note_hashes(notes: dict[str, np.ndarray], counts: Sequence[int],
                grid: int = GRID) -> list[str]:
    """:func:`note_hash` of each piece, for pieces whose notes are concatenated, ``counts`` notes
    each (one sort for all of them)."""
    counts = np.asarray(counts, np.int64)
    keys = (quantise(notes["onset"], grid), notes["pitch"].astype(np.int64),
            np.maximum(quantise(notes["duration"], grid), 1), notes["is_drum"].astype(np.int64))
    order = lex_order(np.repeat(np.arange(counts.size), counts), *keys)
    rows = np.empty((order.size, len(keys)), "<i8")  # each piece's sorted rows, little-endian
    for j, key in enumerate(keys):
        np.take(key, order, out=rows[:, j])
    size = counts * rows.itemsize * len(keys)
    view = memoryview(rows.reshape(-1).view(np.uint8))
    return [hashlib.sha256(view[a:a + n]).hexdigest()
            for a, n in zip(_starts(size).tolist(), size.tolist(), strict=True)]

"""Descriptive music statistics of a notes table, for comparing samples with human pieces.

A notes table is any mapping (dict of arrays, pandas DataFrame) with equal-length columns
``onset`` and ``duration`` in beats and MIDI ``pitch``. Each statistic is a small pure function;
an empty table gives NaN (never an exception), so a failed or silent sample is visible as missing,
not as zero. Definitions follow MusPy's (Dong et al., 2020) where one exists; the differences are
stated in each docstring. MusPy itself is not a dependency, and its functions take a ``Music``
object with tick times, so these are written against the notes table that ingest already produces.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Pitch-class sets of the 12 major scales; natural minor scales have the same sets (relative keys).
_MAJOR = np.array([0, 2, 4, 5, 7, 9, 11])
_SCALES = np.zeros((12, 12), dtype=bool)
for _root in range(12):
    _SCALES[_root, (_MAJOR + _root) % 12] = True


def _cols(notes: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    onset = np.asarray(notes["onset"], dtype=np.float64)
    duration = np.asarray(notes["duration"], dtype=np.float64)
    pitch = np.asarray(notes["pitch"], dtype=np.int64)
    return onset, duration, pitch


def pitch_class_entropy(notes: Mapping) -> float:
    """Shannon entropy (bits) of the note-count histogram over the 12 pitch classes; 0..log2(12)."""
    _, _, pitch = _cols(notes)
    if pitch.size == 0:
        return float("nan")
    p = np.bincount(pitch % 12, minlength=12) / pitch.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum() + 0.0)


def pitch_range(notes: Mapping) -> float:
    """Highest minus lowest pitch, in semitones."""
    _, _, pitch = _cols(notes)
    return float(pitch.max() - pitch.min()) if pitch.size else float("nan")


def polyphony(notes: Mapping) -> float:
    """Time-weighted mean number of sounding notes, over the time when at least one sounds.

    MusPy averages over onset times instead; weighting by time makes a held chord count for as
    long as it lasts. A monophonic line gives exactly 1.
    """
    onset, duration, _ = _cols(notes)
    keep = duration > 0
    if not keep.any():
        return float("nan")
    starts, ends = onset[keep], onset[keep] + duration[keep]
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.lexsort((deltas, times))  # ends before starts at equal times
    times, count = times[order], np.cumsum(deltas[order])
    span = np.diff(times)
    active = count[:-1]
    sounding = span[active > 0].sum()
    return float((span * active).sum() / sounding) if sounding > 0 else float("nan")


def note_density(notes: Mapping) -> float:
    """Notes per beat over the piece's span (first onset to last note end)."""
    onset, duration, _ = _cols(notes)
    if onset.size == 0:
        return float("nan")
    span = float((onset + duration).max() - onset.min())
    return float(onset.size / span) if span > 0 else float("nan")


def scale_consistency(notes: Mapping) -> float:
    """Largest fraction of notes that fall in one major (equivalently natural minor) scale."""
    _, _, pitch = _cols(notes)
    if pitch.size == 0:
        return float("nan")
    hist = np.bincount(pitch % 12, minlength=12)
    return float((_SCALES @ hist).max() / pitch.size)


def empty_beat_rate(notes: Mapping) -> float:
    """Fraction of beats ``[b, b+1)`` from beat 0 to the last note end in which no note sounds.

    MusPy counts beats without an onset; counting sounding notes means a sustained whole note does
    not make three empty beats.
    """
    onset, duration, _ = _cols(notes)
    if onset.size == 0:
        return float("nan")
    n_beats = int(np.ceil((onset + duration).max() - 1e-9))
    if n_beats <= 0:
        return float("nan")
    covered = np.zeros(n_beats, dtype=bool)
    first = np.floor(onset + 1e-9).astype(np.int64)
    last = np.ceil(onset + np.maximum(duration, 0) - 1e-9).astype(np.int64)  # exclusive
    last = np.maximum(last, first + 1)  # a zero-length note still marks its beat
    for a, b in zip(first, last, strict=True):
        covered[max(a, 0):min(b, n_beats)] = True
    return float(1.0 - covered.mean())


def groove_consistency(notes: Mapping, beats_per_bar: int = 4, resolution: int = 4) -> float:
    """1 − mean Hamming distance (as a fraction) between onset patterns of consecutive bars.

    A bar's pattern marks which of its ``beats_per_bar * resolution`` grid positions hold an onset
    (MusPy's definition). Needs at least two bars: fewer gives NaN.
    """
    onset, _, _ = _cols(notes)
    if onset.size == 0:
        return float("nan")
    per_bar = beats_per_bar * resolution
    slots = np.rint(onset * resolution).astype(np.int64)
    n_bars = int(slots.max() // per_bar) + 1
    if n_bars < 2:
        return float("nan")
    grid = np.zeros((n_bars, per_bar), dtype=bool)
    grid[slots // per_bar, slots % per_bar] = True
    hamming = (grid[1:] != grid[:-1]).mean(axis=1)
    return float(1.0 - hamming.mean())


STATS = {
    "pitch_class_entropy": pitch_class_entropy,
    "pitch_range": pitch_range,
    "polyphony": polyphony,
    "note_density": note_density,
    "scale_consistency": scale_consistency,
    "empty_beat_rate": empty_beat_rate,
    "groove_consistency": groove_consistency,
}
"""Statistic name -> function of a notes table. Column names in the audit tables use these keys."""


def all_stats(notes: Mapping, beats_per_bar: int = 4, resolution: int = 4) -> dict[str, float]:
    """Every statistic of one notes table (NaN where undefined)."""
    out = {name: fn(notes) for name, fn in STATS.items() if name != "groove_consistency"}
    out["groove_consistency"] = groove_consistency(notes, beats_per_bar, resolution)
    out["n_notes"] = float(len(np.asarray(notes["pitch"])))
    return out

"""Per-piece conditions derived from the notes: key (tonic and mode), note density and
polyphony; and from the MIDI file: meter and tempo.

Each note condition is a pure function of a piece's notes table (onsets and durations in beats, as
ingest's ``data/notes.parquet`` holds them), and meter and tempo are pure functions of the file's
bytes, so a condition is reproducible from the piece alone and can be checked against it.

- **Key**: the duration-weighted pitch-class profile correlated with the Krumhansl-Kessler major
  and minor key profiles rotated to every tonic (the Krumhansl-Schmuckler algorithm); the best of
  the 24 keys wins, ties to the lowest index (C major first, then C minor, C# major, ...).
  music21 implements the same algorithm (``music21.analysis.discrete.KrumhanslKessler``) on its
  ``Stream`` objects; building a Stream for every piece costs far more than this 24-column
  correlation on arrays, and a test checks that both agree on real chorales.
- **Density**: notes per beat over the piece's span (first onset to last offset).
- **Polyphony**: the mean number of sounding notes over the time at least one note sounds.

- **Meter**: the file's first time signature (the earliest; of several at that time, the first
  in file order) as ``"numerator/denominator"``, e.g. ``"3/4"``; None when the file has none.
- **Tempo**: the file's first tempo event in quarter notes per minute, from the microseconds per
  quarter the file stores (``60e6 / mspq``) rounded to 0.01 qpm: that rounding gives back the
  value the file was written with (the whole microseconds move it by under 0.001 qpm below 240
  qpm); None when the file has none. A file without one plays at MIDI's default of 120 qpm, and
  music21 writes 120 for a score without a metronome mark, so 120 often means "not marked".

Drum notes carry no pitch class and are left out of the key; they count for density and
polyphony like any other note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PITCH_NAMES = ("C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B")
MODES = ("major", "minor")

# Krumhansl & Kessler (1982) probe-tone ratings, tonic first.
KK_MAJOR = np.array([6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88])
KK_MINOR = np.array([6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17])


@dataclass(frozen=True)
class Key:
    tonic: int
    """Pitch class of the tonic, 0 (C) .. 11 (B)."""
    mode: str
    """``major`` or ``minor``."""
    correlation: float
    """Pearson correlation of the profile with the winning key's (-1..1): how clear the key is."""

    @property
    def name(self) -> str:
        return f"{PITCH_NAMES[self.tonic]} {self.mode}"


def pitch_class_profile(pitch: np.ndarray, duration: np.ndarray,
                        is_drum: np.ndarray | None = None) -> np.ndarray:
    """Total duration per pitch class (12 values); drum notes left out."""
    pitch = np.asarray(pitch, dtype=np.int64)
    weight = np.asarray(duration, dtype=np.float64)
    keep = np.ones(pitch.size, dtype=bool) if is_drum is None else ~np.asarray(is_drum, bool)
    return np.bincount(pitch[keep] % 12, weights=weight[keep], minlength=12)


def _key_profiles() -> np.ndarray:
    """(24, 12): every major key, then every minor key's profile, by tonic."""
    rows = [np.roll(base, tonic) for base in (KK_MAJOR, KK_MINOR) for tonic in range(12)]
    return np.asarray(rows)


def estimate_key(profile: np.ndarray) -> Key | None:
    """The Krumhansl-Schmuckler key of a pitch-class profile; None for a flat (or empty)
    profile, which has no key."""
    p = np.asarray(profile, dtype=np.float64)
    if p.size != 12 or not np.isfinite(p).all() or np.ptp(p) == 0:
        return None
    keys = _key_profiles()
    pc = p - p.mean()
    kc = keys - keys.mean(axis=1, keepdims=True)
    r = (kc @ pc) / (np.linalg.norm(kc, axis=1) * np.linalg.norm(pc))
    order = [12 * m + t for t in range(12) for m in range(2)]  # C major, C minor, C# major, ...
    best = max(order, key=lambda i: (r[i], -order.index(i)))
    return Key(tonic=best % 12, mode=MODES[best // 12], correlation=float(r[best]))


def density(onset: np.ndarray, duration: np.ndarray) -> float:
    """Notes per beat over the span from the first onset to the last offset (0 without notes
    or span)."""
    onset = np.asarray(onset, dtype=np.float64)
    if onset.size == 0:
        return 0.0
    end = float(np.max(onset + np.asarray(duration, dtype=np.float64)))
    span = end - float(onset.min())
    return float(onset.size / span) if span > 0 else 0.0


def polyphony(onset: np.ndarray, duration: np.ndarray) -> float:
    """Mean number of sounding notes over the time at least one sounds (0 without notes)."""
    onset = np.asarray(onset, dtype=np.float64)
    end = onset + np.asarray(duration, dtype=np.float64)
    if onset.size == 0:
        return 0.0
    times = np.concatenate([onset, end])
    steps = np.concatenate([np.ones(onset.size), -np.ones(end.size)])
    order = np.lexsort((steps, times))  # at equal times an offset (-1) comes before an onset
    times, count = times[order], np.cumsum(steps[order])
    widths = np.diff(times)
    sounding = count[:-1]
    busy = widths[sounding > 0].sum()
    return float((widths * sounding).sum() / busy) if busy > 0 else 0.0


def band(value: float, edges: Sequence[float], labels: Sequence[str]) -> str:
    """The label of the band ``value`` falls in: ``labels[i]`` for ``edges[i-1] <= value <
    edges[i]`` (``len(labels) == len(edges) + 1``; edges ascending)."""
    if len(labels) != len(edges) + 1 or list(edges) != sorted(edges):
        raise ValueError(f"band: {len(edges)} ascending edges need {len(edges) + 1} labels")
    return labels[int(np.searchsorted(np.asarray(edges, dtype=np.float64), value, "right"))]


def first_meter(score: Any) -> str | None:
    """The first time signature of a ``symusic.Score`` as ``"3/4"``; None when it has none (or
    a numerator or denominator that is not positive)."""
    events = list(score.time_signatures)
    if not events:
        return None
    first = min(events, key=lambda e: e.time)  # min keeps the first of equal times
    num, den = int(first.numerator), int(first.denominator)
    return f"{num}/{den}" if num > 0 and den > 0 else None


def first_tempo_qpm(score: Any) -> float | None:
    """The first tempo of a ``symusic.Score`` in quarter notes per minute (rounded to 0.01);
    None when it has none (or a non-positive one)."""
    events = list(score.tempos)
    if not events:
        return None
    mspq = int(min(events, key=lambda e: e.time).mspq)
    return round(60_000_000 / mspq, 2) if mspq > 0 else None


def meter_and_tempo(data: bytes) -> tuple[str | None, float | None]:
    """(:func:`first_meter`, :func:`first_tempo_qpm`) of MIDI bytes. Raises ``RuntimeError`` (or
    ``ValueError``) when symusic cannot read them."""
    import symusic

    score = symusic.Score.from_midi(data)
    return first_meter(score), first_tempo_qpm(score)

"""Descriptive music statistics of a notes table, for comparing samples with human pieces.

A notes table is any mapping (dict of arrays, pandas DataFrame) with equal-length columns
``onset`` and ``duration`` in beats and MIDI ``pitch``. Each statistic is a small pure function;
an empty table gives NaN (never an exception), so a failed or silent sample is visible as missing,
not as zero. Definitions follow MusPy's (Dong et al., 2020) where one exists; the differences are
stated in each docstring. MusPy itself is not a dependency, and its functions take a ``Music``
object with tick times, so these are written against the notes table that ingest already produces.

:func:`quality_guard` compares the statistics of a model's samples with held-out human windows
(the audit's sample quality guard); its docstring says why it is built as it is.
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
    """Fraction of beats ``[b, b+1)`` from the first note's beat to the last note end in which no
    note sounds.

    MusPy counts beats without an onset; counting sounding notes means a sustained whole note does
    not make three empty beats. MusPy also counts from beat 0; counting from the first note's beat
    means a window cut from the middle of a piece (the audit's human windows, a continuation's
    generated part) is not charged for the silence before its first note, which is where the cut
    fell, not silence in the music.
    """
    onset, duration, _ = _cols(notes)
    if onset.size == 0:
        return float("nan")
    start = int(np.floor(onset.min() + 1e-9))
    n_beats = int(np.ceil((onset + duration).max() - 1e-9)) - start
    if n_beats <= 0:
        return float("nan")
    covered = np.zeros(n_beats, dtype=bool)
    first = np.floor(onset + 1e-9).astype(np.int64) - start
    last = np.ceil(onset + np.maximum(duration, 0) - 1e-9).astype(np.int64) - start  # exclusive
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


# --- sample quality guard: samples against held-out human windows -----------------------------


def category_edges(reference: np.ndarray, bins: int) -> np.ndarray:
    """Unique quantiles of the finite reference values at ``bins + 1`` evenly spaced levels
    (min and max included); empty when no reference value is finite."""
    v = np.asarray(reference, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.zeros(0)
    return np.unique(np.quantile(v, np.linspace(0.0, 1.0, bins + 1)))


def categorise(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Category of each value among ``2 * len(edges) + 2``: ``2i`` = strictly between
    ``edges[i-1]`` and ``edges[i]`` (``2i = 2m`` above the last edge), ``2i + 1`` = equal to
    ``edges[i]``, ``2m + 1`` = undefined (NaN or infinite)."""
    x = np.asarray(values, dtype=np.float64)
    m = edges.size
    codes = np.full(x.shape, 2 * m + 1, dtype=np.int64)
    ok = np.isfinite(x)
    if m == 0:
        codes[ok] = 0
        return codes
    i = np.searchsorted(edges, x[ok], side="left")
    codes[ok] = 2 * i + ((i < m) & (edges[np.minimum(i, m - 1)] == x[ok]))
    return codes


def overlap_area(codes: np.ndarray, reference_codes: np.ndarray, k: int) -> float:
    """Overlapping area of two category histograms: sum over categories of the smaller share."""
    p = np.bincount(codes, minlength=k) / max(codes.size, 1)
    q = np.bincount(reference_codes, minlength=k) / max(reference_codes.size, 1)
    return float(np.minimum(p, q).sum())


def quality_guard(samples: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                  calibration: Mapping[str, np.ndarray], *, rng: np.random.Generator,
                  bins: int = 10, alpha: float = 0.05, n_boot: int = 2000) -> dict:
    """Is every statistic of the samples inside the band of human-like sets of the same size?

    ``samples``, ``reference`` (held-out human windows the samples are compared with: test) and
    ``calibration`` (other held-out human windows: val) map each statistic name to one value per
    sequence, NaN where undefined (a sample that does not decode is NaN everywhere).

    Per statistic: ``overlap`` = OA(samples, reference), the overlapping area of the two
    per-sequence distributions (1 = identical, 0 = disjoint); the human sets are ``n_boot``
    draws of ``n`` windows with replacement from ``calibration`` (the same draws for every
    statistic), each with its own OA against the reference; ``inside`` = overlap >= band_low.
    The bands are calibrated together (:func:`family_level`): ``band_low`` is the
    ``stat_level`` quantile of the human sets' OA on that statistic, where ``stat_level`` is
    chosen so that a human set has *every* statistic inside in at least ``1 - alpha`` of the
    draws. Returns ``n``, ``n_stats``, ``n_outside``, ``score`` (share of statistics inside: 1
    for human-like samples, 0 for silence or noise), ``score_band_low`` (the share that human
    sets reach in ``1 - alpha`` of draws: 1, all of them, by that calibration), ``stat_level``
    and ``stats`` (per statistic, also both means over defined values and the samples'
    ``undefined`` share). ``score`` is None without samples or calibration windows.

    Why together: with each band at its own ``alpha`` quantile, a human set has ``k``
    chances to fall outside one, so the rule had to allow one statistic outside (at ``k = 7``
    and ``alpha`` 5%, "6 of 7 inside"), and a model with each statistic outside half the time
    then passed 8/128 = 6.25% of the time whatever the sample size. Calibrated on the smallest
    per-statistic rank of each human set (the min-p adjustment of Westfall and Young, 1993),
    the rule is "all inside" at family level ``alpha``, that model passes 1/128, and the
    statistics' correlation (density and polyphony move together) is in the calibration
    rather than assumed away.

    Why an overlap and not "the sample mean lies inside the human bootstrap interval of the
    mean": a mean misses shape (half silence and half dense noise can have a human mean, and so
    can a model that always plays one human-average piece), and the interval of the human mean
    narrows as human pieces are added while the samples' own sampling error is ignored, so
    samples distributed exactly like humans fail more often the more data there is.

    OA is mgeval's measure (Yang & Lerch, 2020). mgeval estimates the densities with a KDE;
    here they are histograms on the reference's quantile bins (:func:`category_edges`), because
    a KDE bandwidth breaks on the statistics' atoms (pitch range is an integer, most human
    empty-beat rates are exactly 0, a monophonic corpus has polyphony exactly 1) and has no room
    for "undefined". Quantile bins are scale-free; each bin edge is also an atom, and undefined
    is a category of its own that human windows practically never fill, so silence, empty and
    undecodable output lose overlap on every statistic (:func:`categorise`).

    The band is calibrated, not chosen: it is the sampling distribution of the OA of a human set
    at exactly the samples' ``n``, so the downward bias of a histogram OA at small ``n`` (64
    samples on about 20 categories) is inside the band too. Val against test also carries the
    difference between two sets of pieces, not only resampling noise.
    """
    names = list(samples)
    n = len(np.asarray(samples[names[0]])) if names else 0
    m = len(np.asarray(calibration[names[0]])) if names else 0
    out: dict = {"n": n, "n_stats": len(names), "n_outside": None, "score": None,
                 "score_band_low": None, "stat_level": None, "stats": {}}
    if n == 0 or m == 0:
        return out
    draws = rng.integers(0, m, size=(n_boot, n))  # one set of human draws for every statistic
    rows = np.arange(n_boot)[:, None]
    null = np.empty((n_boot, len(names)))
    oas = np.empty(len(names))
    for j, name in enumerate(names):
        edges = category_edges(reference[name], bins)
        k = 2 * edges.size + 2
        ref_codes = categorise(reference[name], edges)
        q = np.bincount(ref_codes, minlength=k) / max(ref_codes.size, 1)
        cal = categorise(calibration[name], edges)[draws]  # (n_boot, n)
        counts = np.bincount((rows * k + cal).ravel(), minlength=n_boot * k).reshape(n_boot, k)
        null[:, j] = np.minimum(counts / n, q).sum(axis=1)
        oas[j] = overlap_area(categorise(samples[name], edges), ref_codes, k)
    level, lows = family_level(null, alpha)
    inside = oas >= lows - 1e-9
    for j, name in enumerate(names):
        s = np.asarray(samples[name], dtype=np.float64)
        h = np.asarray(reference[name], dtype=np.float64)
        out["stats"][name] = {
            "overlap": float(oas[j]), "band_low": float(lows[j]), "inside": bool(inside[j]),
            "sample_mean": float(s[np.isfinite(s)].mean()) if np.isfinite(s).any() else None,
            "human_mean": float(h[np.isfinite(h)].mean()) if np.isfinite(h).any() else None,
            "undefined": float((~np.isfinite(s)).mean()),
        }
    null_scores = np.sort((null >= lows - 1e-9).mean(axis=1))
    out.update(n_outside=int((~inside).sum()), score=float(inside.mean()),
               score_band_low=float(null_scores[int(np.floor(alpha * n_boot))]),
               stat_level=level)
    return out


def family_level(null: np.ndarray, alpha: float) -> tuple[float, np.ndarray]:
    """(per-statistic level, per-statistic band low) such that at most ``alpha`` of the rows
    of ``null`` (human sets x statistics, larger = more human-like) have any statistic below
    its band low.

    Each value's rank is the share of its column at or below it; a row's smallest rank is how
    unusual its worst statistic is. The level is the row minimum at position
    ``floor(alpha * rows)`` of their sorted list, so at most that many rows lie below it,
    and each column's band low is its smallest value of rank at least the level: a value is
    at or above the band low exactly when its rank reaches the level."""
    b, k = null.shape
    ranks = np.empty_like(null)
    cols = np.sort(null, axis=0)
    for j in range(k):
        ranks[:, j] = np.searchsorted(cols[:, j], null[:, j], side="right") / b
    level = float(np.sort(ranks.min(axis=1))[int(np.floor(alpha * b))])
    lows = np.array([cols[:, j][np.searchsorted(cols[:, j], cols[:, j], side="right") / b
                                >= level].min() for j in range(k)])
    return level, lows

"""Music statistics on hand-built scores whose answers are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.music import descriptors as ms


def notes(rows: list[tuple[float, float, int]]) -> dict[str, np.ndarray]:
    onset, duration, pitch = zip(*rows, strict=True) if rows else ((), (), ())
    return {"onset": np.array(onset, float), "duration": np.array(duration, float),
            "pitch": np.array(pitch, int)}


C_MAJOR_SCALE = notes([(i, 1.0, p) for i, p in enumerate([60, 62, 64, 65, 67, 69, 71, 72])])
CHROMATIC = notes([(i, 1.0, 60 + i) for i in range(12)])
EMPTY = notes([])


def test_pitch_class_entropy_known_values():
    assert ms.pitch_class_entropy(CHROMATIC) == pytest.approx(math.log2(12))
    assert ms.pitch_class_entropy(notes([(0, 1, 60), (1, 1, 72), (2, 1, 48)])) == 0.0
    # two pitch classes, equally often: one bit
    assert ms.pitch_class_entropy(notes([(0, 1, 60), (1, 1, 67)])) == pytest.approx(1.0)


def test_pitch_range():
    assert ms.pitch_range(C_MAJOR_SCALE) == 12.0
    assert ms.pitch_range(notes([(0, 1, 50)])) == 0.0


def test_polyphony_monophonic_chord_and_gap():
    assert ms.polyphony(C_MAJOR_SCALE) == pytest.approx(1.0)
    triad = notes([(0, 4, 60), (0, 4, 64), (0, 4, 67)])
    assert ms.polyphony(triad) == pytest.approx(3.0)
    # two notes for 2 beats, then one for 2 beats, then silence (not counted), then one
    mixed = notes([(0, 4, 60), (0, 2, 64), (10, 1, 62)])
    assert ms.polyphony(mixed) == pytest.approx((2 * 2 + 1 * 2 + 1 * 1) / 5)


def test_note_density():
    assert ms.note_density(C_MAJOR_SCALE) == pytest.approx(8 / 8)
    assert ms.note_density(notes([(0, 0.5, 60), (0.5, 0.5, 62), (1, 0.5, 64), (1.5, 0.5, 65)])) \
        == pytest.approx(4 / 2)


def test_scale_consistency():
    assert ms.scale_consistency(C_MAJOR_SCALE) == 1.0
    assert ms.scale_consistency(CHROMATIC) == pytest.approx(7 / 12)
    # C major plus one F#: 8 of 9 notes fit C major (or G major: 8 of 9 too)
    plus = notes([*[(i, 1.0, p) for i, p in enumerate([60, 62, 64, 65, 67, 69, 71, 72])],
                  (8, 1.0, 66)])
    assert ms.scale_consistency(plus) == pytest.approx(8 / 9)


def test_empty_beat_rate():
    assert ms.empty_beat_rate(C_MAJOR_SCALE) == 0.0
    # notes on beats 0 and 3 only: beats 1 and 2 are silent
    assert ms.empty_beat_rate(notes([(0, 1, 60), (3, 1, 60)])) == pytest.approx(0.5)
    # a whole note sounds through its four beats
    assert ms.empty_beat_rate(notes([(0, 4, 60)])) == 0.0
    # a window cut mid-piece: silence before its first note is where the cut fell, not a rest
    assert ms.empty_beat_rate(notes([(2.5, 1, 60), (3.5, 1, 62)])) == 0.0
    assert ms.empty_beat_rate(notes([(2, 1, 60), (5, 1, 60)])) == pytest.approx(0.5)


def test_groove_consistency():
    bar = [(0, 1, 60), (1, 1, 62), (2, 1, 64), (3, 1, 65)]
    same = notes([(o + 4 * b, d, p) for b in range(4) for o, d, p in bar])
    assert ms.groove_consistency(same) == 1.0
    # two bars; the second adds one onset: 1 of 16 grid slots differs
    other = notes([*[(o + 4 * b, d, p) for b in range(2) for o, d, p in bar], (4.5, 0.5, 70)])
    assert ms.groove_consistency(other) == pytest.approx(1 - 1 / 16)
    assert math.isnan(ms.groove_consistency(notes(bar)))  # one bar: nothing to compare


def test_empty_table_gives_nan_everywhere_and_accepts_dataframes():
    stats = ms.all_stats(EMPTY)
    assert stats["n_notes"] == 0
    assert all(math.isnan(v) for k, v in stats.items() if k != "n_notes")
    df = pd.DataFrame(C_MAJOR_SCALE)
    assert ms.all_stats(df)["pitch_range"] == 12.0


def test_categories_hold_atoms_intervals_and_undefined():
    edges = ms.category_edges(np.array([0.0, 0.0, 0.0, 1.0, 2.0, np.nan]), bins=4)
    assert edges.tolist() == [0.0, 1.0, 2.0]  # quantiles of the finite values, unique
    codes = ms.categorise(np.array([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, np.nan, np.inf]), edges)
    assert codes.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7]
    # degenerate reference (a monophonic corpus: polyphony exactly 1): 1.0 is its own atom
    one = ms.category_edges(np.ones(5), bins=10)
    assert ms.categorise(np.array([1.0, 1.2, 0.9]), one).tolist() == [1, 2, 0]
    assert ms.categorise(np.array([1.0, np.nan]), np.zeros(0)).tolist() == [0, 1]


def _table(rng: np.random.Generator, n: int, kind: str = "human") -> dict[str, np.ndarray]:
    """Per-sequence statistics of n made-up sequences: human-like, noise-like or silent."""
    if kind == "silent":
        return {s: np.full(n, np.nan) for s in ms.STATS}
    if kind == "noise":
        return {"pitch_class_entropy": rng.normal(3.5, 0.03, n),
                "pitch_range": rng.integers(80, 100, n).astype(float),
                "polyphony": rng.normal(9.0, 1.0, n), "note_density": rng.normal(12, 1, n),
                "scale_consistency": rng.normal(0.62, 0.03, n),
                "empty_beat_rate": rng.uniform(0.2, 0.5, n),
                "groove_consistency": rng.normal(0.3, 0.05, n)}
    return {"pitch_class_entropy": rng.normal(2.95, 0.15, n),
            "pitch_range": rng.integers(26, 40, n).astype(float),
            "polyphony": rng.normal(4.0, 0.3, n), "note_density": rng.normal(4.5, 0.7, n),
            "scale_consistency": np.minimum(rng.normal(0.93, 0.03, n), 1.0),
            "empty_beat_rate": np.where(rng.random(n) < 0.7, 0.0, rng.uniform(0, 0.1, n)),
            "groove_consistency": rng.normal(0.78, 0.05, n)}


@pytest.mark.parametrize(("kind", "passes"), [("human", True), ("noise", False),
                                               ("silent", False)])
def test_quality_guard_passes_human_and_fails_noise_and_silence(kind, passes):
    rng = np.random.default_rng(0)
    reference, calibration = _table(rng, 150), _table(rng, 80)
    q = ms.quality_guard(_table(rng, 64, kind), reference, calibration,
                         rng=np.random.default_rng(1), n_boot=500)
    assert q["n"] == 64 and q["n_stats"] == len(ms.STATS)
    assert (q["score"] >= 0.7) is passes
    assert q["score"] == 1 - q["n_outside"] / q["n_stats"]
    assert q["score_band_low"] == 1.0  # bands calibrated together: human sets have all inside
    if kind == "silent":
        assert q["score"] == 0 and all(v["undefined"] == 1 for v in q["stats"].values())


def test_quality_guard_undefined_samples_cost_overlap_and_mean_shift_is_caught():
    rng = np.random.default_rng(3)
    reference, calibration = _table(rng, 150), _table(rng, 80)
    good = _table(rng, 64)
    half = {s: np.where(np.arange(64) < 32, v, np.nan) for s, v in good.items()}
    g = ms.quality_guard(good, reference, calibration, rng=np.random.default_rng(1), n_boot=300)
    h = ms.quality_guard(half, reference, calibration, rng=np.random.default_rng(1), n_boot=300)
    for s in ms.STATS:  # half undecodable: at most half the overlap, below the band
        assert h["stats"][s]["overlap"] <= 0.5 + 1e-9 < g["stats"][s]["overlap"]
    assert h["score"] == 0
    shifted = {**good, "empty_beat_rate": good["empty_beat_rate"] + 0.15}  # the transformer's
    sh = ms.quality_guard(shifted, reference, calibration, rng=np.random.default_rng(1),
                          n_boot=300)
    assert not sh["stats"]["empty_beat_rate"]["inside"]
    assert sh["n_outside"] == g["n_outside"] + 1


def test_family_level_holds_alpha_for_the_whole_set_and_gains_from_correlation():
    """Independent statistics need each band at about 1 - 0.95^(1/k) (Sidak); identical
    ones need no adjustment; either way fresh human-like sets fail about alpha of the time."""
    rng = np.random.default_rng(0)
    independent = rng.random((4000, 7))
    level, lows = ms.family_level(independent, 0.05)
    assert level == pytest.approx(1 - 0.95 ** (1 / 7), abs=0.002)
    fresh = rng.random((20000, 7))
    assert (fresh < lows).any(axis=1).mean() == pytest.approx(0.05, abs=0.008)
    assert (independent < lows).any(axis=1).mean() <= 0.05
    same = np.repeat(rng.random((4000, 1)), 7, axis=1)
    level_same, _ = ms.family_level(same, 0.05)
    assert level_same == pytest.approx(0.05, abs=0.002)


def test_quality_guard_needs_every_statistic_and_fails_human_sets_at_most_alpha():
    """One statistic shifted fails the set (the per-statistic bands let one of 7 go); fresh
    human-like sets fail at most about 5% of the time (9 of 60 allows for chance; sets drawn
    from 80 calibration windows with replacement vary more than fresh ones, so fewer fail)."""
    rng = np.random.default_rng(5)
    reference, calibration = _table(rng, 150), _table(rng, 80)
    failed = 0
    for i in range(60):
        q = ms.quality_guard(_table(rng, 64), reference, calibration,
                             rng=np.random.default_rng(i), n_boot=300)
        failed += q["score"] < q["score_band_low"]
    assert failed <= 9, failed
    one_off = {**_table(rng, 64), "polyphony": rng.normal(4.8, 0.3, 64)}
    q = ms.quality_guard(one_off, reference, calibration, rng=np.random.default_rng(1),
                         n_boot=300)
    assert not q["stats"]["polyphony"]["inside"] and q["score"] < q["score_band_low"]
    assert 0 < q["stat_level"] < 0.05


def test_quality_guard_is_deterministic_and_empty_safe():
    rng = np.random.default_rng(4)
    args = (_table(rng, 20), _table(rng, 50), _table(rng, 30))
    a = ms.quality_guard(*args, rng=np.random.default_rng(7), n_boot=200)
    b = ms.quality_guard(*args, rng=np.random.default_rng(7), n_boot=200)
    assert a == b
    none = ms.quality_guard({s: np.zeros(0) for s in ms.STATS}, args[1], args[2],
                            rng=np.random.default_rng(7))
    assert none["score"] is None and none["n"] == 0

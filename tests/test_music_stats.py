"""Music statistics on hand-built scores whose answers are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.music import stats as ms


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

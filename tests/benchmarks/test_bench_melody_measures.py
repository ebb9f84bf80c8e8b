"""The melody-measure benchmark's two measures cost what its docstring and
docs/dedupe_and_splits.md say: intervals charge a changed note 4 Indel operations and a dropped
one 3; pitches charge any edited note 1 and ignore transposition."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_melody_measures as bench

TUNE = np.array([62, 64, 66, 67, 69, 71, 73, 74, 73, 71, 69, 67, 66, 64, 62, 61, 62, 66, 69, 74])


def _changed(at: int, to: int) -> np.ndarray:
    out = TUNE.copy()
    out[at] = to
    return out


def test_a_changed_note_costs_intervals_four_operations_and_pitches_one():
    n = TUNE.size
    copy = _changed(5, 72)  # a semitone up, between neighbours it differs from
    assert bench.intervals(TUNE, copy) == pytest.approx(1 - 4 / (2 * (n - 1)))
    assert bench.pitches(TUNE, copy) == pytest.approx(1 - 1 / n)


def test_a_dropped_note_costs_intervals_three_operations_and_pitches_one():
    n = TUNE.size
    copy = np.delete(TUNE, 6)
    assert bench.intervals(TUNE, copy) == pytest.approx(1 - 3 / (2 * n - 3))
    assert bench.pitches(TUNE, copy) == pytest.approx(1 - 1 / n)


def test_both_measures_ignore_transposition_and_repeated_pitches():
    moved = np.repeat(TUNE + 5, 2)  # a fourth up, every note split into two
    assert bench.intervals(TUNE, moved) == 1.0
    assert bench.pitches(TUNE, moved) == 1.0
    assert bench.pitches(TUNE, TUNE[::-1]) < 0.9


def test_unrelated_pairs_are_counted_once_each_at_the_best_transposition():
    heads = [TUNE, TUNE + 7, _changed(5, 72)]
    sims = bench.unrelated(heads, "pitches", 0.5, workers=1)
    assert sims.shape == (3,)  # pairs (0, 1), (0, 2), (1, 2)
    assert sims[0] == 1.0 and sims[1] == pytest.approx(1 - 1 / TUNE.size)
    assert sims[2] == pytest.approx(sims[1])

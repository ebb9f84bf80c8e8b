"""The shuffled-condition diagnostic (pipeline.conditions.diagnostics): the seeded shuffle, the
three variants' sums, the paired gaps and their verdicts, on toy scorers with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.conditions.diagnostics import (
    condition_gap,
    shuffle_conditions,
    variant_sums,
    verdict,
)


def test_shuffle_is_seeded_and_keeps_label_counts():
    cond = np.array([[1], [1], [2], [2], [2]])
    a = shuffle_conditions(cond, 3)
    assert np.array_equal(a, shuffle_conditions(cond, 3))
    assert sorted(a[:, 0].tolist()) == [1, 1, 2, 2, 2]


class Planted:
    """A conditioned scorer: each target of a sequence costs 0.5 nats under the sequence's own
    label (its first id) and 2 under any other, "none" (0) included. Records its calls."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def token_nll(self, seqs, conds):
        self.calls.append(np.asarray(conds).copy())
        return [np.full(len(s) + 1, 0.5 if c[0] == s[0] else 2.0)
                for s, c in zip(seqs, conds, strict=True)]


class Ignores(Planted):
    """A scorer that gives every target 1 nat, whatever the condition."""

    def token_nll(self, seqs, conds):
        return [np.ones(len(s) + 1) for s in seqs]


def test_variant_sums_score_own_shuffled_and_removed_conditions():
    seqs = [np.array([1, 5]), np.array([2, 5, 5]), np.array([1]), np.array([3, 4])]
    cond = np.array([[1], [2], [1], [3]])
    scorer = Planted()
    sums = variant_sums(scorer, seqs, cond, np.array([0]), seed=4)
    assert sums["correct"].tolist() == [1.5, 2.0, 1.0, 1.5]  # 0.5 per target, EOS included
    assert sums["removed"].tolist() == [6.0, 8.0, 4.0, 6.0]
    shuffled = shuffle_conditions(cond, 4)
    assert sums["shuffled"].tolist() == [(0.5 if c[0] == s[0] else 2.0) * (len(s) + 1)
                                         for s, c in zip(seqs, shuffled, strict=True)]
    assert [c.tolist() for c in scorer.calls] == [cond.tolist(), shuffled.tolist(),
                                                  [[0]] * 4]
    given_sums = np.array([9.0, 9.0, 9.0, 9.0])
    again = Planted()
    out = variant_sums(again, seqs, cond, np.array([0]), seed=4, correct=given_sums)
    assert out["correct"].tolist() == given_sums.tolist() and len(again.calls) == 2
    with pytest.raises(ValueError, match="4 sequences but 3 condition rows"):
        variant_sums(scorer, seqs, cond[:3], np.array([0]))


def pieces(n: int) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    seqs = [np.concatenate([[1 + i % 4], rng.integers(5, 9, size=3)]) for i in range(n)]
    return seqs, np.array([[1 + i % 4] for i in range(n)])


def test_the_gap_shows_a_scorer_that_follows_its_condition_and_one_that_ignores_it():
    seqs, cond = pieces(40)
    notes = [4] * 40
    groups = [f"g{i // 2}" for i in range(40)]
    follows = condition_gap(Planted(), seqs, cond, np.array([0]), groups, notes, n_boot=300)
    assert (follows["sequences"], follows["groups"], follows["n_boot"]) == (40, 20, 300)
    assert follows["nll_per_note"]["correct"]["value"] == pytest.approx(0.5 * 5 / 4)
    assert follows["nll_per_note"]["removed"]["value"] == pytest.approx(2.0 * 5 / 4)
    assert follows["removed_minus_correct"]["value"] == pytest.approx(1.5 * 5 / 4)
    assert follows["removed_minus_correct"]["verdict"] == "follows"
    assert follows["shuffled_minus_correct"]["verdict"] == "follows"
    assert 0.5 < follows["changed_share"] <= 1.0  # four labels: most rows change
    ignores = condition_gap(Ignores(), seqs, cond, np.array([0]), groups, notes, n_boot=300)
    for gap in ("shuffled_minus_correct", "removed_minus_correct"):
        assert ignores[gap]["value"] == 0.0 and ignores[gap]["verdict"] == "no gap shown"
    same = condition_gap(Planted(), seqs, np.ones((40, 1), np.int64), np.array([0]), groups,
                         notes, n_boot=100)
    assert same["changed_share"] == 0.0 and same["shuffled_minus_correct"]["value"] == 0.0
    with pytest.raises(ValueError, match="40 sequences, 39 groups and 40 note counts"):
        condition_gap(Planted(), seqs, cond, np.array([0]), groups[:-1], notes)


@pytest.mark.parametrize(("low", "high", "want"), [
    (0.1, 0.3, "follows"), (-0.3, -0.1, "hurt"), (-0.1, 0.1, "no gap shown"),
    (0.0, 0.2, "no gap shown"), (-0.2, 0.0, "no gap shown"),
])
def test_a_verdict_needs_the_whole_interval_on_one_side_of_zero(low, high, want):
    assert verdict({"value": (low + high) / 2, "ci_low": low, "ci_high": high}) == want

"""The hash-and-cut splitters (:mod:`pipeline.similarity.splitters`): the cut itself, both
splitters against the scalar rules the split stage and the leakage audit were written with, and
what each promises beyond the shared contract (``tests/similarity/test_splitter_contract.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.splits import SPLIT_NAMES, unit_hash
from pipeline.similarity.splitters import GroupHashSplit, PieceHashSplit, hash_cut

KEYS = [f"group:g{i}" for i in range(3000)]


def _scalar_group_split(key: str, ratios, seed: int, folds: int = 0, test_fold: int = 0,
                        held: bool = False, held_train: bool = False) -> tuple[str, int]:
    """The split stage's rule, one key at a time, as it was first written."""
    train, val, test = ratios
    u = unit_hash(seed, key)
    fold = -1
    if folds >= 2:
        fold = min(int(unit_hash(seed, key, "fold") * folds), folds - 1)
        split = "test" if fold == test_fold else ("val" if u < val / (train + val) else "train")
    else:
        split = "train" if u < train else "val" if u < train + val else "test"
    if held and split == "test":
        w = unit_hash(seed, key, "exclude_test")
        split = "train" if w < train / (train + val) else "val"
    if held_train and split == "train":
        w = unit_hash(seed, key, "exclude_train")
        split = "val" if held or w < val / (val + test) else "test"
    return split, fold


@pytest.mark.parametrize("ratios", [(0.5, 0.25, 0.25), (0.5, 0.0, 0.5), (1.0, 0.0, 0.0),
                                    (0.0, 0.0, 1.0), (0.3, 0.7)])
def test_a_key_goes_to_the_first_part_whose_cumulative_ratio_exceeds_its_hash(ratios):
    keys = [f"k{i}" for i in range(2000)]
    bounds = np.cumsum(ratios)[:-1].tolist()
    want = [next((i for i, b in enumerate(bounds) if unit_hash(9, k, "s") < b), len(bounds))
            for k in keys]
    got = hash_cut(9, keys, "s", ratios)
    assert got.tolist() == want
    assert all((got == i).any() == (r > 0) for i, r in enumerate(ratios))  # empty iff 0
    assert hash_cut(9, [], "s", ratios).tolist() == []


@pytest.mark.parametrize("ratios, folds", [((0.8, 0.1, 0.1), 0), ((0.5, 0.2, 0.3), 0),
                                           ((0.8, 0.1, 0.1), 5)], ids=["default", "skewed",
                                                                       "folds"])
def test_the_grouped_split_is_the_scalar_rule(ratios, folds):
    test_out = set(KEYS[::3])
    train_out = set(KEYS[::5])  # some groups are in both lists
    got = GroupHashSplit(ratios, 1234, folds=folds, test_fold=2, exclude_test=test_out,
                         exclude_train=train_out).assign(KEYS)
    want = [_scalar_group_split(k, ratios, 1234, folds, 2, k in test_out, k in train_out)
            for k in KEYS]
    assert got[0].tolist() == [s for s, _ in want]
    assert got[1].tolist() == [f for _, f in want]
    plain = GroupHashSplit(ratios, 1234, folds=folds, test_fold=2).assign(KEYS)
    assert plain[0].tolist() == [_scalar_group_split(k, ratios, 1234, folds, 2)[0] for k in KEYS]


def test_listed_groups_leave_test_and_train_and_a_group_in_both_goes_to_val():
    both = GroupHashSplit((0.8, 0.1, 0.1), 3, exclude_test=KEYS, exclude_train=KEYS)
    assert set(both.assign(KEYS)[0]) == {"val"}
    no_test = GroupHashSplit((0.8, 0.1, 0.1), 3, exclude_test=KEYS).assign(KEYS)[0]
    assert "test" not in set(no_test) and {"train", "val"} <= set(no_test)
    no_train = GroupHashSplit((0.8, 0.1, 0.1), 3, exclude_train=KEYS).assign(KEYS)[0]
    assert "train" not in set(no_train) and {"val", "test"} <= set(no_train)


def test_the_grouped_split_yields_positions_of_whole_groups():
    groups = ["b", "a", "b", "c", "a", "d"] * 50
    [(train, val, test)] = list(GroupHashSplit((0.4, 0.3, 0.3), 7).split(groups, groups=groups))
    names = GroupHashSplit((0.4, 0.3, 0.3), 7).assign([f"{g}" for g in groups])[0]
    for split, part in zip(SPLIT_NAMES, (train, val, test), strict=True):
        assert part.tolist() == np.flatnonzero(names == split).tolist()
    with pytest.raises(ValueError, match="6 samples but 5 groups"):
        next(GroupHashSplit((0.8, 0.1, 0.1), 1).split(range(6), groups=list("abcde")))


def test_the_per_piece_split_is_seeded_proportional_and_stable_under_additions():
    shas = [f"{i:064x}" for i in range(20000)]
    split = PieceHashSplit((0.8, 0.1, 0.1), 3)
    a = split.assign(shas)
    # the rule the leakage audit was written with
    u = np.array([unit_hash(3, s, "random-split") for s in shas])
    assert a.tolist() == np.where(u < 0.8, "train", np.where(u < 0.8 + 0.1, "val", "test")
                                  ).tolist()
    assert (a == split.assign(shas)).all()
    assert (a != PieceHashSplit((0.8, 0.1, 0.1), 4).assign(shas)).mean() > 0.2
    assert abs((a == "test").mean() - 0.1) < 0.01 and abs((a == "train").mean() - 0.8) < 0.01
    more = split.assign(["f" * 64, *shas[::2]])
    assert (more[1:] == a[::2]).all()  # a piece keeps its side when others come or go


def test_the_per_piece_split_ignores_groups():
    keys = [f"p{i}" for i in range(100)]
    split = PieceHashSplit((0.8, 0.1, 0.1), 2)
    [a] = list(split.split(keys))
    [b] = list(split.split(keys, groups=["one"] * 100))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

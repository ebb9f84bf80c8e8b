"""The splitter contract, checked on every splitter (as scikit-learn's ``check_estimator`` checks
every estimator): deterministic for a seed, each index in exactly one split, a grouped splitter
never puts a group in two splits, the ratios hold within a stated tolerance, adding unrelated
groups moves no existing one, and ``split`` learns nothing. The last tests plant bad splitters
and show that each check catches its own fault."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.splits import SPLIT_NAMES, unit_hashes
from pipeline.similarity.splitters import GroupHashSplit, PieceHashSplit

EXCLUDED = frozenset(f"g{i}" for i in range(0, 20_000, 10))
"""A tenth of the group keys the checks draw (``g<int>``), kept out of test or train."""


@dataclass(frozen=True)
class Case:
    """A splitter to check: ``make(seed)`` builds it; ``grouped``: it promises whole groups;
    ``shares``: the expected (train, val, test) shares of the groups "g0" .. "g<n-1>"."""

    name: str
    make: Callable[[int], object]
    grouped: bool
    shares: tuple[float, float, float]


def _excluded_shares(ratios, test_out: float, train_out: float) -> tuple[float, float, float]:
    """Expected shares when ``test_out`` of the groups never go to test and ``train_out`` (other
    groups) never to train."""
    tr, va, te = ratios
    return (tr + te * test_out * tr / (tr + va) - tr * train_out,
            va + te * test_out * va / (tr + va) + tr * train_out * va / (va + te),
            te - te * test_out + tr * train_out * te / (va + te))


CASES = [
    Case("grouped", lambda s: GroupHashSplit((0.8, 0.1, 0.1), s), True, (0.8, 0.1, 0.1)),
    Case("grouped-skewed", lambda s: GroupHashSplit((0.5, 0.2, 0.3), s), True, (0.5, 0.2, 0.3)),
    # 5 folds, test = fold 2: test holds a fifth, val a ninth of the rest
    Case("grouped-folds", lambda s: GroupHashSplit((0.8, 0.1, 0.1), s, folds=5, test_fold=2),
         True, (0.8 * 8 / 9, 0.8 / 9, 0.2)),
    Case("grouped-excluding-test", lambda s: GroupHashSplit((0.8, 0.1, 0.1), s,
                                                            exclude_test=EXCLUDED),
         True, _excluded_shares((0.8, 0.1, 0.1), 0.1, 0.0)),
    Case("grouped-excluding-train", lambda s: GroupHashSplit((0.6, 0.1, 0.3), s,
                                                             exclude_train=EXCLUDED),
         True, _excluded_shares((0.6, 0.1, 0.3), 0.0, 0.1)),
    Case("per-piece", lambda s: PieceHashSplit((0.8, 0.1, 0.1), s), False, (0.8, 0.1, 0.1)),
]
IDS = [c.name for c in CASES]


def _split(splitter, keys: list[str], groups: list[str]) -> tuple[np.ndarray, ...]:
    out = list(splitter.split(keys, groups=groups))
    assert len(out) == splitter.get_n_splits(keys, groups=groups) == 1
    [triple] = out
    assert len(triple) == 3
    for part in triple:
        assert isinstance(part, np.ndarray) and part.dtype.kind == "i"
    return triple


def _per_sample(triple: tuple[np.ndarray, ...], n: int) -> np.ndarray:
    """The split name of each sample (the partition check first)."""
    assert np.array_equal(np.sort(np.concatenate(triple)), np.arange(n)), \
        "every index must be in exactly one split"
    out = np.empty(n, dtype=object)
    for name, part in zip(SPLIT_NAMES, triple, strict=True):
        out[part] = name
    return out


def _pieces(labels: list[int]) -> tuple[list[str], list[str]]:
    """Piece keys and group keys for pieces whose groups are ``labels``."""
    return [f"piece-{i}" for i in range(len(labels))], [f"g{g}" for g in labels]


# ------------------------------------------------------------------------------- the checks
def check_deterministic(case: Case) -> None:
    keys, groups = _pieces(list(range(0, 2000, 2)) * 2)
    a = _per_sample(_split(case.make(7), keys, groups), len(keys))
    b = _per_sample(_split(case.make(7), keys, groups), len(keys))
    assert np.array_equal(a, b), "the same seed must give the same split"
    c = _per_sample(_split(case.make(8), keys, groups), len(keys))
    assert (a != c).any(), "the seed must matter"


def check_partition(case: Case) -> None:
    @settings(max_examples=40, deadline=None, database=None)
    @given(st.lists(st.integers(0, 50), max_size=120), st.integers(0, 2**32 - 1))
    def run(labels, seed):
        keys, groups = _pieces(labels)
        _per_sample(_split(case.make(seed), keys, groups), len(keys))

    run()


def check_groups_whole(case: Case) -> None:
    @settings(max_examples=60, deadline=None, database=None)
    @given(st.lists(st.integers(0, 30), min_size=1, max_size=150), st.integers(0, 2**32 - 1))
    def run(labels, seed):
        keys, groups = _pieces(labels)
        split = _per_sample(_split(case.make(seed), keys, groups), len(keys))
        for g in set(groups):
            where = {split[i] for i, h in enumerate(groups) if h == g}
            assert len(where) == 1, f"group {g} in {sorted(where)}"

    run()


def check_ratios(case: Case, n: int = 20_000) -> None:
    """Each share within 5 standard deviations of its expectation (a binomial over ``n``
    groups, one piece each): a wrong cut moves a share by far more."""
    keys, groups = _pieces(list(range(n)))
    split = _per_sample(_split(case.make(3), keys, groups), n)
    for name, expected in zip(SPLIT_NAMES, case.shares, strict=True):
        tolerance = 5 * math.sqrt(expected * (1 - expected) / n) + 1e-9
        share = float((split == name).mean())
        assert abs(share - expected) <= tolerance, (name, share, expected, tolerance)


def check_stable_under_additions(case: Case) -> None:
    @settings(max_examples=40, deadline=None, database=None)
    @given(st.lists(st.integers(0, 40), min_size=1, max_size=100),
           st.lists(st.integers(41, 80), min_size=1, max_size=60),
           st.randoms(use_true_random=False), st.integers(0, 2**32 - 1))
    def run(labels, new_labels, rnd, seed):
        keys, groups = _pieces(labels)
        before = _per_sample(_split(case.make(seed), keys, groups), len(keys))
        # unrelated pieces (new keys in new groups) shuffled in among the old ones
        rows = [(k, g, b) for k, g, b in zip(keys, groups, before, strict=True)]
        rows += [(f"new-{i}", f"g{g}", None) for i, g in enumerate(new_labels)]
        rnd.shuffle(rows)
        after = _per_sample(_split(case.make(seed), [r[0] for r in rows], [r[1] for r in rows]),
                            len(rows))
        for (key, _, old), now in zip(rows, after, strict=True):
            assert old is None or old == now, f"{key} moved from {old} to {now}"

    run()


def check_learns_nothing(case: Case) -> None:
    splitter = case.make(5)
    settings_before = dict(vars(splitter))
    keys, groups = _pieces(list(range(50)))
    _split(splitter, keys, groups)
    assert vars(splitter) == settings_before, "split must not change the splitter"


CHECKS = [check_deterministic, check_partition, check_ratios, check_stable_under_additions,
          check_learns_nothing]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_splitter_contract(case, check):
    check(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.grouped],
                         ids=[c.name for c in CASES if c.grouped])
def test_grouped_splitters_keep_groups_whole(case):
    check_groups_whole(case)


def test_groups_are_required():
    with pytest.raises(ValueError, match="groups"):
        next(GroupHashSplit((0.8, 0.1, 0.1), 1).split(["a", "b"]))


# ----------------------------------------------------------------- planted bad splitters
class _Shuffled:
    """Positions permuted by a seeded generator, then cut: reproducible, but a new piece
    anywhere moves the others, and groups are ignored."""

    def __init__(self, ratios, seed):
        self.ratios, self.seed = ratios, seed

    def get_n_splits(self, X=None, y=None, groups=None):
        return 1

    def split(self, X, y=None, groups=None):
        n = len(X)
        order = np.random.default_rng(self.seed).permutation(n)
        ends = np.round(np.cumsum(self.ratios) * n).astype(int)
        yield tuple(np.sort(p) for p in np.split(order, ends[:-1]))


class _Unseeded(PieceHashSplit):
    """Draws a fresh seed on every call."""

    def split(self, X, y=None, groups=None):
        seed = int(np.random.default_rng().integers(2**32))
        yield from PieceHashSplit(self.ratios, seed).split(X)


class _PieceWise(GroupHashSplit):
    """Claims groups but hashes each piece."""

    def split(self, X, y=None, groups=None):
        yield from PieceHashSplit(self.ratios, self.seed).split(X)


class _Overlapping(PieceHashSplit):
    """Puts the first test piece in train too."""

    def split(self, X, y=None, groups=None):
        train, val, test = next(PieceHashSplit(self.ratios, self.seed).split(X))
        yield np.sort(np.concatenate([train, test[:1]])), val, test


class _Skewed(GroupHashSplit):
    """Cuts the hash at the wrong place (train's share where val's ends)."""

    def split(self, X, y=None, groups=None):
        tr, va, te = self.ratios
        yield from GroupHashSplit((tr - va, 2 * va, te), self.seed).split(X, groups=groups)


class _Learning(PieceHashSplit):
    """Remembers what it split."""

    def split(self, X, y=None, groups=None):
        self.seen_ = len(X)
        yield from super().split(X)


class _Counting(PieceHashSplit):
    """Hashes the key's position: a new piece before it moves it."""

    def split(self, X, y=None, groups=None):
        u = unit_hashes(self.seed, [str(i) for i in range(len(X))], "position")
        part = np.searchsorted(np.cumsum(self.ratios)[:-1], u, side="right")
        yield tuple(np.flatnonzero(part == k) for k in range(3))


RATIOS = (0.8, 0.1, 0.1)
PLANTED = [
    (_Unseeded, False, check_deterministic),
    (_Overlapping, False, check_partition),
    (_PieceWise, True, check_groups_whole),
    (_Skewed, True, check_ratios),
    (_Shuffled, False, check_stable_under_additions),
    (_Counting, False, check_stable_under_additions),
    (_Learning, False, check_learns_nothing),
]


@pytest.mark.parametrize("bad, grouped, check", PLANTED,
                         ids=[f"{c.__name__}-{b.__name__}" for b, _, c in PLANTED])
def test_the_contract_catches_a_planted_bad_splitter(bad, grouped, check):
    case = Case(bad.__name__, lambda s: bad(RATIOS, s), grouped, RATIOS)
    with pytest.raises(AssertionError):
        check(case)

"""Splitters: train/val/test by a seeded hash of a key, cut at the cumulative ratios.

:func:`hash_cut` is the one assignment: a key's :func:`pipeline.core.splits.unit_hash` (a uniform
number in [0, 1) from the seed, a salt and the key) falls in one of the parts ``[0, r0)``,
``[r0, r0 + r1)``, ... of the ratios ``r``. A key's part depends on the key, the seed, the salt
and the ratios alone: adding keys moves none, and the shares hold in expectation.

Two splitters use it, in scikit-learn's splitter shape: ``__init__`` stores the settings
unchanged, nothing is learned, and ``split(X, y=None, groups=None)`` yields index arrays, here
one ``(train, val, test)`` triple of sorted positions:

- :class:`GroupHashSplit`, the split stage's: each group goes whole to one split, by the hash
  of its key (``groups``), so the same group never appears in two splits; optionally by k group
  folds, and keeping listed groups out of test or out of train
  (:mod:`pipeline.stages.split` documents the rules);
- :class:`PieceHashSplit`, the contrast the leakage audit draws
  (:func:`pipeline.similarity.leakage.audit`): each piece on its own, by the hash of its key
  (``X``), the leaky baseline a grouped split is compared with.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np

from pipeline.core.arrays import isin
from pipeline.core.splits import SPLIT_NAMES, unit_hashes

Ratios = tuple[float, float, float]
"""Expected shares of (train, val, test); they sum to 1."""
_NAMES = np.asarray(SPLIT_NAMES, dtype=object)


def hash_cut(seed: int, keys: Sequence[str], salt: str, ratios: Sequence[float]) -> np.ndarray:
    """Part of each key: ``k`` where the key's unit hash lies in ``[r0 + ... + r(k-1),
    r0 + ... + rk)``; the last part also takes whatever rounding leaves above the sum."""
    u = unit_hashes(seed, keys, salt)
    return np.searchsorted(np.cumsum(ratios)[:-1], u, side="right")


def _triple(per_sample: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    train, val, test = (np.flatnonzero(per_sample == s) for s in SPLIT_NAMES)
    return train, val, test


class GroupHashSplit:
    """Groups to train/val/test by a seeded hash of each group's key.

    ``ratios``: expected shares of groups in (train, val, test). ``folds`` >= 2: each group's
    fold is the ``folds``-quantile of another hash of its key; fold ``test_fold`` is test and
    the rest splits into val and train by ``val / (train + val)``. ``exclude_test``: group keys
    that never go to test (one the hash puts there goes to train or val by a third hash, at
    ``train / (train + val)``); ``exclude_train``: group keys that never go to train (to val or
    test, at ``val / (val + test)``; a group in both lists goes to val). Every other group is
    placed exactly as without the lists."""

    salt = "split"

    def __init__(self, ratios: Ratios, seed: int, *, folds: int = 0, test_fold: int = 0,
                 exclude_test: Collection[str] = (), exclude_train: Collection[str] = ()
                 ) -> None:
        self.ratios = ratios
        self.seed = seed
        self.folds = folds
        self.test_fold = test_fold
        self.exclude_test = exclude_test
        self.exclude_train = exclude_train

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return 1

    def assign(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(split, fold)`` of each group key (fold -1 without folds): a pure function of the
        key and the settings."""
        keys = np.asarray(keys, dtype=object).reshape(-1)
        train, val, test = self.ratios
        folds = np.full(keys.size, -1, dtype=np.int16)
        if self.folds >= 2:
            u = unit_hashes(self.seed, keys, "fold")
            folds[:] = np.minimum((u * self.folds).astype(np.int64), self.folds - 1)
            share = val / (train + val)
            rest = np.where(hash_cut(self.seed, keys, self.salt, (share, 1 - share)) == 0,
                            "val", "train")
            splits = np.where(folds == self.test_fold, "test", rest).astype(object)
        else:
            splits = _NAMES[hash_cut(self.seed, keys, self.salt, self.ratios)]
        held = isin(keys.astype(str), self.exclude_test) if len(self.exclude_test) else None
        moved = held & (splits == "test") if held is not None else None
        if moved is not None and moved.any():
            share = train / (train + val)
            cut = hash_cut(self.seed, keys[moved], "exclude_test", (share, 1 - share))
            splits[moved] = np.where(cut == 0, "train", "val")
        out = isin(keys.astype(str), self.exclude_train) & (splits == "train") \
            if len(self.exclude_train) else None
        if out is not None and out.any():
            share = val / (val + test)
            cut = hash_cut(self.seed, keys[out], "exclude_train", (share, 1 - share))
            to_val = (cut == 0) | (held[out] if held is not None else False)
            splits[out] = np.where(to_val, "val", "test")
        return splits, folds

    def split(self, X, y=None, groups=None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One ``(train, val, test)`` of positions in ``X``; ``groups``: each sample's group
        key (required)."""
        if groups is None:
            raise ValueError("GroupHashSplit.split: groups is required (each sample's group key)")
        keys = np.asarray(groups, dtype=object).reshape(-1).astype(str)
        if keys.size != len(X):
            raise ValueError(f"GroupHashSplit.split: {len(X)} samples but {keys.size} groups")
        uniq, inverse = np.unique(keys, return_inverse=True)
        splits, _ = self.assign(uniq.astype(object))
        yield _triple(splits[inverse])


class PieceHashSplit:
    """Each sample to train/val/test by a seeded hash of its own key (``X``: the keys, e.g.
    sha256s), whatever its group: the plain per-piece random split, stable when samples are
    added. ``ratios``: expected shares of samples in (train, val, test)."""

    salt = "random-split"

    def __init__(self, ratios: Ratios, seed: int) -> None:
        self.ratios = ratios
        self.seed = seed

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return 1

    def assign(self, keys: Sequence[str]) -> np.ndarray:
        """The split of each key."""
        return _NAMES[hash_cut(self.seed, keys, self.salt, self.ratios)]

    def split(self, X, y=None, groups=None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One ``(train, val, test)`` of positions in ``X``; ``groups`` is ignored."""
        yield _triple(self.assign([str(x) for x in X]))

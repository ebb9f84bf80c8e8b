"""MinHash LSH banding by sorts (:mod:`pipeline.similarity.lsh`): a pair sharing all rows of a
band is proposed, an unrelated one is not; the cross-set join equals the within-set pairs that
cross; blocking changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.similarity import lsh

BANDING = (8, 4)


def _random_signatures(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, size=(n, 32), dtype=np.uint64).astype(np.uint32)


def test_bands_are_datasketchs_choice():
    from datasketch import MinHashLSH

    b, r = lsh.bands(0.4, 128)
    ref = MinHashLSH(threshold=0.4, num_perm=128, weights=lsh.WEIGHTS)
    assert (b, r) == (ref.b, ref.r)
    assert b * r <= 128


def test_a_planted_pair_is_found_and_no_unrelated_one():
    sig = _random_signatures(20)
    sig[13] = sig[4]  # an identical pair
    sig[17, 8:12] = sig[2, 8:12]  # a pair that agrees on the rows of band 2 only
    sig[9, 8:11] = sig[5, 8:11]  # a pair that agrees on 3 of band 2's 4 rows: not a candidate
    a, b = lsh.pairs_within(sig, np.arange(20), BANDING)
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == [(2, 17), (4, 13)]


def test_only_the_pieces_given_are_paired():
    sig = _random_signatures(10)
    sig[3] = sig[1] = sig[7]
    a, b = lsh.pairs_within(sig, np.array([1, 3, 5]), BANDING)
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == [(1, 3)]
    empty = lsh.pairs_within(sig, np.array([1]), BANDING)
    assert empty[0].size == empty[1].size == 0


def test_pairs_are_enumerated_the_same_in_small_blocks(monkeypatch):
    sig = _random_signatures(40)
    sig[::3, :4] = 7  # one big bucket in band 0
    whole = lsh.pairs_within(sig, np.arange(40), BANDING)
    monkeypatch.setattr(lsh, "PAIR_BLOCK", 5)
    blocked = lsh.pairs_within(sig, np.arange(40), BANDING)
    assert whole[0].size == 14 * 13 // 2
    assert all(np.array_equal(x, y) for x, y in zip(whole, blocked, strict=True))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.integers(2, 30))
def test_pairs_across_are_the_within_pairs_that_cross(seed, n):
    rng = np.random.default_rng(seed)
    sig = rng.integers(0, 3, size=(n, 8)).astype(np.uint32)  # few values: many collisions
    side = rng.random(n) < 0.5
    queries, pool = np.flatnonzero(side), np.flatnonzero(~side)
    a, b = lsh.pairs_within(sig, np.arange(n), (4, 2))
    cross = side[a] != side[b]
    want = sorted((min(i, j, key=lambda x: not side[x]), max(i, j, key=lambda x: not side[x]))
                  for i, j in zip(a[cross].tolist(), b[cross].tolist(), strict=True))
    q, p = lsh.pairs_across(sig, queries, pool, (4, 2))
    assert list(zip(q.tolist(), p.tolist(), strict=True)) == want
    assert side[q].all() and not side[p].any()


@pytest.mark.parametrize("queries, pool", [([], [0, 1]), ([0, 1], [])])
def test_pairs_across_with_an_empty_side_is_empty(queries, pool):
    sig = np.zeros((2, 8), np.uint32)
    q, p = lsh.pairs_across(sig, np.array(queries, np.int64), np.array(pool, np.int64), (4, 2))
    assert q.size == p.size == 0

"""MinHash LSH banding done with sorts: the candidate pairs of the near tier's shingle sets
(:mod:`pipeline.similarity.duplicates`) and of its short melodies
(:mod:`pipeline.similarity.short_melodies`).

The same banding as datasketch's ``MinHashLSH`` (its (b, r) optimiser, its bucket rule), done
with one sort per band: MinHashLSH inserts and queries one key at a time in Python, about 1 ms
per piece at 128 permutations, which is minutes at 100k pieces. A test checks equal candidates.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from pipeline.core.arrays import unique
from pipeline.similarity import fingerprints as fp

WEIGHTS = (0.2, 0.8)
"""Recall-weighted banding (datasketch's false-positive and false-negative weights): every
candidate is verified exactly, so a false positive costs one measure while a false negative is a
leak."""


def bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) that datasketch's MinHashLSH chooses for ``threshold``."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=WEIGHTS)
    return lsh.b, lsh.r


def band_keys(signatures: np.ndarray, banding: tuple[int, int]) -> list[np.ndarray]:
    """One uint64 key per piece and band: pieces share a band's key when they agree on all its
    rows (up to hash collisions, which verification catches)."""
    n_bands, rows = banding
    keys = []
    for band in range(n_bands):
        h = np.zeros(signatures.shape[0], dtype=np.uint64)
        for c in range(band * rows, (band + 1) * rows):
            h = fp.mix64(h ^ signatures[:, c].astype(np.uint64)) + np.uint64(c)
        keys.append(h)
    return keys


PAIR_BLOCK = 1 << 20
"""Pairs formed at once within a band: a band whose buckets hold millions of pairs (pieces of one
style sharing common grams) is enumerated in blocks, so memory stays a few arrays of this size."""


def band_pairs(signatures: np.ndarray, pieces: np.ndarray, banding: tuple[int, int]
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pairs of ``pieces`` that share a band's key, band after band, in blocks of at most
    about ``PAIR_BLOCK`` pairs, as (i, j) index arrays with ``i < j`` (a pair sharing several
    bands comes once per band)."""
    if pieces.size < 2:
        return
    for h in band_keys(signatures[pieces], banding):
        order = np.argsort(h, kind="stable")
        hs = h[order]
        new = np.ones(hs.size, dtype=bool)
        new[1:] = hs[1:] != hs[:-1]
        bucket_end = np.flatnonzero(np.append(new[1:], True))  # last position of each bucket
        end = np.repeat(bucket_end, np.diff(np.append(np.flatnonzero(new), hs.size)))
        later = end - np.arange(hs.size)  # members after each position in its bucket
        total = np.cumsum(later)
        start = 0
        while start < hs.size:
            done = int(total[start - 1]) if start else 0
            stop = min(max(int(np.searchsorted(total, done + PAIR_BLOCK, side="right")),
                           start + 1), hs.size)
            count = later[start:stop]
            first = np.repeat(np.arange(start, stop), count)
            second = first + 1 + (np.arange(first.size)
                                  - np.repeat(np.cumsum(count) - count, count))
            i, j = pieces[order[first]], pieces[order[second]]
            if i.size:
                yield np.minimum(i, j), np.maximum(i, j)
            start = stop


def pairs_within(signatures: np.ndarray, pieces: np.ndarray, banding: tuple[int, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs ``i < j`` among ``pieces``: those sharing all rows of some band; unique,
    sorted by ``i`` then ``j``."""
    n = signatures.shape[0]
    codes = [a.astype(np.int64) * n + b for a, b in band_pairs(signatures, pieces, banding)]
    if not codes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    code = unique(np.concatenate(codes))
    return code // n, code % n


def band_pairs_across(signatures: np.ndarray, queries: np.ndarray, pool: np.ndarray,
                      banding: tuple[int, int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per band, the pairs of :func:`band_pairs` that join a ``queries`` piece with a ``pool``
    piece (the two index sets are disjoint), as (query, pool) index arrays, without forming the
    pool's own pairs: a sorted join of the query keys on the pool keys."""
    if queries.size == 0 or pool.size == 0:
        return
    q_keys, p_keys = band_keys(signatures[queries], banding), band_keys(signatures[pool], banding)
    for hq, hp in zip(q_keys, p_keys, strict=True):
        order = np.argsort(hp, kind="stable")
        hs = hp[order]
        lo, hi = np.searchsorted(hs, hq, "left"), np.searchsorted(hs, hq, "right")
        count = hi - lo
        q = np.repeat(np.arange(queries.size), count)
        within = np.arange(q.size) - np.repeat(np.cumsum(count) - count, count)
        yield queries[q], pool[order[np.repeat(lo, count) + within]]


def pairs_across(signatures: np.ndarray, queries: np.ndarray, pool: np.ndarray,
                 banding: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of :func:`band_pairs_across` over all bands: (query, pool) index arrays,
    unique, sorted by query then pool."""
    n = signatures.shape[0]
    codes = [q.astype(np.int64) * n + p
             for q, p in band_pairs_across(signatures, queries, pool, banding)]
    if not codes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    code = unique(np.concatenate(codes))
    return code // n, code % n

"""Memorisation measures: how much of a sequence already exists in the training set.

- :class:`SuffixIndex` — a suffix array over all training sequences (each closed by its own
  separator, so no match spans two pieces). ``matching_statistics(q)`` gives, for every position
  ``i`` of ``q``, the length of the longest prefix of ``q[i:]`` found anywhere in training, in
  ``O(|q| log N)`` pattern look-ups (the length at ``i+1`` is at least the length at ``i`` minus
  one, so each position costs amortised O(1) look-ups). The longest common substring and the
  n-gram novelty at every n follow from that one array: an n-gram starting at ``i`` occurs in
  training exactly when ``ms[i] >= n``.
- :class:`ShingleIndex` — nearest training piece by Jaccard / containment of the dedupe stage's
  shingle sets (pitch interval + inter-onset-ratio k-grams), its notion of "same tune".
- :func:`extraction_test` — greedy continuation of prefixes vs the true continuation.
- :func:`membership_auc` — how well per-piece loss separates training from held-out pieces.

Hand-written because no maintained suffix-array package is in the environment (pydivsufsort,
suffix-tree packages are not installed); construction is numpy prefix doubling (O(N log² N),
vectorised), and look-ups compare big-endian byte strings, whose order equals the order of the
id sequences, with :func:`bisect.bisect_left`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.base import SequenceModel

_SEP_TOP = 2**32 - 1  # separators count down from here; real ids stay below 2**31


def suffix_array(text: np.ndarray) -> np.ndarray:
    """Suffix array of an integer array by prefix doubling (ranks compared as pairs)."""
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(text, return_inverse=True)[1].astype(np.int64).reshape(-1)
    sa = np.argsort(rank, kind="stable")
    k = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:] if k < n else second[:0]
        sa = np.lexsort((second, rank))
        r, s = rank[sa], second[sa]
        new = np.empty(n, dtype=np.int64)
        new[sa] = np.concatenate([[0], np.cumsum((r[1:] != r[:-1]) | (s[1:] != s[:-1]))])
        rank = new
        if rank[sa[-1]] == n - 1 or k >= n:
            return sa
        k *= 2


@dataclass(frozen=True)
class Match:
    """Longest common substring of a query with the training set."""

    length: int
    """Matched ids (0 = not even one id in common)."""
    query_start: int
    """Where the match starts in the query (-1 when length is 0)."""
    seq_index: int
    """Which training sequence (index into the fitted list; -1 when length is 0)."""
    seq_offset: int
    """Where the match starts in that training sequence."""


class SuffixIndex:
    """Suffix array over a list of id sequences. ``fit(seqs)`` then query with ``longest_match``."""

    def fit(self, seqs: Sequence[np.ndarray]) -> SuffixIndex:
        if len(seqs) >= 2**31:
            raise ValueError("too many sequences for the separator space")
        parts, starts, pos = [], [], 0
        for k, s in enumerate(seqs):
            s = np.asarray(s, dtype=np.int64)
            if s.size and (s.min() < 0 or s.max() >= 2**31):
                raise ValueError("ids must lie in [0, 2**31)")
            starts.append(pos)
            parts.append(np.append(s, _SEP_TOP - k))
            pos += s.size + 1
        self.text_ = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.starts_ = np.asarray(starts, dtype=np.int64)
        self.sa_ = suffix_array(self.text_).tolist()  # a list: bisect indexes it element by element
        self._buf = self.text_.astype(">u4").tobytes()
        return self

    def find(self, pattern: bytes) -> int:
        """Start position in the text of one occurrence of ``pattern`` (big-endian u4), or -1."""
        buf, w = self._buf, len(pattern)
        i = bisect.bisect_left(self.sa_, pattern, key=lambda p: buf[4 * p : 4 * p + w])
        if i < len(self.sa_) and buf[4 * self.sa_[i] : 4 * self.sa_[i] + w] == pattern:
            return self.sa_[i]
        return -1

    def matching_statistics(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths, text_positions)``: longest training match starting at each query position."""
        q = np.asarray(query, dtype=np.int64)
        m = q.size
        qb = q.astype(">u4").tobytes()
        lengths = np.zeros(m, dtype=np.int64)
        where = np.full(m, -1, dtype=np.int64)
        length, pos = 0, -1
        for i in range(m):
            if length > 0:  # q[i-1 : i-1+length] occurred at pos, so q[i : i-1+length] at pos+1
                length, pos = length - 1, pos + 1
            if length == 0:
                pos = -1
            while i + length < m:
                found = self.find(qb[4 * i : 4 * (i + length + 1)])
                if found < 0:
                    break
                length, pos = length + 1, found
            lengths[i], where[i] = length, pos
        return lengths, where

    def locate(self, text_pos: int) -> tuple[int, int]:
        """Text position -> (sequence index, offset in that sequence)."""
        k = int(np.searchsorted(self.starts_, text_pos, side="right") - 1)
        return k, int(text_pos - self.starts_[k])

    def longest_match(self, query: np.ndarray) -> tuple[Match, np.ndarray]:
        """The longest common substring with training, plus the matching statistics behind it."""
        lengths, where = self.matching_statistics(query)
        if lengths.size == 0 or lengths.max() == 0:
            return Match(0, -1, -1, -1), lengths
        i = int(np.argmax(lengths))  # first position of the longest match
        k, off = self.locate(int(where[i]))
        return Match(int(lengths[i]), i, k, off), lengths


def novelty(lengths: np.ndarray, n: int) -> float:
    """Fraction of the query's n-grams absent from training, from its matching statistics.

    NaN when the query is shorter than ``n`` (no n-grams to judge).
    """
    count = len(lengths) - n + 1
    if count <= 0:
        return float("nan")
    return float((np.asarray(lengths[:count]) < n).mean())


def intervals(pitch: np.ndarray) -> np.ndarray:
    """Transposition-invariant view of a notes table sorted by (onset, pitch): successive
    pitch differences, shifted by +128 so they are non-negative ids."""
    p = np.asarray(pitch, dtype=np.int64)
    return (np.diff(p) + 128) if p.size > 1 else np.zeros(0, dtype=np.int64)


class ShingleIndex:
    """Nearest training piece by shingle-set Jaccard, via an inverted index over all sets.

    Sets are sorted unique uint64 arrays as :func:`pipeline.music.fingerprints.shingles` makes them
    (the dedupe stage's "near" tier), and similarities are the dedupe stage's: Jaccard and
    containment ``|q ∩ t| / min(|q|, |t|)``
    (:func:`pipeline.music.fingerprints.jaccard_containment`), computed for every training set at
    once from one sorted array of (value, set) pairs.
    """

    def fit(self, sets: Sequence[np.ndarray]) -> ShingleIndex:
        sizes = np.asarray([len(s) for s in sets], dtype=np.int64)
        values = np.concatenate([np.asarray(s, dtype=np.uint64) for s in sets]) if sets else \
            np.zeros(0, dtype=np.uint64)
        owner = np.repeat(np.arange(len(sets), dtype=np.int64), sizes)
        order = np.argsort(values, kind="stable")
        self.values_, self.owner_, self.sizes_ = values[order], owner[order], sizes
        return self

    def nearest(self, query: np.ndarray) -> tuple[int, float, float]:
        """``(index, jaccard, containment)`` of the most similar set by Jaccard (lowest index on
        ties); ``(-1, 0, 0)`` when no set shares a shingle with ``query``."""
        q = np.unique(np.asarray(query, dtype=np.uint64))
        if q.size == 0 or self.values_.size == 0:
            return -1, 0.0, 0.0
        lo = np.searchsorted(self.values_, q, side="left")
        hi = np.searchsorted(self.values_, q, side="right")
        counts = hi - lo
        if counts.sum() == 0:
            return -1, 0.0, 0.0
        # positions lo..hi-1 of every query value, flattened
        pos = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        inter = np.bincount(self.owner_[pos], minlength=self.sizes_.size).astype(np.float64)
        jac = inter / (q.size + self.sizes_ - inter)
        k = int(np.argmax(jac))
        return k, float(jac[k]), float(inter[k] / min(q.size, self.sizes_[k]))


@dataclass(frozen=True)
class Extraction:
    """Greedy continuation of prefixes compared with the true next ``m`` ids."""

    n: int
    exact_rate: float
    """Fraction of prefixes whose greedy continuation equals the true next m ids exactly."""
    token_match: float
    """Mean fraction of the m positions predicted correctly."""


def extraction_test(model: SequenceModel, seqs: Sequence[np.ndarray], prefix_len: int, m: int,
                    forbid: Sequence[int] = (), batch_size: int = 16) -> Extraction:
    """Greedy-continue ``seq[:prefix_len]`` of each sequence (at least prefix_len+m ids long)."""
    from pipeline.scoring.sampling import SamplingParams, sample_sequences

    seqs = [np.asarray(s) for s in seqs if len(s) >= prefix_len + m]
    if not seqs:
        return Extraction(0, float("nan"), float("nan"))
    gens = sample_sequences(model, [s[:prefix_len] for s in seqs], max_new_tokens=m,
                            params=SamplingParams(temperature=0.0), rngs=None, forbid=forbid,
                            batch_size=batch_size)
    exact, match = [], []
    for s, g in zip(seqs, gens, strict=True):
        truth = s[prefix_len : prefix_len + m]
        got = np.full(m, -1, dtype=np.int64)
        got[: len(g)] = g[:m]
        exact.append(bool(np.array_equal(got, truth)))
        match.append(float((got == truth).mean()))
    return Extraction(len(seqs), float(np.mean(exact)), float(np.mean(match)))


def membership_auc(train_loss: Sequence[float], heldout_loss: Sequence[float]) -> float:
    """ROC AUC of "lower loss means training member"; 0.5 = no membership signal. NaN if a side
    is empty."""
    from sklearn.metrics import roc_auc_score

    a = np.asarray(train_loss, dtype=float)
    b = np.asarray(heldout_loss, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return float("nan")
    y = np.concatenate([np.ones(a.size), np.zeros(b.size)])
    return float(roc_auc_score(y, -np.concatenate([a, b])))


def mean_token_nll(model: SequenceModel, seqs: Sequence[np.ndarray]) -> np.ndarray:
    """Per-sequence mean NLL (nats per target, EOS included) under the scoring protocol."""
    if not seqs:
        return np.zeros(0)
    return np.asarray([float(np.mean(v)) for v in model.token_nll(list(seqs))])

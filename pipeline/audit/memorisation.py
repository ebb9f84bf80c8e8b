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
- :func:`window_offsets` — where the length-matched human windows start in a held-out piece.
- Judging against a baseline, each value with an interval: :func:`judge_flag_rate` (a model's
  flag rate against the human windows' rate), :func:`judge_extraction` (train against test
  pieces) and :func:`judge_membership` (AUC against 0.5).

Hand-written because no maintained suffix-array package is in the environment (pydivsufsort,
suffix-tree packages are not installed); construction is numpy prefix doubling (O(N log² N),
vectorised), and look-ups compare big-endian byte strings, whose order equals the order of the
id sequences, with :func:`bisect.bisect_left`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from models.base import SequenceModel
from pipeline.stats.bootstrap import (
    bootstrap_weights,
    safe_ratio,
    seed_half_width,
    value_interval,
    with_seed_term,
)

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

    Sets are sorted unique uint64 arrays as :func:`pipeline.similarity.fingerprints.shingles` makes
    them
    (the dedupe stage's "near" tier), and similarities are the dedupe stage's: Jaccard and
    containment ``|q ∩ t| / min(|q|, |t|)``
    (:func:`pipeline.similarity.fingerprints.jaccard_containment`), computed for every training set
    at
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
    exact_each: tuple[bool, ...] = ()
    """Per sequence (in input order, those long enough): was the continuation exact."""


def extraction_test(model: SequenceModel, seqs: Sequence[np.ndarray], prefix_len: int, m: int,
                    forbid: Sequence[int] = (), batch_size: int = 16) -> Extraction:
    """Greedy-continue ``seq[:prefix_len]`` of each sequence (at least prefix_len+m ids long).
    A model with its own ``greedy_continue(prefixes, m)`` (compound tokens' step symbols,
    :class:`pipeline.audit.compound.SymbolModel`) continues the prefixes itself."""
    from pipeline.inference.sampling import SamplingParams, sample_sequences

    seqs = [np.asarray(s) for s in seqs if len(s) >= prefix_len + m]
    if not seqs:
        return Extraction(0, float("nan"), float("nan"))
    greedy = getattr(model, "greedy_continue", None)
    if greedy is not None:
        gens = greedy([s[:prefix_len] for s in seqs], m)
    else:
        gens = sample_sequences(model, [s[:prefix_len] for s in seqs], max_new_tokens=m,
                                params=SamplingParams(temperature=0.0), rngs=None,
                                forbid=forbid, batch_size=batch_size)
    exact, match = [], []
    for s, g in zip(seqs, gens, strict=True):
        truth = s[prefix_len : prefix_len + m]
        got = np.full(m, -1, dtype=np.int64)
        got[: len(g)] = g[:m]
        exact.append(bool(np.array_equal(got, truth)))
        match.append(float((got == truth).mean()))
    return Extraction(len(seqs), float(np.mean(exact)), float(np.mean(match)), tuple(exact))


def union_extraction(per_seed: Sequence[Extraction]) -> Extraction:
    """The extraction of a model trained over several seeds, on the same sequences: a sequence
    counts as extracted when *any* seed reproduces it exactly (what the training recipe can
    leak), ``token_match`` the seeds' mean. The unit stays the sequence, so the score intervals
    of :func:`judge_extraction` keep their meaning; pooling the seeds' counts would treat one
    piece seen by three seeds as three independent pieces."""
    if not per_seed:
        raise ValueError("no seeds")
    sizes = {e.n for e in per_seed}
    if len(sizes) != 1:
        raise ValueError(f"seeds measured on different numbers of sequences: {sorted(sizes)}")
    if per_seed[0].n == 0:
        return per_seed[0]
    exact = tuple(bool(x) for x in np.any([e.exact_each for e in per_seed], axis=0))
    return Extraction(per_seed[0].n, float(np.mean(exact)),
                      float(np.mean([e.token_match for e in per_seed])), exact)


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


# --- human windows ------------------------------------------------------------------------------


def window_offsets(n: int, width: int, stride: int, max_windows: int) -> np.ndarray:
    """Start offsets of the windows of ``width`` ids cut from a sequence of ``n`` ids.

    Windows start every ``stride`` ids and lie wholly inside the sequence; when there are more
    than ``max_windows``, that many are kept, evenly spread from the first to the last (so a long
    piece cannot dominate a quantile). A sequence of at most ``width`` ids is one window: itself.
    """
    if n <= width:
        return np.zeros(1, dtype=np.int64)
    starts = np.arange(0, n - width + 1, stride, dtype=np.int64)
    if starts.size > max_windows:
        keep = np.unique(np.round(np.linspace(0, starts.size - 1, max_windows)).astype(np.int64))
        starts = starts[keep]
    return starts


# --- judging: intervals against a baseline ----------------------------------------------------
#
# Single proportions of independent units (a model's samples, each with its own generator;
# extraction pieces) get a Wilson score interval: it stays inside [0, 1] and is not degenerate at
# 0 or n events, where a percentile bootstrap collapses to a point. The difference of two such
# proportions (extraction on train minus test) gets Newcombe's hybrid score interval from those
# two Wilson intervals, for the same reason: 0 of 64 against 0 of 45 is [0, 0] by bootstrap but
# about [-7.9, +5.7] points by score. Other differences and the AUC get a percentile bootstrap,
# resampling the units that are independent: samples within their kind
# (stratified), human *pieces* with all their windows (windows of one piece are correlated, so
# resampling windows would make the interval too narrow), train and test pieces separately.


def wilson_interval(k: int, n: int, level: float) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` at central coverage ``level``."""
    if n <= 0:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends, not rounding residue
    hi = 1.0 if k == n else min(1.0, centre + half)
    return float(lo), float(hi)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, level: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``k1/n1 - k2/n2`` (his method 10, 1998): the
    difference with each side widened by the two Wilson intervals' distances from their
    proportions. Never of zero width while either ``n`` is finite, whatever the counts."""
    if n1 <= 0 or n2 <= 0:
        return float("nan"), float("nan")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, level)
    l2, u2 = wilson_interval(k2, n2, level)
    d = p1 - p2
    return (float(d - np.hypot(p1 - l1, u2 - p2)), float(d + np.hypot(u1 - p1, p2 - l2)))


def resampled_rate(values: np.ndarray, groups: np.ndarray, n_boot: int, rng: np.random.Generator,
                   strata: np.ndarray | None = None) -> np.ndarray:
    """``(n_boot,)`` bootstrap replicates of the mean of ``values`` (one per unit).

    Units sharing a group are drawn together (a cluster bootstrap); groups are drawn with
    replacement within each stratum, keeping each stratum's group count, and a replicate's mean
    is (sum of drawn values) / (number of drawn units). NaN replicates when there are no units.
    """
    values = np.asarray(values, dtype=np.float64)
    groups = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    strata = np.zeros(values.size, dtype=np.int64) if strata is None else \
        np.unique(np.asarray(strata), return_inverse=True)[1].reshape(-1)
    n_groups = int(groups.max()) + 1 if values.size else 0
    sums = np.bincount(groups, weights=values, minlength=n_groups)
    sizes = np.bincount(groups, minlength=n_groups).astype(np.float64)
    group_stratum = np.zeros(n_groups, dtype=np.int64)
    group_stratum[groups] = strata
    num, den = np.zeros(n_boot), np.zeros(n_boot)
    for s in np.unique(group_stratum):
        members = np.flatnonzero(group_stratum == s)
        w = bootstrap_weights(members.size, n_boot, rng)
        num += w @ sums[members]
        den += w @ sizes[members]
    return safe_ratio(num, den)


def _unit(x: float) -> float:
    """``x`` clipped to [0, 1], the range of a proportion (NaN stays NaN)."""
    return float(np.clip(x, 0.0, 1.0))


def judge_flag_rate(sample_flags: np.ndarray, sample_kinds: np.ndarray, human_flags: np.ndarray,
                    human_pieces: np.ndarray, *, n_boot: int, level: float,
                    rng: np.random.Generator, sample_seeds: np.ndarray | None = None
                    ) -> dict[str, Any]:
    """A model's flag rate against the human test windows' rate, each with its interval.

    Returns ``value``/``ci_low``/``ci_high`` (Wilson over the samples), ``n``, ``n_flagged``,
    ``human`` (rate over the windows; interval by resampling pieces with all their windows;
    ``n_windows``, ``n_pieces``) and ``excess`` = model − human (percentile interval of the
    difference of the two bootstraps: samples resampled within their kind, pieces with their
    windows).

    ``sample_seeds`` (the training seed of each sample's model, for a model trained over
    several seeds): the samples are pooled over the seeds and resampled within (kind, seed),
    and the seeds' Student-t interval over the per-seed flag rates (``per_seed``) takes the
    place of the samples' bootstrap where it is wider. Each seed's rate carries the noise of its
    own samples as well as the seed's, so that t interval alone is the honest one for the pooled
    rate (its variance is the per-seed rates' variance over the seeds); the bootstrap is its
    floor, for seeds that agree exactly (0 flags everywhere gives no spread, not certainty).
    Both intervals are widened, in quadrature, by ``seed_half_width`` =
    ``sqrt(max(0, t² − b²))``, ``t`` the seeds' half-width and ``b`` the samples' bootstrap
    half-width (``z`` times its replicates' standard deviation), so nothing is counted twice.
    """
    f = np.asarray(sample_flags, dtype=np.float64)
    h = np.asarray(human_flags, dtype=np.float64)
    kinds = np.asarray(sample_kinds).astype(str)
    seeds = None if sample_seeds is None else np.asarray(sample_seeds)
    if seeds is not None and np.unique(seeds).size < 2:
        seeds = None  # one seed: exactly the plain judgement
    lo, hi = wilson_interval(int(f.sum()), f.size, level)
    strata = kinds if seeds is None else np.char.add(np.char.add(kinds, "@"), seeds.astype(str))
    model = resampled_rate(f, np.arange(f.size), n_boot, rng, strata=strata)
    human = resampled_rate(h, np.asarray(human_pieces), n_boot, rng)
    value = float(f.mean()) if f.size else float("nan")
    human_value = float(h.mean()) if h.size else float("nan")
    out: dict[str, Any] = {
        "value": value, "ci_low": lo, "ci_high": hi, "n": int(f.size), "n_flagged": int(f.sum()),
        "human": {**value_interval(human_value, human, level), "n_windows": int(h.size),
                  "n_pieces": int(np.unique(np.asarray(human_pieces)).size)},
        "excess": value_interval(value - human_value, model - human, level),
    }
    if seeds is not None:
        per_seed = {str(k): {"n": int((seeds == k).sum()), "n_flagged": int(f[seeds == k].sum()),
                             "value": float(f[seeds == k].mean())}
                    for k in sorted(np.unique(seeds).tolist())}
        t = seed_half_width([[v["value"] for v in per_seed.values()]], level)
        b = NormalDist().inv_cdf(0.5 + level / 2) * float(np.std(model))
        half = math.sqrt(max(0.0, t * t - b * b)) if np.isfinite(t) else t
        rate = with_seed_term(out, half)
        out = {**rate, "ci_low": _unit(rate["ci_low"]), "ci_high": _unit(rate["ci_high"]),
               "excess": with_seed_term(out["excess"], half), "per_seed": per_seed}
    return out


def judge_extraction(train: Extraction, test: Extraction, *, level: float
                     ) -> dict[str, dict[str, float]]:
    """Exact-extraction rate on train pieces against test pieces (the chance level: what the
    model reproduces of music it never saw): ``train`` and ``test`` with Wilson intervals and
    ``excess`` = train − test with Newcombe's score interval (:func:`newcombe_interval`). Pieces
    are independent units, one each, so score intervals need no resampling; a bootstrap gave
    [0, 0] at 0 events on both sides, a certainty 64 pieces cannot give."""
    out: dict[str, dict[str, float]] = {}
    counts = []
    for name, e in (("train", train), ("test", test)):
        x = np.asarray(e.exact_each, dtype=np.float64)
        counts.append((int(x.sum()), int(x.size)))
        lo, hi = wilson_interval(int(x.sum()), x.size, level)
        out[name] = {"value": float(x.mean()) if x.size else float("nan"), "ci_low": lo,
                     "ci_high": hi, "n": int(x.size)}
    lo, hi = newcombe_interval(*counts[0], *counts[1], level)
    out["excess"] = {"value": out["train"]["value"] - out["test"]["value"], "ci_low": lo,
                     "ci_high": hi, "method": "newcombe"}
    return out


def _group_weights(groups: Sequence | None, n: int, n_boot: int,
                   rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n)`` draw counts of ``n`` units, whole groups drawn together (a unit its own
    group when ``groups`` is None)."""
    if groups is None:
        return bootstrap_weights(n, n_boot, rng)
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    return bootstrap_weights(int(codes.max()) + 1 if n else 0, n_boot, rng)[:, codes]


def tpr_at_fpr(train_loss: np.ndarray, heldout_loss: np.ndarray, fpr: float,
               w_train: np.ndarray | None = None, w_heldout: np.ndarray | None = None
               ) -> np.ndarray:
    """True-positive rate of the loss attack ("member when the loss is below t") at the
    threshold ``t`` that calls at most ``fpr`` of the held-out pieces members: ``t`` is the
    smallest held-out loss with more than ``fpr`` of the held-out weight at or below it, so
    held-out pieces strictly below ``t`` are the false positives. One row per row of the weight
    matrices (draw counts; None = each piece once), a 1-d array either way."""
    a = np.asarray(train_loss, dtype=np.float64)
    b = np.asarray(heldout_loss, dtype=np.float64)
    wa = np.ones((1, a.size)) if w_train is None else np.atleast_2d(w_train)
    wb = np.ones((1, b.size)) if w_heldout is None else np.atleast_2d(w_heldout)
    order = np.argsort(b, kind="stable")
    cum = np.cumsum(wb[:, order], axis=1)
    first = np.argmax(cum > fpr * cum[:, -1:] * (1 + 1e-12), axis=1)
    t = b[order][first]
    return safe_ratio((wa * (a[None, :] < t[:, None])).sum(axis=1), wa.sum(axis=1))


def judge_membership(train_loss: Any, heldout_loss: Any, *, n_boot: int,
                     level: float, rng: np.random.Generator,
                     train_groups: Sequence | None = None,
                     heldout_groups: Sequence | None = None,
                     fpr: float = 0.1, seeds: Sequence[Any] | None = None) -> dict[str, Any]:
    """Membership inference by the loss attack ("lower loss ⇒ training member"): the AUC
    (``value``, ``chance`` = 0.5) and ``tpr`` = the true-positive rate at a false-positive rate
    of at most ``fpr`` (:func:`tpr_at_fpr`; chance = ``fpr``), each with a percentile interval.

    Replicates resample train and held-out pieces independently, and whole groups together
    when ``train_groups`` / ``heldout_groups`` are given (pieces of one tune family are not
    independent evidence, as in evaluate's bootstrap). All AUC replicates come from one
    pairwise matrix ``C[i, j]`` (1 when train piece ``i`` has the lower loss than held-out piece
    ``j``, 0.5 on ties): a replicate's AUC is ``w_train @ C @ w_heldout / (Σw_train Σw_heldout)``
    with its draw counts.

    A model trained over several seeds passes 2-d losses, ``(seeds, pieces)``, the same pieces
    in every row: the AUC and the TPR are the seeds' means, every replicate draws the same
    groups for all seeds, and each interval is widened by the seeds' Student-t term over the
    per-seed values (:func:`pipeline.stats.bootstrap.with_seed_term`, as evaluate widens the
    gain); ``per_seed`` maps each seed (``seeds``, the rows' labels; default their positions)
    to its ``value`` and ``tpr``. A piece counts when every seed scored it. 1-d
    losses are one model: exactly the plain judgement.
    """
    a = np.atleast_2d(np.asarray(train_loss, dtype=np.float64))
    b = np.atleast_2d(np.asarray(heldout_loss, dtype=np.float64))
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{a.shape[0]} seeds of train losses, {b.shape[0]} of held-out losses")
    for name, g, x in (("train", train_groups, a), ("held-out", heldout_groups, b)):
        if g is not None and len(g) != x.shape[1]:
            raise ValueError(f"{len(g)} {name} group labels for {x.shape[1]} pieces")
    keep_a, keep_b = np.isfinite(a).all(axis=0), np.isfinite(b).all(axis=0)
    ga = None if train_groups is None else np.asarray(train_groups)[keep_a]
    gb = None if heldout_groups is None else np.asarray(heldout_groups)[keep_b]
    a, b = a[:, keep_a], b[:, keep_b]
    n_a, n_b = a.shape[1], b.shape[1]
    out: dict[str, Any] = {
        "chance": 0.5, "n_train": int(n_a), "n_heldout": int(n_b),
        "n_train_groups": int(np.unique(ga).size) if ga is not None else int(n_a),
        "n_heldout_groups": int(np.unique(gb).size) if gb is not None else int(n_b)}
    if n_a == 0 or n_b == 0:
        nan = float("nan")
        return {**out, "value": nan, "ci_low": nan, "ci_high": nan,
                "tpr": {"fpr": fpr, "chance": fpr, "value": nan, "ci_low": nan, "ci_high": nan}}
    wa = _group_weights(ga, n_a, n_boot, rng)
    wb = _group_weights(gb, n_b, n_boot, rng)
    aucs, reps, tprs, tpr_reps = [], np.zeros(n_boot), [], np.zeros(n_boot)
    for x, y in zip(a, b, strict=True):
        c = (x[:, None] < y[None, :]) + 0.5 * (x[:, None] == y[None, :])
        aucs.append(float(c.mean()))
        reps += ((wa @ c) * wb).sum(axis=1) / (wa.sum(axis=1) * wb.sum(axis=1))
        tprs.append(float(tpr_at_fpr(x, y, fpr)[0]))
        tpr_reps += tpr_at_fpr(x, y, fpr, wa, wb)
    k = len(aucs)
    auc = value_interval(float(np.mean(aucs)), reps / k, level)
    tpr = value_interval(float(np.mean(tprs)), tpr_reps / k, level)
    if k > 1:  # both are proportions: the widened interval stays within [0, 1]
        auc, tpr = ({**x, "ci_low": _unit(x["ci_low"]), "ci_high": _unit(x["ci_high"])}
                    for x in (with_seed_term(auc, seed_half_width([aucs], level)),
                              with_seed_term(tpr, seed_half_width([tprs], level))))
        labels = [str(x) for x in (range(k) if seeds is None else seeds)]
        if len(labels) != k:
            raise ValueError(f"{len(labels)} seed labels for {k} rows of losses")
        out["per_seed"] = {lab: {"value": v, "tpr": t}
                           for lab, v, t in zip(labels, aucs, tprs, strict=True)}
    return {**out, **auc, "tpr": {"fpr": fpr, "chance": fpr, **tpr}}

"""Exhaustive near-copy search: each query piece against every piece of a pool, with no
candidates and no sampling (the leakage audit's measure, :mod:`pipeline.similarity.leakage`).

A **near copy** is a pool piece that meets one of dedupe's near rules
(:class:`pipeline.similarity.rule.NearCopyRule`): exact shingle Jaccard >= ``jaccard`` or
containment >= ``containment`` (both pieces with at least ``min_shingles`` shingles), or
normalised Indel similarity >= ``alignment`` of the whole note-token sequences (both pieces with
at least ``min_align_onsets`` distinct onsets) or of the top-voice interval sequences (melodies
of at least ``min_melody_notes`` notes). A query piece is aligned when it has fewer than
``max_align_tokens`` tokens (``max_melody_notes`` melody notes: :class:`LengthCaps`); a longer
one is judged by the other rules.

Each piece is measured through its :class:`ShingleMatrix` row, :class:`Melodies` and
:class:`TokenStrings`. :func:`neighbours` keeps, per query, the best of each measure and the pool
piece reaching it (:class:`Neighbours`, which merge exactly over parts of a pool);
:func:`near_copies` gives the near copies they make, :func:`pair_record` one pair's similarities
and the rules it meets.

Similarity is exact: pieces are rows of a sparse piece × shingle incidence matrix and one sparse
product gives every intersection size, processed in blocks of query rows to bound memory;
sequences are aligned with rapidfuzz ``cdist`` in blocks of queries sorted by length, against the
pool sequences whose length alone does not rule out the threshold. Note tokens are aligned first
as one-byte strings in which rare tokens share a character (:class:`TokenStrings`), an upper
bound of the similarity, and then exactly wherever the bound allows a better pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel
from scipy.sparse import csr_array

from pipeline.core.arrays import unique_inverse
from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import melody
from pipeline.similarity.rule import NearCopyRule

BLOCK_ROWS = 256
ALIGN_BLOCK = 64
"""Query strings per ``cdist`` call (memory: this × candidate train strings × 8 bytes)."""
MAX_MELODY_NOTES = 256
"""Melodies of fewer notes are aligned; longer ones are judged by the other rules (which bounds
an alignment's cost, and at that length a shingle set is large enough to judge)."""
MAX_ALIGN_TOKENS = 512
"""Note-token sequences of fewer tokens are aligned whole; longer pieces are judged by the other
rules. An alignment costs about the product of the two lengths, so the cap bounds the audit's
time; and at that length a shingle set is large enough to judge: the alignment threshold is the
similarity left by the edit rate at which Jaccard falls to ``near_jaccard``, and a long piece's
Jaccard stays near its expectation. 96% of the Bach chorales have fewer than 512."""
_EPS = 1e-9  # a similarity equal to the threshold in exact arithmetic counts as reaching it
_CODE = 128  # interval i (|i| <= 127) -> chr(_CODE + i): exact, and a one-byte string is
# rapidfuzz's fastest input (about 1.6x faster than characters above 255)


@dataclass(frozen=True)
class ShingleMatrix:
    """Rows = pieces (in ``sha256`` order), columns = distinct shingles, values 1."""

    sha256: np.ndarray
    matrix: csr_array
    sizes: np.ndarray  # distinct shingles per piece

    @classmethod
    def build(cls, notes: fp.NoteArrays, k: int, ioi_resolution: int) -> ShingleMatrix:
        return cls.from_sets(notes.sha256, *fp.shingles(notes, k, ioi_resolution))

    @classmethod
    def from_sets(cls, sha256: np.ndarray, offsets: np.ndarray, values: np.ndarray
                  ) -> ShingleMatrix:
        """From each piece's shingle set (:func:`pipeline.similarity.fingerprints.shingles`)."""
        _, column = unique_inverse(values)
        n_cols = int(column.max()) + 1 if column.size else 0
        offsets = np.asarray(offsets, dtype=np.int64)
        m = csr_array((np.ones(column.size, dtype=np.float32), column.astype(np.int64), offsets),
                      shape=(sha256.size, n_cols))
        return cls(sha256, m, np.diff(offsets))

    def shingle_set(self, i: int) -> np.ndarray:
        """Column ids of piece ``i``'s shingles (sorted)."""
        return self.matrix.indices[self.matrix.indptr[i] : self.matrix.indptr[i + 1]]


@dataclass(frozen=True)
class Melodies:
    """Top-voice pitch-interval sequences of each piece (rows in ``sha256`` order) in the two views
    of :func:`pipeline.similarity.melody.melody_intervals` (skyline, top track); each interval is
    one
    character, so a melody is a string."""

    sha256: np.ndarray
    views: tuple[tuple[str, ...], tuple[str, ...]]
    lengths: np.ndarray  # (2, P) intervals per view and piece (= melody notes - 1)
    same: np.ndarray  # (P,) both views are one melody (a single voice, no crossing)

    @classmethod
    def build(cls, notes: fp.NoteArrays) -> Melodies:
        return cls.from_views(notes.sha256, melody_texts(notes))

    @classmethod
    def from_views(cls, sha256: np.ndarray, views: tuple[Sequence[str], Sequence[str]]
                   ) -> Melodies:
        """From each piece's two melody strings (:func:`melody_texts`)."""
        views = (tuple(views[0]), tuple(views[1]))
        lengths = np.array([[len(t) for t in v] for v in views], dtype=np.int64).reshape(2, -1)
        same = np.fromiter((a == b for a, b in zip(*views, strict=True)), dtype=bool,
                           count=sha256.size)
        return cls(sha256, views, lengths, same)

    def select(self, rows: np.ndarray) -> Melodies:
        """The melodies of pieces ``rows``, in that order."""
        return Melodies(self.sha256[rows], tuple(tuple(v[i] for i in rows) for v in self.views),
                        self.lengths[:, rows], self.same[rows])


@dataclass(frozen=True)
class TokenStrings:
    """The note tokens of each piece (rows in ``sha256`` order) as one string, one character per
    token (:class:`pipeline.similarity.alignment.Sequences`, the strings dedupe aligns), and its
    distinct onsets (a chord counts once).

    Token characters lie above 255, which rapidfuzz aligns about 5 times slower than one-byte
    strings. ``coarse`` writes the same strings in ``symbols`` bytes: the commonest tokens of
    these pieces take three quarters of the bytes, one each, and the rarer tokens share the last
    quarter (frequency rank modulo its size). Merging symbols never lowers an Indel similarity,
    so a similarity on ``coarse`` bounds the exact one from above: a pair under a threshold there
    is under it exactly, and the rest are aligned again on ``exact``. Sharing a quarter rather
    than one byte keeps the bound tight: on generated pieces whose rarer tokens make 5% of all,
    a query then needs about 1.3 exact alignments instead of 80."""

    sha256: np.ndarray
    exact: tuple[str, ...]
    coarse: tuple[str, ...]
    lengths: np.ndarray  # (P,) tokens per piece
    onsets: np.ndarray  # (P,) distinct onsets per piece

    @classmethod
    def build(cls, notes: fp.NoteArrays, ioi_resolution: int, symbols: int = 256
              ) -> TokenStrings:
        seqs = similarity.Sequences.build(notes, ioi_resolution, melodies=False)
        return cls.from_tokens(notes.sha256, seqs.tokens, seqs.distinct_onsets, symbols)

    @classmethod
    def from_tokens(cls, sha256: np.ndarray, tokens: Sequence[str], onsets: np.ndarray,
                    symbols: int = 256) -> TokenStrings:
        """From each piece's note-token string and distinct onsets
        (:class:`pipeline.similarity.alignment.Sequences`)."""
        if not 1 <= symbols <= 256:
            raise ValueError(f"TokenStrings.build: symbols must be 1 to 256, got {symbols}")
        tokens = tuple(tokens)
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        chars = np.frombuffer("".join(tokens).encode("utf-32-le"), dtype=np.uint32)
        # token characters are code points (< 0x110000): counting them is a bincount, not the
        # sort np.unique would make of every character (5 s of a 100,000-piece audit)
        every = np.bincount(chars)
        present = np.flatnonzero(every)  # the distinct characters, in increasing order
        counts = every[present]
        rank = np.empty(counts.size, dtype=np.int64)
        rank[np.argsort(-counts, kind="stable")] = np.arange(counts.size)
        own = symbols * 3 // 4
        lut = np.zeros(every.size, dtype=np.uint8)
        lut[present] = np.where(rank < own, rank, own + (rank - own) % (symbols - own))
        code = lut[chars]
        off = np.concatenate([[0], np.cumsum(lengths)])
        return cls(sha256, tokens, _slices(code.tobytes().decode("latin-1"), off), lengths,
                   np.asarray(onsets, dtype=np.int64))

    def select(self, rows: np.ndarray) -> TokenStrings:
        """The token strings of pieces ``rows``, in that order."""
        return TokenStrings(self.sha256[rows], tuple(self.exact[i] for i in rows),
                            tuple(self.coarse[i] for i in rows), self.lengths[rows],
                            self.onsets[rows])


def melody_texts(notes: fp.NoteArrays) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each piece's two melodies (:func:`pipeline.similarity.melody.melody_intervals`: skyline, top
    track) as strings of one character per interval."""
    views = []
    for off, interval in melody.melody_intervals(notes):
        text = (np.clip(interval, -127, 127) + _CODE).astype(np.uint8).tobytes()
        views.append(_slices(text.decode("latin-1"), off))
    return views[0], views[1]


def _slices(text: str, offsets: np.ndarray) -> tuple[str, ...]:
    return tuple(text[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(),
                                           strict=True))


@dataclass(frozen=True)
class LengthCaps:
    """The audit's length caps on the alignments: a held-out piece's note tokens are aligned when
    it has fewer than ``max_align_tokens`` tokens, its melodies when they have fewer than
    ``max_melody_notes`` notes; a longer one is judged by the other measures."""

    max_align_tokens: int = MAX_ALIGN_TOKENS
    max_melody_notes: int = MAX_MELODY_NOTES


CAPS = LengthCaps()


MEASURES = ("nearest_jaccard", "nearest_containment", "jaccard", "containment", "alignment",
            "melody")
"""What :class:`Neighbours` keeps per query: the nearest shingle Jaccard and containment over
every pool piece; the same two over the pairs whose pieces both have ``min_shingles`` shingles
(the near rule's); the Indel similarity of the whole note tokens and of the melodies."""
NEAREST_JACCARD, NEAREST_CONTAINMENT, JACCARD, CONTAINMENT, ALIGNMENT, MELODY = range(6)
_NO_ROW = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Neighbours:
    """Per query piece, over the pool pieces it is compared with: the best value of each of
    :data:`MEASURES` and the pool row reaching it (the lowest row, i.e. the smallest sha256,
    among equal values; -1 where the best is 0), and the strongest shingle near copy
    (``partner``: highest Jaccard, then containment, then lowest row, among the pairs that meet
    the shingle rule; -1: none) with its Jaccard and containment.

    Each entry is a maximum over pairs, each pair's value a pure function of its two pieces, with
    ties broken by row: the result over a pool is the :meth:`merge` of the results over any
    partition of it, whatever the order, so a query can be compared with new pool pieces only
    and merged with what an earlier run found (:mod:`pipeline.similarity.leakage_cache`)."""

    values: np.ndarray  # (Q, len(MEASURES)) float64
    rows: np.ndarray  # (Q, len(MEASURES)) int64
    partner: np.ndarray  # (Q,) int64
    partner_sims: np.ndarray  # (Q, 2) float64: the partner's Jaccard and containment

    @classmethod
    def zeros(cls, n: int) -> Neighbours:
        return cls(np.zeros((n, len(MEASURES))), np.full((n, len(MEASURES)), -1, np.int64),
                   np.full(n, -1, np.int64), np.zeros((n, 2)))

    def raise_to(self, m: int, q: np.ndarray, v: np.ndarray, r: np.ndarray) -> None:
        """Raise measure ``m`` of queries ``q`` (positions, repeats allowed) to values ``v``
        reached at pool rows ``r`` where they beat what is held (ties: the lower row)."""
        keep = v > 0
        q, v, r = q[keep], v[keep], r[keep]
        if q.size == 0:
            return
        if q.size > 1 and (q[1:] < q[:-1]).any():
            order = np.argsort(q, kind="stable")
            q, v, r = q[order], v[order], r[order]
        starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
        best = np.maximum.reduceat(v, starts)
        tied = v == np.repeat(best, np.diff(np.r_[starts, q.size]))
        low = np.minimum.reduceat(np.where(tied, r, _NO_ROW), starts)
        q = q[starts]
        held_v, held_r = self.values[q, m], self.rows[q, m]
        take = (best > held_v) | ((best == held_v) & (low < held_r))
        self.values[q[take], m] = best[take]
        self.rows[q[take], m] = low[take]

    def raise_partner(self, q: np.ndarray, jac: np.ndarray, con: np.ndarray, r: np.ndarray
                      ) -> None:
        """Offer pairs that meet the shingle rule as near copies of queries ``q``."""
        if q.size == 0:
            return
        order = np.lexsort((r, -con, -jac, q))
        first = np.r_[True, q[order][1:] != q[order][:-1]]
        sel = order[first]
        q, jac, con, r = q[sel], jac[sel], con[sel], r[sel]
        held, (hj, hc) = self.partner[q], self.partner_sims[q].T
        take = (held < 0) | (jac > hj) | ((jac == hj) & ((con > hc) | ((con == hc)
                                                                        & (r < held))))
        self.partner[q[take]] = r[take]
        self.partner_sims[q[take]] = np.stack([jac[take], con[take]], axis=1)

    def merge(self, other: Neighbours, at: np.ndarray) -> None:
        """Merge ``other`` (results of the queries at positions ``at``) into these."""
        for m in range(len(MEASURES)):
            self.raise_to(m, at, other.values[:, m], other.rows[:, m])
        has = other.partner >= 0
        self.raise_partner(at[has], other.partner_sims[has, 0], other.partner_sims[has, 1],
                           other.partner[has])

    def near_copies(self, rule: NearCopyRule) -> NearCopies:
        """The near-copy view under ``rule``: an alignment's best row is a partner where it
        reaches ``rule.alignment``."""
        t = rule.alignment - _EPS
        a, m = self.values[:, ALIGNMENT], self.values[:, MELODY]
        return NearCopies(self.values[:, JACCARD], self.values[:, CONTAINMENT], a, m,
                          self.partner, np.where(a >= t, self.rows[:, ALIGNMENT], -1),
                          np.where(m >= t, self.rows[:, MELODY], -1))


@dataclass(frozen=True)
class NearCopies:
    """Per query piece: the best similarities to any pool piece and the pool row of its strongest
    near copy by each measure (-1: none)."""

    jaccard: np.ndarray
    containment: np.ndarray
    alignment: np.ndarray
    melody: np.ndarray
    shingle_partner: np.ndarray
    alignment_partner: np.ndarray
    melody_partner: np.ndarray

    @property
    def near(self) -> np.ndarray:
        return (self.shingle_partner >= 0) | (self.alignment_partner >= 0) | (
            self.melody_partner >= 0)

    @property
    def partner(self) -> np.ndarray:
        """The near copy by shingles, else by alignment, else by melody (dedupe's rule order)."""
        return np.where(self.shingle_partner >= 0, self.shingle_partner,
                        np.where(self.alignment_partner >= 0, self.alignment_partner,
                                 self.melody_partner))


def _shingle_neighbours(sm: ShingleMatrix, query: np.ndarray, pool: np.ndarray,
                        rule: NearCopyRule | None, groups: np.ndarray | None,
                        out: Neighbours) -> None:
    """The shingle measures of ``out`` (nearest Jaccard and containment over every pool piece;
    with ``rule``, the same over pieces of ``rule.min_shingles`` shingles and the shingle
    partner) from one sparse product per block of queries; pairs with equal ``groups`` codes
    are skipped when ``groups`` is given."""
    if query.size == 0 or pool.size == 0:
        return
    pool_rows = sm.matrix[pool]
    # several blocks: the pool's transpose as CSR, once (scipy turns the right operand of a
    # CSR product into CSR on every call, which took most of the audit's time when it was
    # handed CSC); one block (a re-run's few queries against a whole pool): the pool times the
    # queries' transpose, one pass over the pool's entries instead of a transpose and a sort
    pool_t = pool_rows.T.tocsr() if query.size > BLOCK_ROWS else None
    pool_sizes = sm.sizes[pool].astype(np.float64)
    for start in range(0, query.size, BLOCK_ROWS):
        rows = query[start : start + BLOCK_ROWS]
        if pool_t is None:
            inter = (pool_rows @ sm.matrix[rows].T.tocsr()).T.tocoo()
        else:
            inter = (sm.matrix[rows] @ pool_t).tocoo()
        r, c, v = inter.row, inter.col, inter.data.astype(np.float64)
        if groups is not None:
            other = groups[rows[r]] != groups[pool[c]]
            r, c, v = r[other], c[other], v[other]
        qs, ps = sm.sizes[rows][r].astype(np.float64), pool_sizes[c]
        jac = v / np.maximum(qs + ps - v, 1.0)
        con = v / np.maximum(np.minimum(qs, ps), 1.0)
        q, p = start + r, pool[c]
        out.raise_to(NEAREST_JACCARD, q, jac, p)
        out.raise_to(NEAREST_CONTAINMENT, q, con, p)
        if rule is None:
            continue
        big = np.minimum(qs, ps) >= rule.min_shingles
        q, p, jac, con = q[big], p[big], jac[big], con[big]
        out.raise_to(JACCARD, q, jac, p)
        out.raise_to(CONTAINMENT, q, con, p)
        fired = (jac >= rule.jaccard) | (con >= rule.containment)
        out.raise_partner(q[fired], jac[fired], con[fired], p[fired])


def _aligned_neighbours(texts: Sequence[str], lengths: np.ndarray, query: np.ndarray,
                        qpos: np.ndarray, cand: np.ndarray, t: float, out: Neighbours, m: int, *,
                        groups: np.ndarray | None, workers: int,
                        exact: Sequence[str] | None = None) -> None:
    """Raise measure ``m`` of ``out`` at positions ``qpos`` to the best Indel similarity of each
    query ``query[qpos]`` with a pool row of ``cand`` whose length allows ``t``. ``lengths`` are
    the strings' lengths.

    Indel similarity is at most 2·min(a, b) / (a + b) for lengths a, b, so pool strings outside
    [a·t / (2 - t), a·(2 - t) / t] cannot reach ``t`` and are not aligned: the best similarity
    is the best over the pairs whose lengths allow ``t``. Queries are aligned in blocks of
    ``ALIGN_BLOCK``, sorted by length, against the pool strings each block's lengths allow.
    With ``exact``, ``texts`` give upper bounds of the similarities (:class:`TokenStrings`) and
    each best is made exact by :func:`_exact_best`.
    """
    qlen = lengths[query]
    qpos = qpos[np.argsort(qlen[qpos], kind="stable")]
    cand = cand[np.argsort(lengths[cand], kind="stable")]
    clen = lengths[cand]
    for start in range(0, qpos.size, ALIGN_BLOCK):
        pos = qpos[start : start + ALIGN_BLOCK]
        rows = query[pos]
        a = np.searchsorted(clen, qlen[pos].min() * t / (2 - t) - _EPS, side="left")
        b = np.searchsorted(clen, qlen[pos].max() * (2 - t) / t + _EPS, side="right")
        if a >= b:
            continue
        cols = cand[a:b]
        sim = process.cdist([texts[i] for i in rows], [texts[i] for i in cols],
                            scorer=Indel.normalized_similarity, dtype=np.float64,
                            workers=workers)
        ql, cl = qlen[pos][:, None], clen[a:b][None, :]
        sim[2 * np.minimum(ql, cl) / (ql + cl) < t - _EPS] = -1.0  # outside this row's band
        if groups is not None:
            sim[groups[rows][:, None] == groups[cols][None, :]] = -1.0
        if exact is None:
            top = sim.max(axis=1)
            low = np.where(sim == top[:, None], cols[None, :], _NO_ROW).min(axis=1)
        else:
            top, low = _exact_best(sim, exact, rows, cols)
        out.raise_to(m, pos, top, low)


def _exact_best(bound: np.ndarray, exact: Sequence[str], rows: np.ndarray, cols: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``bound`` (upper bounds of the Indel similarities of pieces ``rows`` with pieces
    ``cols``; negative: not a pair), the exact best similarity over its pairs (-1 if none) and
    the lowest of ``cols`` reaching it. Pairs are aligned on ``exact`` in decreasing order of
    their bound until the bound falls below the best found: usually one or two pairs per row.
    ``bound`` is consumed."""
    top = np.full(rows.size, -1.0)
    low = np.full(rows.size, -1, dtype=np.int64)
    for r, q in enumerate(rows.tolist()):
        row = bound[r]
        while True:
            c = int(row.argmax())
            if row[c] < 0 or row[c] < top[r]:
                break
            s = Indel.normalized_similarity(exact[q], exact[cols[c]])
            if s > top[r] or (s == top[r] and cols[c] < low[r]):
                top[r], low[r] = s, cols[c]
            row[c] = -1.0
    return top, low


def _melody_neighbours(mel: Melodies, query: np.ndarray, pool: np.ndarray, rule: NearCopyRule,
                       caps: LengthCaps, groups: np.ndarray | None, workers: int,
                       out: Neighbours) -> None:
    """The melody measure of ``out``: the best similarity (either view) of each query over
    ``pool``. Query melodies of ``min_melody_notes`` to ``max_melody_notes - 1`` notes are
    aligned, against pool melodies of at least ``min_melody_notes``."""
    lo_len, hi_len = rule.min_melody_notes - 1, caps.max_melody_notes - 1
    qall = np.arange(query.size)
    q_same = mel.same[query]
    # the top-track view adds something only where one side's two views differ
    tasks = [(0, qall, pool), (1, qall[~q_same], pool), (1, qall[q_same], pool[~mel.same[pool]])]
    for v, qsub, psub in tasks:
        lengths = mel.lengths[v]
        qlen = lengths[query[qsub]]
        _aligned_neighbours(mel.views[v], lengths, query, qsub[(qlen >= lo_len) & (qlen < hi_len)],
                            psub[lengths[psub] >= lo_len], rule.alignment, out, MELODY,
                            groups=groups, workers=workers)


def _token_neighbours(tok: TokenStrings, query: np.ndarray, pool: np.ndarray, rule: NearCopyRule,
                      caps: LengthCaps, groups: np.ndarray | None, workers: int,
                      out: Neighbours) -> None:
    """The alignment measure of ``out``: the best whole note-token similarity of each query over
    ``pool``. Both pieces need ``min_align_onsets`` distinct onsets; queries of
    ``max_align_tokens`` tokens or more are not aligned."""
    ok = tok.onsets >= rule.min_align_onsets
    qpos = np.flatnonzero(ok[query] & (tok.lengths[query] < caps.max_align_tokens))
    _aligned_neighbours(tok.coarse, tok.lengths, query, qpos, pool[ok[pool]], rule.alignment, out,
                        ALIGNMENT, groups=groups, workers=workers, exact=tok.exact)


def neighbours(sm: ShingleMatrix, mel: Melodies, tok: TokenStrings, query: np.ndarray,
               pool: np.ndarray, rule: NearCopyRule, *, caps: LengthCaps = CAPS,
               groups: np.ndarray | None = None, workers: int = 1, align: bool = True
               ) -> Neighbours:
    """Exhaustive search of every ``query`` row against every ``pool`` row (no candidates, no
    sampling); ``groups``: skip pairs with equal codes (a piece's own group, or the piece itself);
    ``align`` False: the shingle measures only."""
    out = Neighbours.zeros(query.size)
    _shingle_neighbours(sm, query, pool, rule, groups, out)
    if align:
        _token_neighbours(tok, query, pool, rule, caps, groups, workers, out)
        _melody_neighbours(mel, query, pool, rule, caps, groups, workers, out)
    return out


def near_copies(sm: ShingleMatrix, mel: Melodies, tok: TokenStrings, query: np.ndarray,
                pool: np.ndarray, rule: NearCopyRule, *, caps: LengthCaps = CAPS,
                groups: np.ndarray | None = None, workers: int = 1) -> NearCopies:
    """Exhaustive near-copy search of every ``query`` row against every ``pool`` row (no
    candidates, no sampling); ``groups``: skip pairs of one group (within-train neighbours)."""
    return neighbours(sm, mel, tok, query, pool, rule, caps=caps, groups=groups,
                      workers=workers).near_copies(rule)


def pair_record(sm: ShingleMatrix, mel: Melodies, tok: TokenStrings, q: int, p: int,
                rule: NearCopyRule, caps: LengthCaps = CAPS) -> dict:
    """Similarities of one (held-out, train) pair and the criteria of ``rule`` it meets under
    ``caps`` (``fired``, in dedupe's rule order)."""
    t = rule.alignment - _EPS
    big = min(sm.sizes[q], sm.sizes[p]) >= rule.min_shingles
    jac, con = fp.jaccard_containment(sm.shingle_set(q), sm.shingle_set(p))
    x, y = tok.exact[q], tok.exact[p]
    whole = Indel.normalized_similarity(x, y) if x and y else 0.0
    aligned = (min(tok.onsets[q], tok.onsets[p]) >= rule.min_align_onsets
               and tok.lengths[q] < caps.max_align_tokens)
    sims = []
    for view, lengths in zip(mel.views, mel.lengths, strict=True):
        ok = (rule.min_melody_notes - 1 <= lengths[q] < caps.max_melody_notes - 1
              and lengths[p] >= rule.min_melody_notes - 1)
        sims.append((Indel.normalized_similarity(view[q], view[p]), ok))
    fired = [name for name, hit in (("jaccard", big and jac >= rule.jaccard),
                                    ("containment", big and con >= rule.containment),
                                    ("alignment", aligned and whole >= t),
                                    ("melody", any(ok and s >= t for s, ok in sims)))
             if hit]
    return {"test_sha256": str(sm.sha256[q]), "train_sha256": str(sm.sha256[p]),
            "jaccard": round(jac, 6), "containment": round(con, 6),
            "alignment_similarity": round(whole, 6),
            "melody_similarity": round(max(s for s, _ in sims), 6), "fired": fired}

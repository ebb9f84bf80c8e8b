"""Edit-tolerant similarity of note sequences, and the candidate pairs that need it.

Shingle Jaccard (``pipeline.similarity.fingerprints``) falls fast on short pieces: one changed note
breaks ``k + 1`` shingles at once. Alignment does not: the note-token and melody sequences of two
pieces are compared by normalised Indel similarity (rapidfuzz), the whole of each for edited
copies, and for excerpts the shorter with the stretch of the longer where its runs of tokens
fall (:func:`locate`, which also says where the stretch lies).

Alignment is too costly for all pairs, so it checks candidates. LSH over shingle sets proposes
pieces of similar size; an excerpt is a small part of a longer piece, whose Jaccard is about its
share of it, so LSH misses it. :func:`winnow_candidates` proposes every pair that shares a run of
at least ``w + k - 1`` tokens, by winnowing (Schleimer, Wilkerson and Aiken, SIGMOD 2003): each
piece keeps the smallest hash of every window of ``w`` consecutive ``k``-grams, so two pieces
that share such a run share a kept hash. Kept hashes held by more than ``max_df`` pieces (stock
figures of the style, repeated notes) propose nothing: they would propose every pair of those
pieces and tell nothing about any one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from rapidfuzz.distance import Indel

from pipeline.core.arrays import unique
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import melody as mel

_BASE = 0x100
"""Token t -> chr(_BASE + t): exact, one character per token, clear of the surrogate range for
every token :func:`fingerprints.note_tokens` makes (< 0x6000)."""
_EMPTY = np.uint64(np.iinfo(np.uint64).max)


def _texts(values: np.ndarray, offsets: np.ndarray) -> tuple[str, ...]:
    """One string per piece, ``values[offsets[i]:offsets[i+1]]`` as characters: one decode of
    all pieces, then slices (a Python loop per value would take a minute at 100k pieces)."""
    text = (values.astype(np.uint32) + np.uint32(_BASE)).tobytes().decode("utf-32-le")
    return tuple(text[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(),
                                           strict=True))


@dataclass(frozen=True)
class Sequences:
    """Per piece (in ``NoteArrays`` order): its note tokens as a string, the onset of each
    token's note (beats), and its two top-voice interval sequences (skyline, top track) as
    strings."""

    tokens: tuple[str, ...]
    onsets: tuple[np.ndarray, ...]
    melodies: tuple[tuple[str, ...], tuple[str, ...]]
    distinct_onsets: np.ndarray
    """Distinct onsets of each piece's notes (a chord counts once)."""

    @classmethod
    def build(cls, notes: fp.NoteArrays, ioi_resolution: int, melodies: bool = True
              ) -> Sequences:
        """Sequences of every piece, built in bounded chunks of pieces (the same result);
        without ``melodies`` the two melody views are empty tuples (finding the top voice is
        most of the work, and the leakage audit's token strings do not use it)."""
        parts = [cls._build(c, ioi_resolution, melodies) for c in notes.chunks()]
        if not parts:
            return cls((), (), ((), ()), np.zeros(0, np.int64))
        return cls(tuple(t for p in parts for t in p.tokens),
                   tuple(o for p in parts for o in p.onsets),
                   (tuple(m for p in parts for m in p.melodies[0]),
                    tuple(m for p in parts for m in p.melodies[1])),
                   np.concatenate([p.distinct_onsets for p in parts]))

    @classmethod
    def _build(cls, notes: fp.NoteArrays, ioi_resolution: int, melodies: bool = True
               ) -> Sequences:
        tokens, piece, onset = fp.note_tokens_with_onsets(notes, ioi_resolution)
        off = np.zeros(notes.n_pieces + 1, dtype=np.int64)
        np.cumsum(np.bincount(piece, minlength=notes.n_pieces), out=off[1:])
        views = [_texts(np.clip(interval, -127, 127) + 128, m_off)
                 for m_off, interval in mel.melody_intervals(notes)] if melodies else [(), ()]
        seg, on = notes.segment(), notes.onset
        if not (np.all(np.diff(seg) >= 0) and np.all((np.diff(on) >= 0) | (np.diff(seg) > 0))):
            order = np.lexsort((on, seg))
            seg, on = seg[order], on[order]
        new = np.ones(seg.size, dtype=bool)
        new[1:] = (seg[1:] != seg[:-1]) | (on[1:] != on[:-1])
        distinct = np.bincount(seg[new], minlength=notes.n_pieces)
        onsets = np.split(onset, off[1:-1]) if notes.n_pieces else []
        return cls(_texts(tokens, off), tuple(onsets), (views[0], views[1]), distinct)


@dataclass(frozen=True)
class Alignment:
    """Alignment similarities of one pair (each in [0, 1]; 0 where a sequence is empty)."""

    whole: float
    """Indel similarity of the two note-token sequences."""
    melody: float
    """Best Indel similarity of the two pieces' melodies, view against view (0 when either is
    shorter than ``min_melody_notes``)."""
    part: float
    """Indel similarity of the shorter token sequence with the stretch of the longer one where
    it lies (:func:`locate`)."""
    longer: int
    """Which piece is longer, 0 (the first) or 1; ties: 1."""
    part_start: float
    """Onset (beats) in the longer piece of the first note of the matching stretch."""
    part_end: float
    """Onset (beats) of its last note."""


def align(seqs: Sequences, i: int, j: int, min_melody_notes: int,
          cutoff: float = 0.0) -> Alignment:
    """Every alignment similarity of pieces ``i`` and ``j``; a similarity under ``cutoff`` may
    be reported as 0 (rapidfuzz then stops early)."""
    x, y = seqs.tokens[i], seqs.tokens[j]
    whole = Indel.normalized_similarity(x, y, score_cutoff=cutoff) if x and y else 0.0
    best = 0.0
    views_i = dict.fromkeys((seqs.melodies[0][i], seqs.melodies[1][i]))
    views_j = dict.fromkeys((seqs.melodies[0][j], seqs.melodies[1][j]))
    for a in views_i:
        for b in views_j:
            if min(len(a), len(b)) + 1 >= min_melody_notes:
                best = max(best, Indel.normalized_similarity(a, b, score_cutoff=cutoff))
    longer = 0 if len(x) > len(y) else 1
    short, long_ = (y, x) if longer == 0 else (x, y)
    if not short:
        return Alignment(whole, best, 0.0, longer, float("nan"), float("nan"))
    score, lo, hi = locate(short, long_, cutoff=cutoff)
    onsets = seqs.onsets[i if longer == 0 else j]
    return Alignment(whole, best, score, longer, float(onsets[lo]), float(onsets[hi - 1]))


ANCHOR_K = 6
"""Tokens per anchor gram of :func:`locate`."""


GRAM_CACHE = 4096
"""Token strings whose anchor grams :func:`locate` keeps: dedupe measures candidate pairs in
order of their first piece, so one piece meets many others in a row, and a string's hash is
computed once (Python keeps it), so a hit costs a dictionary lookup."""


@functools.lru_cache(maxsize=GRAM_CACHE)
def _grams(text: str, k: int) -> np.ndarray:
    grams = fp.gram_hashes(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32), k)
    grams.flags.writeable = False
    return grams


@functools.lru_cache(maxsize=GRAM_CACHE)
def _sorted_grams(text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_grams` of ``text`` sorted, and where each came from (a stable argsort)."""
    grams = _grams(text, k)
    order = np.argsort(grams, kind="stable")
    ordered = grams[order]
    order.flags.writeable = ordered.flags.writeable = False
    return order, ordered


def locate(short: str, long_: str, k: int = ANCHOR_K, cutoff: float = 0.0
           ) -> tuple[float, int, int]:
    """Where ``short`` lies in ``long_`` and how well it matches there: ``(similarity, start,
    end)``, the Indel similarity of ``short`` with ``long_[start:end]``, a stretch of its length.

    The stretch starts at the offset (position in ``long_`` minus position in ``short``) that
    most of ``short``'s ``k``-grams found in ``long_`` agree on (ties: the smallest), so an
    edited excerpt still lands where its unedited runs are. Cost: sorting the grams and one
    Indel distance, against ``fuzz.partial_ratio_alignment``'s search over every offset, which
    takes a tenth of a second for two 2,000-token pieces. Without a shared gram: offset 0. A
    similarity under ``cutoff`` may be reported as 0."""
    n = len(short)
    if n == 0:
        return 0.0, 0, 1
    k = min(k, n)  # a piece shorter than a gram is its own gram
    gs = _grams(short, k)
    order, sorted_l = _sorted_grams(long_, k)
    offset = 0
    if gs.size and sorted_l.size:
        at = np.searchsorted(sorted_l, gs)
        hit = at < sorted_l.size
        hit[hit] = sorted_l[at[hit]] == gs[hit]
        if hit.any():
            offsets = order[at[hit]] - np.flatnonzero(hit)
            values, counts = np.unique(offsets, return_counts=True)
            offset = int(values[np.argmax(counts)])
    start = min(max(offset, 0), max(len(long_) - n, 0))
    end = min(start + n, len(long_))
    score = Indel.normalized_similarity(short, long_[start:end], score_cutoff=cutoff)
    return score, start, max(end, start + 1)


KEY_BITS = 40
"""Bits of a kept hash (the piece index takes the other 24 of a packed uint64: 16M pieces). Two
runs that collide in 40 bits only propose a pair, which verification then measures."""
CHUNK = 20_000
"""Pieces winnowed per block, so the temporary hashes stay a few hundred MB at any corpus size."""


def winnow(texts: Sequence[str], k: int, w: int, eligible: np.ndarray) -> np.ndarray:
    """The packed ``piece << KEY_BITS | key`` values kept by winnowing each eligible piece's
    token string: the smallest ``k``-gram hash of every window of ``w`` consecutive
    ``k``-grams (its top KEY_BITS bits), unique and sorted. A piece shorter than ``w + k - 1``
    tokens keeps nothing."""
    which = np.flatnonzero(eligible)
    if which.size >= 1 << (64 - KEY_BITS):
        raise ValueError(f"at most {1 << (64 - KEY_BITS)} pieces, got {which.size}")
    out = []
    for lo in range(0, which.size, CHUNK):
        block = which[lo: lo + CHUNK]
        rows = [np.frombuffer(texts[i].encode("utf-32-le"), dtype=np.uint32) for i in block]
        lengths = np.asarray([r.size for r in rows], dtype=np.int64)
        tokens = np.concatenate(rows).astype(np.uint64) if rows else np.zeros(0, np.uint64)
        piece = np.repeat(block, lengths)
        m = tokens.size - k + 1 - w + 1
        if m <= 0:
            continue
        h = fp.gram_hashes(tokens, k)
        # a window is valid when its first and last k-gram lie in one piece (grams are contiguous)
        valid = piece[:m] == piece[w + k - 2: w + k - 2 + m]
        mins = sliding_window_view(h, w).min(axis=1)[valid] >> np.uint64(64 - KEY_BITS)
        out.append(unique((piece[:m][valid].astype(np.uint64) << np.uint64(KEY_BITS)) | mins))
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


PAIR_BLOCK = 1 << 22
"""Pair codes judged at once: the gathers of a block stay at tens of MB."""


def pairs_sharing(packed: np.ndarray, max_df: int, min_share: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``i < j`` of pieces whose common keys number at least ``min_share`` of the smaller
    piece's keys, counting only keys that at most ``max_df`` pieces hold (``packed``: unique
    ``piece << KEY_BITS | key`` values).

    Keys are grouped by one sort; only keys held by 2..``max_df`` pieces form pairs (at 100,000
    pieces, 1.9 M of 20 M distinct keys, 7 M of 26 M values), and their pair codes are counted
    by sorting them in place and judged in blocks, so the temporaries stay a few arrays of the
    input's size (2.4 GB above dedupe's other memory at 100,000 pieces when every array was
    built whole)."""
    if packed.size < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    packed = np.asarray(packed, dtype=np.uint64)
    shift = np.uint64(KEY_BITS)
    piece_bits = np.uint64(64 - KEY_BITS)
    piece_mask = np.uint64((1 << (64 - KEY_BITS)) - 1)
    n = int(packed.max() >> shift) + 1  # the piece is in the top bits
    by_key = ((packed & np.uint64((1 << KEY_BITS) - 1)) << piece_bits) | (packed >> shift)
    by_key.sort()
    key = by_key >> piece_bits
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    del key
    sizes = np.diff(starts, append=by_key.size)
    # informative keys per piece: all its keys but those more than max_df pieces hold
    size = np.bincount((packed >> shift).view(np.int64), minlength=n)
    wide = np.flatnonzero(sizes > max_df)
    if wide.size:
        size -= np.bincount(_piece_at(by_key, starts[wide], sizes[wide], piece_mask),
                            minlength=n)
    multi = np.flatnonzero((sizes >= 2) & (sizes <= max_df))
    m_starts, m_sizes = starts[multi], sizes[multi]
    del starts, sizes
    codes = []
    for df in np.unique(m_sizes).tolist():
        s = m_starts[m_sizes == df]
        ii, jj = np.triu_indices(df, 1)
        a = (by_key[(s[:, None] + ii[None, :]).ravel()] & piece_mask).view(np.int64)
        b = (by_key[(s[:, None] + jj[None, :]).ravel()] & piece_mask).view(np.int64)
        codes.append(np.minimum(a, b) * n + np.maximum(a, b))
    del by_key
    if not codes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    code = np.concatenate(codes)
    del codes
    code.sort()
    first = np.flatnonzero(np.concatenate([[True], code[1:] != code[:-1]]))
    shared = np.diff(first, append=code.size)
    code = code[first]
    keep = np.zeros(code.size, bool)
    for lo in range(0, code.size, PAIR_BLOCK):
        c = code[lo : lo + PAIR_BLOCK]
        keep[lo : lo + PAIR_BLOCK] = shared[lo : lo + PAIR_BLOCK] >= \
            min_share * np.minimum(size[c // n], size[c % n])
    code = code[keep]
    return code // n, code % n


def _piece_at(by_key: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
              piece_mask: np.uint64) -> np.ndarray:
    """The pieces of the groups at ``starts`` (``sizes`` values each) of ``by_key``."""
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    return (by_key[offsets + np.arange(int(sizes.sum()))] & piece_mask).view(np.int64)


def winnow_runs(texts: Sequence[str], eligible: np.ndarray, min_run: int, k: int
                ) -> np.ndarray:
    """:func:`winnow` with windows of ``min_run - k + 1`` ``k``-grams, so that any two pieces
    with a common run of ``min_run`` tokens share a kept hash."""
    return winnow(texts, k, max(min_run - k + 1, 1), eligible)


def winnow_candidates(texts: Sequence[str], eligible: np.ndarray, min_run: int, k: int,
                      max_df: int, min_share: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of eligible pieces whose winnowed hashes (:func:`winnow_runs`) overlap by at least
    ``min_share`` of the smaller piece's: a containment estimate of runs, not of tokens."""
    return pairs_sharing(winnow_runs(texts, eligible, min_run, k), max_df, min_share)

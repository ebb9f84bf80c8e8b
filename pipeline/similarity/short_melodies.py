"""Near-tier candidates for short melodies: MinHash LSH over the pitch-interval k-grams of each
piece's top voice, for melodies of at most ``short_melody_notes`` notes (and at least
``min_shingles`` distinct k-grams), each pair then kept where the two melodies align at the
alignment threshold.

Why another path: the near tier's other candidates hang on shingles of (pitch interval,
inter-onset-ratio) tokens and on shared runs of 8 or more tokens, and a short tune edited in a
few places keeps few of either. A dropped note or a note split in two changes a pitch interval
and the rhythm classes of two or three notes, so one edit breaks ``k + 2`` or more note
shingles; copies of short tunes with 8-10% of their notes edited (chromatic and diatonic
changes, dropped notes, ornaments) that still align above the threshold keep a median shingle
Jaccard of about 0.4 (``benchmarks/bench_dedupe_quality.py``), which the LSH at
``lsh_threshold`` proposes with a probability of 0.87, and a tenth of them under 0.32 (0.64).
The melody view is the sequence the ``melody`` rule aligns: pitch intervals only, repeated
pitches merged, so a rhythm edit breaks nothing and a pitch edit breaks at most ``k + 1``
grams.

The LSH threshold is not a setting: :func:`lsh_threshold` derives it from the alignment
threshold, as the Jaccard of the k-gram sets at the edit rate where the alignment falls to it.
Every pair the LSH proposes is aligned (rapidfuzz ``cpdist``, one character per interval) and
kept only where the melodies reach the alignment threshold, so the path adds only pairs the
``melody`` rule confirms: a false positive of the LSH costs an alignment of two short strings,
never a merge. Pieces with equal melodies are the ``melody`` tier's; one of each proposes.
"""

from __future__ import annotations

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel

from pipeline.core.arrays import unique
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import lsh


def texts(offsets: np.ndarray, intervals: np.ndarray, min_notes: int, max_notes: int, k: int,
          min_grams: int) -> np.ndarray:
    """Per piece its melody (``offsets``, ``intervals``: :func:`pipeline.similarity.melody.
    melody_intervals`' view) as a string of one character per interval (below 256, the same
    Indel similarity as :class:`pipeline.similarity.alignment.Sequences`' melodies), for melodies
    of ``min_notes`` to ``max_notes`` notes with at least ``min_grams`` distinct ``k``-grams;
    "" for the others. A melody of a dozen notes, or one that turns round a few figures, is
    too little to tell tunes apart: among 100,000 generated pieces, melodies of 12-13 notes
    with a handful of distinct grams aligned above the threshold by chance."""
    n_int = np.diff(offsets)
    codes = (np.clip(intervals, -127, 127) + 128).astype(np.uint8)
    piece = np.repeat(np.arange(n_int.size, dtype=np.int64), n_int)
    grams, _ = fp.gram_sets(codes.astype(np.uint64), piece, n_int.size, k)
    keep = (n_int + 1 >= min_notes) & (n_int + 1 <= max_notes) & (np.diff(grams) >= min_grams)
    out = np.full(n_int.size, "", dtype=object)
    which = np.flatnonzero(keep)
    if which.size:
        chars = codes.tobytes().decode("latin-1")
        for i in which.tolist():
            out[i] = chars[offsets[i]: offsets[i + 1]]
    return out


def signatures(melodies: np.ndarray, k: int, permutations: np.ndarray) -> np.ndarray:
    """MinHash signatures ``(P, num_perm)`` of the sets of ``k``-grams of each melody string
    (datasketch's initial value, all ones, for a melody with no ``k``-gram)."""
    lengths = np.fromiter((len(t) for t in melodies), dtype=np.int64, count=len(melodies))
    joined = "".join(melodies.tolist()).encode("latin-1")
    tokens = np.frombuffer(joined, dtype=np.uint8).astype(np.uint64)
    piece = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    offsets, values = fp.gram_sets(tokens, piece, lengths.size, k)
    return fp.minhash_signatures(offsets, values, permutations)


def lsh_threshold(alignment: float, k: int) -> float:
    """The Jaccard of two melodies' ``k``-gram sets at the edit rate where their alignment
    similarity falls to ``alignment``, for the edits that break the most grams per unit of
    similarity: a dropped or added note costs 3 Indel operations (two intervals become one, or
    one two) out of the 2(n - 1) intervals of both copies and breaks ``k + 1`` grams of each,
    so ``b = 2(k + 1)(1 - alignment)/3`` of the grams differ and Jaccard is (1 - b)/(1 + b):
    0.385 at alignment 0.867 and k = 4 (a changed note costs 4 operations and ``k + 1`` grams:
    Jaccard 0.5 there). Not positive when ``alignment`` is at most 1 - 3/(2(k + 1))."""
    broken = 2.0 * (k + 1) * (1.0 - alignment) / 3.0
    return (1.0 - broken) / (1.0 + broken)


def candidates(melodies: np.ndarray, sigs: np.ndarray, *, alignment: float, k: int,
               side: np.ndarray | None = None, workers: int = 1,
               stats: dict[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``i < j`` of pieces with a melody string (``melodies``, see :func:`texts`) whose
    signatures ``sigs`` share a band of the LSH at :func:`lsh_threshold` and whose melodies
    align at ``alignment`` or more (normalised Indel similarity); unique, sorted. With ``side``
    (0 or 1 per piece), only pairs across the two sides.

    Pairs are aligned as the LSH forms them (:func:`pipeline.similarity.lsh.band_pairs`, in blocks),
    so memory holds one block at a time; a pair in several bands is aligned once per band.
    ``stats`` gets ``near_short_aligned`` (the alignments made) and ``near_candidates_short``
    (the pairs kept). ``workers``: rapidfuzz's threads (the result does not depend on it)."""
    n = len(melodies)
    lengths = np.fromiter((len(t) for t in melodies), dtype=np.int64, count=n)
    key = melodies.astype(str)
    if side is not None:
        key = np.char.add(side.astype(str), key)
    idx = np.flatnonzero(lengths >= k)  # melodies with a k-gram (else the signature is all ones)
    _, first = np.unique(key[idx], return_index=True)
    reps = np.sort(idx[first])  # one piece per distinct melody (and side)
    banding = lsh.bands(lsh_threshold(alignment, k), sigs.shape[1])
    if side is None:
        bands = lsh.band_pairs(sigs, reps, banding)
    else:
        bands = lsh.band_pairs_across(sigs, reps[side[reps] == 0], reps[side[reps] == 1],
                                      banding)
    strings = melodies.tolist()
    kept, aligned = [], 0
    for a, b in bands:
        # Indel similarity is at most 2 min(la, lb) / (la + lb): unlike lengths cannot reach it
        # (the margin only keeps a pair that rounding would drop; rapidfuzz decides)
        la, lb = lengths[a], lengths[b]
        fit = 2 * np.minimum(la, lb) >= alignment * (la + lb) - 1e-9
        a, b = a[fit], b[fit]
        aligned += a.size
        for lo in range(0, a.size, lsh.PAIR_BLOCK):
            ia, ib = a[lo: lo + lsh.PAIR_BLOCK], b[lo: lo + lsh.PAIR_BLOCK]
            sim = process.cpdist([strings[i] for i in ia.tolist()],
                                 [strings[j] for j in ib.tolist()],
                                 scorer=Indel.normalized_similarity, score_cutoff=alignment,
                                 dtype=np.float64, workers=workers)
            ok = sim >= alignment
            kept.append(np.minimum(ia[ok], ib[ok]) * n + np.maximum(ia[ok], ib[ok]))
    code = unique(np.concatenate(kept)) if kept else np.zeros(0, np.int64)
    if stats is not None:
        stats["near_short_aligned"] = int(aligned)
        stats["near_candidates_short"] = int(code.size)
    return code // max(n, 1), code % max(n, 1)

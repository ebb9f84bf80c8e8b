"""Two measures of melodic nearness on the tune set, side by side: can any threshold link short
tunes with 8-10% of their notes edited and keep unrelated tunes of one style apart?

The tune set is ``bench_dedupe_quality.py``'s (``benchmarks/dance_tunes.py``: per length band and
edit kind, tunes with an edited copy and a sibling sharing all the style can share). Melodies are
taken straight from the generated notes (a tune is one voice, so it is its own skyline), repeated
pitches merged, as the ``melody`` rule takes them. Measured without MIDI, ingest or candidates:

- ``intervals``: the ``melody`` rule's measure, normalised Indel similarity of the pitch-interval
  sequences (transposition-free). A changed note costs 4 operations, a dropped or added one 3,
  out of the 2(n - 1) intervals of both copies.
- ``pitches``: normalised Levenshtein similarity (1 - distance / longer length) of the pitch
  sequences, best over the 12 transpositions of their pitch classes. Every edit of one note costs
  1 operation, whatever its kind, so 1 - similarity reads as the share of notes edited. Pitch
  classes and the best of all transpositions make unrelated tunes no less similar than pitches
  at their best transposition would: the count of unrelated pairs errs high.

For each measure and threshold it prints how many cells (band x mix x rate) reach their recall
target when every copy is measured against its own tune (recall with a complete candidate
search: what ``bench_dedupe_quality.py`` prints in brackets), the worst cell, and how many pairs
of unrelated tunes (tunes and siblings, every pair, exactly) reach the threshold: each such pair
would be a false merge.

    python benchmarks/bench_melody_measures.py [--tunes 64] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel, Levenshtein

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dedupe_quality import tune_cases, tune_target  # noqa: E402
from pipeline.similarity.rule import alignment_threshold  # noqa: E402

DEFAULT = alignment_threshold(0.5, 4)
"""``near_alignment`` as derived from the default ``near_jaccard`` and ``shingle_k`` (0.867)."""
THRESHOLDS = {"intervals": (DEFAULT, 0.84, 0.80), "pitches": (0.90, 0.875, 0.86, 0.85, 0.84)}
_EPS = 1e-9


def melody(pitch: np.ndarray) -> np.ndarray:
    """The pitches with repeated ones merged."""
    pitch = np.asarray(pitch, np.int64)
    return pitch[np.concatenate([[True], pitch[1:] != pitch[:-1]])]


def interval_text(pitch: np.ndarray) -> str:
    return (np.diff(melody(pitch)) + 128).astype(np.uint8).tobytes().decode("latin-1")


def class_text(pitch: np.ndarray, shift: int = 0) -> str:
    return ((melody(pitch) + shift) % 12 + 65).astype(np.uint8).tobytes().decode("latin-1")


def intervals(a: np.ndarray, b: np.ndarray) -> float:
    return Indel.normalized_similarity(interval_text(a), interval_text(b))


def pitches(a: np.ndarray, b: np.ndarray) -> float:
    ta = class_text(a)
    return max(Levenshtein.normalized_similarity(ta, class_text(b, s)) for s in range(12))


MEASURES: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "intervals": intervals, "pitches": pitches}


def unrelated(heads: list[np.ndarray], name: str, cutoff: float, workers: int) -> np.ndarray:
    """Every pair's similarity under measure ``name`` where it reaches ``cutoff`` (else 0), as a
    condensed upper triangle."""
    n = len(heads)
    if name == "intervals":
        texts = [interval_text(h) for h in heads]
        sim = process.cdist(texts, texts, scorer=Indel.normalized_similarity, dtype=np.float32,
                            workers=workers, score_cutoff=cutoff)
    else:
        base = [class_text(h) for h in heads]
        sim = np.zeros((n, n), np.float32)
        for s in range(12):
            np.maximum(sim, process.cdist([class_text(h, s) for h in heads], base,
                                          scorer=Levenshtein.normalized_similarity,
                                          dtype=np.float32, workers=workers,
                                          score_cutoff=cutoff), out=sim)
        sim = np.maximum(sim, sim.T)  # the best transposition, whichever tune moves
    return sim[np.triu_indices(n, 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tunes", type=int, default=64, help="tunes per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    copies: dict[str, dict[tuple[str, str], list[float]]] = {m: defaultdict(list)
                                                             for m in MEASURES}
    heads: list[np.ndarray] = []
    for c in tune_cases(args.tunes, args.seed):
        heads += [c.tune.pitch, c.sibling.pitch]
        for name, fn in MEASURES.items():
            copies[name][(c.band, c.kind)].append(fn(c.tune.pitch, c.copy.pitch))
    print(f"{args.tunes} tunes per cell, {len(copies['intervals'])} cells, "
          f"{len(heads) * (len(heads) - 1) // 2:,} pairs of unrelated tunes; seed {args.seed}\n")
    print("| measure | threshold | cells at target | worst cell | unrelated pairs at it |")
    print("|---|---:|---:|---|---:|")
    for name, thresholds in THRESHOLDS.items():
        pairs = unrelated(heads, name, min(thresholds), args.workers)
        for t in thresholds:
            share = {cell: float(np.mean(np.asarray(v) >= t - _EPS))
                     for cell, v in copies[name].items()}
            met = sum(s >= tune_target(kind, band) for (band, kind), s in share.items())
            (band, kind), worst = min(share.items(), key=lambda kv: kv[1])
            print(f"| {name} | {t:.3g} | {met} of {len(share)} | {worst:.2f} ({kind}, {band}) "
                  f"| {int((pairs >= t - _EPS).sum())} |")
        top = float(pairs.max(initial=0.0))
        closest = f"{top:.3f}" if top > 0 else f"below {min(thresholds)}"
        print(f"\n{name}: closest unrelated pair {closest}; copies' lowest "
              "similarity per rate: " + ", ".join(
                  f"{r} {min(min(v) for (_, k), v in copies[name].items() if k.endswith(r)):.3f}"
                  for r in ("2%", "5%", "8%", "10%")) + "\n")
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

"""Throughput and peak memory of ``NGramLM`` (interpolated modified Kneser-Ney) on generated data.

Data: a seeded first-order Markov chain whose rows are Zipf-distributed over a shuffled vocabulary
(music-like: a few very common continuations, a long tail), cut into pieces of ~1,000 tokens.

Baseline, measured in the same run: a pure-Python ``collections.Counter`` of all 1..order-grams
on a 1M-token subset (the counting step alone, without any smoothing), extrapolated per token.
Ratios > 1 mean NGramLM is faster than that baseline.

    python benchmarks/bench_ngram.py                # 10M tokens, order 5
    python benchmarks/bench_ngram.py --tokens 200000
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.ngram import NGramLM


def markov_zipf(n_tokens: int, vocab: int, piece_len: int, seed: int) -> list[np.ndarray]:
    """Seeded Markov chain with Zipf(1.1) transition rows, split into pieces."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64) ** -1.1
    cdf = np.cumsum(ranks / ranks.sum())
    perms = np.argsort(rng.random((vocab, vocab)), axis=1)  # each state: its own shuffled ranking
    draws = np.searchsorted(cdf, rng.random(n_tokens))
    np.minimum(draws, vocab - 1, out=draws)
    out = np.empty(n_tokens, dtype=np.int64)
    state = 0
    for i in range(n_tokens):  # sequential by nature; ~1 s per 1M tokens
        state = perms[state, draws[i]]
        out[i] = state
    cuts = np.arange(piece_len, n_tokens, piece_len)
    return np.split(out, cuts)


def python_counter(seqs: list[np.ndarray], order: int, bos: int, eos: int) -> int:
    counts: Counter = Counter()
    for s in seqs:
        toks = [bos, *s.tolist(), eos]
        for n in range(1, order + 1):
            counts.update(zip(*(toks[i:] for i in range(n)), strict=False))
    return len(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--order", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--score-tokens", type=int, default=2_000_000)
    ap.add_argument("--baseline-tokens", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    # One chain, cut into train pieces and held-out pieces (same transition table).
    pieces = markov_zipf(args.tokens + args.score_tokens, args.vocab, 1000, args.seed)
    seqs, held = pieces[: args.tokens // 1000], pieces[args.tokens // 1000 :]
    print(f"generated {args.tokens:,} train + {args.score_tokens:,} held-out tokens "
          f"(vocab {args.vocab}) in {time.perf_counter() - t0:.1f} s")

    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    tracemalloc.start()
    t0 = time.perf_counter()
    model = NGramLM(order=args.order).fit(seqs)
    fit_s = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = proc.memory_info().rss

    t0 = time.perf_counter()
    nll = model.nll(held)
    score_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    nll_train = model.nll(seqs[: max(1, args.score_tokens // 1000)])
    score_train_s = time.perf_counter() - t0

    n_base = min(args.baseline_tokens, args.tokens)
    sub = seqs[: max(1, n_base // 1000)]
    n_base = sum(len(s) for s in sub)
    t0 = time.perf_counter()
    python_counter(sub, args.order, model.bos_id_, model.eos_id_)
    base_s = time.perf_counter() - t0
    base_rate = n_base / base_s

    fit_rate = args.tokens / fit_s
    score_rate = args.score_tokens / score_s
    print(f"order {args.order}, n-grams per level: {model.n_ngrams_}")
    print(f"fit:   {fit_s:6.2f} s  {fit_rate:12,.0f} tokens/s  "
          f"x{fit_rate / base_rate:.1f} vs Python Counter ({base_rate:,.0f} tokens/s on "
          f"{n_base:,} tokens, counting only)")
    print(f"score held-out: {score_s:6.2f} s  {score_rate:12,.0f} tokens/s  "
          f"x{score_rate / base_rate:.1f} vs the same baseline; nll {nll:.4f} nats/token")
    print(f"score train slice: {score_train_s:6.2f} s  "
          f"{args.score_tokens / score_train_s:12,.0f} tokens/s; nll {nll_train:.4f}")
    print(f"Python Counter extrapolated to {args.tokens:,} tokens: {args.tokens / base_rate:.1f} s "
          f"(NGramLM fit incl. smoothing: {fit_s:.1f} s)")
    print(f"uniform nll would be {np.log(model.vocab_size_ - 1):.4f} nats/token")
    print(f"fit peak memory: tracemalloc {peak / 2**20:,.0f} MiB; "
          f"RSS growth {(rss1 - rss0) / 2**20:,.0f} MiB (model kept)")


if __name__ == "__main__":
    main()

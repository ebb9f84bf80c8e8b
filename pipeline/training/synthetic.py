"""Synthetic token tables in the tokenize stage's format, for the doctor, tests and benchmarks.

``write_token_data(dir, ...)`` writes ``tokens.parquet`` (sha256, split, track, ids, n_tokens,
n_notes, roundtrip_f1), ``augmented.parquet`` and ``info.json`` like ``symkit tokenize`` does.
Pieces are drawn from a small seeded Markov chain, so there is structure to learn.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.core.artifacts import write_parquet
from pipeline.tokens.contract import AUGMENTED_SCHEMA, TokenInfo, tokens_table

PAD, BOS, EOS = 0, 1, 2
N_SPECIAL = 3



def synthetic_pieces(n: int, vocab_size: int, mean_len: int, seed: int) -> list[np.ndarray]:
    """``n`` id sequences (no specials) from a sparse random Markov chain over the vocabulary."""
    rng = np.random.default_rng(seed)
    k = vocab_size - N_SPECIAL
    succ = rng.integers(0, k, size=(k, 4))  # each token has 4 likely successors
    pieces = []
    for _ in range(n):
        length = max(4, int(rng.normal(mean_len, mean_len / 5)))
        seq = np.empty(length, dtype=np.int32)
        seq[0] = rng.integers(0, k)
        choice = rng.integers(0, 4, size=length)
        noise = rng.random(length) < 0.05
        rand = rng.integers(0, k, size=length)
        for i in range(1, length):
            seq[i] = rand[i] if noise[i] else succ[seq[i - 1], choice[i]]
        pieces.append(seq + N_SPECIAL)
    return pieces


def write_token_data(folder: Path, *, n_pieces: int = 40, vocab_size: int = 64,
                     mean_len: int = 120, seed: int = 0, n_augmented: int = 0,
                     info_extra: dict[str, Any] | None = None, name: str = "piece"
                     ) -> dict[str, Path]:
    """Write the three token artifacts into ``folder``; returns their paths. Piece ``i``'s
    sha256 is that of ``f"{name}{i}"``, so corpora written under other names share no piece."""
    folder = Path(folder)
    pieces = synthetic_pieces(n_pieces, vocab_size, mean_len, seed)
    n_val = max(1, n_pieces // 10)
    rows = []
    for i, ids in enumerate(pieces):
        split = "val" if i < n_val else "test" if i < 2 * n_val else "train"
        rows.append({"sha256": hashlib.sha256(f"{name}{i}".encode()).hexdigest(), "split": split,
                     "track": 0, "ids": ids.tolist(), "n_notes": len(ids) // 4})
    df = pd.DataFrame(rows).sort_values("sha256")
    paths = {"tokens": folder / "tokens.parquet", "info": folder / "info.json",
             "augmented": folder / "augmented.parquet"}
    write_parquet(paths["tokens"], tokens_table(df.to_dict("records")))
    train = df[df["split"] == "train"]
    aug = [{"sha256": sha, "transpose": t, "track": 0, "ids": list(ids), "n_tokens": len(ids)}
           for sha, ids in zip(train["sha256"][:n_augmented], train["ids"][:n_augmented],
                               strict=True) for t in (-1, 1)]
    write_parquet(paths["augmented"],
                  pa.Table.from_pylist(aug, AUGMENTED_SCHEMA) if aug
                  else AUGMENTED_SCHEMA.empty_table())
    info = TokenInfo(vocab_size=vocab_size, pad_id=PAD, bos_id=BOS, eos_id=EOS,
                     tokenizer_hash="tok-hash", split_hash="split-hash")
    replace(info, **(info_extra or {})).write(paths["info"])
    return paths

"""A trained vocabulary (BPE, WordPiece, Unigram) applied to cached base ids.

miditok's trained models see each base id as one character and each bar or beat as one word
(``encode_ids_split``); :func:`apply_model` feeds them the words of stored entries exactly as
``tokenizer.encode`` would, and :func:`expand` maps final ids back to base ids.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from pipeline.tokens.entries import EntryBlock, SeqEncoding


def words(tokenizer: Any, byte_table: list[str], seq: SeqEncoding) -> list[str]:
    """A sequence as the per-bar/beat byte strings miditok feeds its trained model."""
    split = tokenizer.config.encode_ids_split
    starts = (seq.bar_starts if split == "bar" else seq.beat_starts if split == "beat"
              else np.zeros(1, np.int32)).tolist()
    text = "".join([byte_table[i] for i in seq.ids.tolist()])  # one character per base id
    bounds = [*starts, len(text)] if starts else [0, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def base_byte_table(tokenizer: Any) -> list[str]:
    """Base id -> the single character miditok's trained models see (private miditok map;
    tests check the result against ``tokenizer.encode``)."""
    return [tokenizer._vocab_base_id_to_byte[i] for i in range(len(tokenizer.vocab))]


def apply_model(tokenizer: Any, block: EntryBlock, batch: int = 2048) -> list[np.ndarray] | None:
    """Final ids of each sequence of ``block``: None when the tokenizer has no trained model
    (the base ids are final), else the trained model applied as ``encode`` does."""
    if not tokenizer.is_trained:
        return None
    table = base_byte_table(tokenizer)
    n = len(block.table)
    out: list[np.ndarray] = []
    for lo in range(0, n, batch):
        done = tokenizer._model.encode_batch(
            [words(tokenizer, table, block.sequence(j)) for j in range(lo, min(n, lo + batch))],
            is_pretokenized=True)
        out += [np.asarray(enc.ids, dtype=np.int32) for enc in done]
    return out


def expansion_table(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(flat base ids, offsets) of every final id, via miditok's public ``decode_token_ids``."""
    from miditok import TokSequence

    pieces = []
    for v in range(len(tokenizer)):
        seq = TokSequence(ids=[v], are_ids_encoded=v >= len(tokenizer.vocab))
        tokenizer.decode_token_ids(seq)
        pieces.append(np.asarray(seq.ids, dtype=np.int32))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return np.concatenate(pieces), offsets


def expand(ids: np.ndarray, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Final ids -> base ids, vectorised (``decode_token_ids`` is a Python loop per id)."""
    flat, offsets = table
    starts, lens = offsets[ids], offsets[ids + 1] - offsets[ids]
    pos = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return flat[pos + np.arange(int(lens.sum()))]

"""The scoring protocol's token rules, shared by every model that is fitted or scored on tokens.

See ``docs/evaluation.md``: special ids are never targets, and a piece that could not be encoded
or holds an id outside the vocabulary is excluded whole (never partially scored) and counted.
Compound tokens (CPWord, Octuple) follow the same rules per codebook (:func:`clean_compound`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.tokens.contract import TokenInfo

NOT_APPLICABLE = "not_applicable.json"
"""A model folder holding this file instead of a model: the model does not apply to these tokens
(``train-ngram`` for compound tokens), its ``reason`` inside; loading reports that reason."""


def clean_sequences(tokens: pd.DataFrame, info: TokenInfo) -> tuple[pd.DataFrame, dict]:
    """Apply the protocol's token rules to token-table rows.

    Input columns ``sha256``, ``split``, ``track``, ``ids``. Returns the usable rows with ``ids``
    as int64 arrays without special ids, plus an ``excluded`` report. Whole pieces are excluded
    (never partially scored) when a row is the tokenizer's placeholder for a piece it could not
    encode (no ids and ``track < 0``; single-stream tokenizers use ``track == -1`` for real rows
    too) or holds an id outside the vocabulary.
    """
    specials = np.array(info.special_ids(), dtype=np.int64)
    vocab = info.vocab_size
    ids, bad_pieces, n_special, rows_special = [], {}, 0, 0
    for sha, track, row_ids in zip(tokens["sha256"], tokens["track"], tokens["ids"],
                                   strict=True):
        arr = np.asarray(row_ids, dtype=np.int64)
        if track < 0 and arr.size == 0:
            bad_pieces.setdefault(sha, "not_encoded")
        elif arr.size and (arr.min() < 0 or arr.max() >= vocab):
            bad_pieces.setdefault(sha, "id_out_of_range")
        special = np.isin(arr, specials)
        if special.any():
            n_special += int(special.sum())
            rows_special += 1
            arr = arr[~special]
        ids.append(arr)
    out = tokens.assign(ids=ids)
    out = out[~out["sha256"].isin(bad_pieces)].reset_index(drop=True)
    excluded = {
        "pieces": [{"sha256": s, "reason": r} for s, r in sorted(bad_pieces.items())],
        "special_ids_removed": n_special,
        "rows_with_special_ids": rows_special,
    }
    return out, excluded


def clean_compound(tokens: pd.DataFrame, info: TokenInfo) -> tuple[pd.DataFrame, dict]:
    """:func:`clean_sequences` for compound tokens: input columns ``sha256``, ``split``,
    ``track``, ``codes`` (one list per codebook); returns the usable rows with ``ids`` as
    (steps, K) int64 arrays. The rules are those of one stream, read per codebook: a piece is
    excluded whole when not encoded or when a step holds an id outside its codebook; a step with
    a codebook's own PAD, BOS or EOS in any codebook is removed (counted as special ids)."""
    k = len(info.codebooks or [])
    sizes = np.asarray(info.codebook_sizes(), dtype=np.int64)
    specials = np.stack([info.codebook_ids(key) for key in ("pad_id", "bos_id", "eos_id")])
    ids, bad_pieces, n_special, rows_special = [], {}, 0, 0
    for sha, track, codes in zip(tokens["sha256"], tokens["track"], tokens["codes"],
                                 strict=True):
        books = [np.asarray(c, dtype=np.int64) for c in (codes if codes is not None else [])]
        arr = np.stack(books, axis=1) if books else np.zeros((0, k), dtype=np.int64)
        if track < 0 and arr.size == 0:
            bad_pieces.setdefault(sha, "not_encoded")
        elif arr.size and ((arr < 0).any() or (arr >= sizes).any()):
            bad_pieces.setdefault(sha, "id_out_of_range")
        special = (arr[:, None, :] == specials[None]).any(axis=(1, 2))  # (steps,)
        if special.any():
            n_special += int(special.sum())
            rows_special += 1
            arr = arr[~special]
        ids.append(arr)
    out = tokens.assign(ids=ids).drop(columns=["codes"])
    out = out[~out["sha256"].isin(bad_pieces)].reset_index(drop=True)
    excluded = {
        "pieces": [{"sha256": s, "reason": r} for s, r in sorted(bad_pieces.items())],
        "special_ids_removed": n_special,
        "rows_with_special_ids": rows_special,
    }
    return out, excluded


def clean_rows(tokens: pd.DataFrame, info: TokenInfo) -> tuple[pd.DataFrame, dict]:
    """:func:`clean_compound` for compound tokens, else :func:`clean_sequences`."""
    return clean_compound(tokens, info) if info.compound else clean_sequences(tokens, info)

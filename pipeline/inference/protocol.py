"""The scoring protocol's token rules, shared by every model that is fitted or scored on tokens.

See ``docs/evaluation.md``: special ids are never targets, and a piece that could not be encoded
or holds an id outside the vocabulary is excluded whole (never partially scored) and counted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.tokens.contract import TokenInfo


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

"""Per-piece scores under the scoring protocol (``docs/evaluation.md``): one model's NLL of every
token sequence, summed per piece, with the facts (split, group, notes, seconds) the aggregates
divide by. Shared by ``symkit evaluate`` and ``symkit adapt-evaluate``, so both score alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

PER_PIECE_SCHEMA = pa.schema([
    ("sha256", pa.string()), ("split", pa.string()), ("model", pa.string()),
    ("seed", pa.int64()), ("group_id", pa.string()), ("nll_nats", pa.float64()),
    ("n_tokens", pa.int64()), ("n_notes", pa.int64()), ("duration_s", pa.float64()),
])
"""Columns of a per-piece table (``reports/eval/per_piece.parquet``); ``seed`` is null for a
model trained once."""


def per_piece_schema(codebooks: Sequence[str] = ()) -> pa.Schema:
    """:data:`PER_PIECE_SCHEMA`, then for compound tokens ``nll_nats_<key>`` per codebook key:
    that codebook's share of ``nll_nats`` (the shares add up to it)."""
    schema = PER_PIECE_SCHEMA
    for key in codebooks:
        schema = schema.append(pa.field(f"nll_nats_{key}", pa.float64()))
    return schema


def score_rows(model: Any, ids: Sequence[np.ndarray],
               conds: np.ndarray | None = None) -> np.ndarray:
    """Total NLL (nats) of each sequence under the protocol; checks the target count.
    ``conds`` (N, K): each sequence's condition ids, for a conditioned model only."""
    per = model.token_nll(list(ids)) if conds is None else model.token_nll(list(ids), conds=conds)
    for i, (t, s) in enumerate(zip(per, ids, strict=True)):
        if len(t) != len(s) + 1:
            raise ValueError(f"{type(model).__name__}.token_nll returned {len(t)} values for a "
                             f"sequence of {len(s)} tokens (row {i}); the protocol needs len + 1")
    return np.array([math.fsum(t) for t in per], dtype=np.float64)


def score_codebooks(model: Any, ids: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Compound tokens: each sequence's joint NLL (nats) and its (K,) per-codebook shares, from
    the model's ``codebook_nll``; the joint NLL is the sum of all the sequence's per-codebook
    NLLs, so the shares add up to it (up to float rounding). Checks the target count."""
    per = model.codebook_nll(list(ids))
    for i, (t, s) in enumerate(zip(per, ids, strict=True)):
        if len(t) != len(s) + 1:
            raise ValueError(f"{type(model).__name__}.codebook_nll returned {len(t)} steps for a "
                             f"sequence of {len(s)} steps (row {i}); the protocol needs len + 1")
    joint = np.array([math.fsum(t.ravel()) for t in per], dtype=np.float64)
    shares = np.array([[math.fsum(col) for col in t.T] for t in per], dtype=np.float64)
    return joint, shares.reshape(len(per), -1)


def piece_table(rows: pd.DataFrame, nll: np.ndarray, pieces: pd.DataFrame, name: str,
                seed: int | None = None, codebooks: dict[str, np.ndarray] | None = None
                ) -> pd.DataFrame:
    """Per-piece sums for one model (one training seed of it): rows (one per sequence) -> one
    row per piece. ``codebooks``: compound tokens, each codebook key's NLL per row, summed per
    piece into ``nll_nats_<key>`` (:func:`per_piece_schema`)."""
    books = codebooks or {}
    df = pd.DataFrame({"sha256": rows["sha256"].to_numpy(), "nll_nats": nll,
                       "n_tokens": np.array([len(s) + 1 for s in rows["ids"]], dtype=np.int64),
                       **{f"nll_nats_{k}": v for k, v in books.items()}})
    agg = df.groupby("sha256", sort=True).sum().reset_index()
    out = agg.merge(pieces, on="sha256", how="inner", validate="one_to_one")
    out["model"] = name
    out["seed"] = pd.array([seed] * len(out), dtype="Int64")
    out["n_notes"] = out["n_notes"].astype(np.int64)
    return out[per_piece_schema(list(books)).names]


def piece_facts(manifest: pd.DataFrame, splits: pd.DataFrame) -> pd.DataFrame:
    """sha256 -> split, group_id, n_notes, duration_s (manifest rows of equal bytes agree)."""
    man = manifest.assign(_ok=manifest["status"] != "ok") if "status" in manifest else manifest
    man = man.sort_values([c for c in ("sha256", "_ok") if c in man]).drop_duplicates("sha256")
    facts = splits[["sha256", "split", "group_id"]].merge(
        man[["sha256", "n_notes", "duration_s"]], on="sha256", how="left", validate="one_to_one")
    facts["group_id"] = facts["group_id"].astype(str)
    return facts


def match_facts(rows: pd.DataFrame, facts: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Keep rows whose piece is in splits.parquet with the same split and manifest facts."""
    merged = rows[["sha256", "split"]].merge(facts, on="sha256", how="left",
                                             suffixes=("", "_splits"))
    reason = np.select(
        [merged["split_splits"].isna(), merged["split_splits"] != merged["split"],
         merged["n_notes"].isna() | merged["duration_s"].isna()],
        ["not_in_splits", "split_mismatch", "not_in_manifest"], "")
    bad = dict(zip(merged["sha256"][reason != ""], reason[reason != ""], strict=True))
    keep = rows[~rows["sha256"].isin(bad)].reset_index(drop=True)
    return keep, [{"sha256": s, "reason": r} for s, r in sorted(bad.items())]

"""Split identity: the schema of ``data/splits.parquet`` and the hash that names a split.

The split stage writes the table and ``split_hash`` into ``reports/split.json``; the tokenize
stage copies the hash into ``data/tokens/info.json``; models, checkpoints and the registration
record it. All of them compute or read it here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

SPLIT_NAMES = ("train", "val", "test")
SPLITS_SCHEMA = pa.schema([("sha256", pa.string()), ("group_id", pa.string()),
                           ("split", pa.string()), ("fold", pa.int16())])
"""``data/splits.parquet``: every kept piece, its group and split (``fold`` -1 when folds are
off)."""


def unit_hash(seed: int, key: str, salt: str = "split") -> float:
    """A uniform number in [0, 1) from (seed, salt, key): stable across runs and machines. The
    split stage assigns groups with it; the leakage audit draws its samples and its random
    split with it (other salts), so they stay put when pieces are added."""
    digest = hashlib.sha256(f"{seed}\x00{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def unit_hashes(seed: int, keys: Iterable[str], salt: str) -> np.ndarray:
    """:func:`unit_hash` of each key, as float64."""
    return np.fromiter((unit_hash(seed, k, salt) for k in keys), dtype=np.float64)


def split_hash(sha256: Iterable[str], split: Iterable[str]) -> str:
    """sha256 over the sorted ``sha256<TAB>split`` lines: the identity of a split."""
    lines = sorted(f"{s}\t{p}\n" for s, p in zip(sha256, split, strict=True))
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def split_hash_of(split_report: Any) -> str | None:
    """The ``split_hash`` recorded in a ``reports/split.json`` object (None when absent)."""
    if isinstance(split_report, dict) and isinstance(split_report.get("split_hash"), str):
        return split_report["split_hash"]
    return None

"""The token contract: what ``symkit tokenize`` writes and every later stage reads.

One home for each piece of it, with one reader and one writer:

- ``data/tokens/info.json``: :class:`TokenInfo` (``TokenInfo.read`` / ``TokenInfo.write``);
- ``data/tokens/tokens.parquet`` and ``augmented.parquet``: :data:`TOKENS_SCHEMA`,
  :data:`AUGMENTED_SCHEMA` and :func:`read_tokens`;
- special ids: :data:`SPECIAL_TOKENS` (PAD, BOS, EOS, required of every tokenizer),
  :meth:`TokenInfo.special_ids` and :func:`never_sampled`; padded targets are
  :data:`models.base.IGNORE_INDEX`, which every model reads.

Token tables hold no BOS/EOS: a model frames each row as ``BOS x_1..x_n EOS``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.core.artifacts import ArtifactError, read_json, read_parquet, write_json

SPECIAL_TOKENS = ("PAD_None", "BOS_None", "EOS_None")
"""miditok special tokens every tokenizer must have (the tokenize stage refuses others)."""

TOKENS_SCHEMA = pa.schema([
    ("sha256", pa.string()), ("split", pa.string()), ("track", pa.int16()),
    ("program", pa.int16()), ("is_drum", pa.bool_()), ("ids", pa.list_(pa.int32())),
    ("n_tokens", pa.int32()), ("n_notes", pa.int32()), ("n_notes_input", pa.int32()),
    ("roundtrip_f1", pa.float64()), ("flags", pa.list_(pa.string())),
])
"""``tokens.parquet``: one row per sequence (track, or piece for one-stream tokenizers), sorted
by (sha256, track). A piece that could not be encoded keeps one row with ``track = -1``, no ids
and a flag."""
AUGMENTED_SCHEMA = pa.schema([
    ("sha256", pa.string()), ("transpose", pa.int8()), ("track", pa.int16()),
    ("ids", pa.list_(pa.int32())), ("n_tokens", pa.int32()),
])
"""``augmented.parquet``: transposed copies of train pieces only."""


TOKEN_ROW_DEFAULTS: dict[str, Any] = {"program": 0, "is_drum": False, "n_notes": 0,
                                      "roundtrip_f1": 1.0, "flags": []}


def tokens_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows (``sha256``, ``split``, ``track``, ``ids`` at least) as a :data:`TOKENS_SCHEMA` table.

    Missing columns take :data:`TOKEN_ROW_DEFAULTS`, ``n_tokens`` = ``len(ids)`` and
    ``n_notes_input`` = ``n_notes``: for token tables written by other tools or by tests.
    """
    full = []
    for row in rows:
        r = {**TOKEN_ROW_DEFAULTS, **row}
        r.setdefault("n_tokens", len(r["ids"]))
        r.setdefault("n_notes_input", r["n_notes"])
        full.append({name: r[name] for name in TOKENS_SCHEMA.names})
    return pa.Table.from_pylist(full, schema=TOKENS_SCHEMA)


@dataclass(frozen=True)
class TokenInfo:
    """``data/tokens/info.json``: vocabulary size, special ids and the identity of the tokens.

    ``tokenizer_hash`` and ``split_hash`` say which tokenizer and which split produced the
    tokens; models record them, and a model trained on other tokens is not scored against these.
    """

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    tokenizer_hash: str
    split_hash: str
    tokenizer: str | None = None
    """miditok class name (``REMI``...)."""
    model: str | None = None
    """Trained vocabulary: ``BPE``, ``WordPiece`` or ``none``."""
    base_vocab_size: int | None = None
    one_token_stream: bool | None = None

    @classmethod
    def read(cls, path: Path | str) -> TokenInfo:
        """Read and check ``info.json``; a missing, corrupt or incomplete file is an
        :class:`~pipeline.core.artifacts.ArtifactError` naming the file and its stage."""
        raw = read_json(path)
        names = [f.name for f in fields(cls)]
        required = names[:6]
        missing = [k for k in required if not isinstance(raw, dict) or k not in raw]
        if missing:
            raise ArtifactError.for_path(path, f"lacks {', '.join(missing)}")
        try:
            return cls(**{k: raw[k] for k in names if k in raw})
        except TypeError as e:
            raise ArtifactError.for_path(path, f"is not a token info file ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, without the optional keys that are unset."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def write(self, path: Path | str) -> None:
        write_json(path, self.to_dict())

    def special_ids(self) -> tuple[int, ...]:
        """PAD, BOS and EOS ids, sorted and distinct."""
        return tuple(sorted({self.pad_id, self.bos_id, self.eos_id}))


def never_sampled(info: TokenInfo, tokenizer: Any | None = None) -> list[int]:
    """Ids a sampler must never emit: PAD, BOS and the tokenizer's other specials, but not EOS
    (EOS ends a sample)."""
    ids: set[int] = {info.pad_id, info.bos_id}
    if tokenizer is not None:
        ids |= {int(i) for i in getattr(tokenizer, "special_tokens_ids", [])}
    ids.discard(info.eos_id)
    return sorted(ids)


NOT_HERE = ("test rows are read through pipeline.decision.looks (test_tokens), which records "
            "the look in the test-access ledger first")


def read_tokens(path: Path | str, columns: Iterable[str] | None = None,
                splits: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows of ``tokens.parquet`` of ``splits`` (train and val when None; optionally some
    columns), sorted by (sha256, track) so that file order never matters. The test split is
    refused: scoring test pieces is a look, and :func:`pipeline.decision.looks.test_tokens`
    records it before reading them."""
    wanted = ["train", "val"] if splits is None else list(splits)
    if "test" in wanted:
        raise ValueError(f"read_tokens: {NOT_HERE}")
    cols = list(columns) if columns is not None else None
    df = read_parquet(path, columns=None if cols is None else sorted({*cols, "split"}))
    df = df[df["split"].isin(wanted)]
    if cols is not None:
        df = df[cols]
    keys = [c for c in ("sha256", "track") if c in df.columns]
    if keys:
        df = df.sort_values(keys, kind="stable")
    return df.reset_index(drop=True)

"""The token contract: what ``symkit tokenize`` writes and every later stage reads.

One home for each piece of it, with one reader and one writer:

- ``data/tokens/info.json``: :class:`TokenInfo` (``TokenInfo.read`` / ``TokenInfo.write``);
- ``data/tokens/tokens.parquet`` and ``augmented.parquet``: :data:`TOKENS_SCHEMA`,
  :data:`AUGMENTED_SCHEMA` and :func:`read_tokens`;
- special ids: :data:`SPECIAL_TOKENS` (PAD, BOS, EOS, required of every tokenizer),
  :meth:`TokenInfo.special_ids` and :func:`never_sampled`; padded targets are
  :data:`models.base.IGNORE_INDEX`, which every model reads;
- compound tokens (CPWord, Octuple: one id per codebook per step): the tables'
  ``codes`` column (:func:`tokens_schema`), ``TokenInfo.codebooks``, and
  :func:`refuse_compound`, the one refusal of every reader that models one id stream.

Token tables hold no BOS/EOS: a model frames each row as ``BOS x_1..x_n EOS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.core.artifacts import ArtifactError, read_json, read_parquet, write_json
from pipeline.core.config import ParamsError

COMPOUND = ("CPWord", "Octuple")
"""Compound (multi-vocabulary) tokenizers: one id per codebook per step. Trained and scored by the
compound transformer; refused where one id stream is modelled (:func:`refuse_compound`)."""
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
CODES_FIELD = pa.field("codes", pa.list_(pa.list_(pa.int32())))
"""Compound tokens: one list per codebook, each ``n_tokens`` ids long (one per step). Only the
tables of a compound tokenizer have the column (their ``ids`` are then empty): single-stream
tables keep :data:`TOKENS_SCHEMA` and :data:`AUGMENTED_SCHEMA`, byte for byte, and a reader that
asks for ``codes`` of one gets none (:func:`read_tokens`)."""


def tokens_schema(compound: bool) -> pa.Schema:
    """``tokens.parquet``'s schema: :data:`TOKENS_SCHEMA`, with ``codes`` after ``ids`` for a
    compound tokenizer."""
    return TOKENS_SCHEMA.insert(6, CODES_FIELD) if compound else TOKENS_SCHEMA


def augmented_schema(compound: bool) -> pa.Schema:
    """``augmented.parquet``'s schema: :data:`AUGMENTED_SCHEMA`, with ``codes`` after ``ids``
    for a compound tokenizer."""
    return AUGMENTED_SCHEMA.insert(4, CODES_FIELD) if compound else AUGMENTED_SCHEMA


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
    compound: bool | None = None
    """True for a compound tokenizer (CPWord, Octuple): the tables hold ``codes``, one id per
    codebook per step, and ``ids`` are empty. Unset (absent from the file) otherwise."""
    codebooks: list[dict[str, Any]] | None = None
    """Compound tokens: per codebook, in miditok's order, ``name`` (its token types, e.g.
    ``Pitch``), ``size`` and its own ``pad_id``, ``bos_id``, ``eos_id`` (and ``ignore_id`` where
    it has CPWord's ``Ignore_None``). ``vocab_size`` is then the sum of the sizes (miditok's
    ``len``) and ``pad_id``/``bos_id``/``eos_id`` the first codebook's."""

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
            info = cls(**{k: raw[k] for k in names if k in raw})
        except TypeError as e:
            raise ArtifactError.for_path(path, f"is not a token info file ({e})") from None
        keys = {"name", "size", "pad_id", "bos_id", "eos_id"}
        if bool(info.compound) != bool(info.codebooks) or not all(
                isinstance(c, dict) and keys <= c.keys() for c in info.codebooks or []):
            raise ArtifactError.for_path(path, "has compound and codebooks that disagree (a "
                                         "compound tokenizer lists its codebooks, each with "
                                         f"{', '.join(sorted(keys))})")
        return info

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, without the optional keys that are unset."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def write(self, path: Path | str) -> None:
        write_json(path, self.to_dict())

    def special_ids(self) -> tuple[int, ...]:
        """PAD, BOS and EOS ids, sorted and distinct."""
        return tuple(sorted({self.pad_id, self.bos_id, self.eos_id}))

    # ---- compound tokens: one entry per codebook, in the tokenizer's order
    def codebook_sizes(self) -> tuple[int, ...]:
        return tuple(int(c["size"]) for c in self.codebooks or [])

    def codebook_ids(self, key: str) -> tuple[int, ...]:
        """Each codebook's ``pad_id``, ``bos_id`` or ``eos_id`` (``key``)."""
        return tuple(int(c[key]) for c in self.codebooks or [])

    def codebook_mask_ids(self) -> tuple[tuple[int, ...], ...]:
        """Per codebook the ids that are never predicted: its ``ignore_id`` (CPWord's
        ``Ignore_None``), or none. :func:`models.compound.codebook_nll`'s ``mask_ids``."""
        return tuple((int(c["ignore_id"]),) if "ignore_id" in c else ()
                     for c in self.codebooks or [])

    def codebook_keys(self) -> tuple[str, ...]:
        """Per codebook a name usable as a column suffix (:func:`codebook_key`)."""
        return tuple(codebook_key(c["name"]) for c in self.codebooks or [])


def codebook_key(name: str) -> str:
    """A codebook's name as a column suffix: lower case, runs of other characters than letters
    and digits as one ``_`` (CPWord's ``Position/Bar`` -> ``position_bar``)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "codebook"


NOT_YET_MODELLED = ("compound tokenizers (one id per codebook per step) are trained, scored, "
                    "sampled and audited by train-transformer, evaluate, generate, audit, "
                    "symkit score and symkit sample, but not yet modelled here; use "
                    "tokenize.tokenizer: REMI, TSD, MIDILike or Structured")


def refuse_compound(info: TokenInfo | None, what: str) -> None:
    """Refuse compound tokens where ``what`` (a stage or command) models one id stream: a
    :class:`~pipeline.core.config.ParamsError` naming ``tokenize.tokenizer`` and its value.
    The one check every such entry point makes at its start, from the tokens' ``info`` (None:
    no tokens yet, nothing to refuse)."""
    if info is not None and info.compound:
        raise ParamsError(f"tokenize.tokenizer: {info.tokenizer} — {what} reads one id stream, "
                          f"and {NOT_YET_MODELLED}")


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
    compound = is_compound_table(path) if Path(path).is_file() else False
    if cols is not None and "ids" in cols and "codes" not in cols and compound:
        raise ParamsError(f"{path}: compound tokens (empty ids, one list of codes per codebook) "
                          f"read for their ids; {NOT_YET_MODELLED}")
    wanted_cols = None if cols is None else sorted({*cols, "split"} - (
        set() if compound else {CODES_FIELD.name}))
    df = read_parquet(path, columns=wanted_cols)
    if cols is not None and CODES_FIELD.name in cols and not compound:
        df[CODES_FIELD.name] = None  # a single-stream table: no codes
    df = df[df["split"].isin(wanted)]
    if cols is not None:
        df = df[cols]
    keys = [c for c in ("sha256", "track") if c in df.columns]
    if keys:
        df = df.sort_values(keys, kind="stable")
    return df.reset_index(drop=True)


def is_compound_table(path: Path | str) -> bool:
    """Whether a token table (``tokens.parquet``, ``augmented.parquet``) holds compound tokens
    (it has the ``codes`` column); an unreadable file is an ArtifactError naming its stage."""
    import pyarrow.parquet as pq

    try:
        return CODES_FIELD.name in pq.read_schema(path).names
    except (pa.ArrowException, OSError):
        raise ArtifactError.for_path(path, "is not a readable Parquet file") from None

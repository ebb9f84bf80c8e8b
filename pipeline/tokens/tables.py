"""The tokenize stage's outputs from cached base encodings: the trained vocabulary (learnt on
the train split's pieces only, :func:`train_model`) and the token tables, assembled ``BATCH``
pieces at a time (:func:`write_tables`), with the statistics ``reports/tokenize.json`` reports.
Outputs do not depend on ``BATCH``. A compound tokenizer's rows hold ``codes`` (one list per
codebook) and empty ``ids``; its ``n_tokens`` and token counts count steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.core.arrays import list_array
from pipeline.core.artifacts import ROW_GROUP_ROWS, table_writer
from pipeline.tokens.contract import augmented_schema, tokens_schema
from pipeline.tokens.entries import EntryBlock, SeqEncoding, f1_from_counts
from pipeline.tokens.roundtrip import match_counts
from pipeline.tokens.store import Entries
from pipeline.tokens.tokenizer import is_compound
from pipeline.tokens.vocabulary import apply_model, base_byte_table, expand, expansion_table, words

BATCH = 2048
"""Pieces assembled at once: the stage holds one batch's encodings, whatever the corpus size."""


class TrainingCorpus:
    """What ``tokenizer.train`` receives: train pieces only, sorted; records every sha256 read.

    Mirrors ``miditok.TokTrainingIterator`` (empty bar/beat chunks dropped) but reads the cached
    base encodings instead of re-encoding files, ``BATCH`` pieces at a time.
    """

    def __init__(self, tokenizer: Any, byte_table: list[str], entries: Entries,
                 shas: list[str]) -> None:
        self.tokenizer, self.byte_table, self.entries, self.shas = \
            tokenizer, byte_table, entries, shas
        self.seen: list[str] = []

    def __len__(self) -> int:
        return len(self.shas)

    def __iter__(self):
        for lo in range(0, len(self.shas), BATCH):
            part = self.shas[lo : lo + BATCH]
            encodings = self.entries.get([(s, 0) for s in part])
            for sha in part:
                self.seen.append(sha)
                yield [w for s in encodings[(sha, 0)].seqs
                       for w in words(self.tokenizer, self.byte_table, s) if w]


def train_model(model: str, vocab_size: int, tokenizer: Any, pieces: pd.DataFrame,
                entries: Entries, also: Sequence[str] = ()) -> tuple[Any, list[str]]:
    """Train ``tokenizer`` (in place) with ``model`` (``tokenize.model``; "none" trains nothing)
    on the train split's base encodings, and on those of ``also`` (``tokenize.also_train_on``'s
    train pieces)."""
    if model == "none":
        return tokenizer, []
    train = sorted({s for s, p in zip(pieces["sha256"], pieces["split"], strict=True)
                    if p == "train" and (s, 0) in entries} | {s for s in also if (s, 0) in entries})
    corpus = TrainingCorpus(tokenizer, base_byte_table(tokenizer), entries, train)
    tokenizer.train(vocab_size=vocab_size, model=model, iterator=corpus)
    return tokenizer, sorted(set(corpus.seen))


def _lossy_f1(tokenizer: Any, seq: SeqEncoding, recovered: np.ndarray, one_stream: bool) -> float:
    """F1 of the model-decoded sequence against the base decoding (exact when that is)."""
    from miditok import TokSequence

    def dec(ids: np.ndarray) -> Any:
        if one_stream:
            return tokenizer.decode(TokSequence(ids=ids.tolist()))
        return tokenizer.decode([TokSequence(ids=ids.tolist())],
                                programs=[(seq.program, seq.is_drum)])

    ref = dec(seq.ids)
    matched, n_dec = match_counts(ref, dec(recovered), program=0)
    n_ref = sum(len(t.notes) for t in ref.tracks)
    return min(seq.roundtrip_f1, f1_from_counts(matched, n_ref, n_dec))


def write_tables(tokenizer: Any, pieces: pd.DataFrame, wanted: dict[str, tuple[int, ...]],
                 entries: Entries, failures: dict[str, tuple[str, str]], tokens_path: Path,
                 augmented_path: Path) -> dict[str, Any]:
    """Write the tokens and augmented tables (sorted by key), ``BATCH`` pieces at a time, and
    return the report's statistics. ``pieces`` is sorted by sha256."""
    table = expansion_table(tokenizer) if tokenizer.is_trained else None
    compound = is_compound(tokenizer)
    schema = tokens_schema(compound)
    id_columns = ["ids", "codes"] if compound else ["ids"]
    summary = [schema.empty_table().drop_columns(id_columns)]  # rows without their ids, for
    # the statistics
    examples: list[dict[str, Any]] = []
    counts = Counter()
    with table_writer(tokens_path, schema, ROW_GROUP_ROWS) as put_tokens, \
            table_writer(augmented_path, augmented_schema(compound),
                         ROW_GROUP_ROWS) as put_augmented:
        shas, splits = pieces["sha256"].tolist(), pieces["split"].tolist()
        for lo in range(0, len(shas), BATCH):
            part = shas[lo : lo + BATCH]
            block = entries.block([(sha, t) for sha in part for t in wanted.get(sha, ())
                                   if (sha, t) in entries])
            tokens, augmented = batch_tables(tokenizer, table, part, splits[lo : lo + BATCH],
                                             block, apply_model(tokenizer, block), failures,
                                             examples, counts)
            put_tokens(tokens)
            put_augmented(augmented)
            summary.append(tokens.drop_columns(id_columns))
    return _stats(pa.concat_tables(summary), counts, examples)


FLAG_BITS = ("model_lossy", "no_notes", "notes_dropped", "roundtrip_lossy", "truncated_bars")
"""Row flags computed for encoded pieces, in sorted order (bit ``k`` of a row's flag code)."""


def batch_tables(tokenizer: Any, table: tuple[np.ndarray, np.ndarray] | None,
                 shas: list[str], splits: list[str], block: EntryBlock,
                 final: list[np.ndarray] | None, failures: dict[str, tuple[str, str]],
                 examples: list[dict[str, Any]], counts: Counter) -> tuple[pa.Table, pa.Table]:
    """The tokens and augmented rows of the pieces ``shas`` (sorted) in ``splits``, from their
    entries in ``block`` (``final``: the final ids of its sequences, None when they are the base
    ids); a piece that could not be encoded is added to ``examples``; ``counts`` gets the
    report's token and augmentation counts. Columns are built with array operations over the
    block: a row at a time cost more than reading the entries."""
    index = {key: e for e, key in enumerate(block.keys)}
    first, tab = block.first_seq, block.table
    seq_entry = np.repeat(np.arange(len(block.keys)), np.diff(first))
    n_seq = np.diff(first)
    width = len(tokenizer.vocab) if is_compound(tokenizer) else 1  # ids per step
    n_tokens = tab[:, 4] // width if final is None else np.fromiter(map(len, final), np.int64,
                                                                     count=len(final))
    # per sequence: the round-trip F1 (a trained model that loses notes lowers it) and flags
    matched, n_notes, decoded = tab[:, 7], tab[:, 3], tab[:, 8]
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(matched < 0, np.nan, np.where(n_notes + decoded == 0, 1.0,
                                                    2.0 * matched / (n_notes + decoded)))
    lossy = np.zeros(len(tab), dtype=bool)
    base_entry = np.array([k[1] == 0 for k in block.keys], dtype=bool)
    if table is not None:
        one_stream = bool(tokenizer.one_token_stream)
        for j in np.flatnonzero(base_entry[seq_entry]).tolist():
            recovered = expand(final[j], table)
            if not np.array_equal(recovered, block.ids(j)):
                lossy[j] = True
                f1[j] = _lossy_f1(tokenizer, block.sequence(j), recovered, one_stream)
    notes = np.bincount(seq_entry, weights=n_notes, minlength=len(block.keys)).astype(np.int64)
    entry_code = 2 * (notes == 0) + 4 * (notes < block.n_input) + 16 * block.truncated_bars
    seq_code = entry_code[seq_entry] + lossy + 8 * (f1 < 1.0)

    # one row per sequence of each piece's base entry; one row for a piece without sequences
    base = np.fromiter((index.get((sha, 0), -1) for sha in shas), np.int64, count=len(shas))
    seqs_of = np.zeros(len(shas), np.int64)  # sequences of each piece's base entry
    seqs_of[base >= 0] = n_seq[base[base >= 0]]
    rows = np.maximum(seqs_of, 1)
    piece = np.repeat(np.arange(len(shas)), rows)
    entry = base[piece]
    has = seqs_of[piece] > 0  # the row is a sequence (then ``entry`` >= 0)
    seq = np.zeros(len(piece), np.int64)
    seq[has] = (first[entry] + np.arange(len(piece)) - (np.cumsum(rows) - rows)[piece])[has]
    at = seq[has]
    bare = (entry >= 0) & ~has  # an entry without sequences

    def per_row(values: np.ndarray, default: Any, dtype: Any) -> np.ndarray:
        out = np.full(len(piece), default, dtype=dtype)
        out[has] = values[at]
        return out

    code = np.zeros(len(piece), np.int64)
    code[has] = seq_code[at]
    code[bare] = entry_code[entry[bare]]
    flag_lists = [[f for k, f in enumerate(FLAG_BITS) if c >> k & 1]
                  for c in range(2 ** len(FLAG_BITS))]
    flags = [flag_lists[c] for c in code.tolist()]
    for r in np.flatnonzero(entry < 0).tolist():
        sha = shas[piece[r]]
        flag, detail = failures.get(sha, ("missing_source", "no ok manifest row"))
        flags[r] = [flag]
        examples.append({"sha256": sha, "flags": [flag], "detail": detail})
    n_input = np.zeros(len(piece), np.int64)
    n_input[entry >= 0] = block.n_input[entry[entry >= 0]]
    ids_of = [_NO_IDS] * len(piece)
    for r, j in zip(np.flatnonzero(has).tolist(), at.tolist(), strict=True):
        ids_of[r] = final[j] if final is not None else \
            block.flat[block.ids_at[j] : block.ids_at[j] + tab[j, 4]]
    schema = tokens_schema(width > 1)
    codes = {}
    if width > 1:  # compound: the stored steps as codes, and no ids
        codes["codes"] = codes_column(ids_of, width)
        ids_of = [_NO_IDS] * len(piece)
    piece_list = piece.tolist()
    tokens = pa.table({
        "sha256": pa.array([shas[p] for p in piece_list], pa.string()),
        "split": pa.array([splits[p] for p in piece_list], pa.string()),
        "track": pa.array(per_row(tab[:, 0], -1, np.int16)),
        "program": pa.array(per_row(tab[:, 1], -1, np.int16)),
        "is_drum": pa.array(per_row(tab[:, 2] != 0, False, bool)),
        "ids": list_array(ids_of, schema.field("ids").type),
        **codes,
        "n_tokens": pa.array(per_row(n_tokens, 0, np.int32)),
        "n_notes": pa.array(per_row(n_notes, 0, np.int32)),
        "n_notes_input": pa.array(n_input.astype(np.int32)),
        "roundtrip_f1": pa.array(per_row(f1, np.nan, np.float64), mask=~has),
        "flags": pa.array(flags, schema.field("flags").type),
    }, schema=schema)
    base_seqs = base_entry[seq_entry]
    counts["base_tokens"] += int(tab[base_seqs, 4].sum()) // width
    counts["augmented_sequences"] += int((~base_seqs).sum())
    counts["augment_out_of_range"] += int(block.out_of_range[~base_entry].sum())
    aug = [j for e in sorted(np.flatnonzero(~base_entry).tolist(), key=block.keys.__getitem__)
           for j in range(first[e], first[e + 1])]
    aug_ids = [final[j] if final is not None else block.ids(j) for j in aug]
    aug_schema = augmented_schema(width > 1)
    aug_codes = {}
    if width > 1:
        aug_codes["codes"] = codes_column(aug_ids, width)
        aug_ids = [_NO_IDS] * len(aug)
    augmented = pa.table({
        "sha256": pa.array([block.keys[e][0] for e in seq_entry[aug].tolist()], pa.string()),
        "transpose": pa.array([block.keys[e][1] for e in seq_entry[aug].tolist()], pa.int8()),
        "track": pa.array(tab[aug, 0].astype(np.int16)),
        "ids": list_array(aug_ids, aug_schema.field("ids").type),
        **aug_codes,
        "n_tokens": pa.array(n_tokens[aug].astype(np.int32)),
    }, schema=aug_schema)
    return tokens, augmented


_NO_IDS = np.zeros(0, np.int32)


def codes_column(steps: list[np.ndarray], width: int) -> pa.Array:
    """The ``codes`` column of rows whose stored ids are ``steps`` (each a compound sequence's
    steps one after the other, ``width`` ids each): per row ``width`` lists, the ids of each
    codebook in step order (a row without ids gets ``width`` empty lists)."""
    inner = [c for flat in steps for c in np.asarray(flat).reshape(-1, width).T]
    values = list_array(inner, pa.list_(pa.int32()))
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    offsets = pa.array(np.arange(len(steps) + 1, dtype=np.int32) * width, pa.int32())
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.list_(pa.int32())))


def _stats(tokens: pa.Table, counts: Counter, examples: list[dict[str, Any]]) -> dict[str, Any]:
    df = tokens.select(["sha256", "split", "n_tokens", "roundtrip_f1", "flags"]).to_pandas()
    f1 = df["roundtrip_f1"].dropna()
    flag_counts = Counter(f for fl in df["flags"] for f in set(fl))
    flagged = df[df["flags"].map(len) > 0]
    for sha, fl in zip(flagged["sha256"], flagged["flags"], strict=True):
        if len(examples) < 20 and not any(e["sha256"] == sha for e in examples):
            examples.append({"sha256": sha, "flags": list(fl), "detail": ""})
    return {
        "pieces": int(df["sha256"].nunique()),
        "pieces_by_split": {k: int(v) for k, v in df.groupby("split")["sha256"].nunique().items()},
        "sequences": len(df),
        "tokens_by_split": {k: int(v) for k, v in df.groupby("split")["n_tokens"].sum().items()},
        "base_tokens": int(counts["base_tokens"]),
        "compression": float(counts["base_tokens"] / max(1, int(df["n_tokens"].sum()))),
        "roundtrip_f1_mean": float(f1.mean()) if len(f1) else None,
        "roundtrip_f1_min": float(f1.min()) if len(f1) else None,
        "roundtrip_below_1": int((f1 < 1.0).sum()),
        "flags": dict(sorted(flag_counts.items())),
        "flagged_pieces": int(flagged["sha256"].nunique()),
        "flagged_examples": sorted(examples, key=lambda e: e["sha256"])[:20],
        "augmented_sequences": int(counts["augmented_sequences"]),
        "augment_out_of_range": int(counts["augment_out_of_range"]),
    }

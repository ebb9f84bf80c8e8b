"""``symkit tokenize``: miditok tokenizer, trained vocabulary (train split only), token tables.

Inputs: ``data/raw/`` (MIDI), ``data/manifest.parquet`` (``path``, ``sha256``, ``status``),
``data/splits.parquet`` (``sha256``, ``split``) and, if present, ``reports/split.json``
(``split_hash``). Outputs:

- ``data/tokenizer.json``: the miditok tokenizer, loadable with ``miditok.REMI(params=...)``;
  library version strings are left out so the file is a pure function of config and data;
- ``data/tokens/tokens.parquet``: one row per sequence of every piece in the splits
  (``sha256``, ``split``, ``track``, ``program``, ``is_drum``, ``ids``, ``n_tokens``, ``n_notes``,
  ``n_notes_input``, ``roundtrip_f1``, ``flags``), sorted by (``sha256``, ``track``), in row
  groups of ``ROW_GROUP_ROWS`` rows;
- ``data/tokens/augmented.parquet``: transposed train pieces (``sha256``, ``transpose``,
  ``track``, ``ids``, ``n_tokens``);
- ``data/tokens/info.json``: vocabulary size, special ids, ``tokenizer_hash``, ``split_hash``;
- ``.cache/tokens/``: base encodings per file, in segments (see :mod:`pipeline.tokens.cache`;
  a cache, not an output: the outputs never depend on what it holds);
- ``reports/tokenize.json`` (metrics) and ``reports/tokenize.env.json`` (timings, worker
  seconds of encoding and of the round-trip check, cache hits).

Invariants: the trained vocabulary sees train pieces only; outputs are byte-identical for any
worker count, file order, cache state and ``BATCH``; every piece gets a row, failures are
flagged. With the cache, memory does not grow with the corpus's tokens: encodings are read from
the store ``BATCH`` pieces at a time (:class:`pipeline.tokens.cache.Entries`) and the tables are
written as they are assembled.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from pipeline.core.arrays import list_array
from pipeline.core.artifacts import (
    ROW_GROUP_ROWS,
    read_json,
    read_parquet,
    sha256_bytes,
    sha256_json,
    table_writer,
    write_json,
    write_sidecar,
    write_text,
)
from pipeline.core.config import ParamsError, RuntimeConfig, StageConfig, load_section
from pipeline.core.parallel import join_all
from pipeline.core.segments import StoreChanged, rerun_if_store_changed
from pipeline.core.splits import split_hash as compute_split_hash
from pipeline.tokens.cache import (
    Encoding,
    Entries,
    SeqEncoding,
    TokenCache,
    apply_model,
    base_byte_table,
    config_key,
    encode_missing,
    expand,
    expansion_table,
    f1_from_counts,
    match_counts,
    words,
)
from pipeline.tokens.contract import AUGMENTED_SCHEMA, TOKENS_SCHEMA, TokenInfo
from pipeline.tokens.tokenizer import (
    MODELS,
    REFUSED,
    SUPPORTED,
    make_tokenizer,
    tokenizer_config_args,
)


class TokenizeConfig(StageConfig):
    """``tokenize`` section of params.yaml; each key is documented there, beside its value."""

    tokenizer: str = "REMI"
    config: dict[str, Any] = Field(default_factory=lambda: {"use_programs": True})
    model: str = "BPE"
    vocab_size: int = Field(1000, ge=1)
    transpose: list[int] = Field(default_factory=list)
    timeout_s: float = Field(120.0, gt=0)

    @field_validator("tokenizer")
    @classmethod
    def _known_tokenizer(cls, v: str) -> str:
        if v in REFUSED:
            raise ValueError(f"{v} is refused: {REFUSED[v]}; use one of {', '.join(SUPPORTED)}")
        if v not in SUPPORTED:
            raise ValueError(f"unknown tokenizer; use one of {', '.join(SUPPORTED)}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v == "Unigram":
            raise ValueError("Unigram is refused: its training assigns different ids on every "
                             f"run; use one of {', '.join(MODELS)}")
        if v not in MODELS:
            raise ValueError(f"unknown model; use one of {', '.join(MODELS)}")
        return v

    @field_validator("transpose")
    @classmethod
    def _offsets(cls, v: list[int]) -> list[int]:
        bad = [o for o in v if o == 0 or abs(o) > 24]
        if bad or len(set(v)) != len(v):
            raise ValueError("offsets must be distinct non-zero semitones within -24..24")
        return v

    @field_validator("config")
    @classmethod
    def _config_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        allowed = tokenizer_config_args()
        for key in sorted(v):
            if key not in allowed:
                usable = sorted(k for k in allowed if not k.startswith("ac_"))
                raise ValueError(f"config.{key}: not a miditok TokenizerConfig argument; "
                                 f"allowed: {', '.join(usable)}")
            if key.startswith("ac_"):
                raise ValueError(f"config.{key}: attribute controls are sampled with an "
                                 "unseeded random generator and are not supported")
        return v

    @model_validator(mode="after")
    def _buildable(self) -> TokenizeConfig:
        make_tokenizer(self.tokenizer, self.config)  # raises ValueError naming the key
        return self


@dataclass(frozen=True)
class TokenizeSummary:
    pieces: int
    rows: int
    vocab_size: int
    encoded: int  # files encoded in this run (cache misses)
    reused: int  # files taken from the cache
    flagged: int
    pruned: int


# ---- stage ------------------------------------------------------------------------------


def plan_pieces(manifest: Path, splits: Path, raw_dir: Path) -> pd.DataFrame:
    """Every piece of ``splits`` with its source path (None when no ``ok`` manifest row)."""
    sp = read_parquet(splits, columns=["sha256", "split"])
    man = read_parquet(manifest, columns=["path", "sha256", "status"])
    ok = man[man["status"] == "ok"].sort_values(["sha256", "path"]).drop_duplicates("sha256")
    paths = dict(zip(ok["sha256"], ok["path"], strict=True))
    sp = sp.sort_values("sha256").reset_index(drop=True)
    if sp["sha256"].duplicated().any():
        raise ValueError(f"{splits}: a sha256 appears twice")
    root = str(raw_dir)
    sp["path"] = pd.Series([os.path.join(root, paths[s]) if s in paths else None
                            for s in sp["sha256"]], dtype=object)
    return sp


def split_hash(pieces: pd.DataFrame, split_report: Path | None) -> tuple[str, bool | None]:
    """The split identity (:func:`pipeline.core.splits.split_hash`) of the pieces tokenised.

    The split stage's ``reports/split.json`` value wins when present; returns (hash, whether
    our computation agrees with it, or None when there is no report).
    """
    ours = compute_split_hash(pieces["sha256"], pieces["split"])
    if split_report is not None and split_report.exists():
        theirs = read_json(split_report).get("split_hash")
        if theirs:
            return str(theirs), theirs == ours
    return ours, None


BATCH = 2048
"""Pieces assembled at once: the stage holds one batch's encodings, whatever the corpus size."""


@rerun_if_store_changed
def run(cfg: TokenizeConfig, runtime: RuntimeConfig, *, raw_dir: Path, manifest: Path,
        splits: Path, split_report: Path | None, tokenizer_out: Path, tokens_dir: Path,
        cache_dir: Path | None, report: Path, prune_cache: bool = False) -> TokenizeSummary:
    """Tokenise every piece of ``splits``; ``cache_dir=None`` encodes everything afresh (and
    holds every encoding in memory until the tables are written). A cache changed under the
    run (entries gone or unreadable) makes it run once more, encoding what is missing."""
    t0 = time.perf_counter()
    base = make_tokenizer_checked(cfg)
    key = config_key(cfg.tokenizer, base.config.to_dict(serialize=True))
    cache = TokenCache(cache_dir, key) if cache_dir is not None else None
    pieces = plan_pieces(manifest, splits, raw_dir)

    wanted: dict[str, tuple[int, ...]] = {}
    for sha, split, path in zip(pieces["sha256"], pieces["split"], pieces["path"], strict=True):
        if path is not None:
            wanted[sha] = tuple(sorted((0, *cfg.transpose))) if split == "train" else (0,)
    keys = {(sha, t) for sha, ts in wanted.items() for t in ts}
    entries = Entries()
    before = _segment_ids(cache)
    if cache is not None:
        entries.where = cache.locate(keys)
    jobs = []
    for sha, path in zip(pieces["sha256"], pieces["path"], strict=True):
        if path is None:
            continue
        todo = tuple(t for t in wanted[sha] if (sha, t) not in entries)
        if todo:
            jobs.append((sha, path, todo))
    t_plan = time.perf_counter()
    failures: dict[str, tuple[str, str]] = {}
    worker_s: dict[str, float] = {}
    closing: list[threading.Thread] = []  # idle pools shutting down while the tables are built
    results = encode_missing(jobs, (make_tokenizer, cfg.tokenizer, cfg.config), cache,
                             workers=runtime.n_workers(), timeout_s=cfg.timeout_s,
                             show_progress=runtime.progress, seconds=worker_s, closing=closing)
    fresh: set[tuple[str, int]] = set()
    for sha, res in results.items():
        if isinstance(res, dict):
            fresh.update((sha, t) for t in res)
            entries.packed.update({(sha, t): a for t, a in res.items() if a is not None})
        else:
            failures[sha] = res
    if cache is not None and fresh:  # written by the workers: read from the segments they added
        after = _segment_ids(cache)
        added = [seg for seg, ino in after.items() if before.get(seg) != ino]
        entries.where.update(cache.locate(fresh, check=False, segments=added))
        if lost := fresh - entries.where.keys():
            raise StoreChanged(f"{cache.dir}: {len(lost)} entries written in this run are "
                               "missing")
    t_encode = time.perf_counter()

    base_vocab = len(base.vocab)
    tokenizer, trained_on = train_model(cfg, base, pieces, entries)
    t_train = time.perf_counter()
    stats = write_tables(tokenizer, pieces, wanted, entries, failures,
                         tokens_dir / "tokens.parquet", tokens_dir / "augmented.parquet")
    entries.close()
    t_assemble = time.perf_counter()

    tok_dict = {k: v for k, v in tokenizer.to_dict().items() if not k.endswith("_version")}
    tok_text = json.dumps(tok_dict, indent=4)  # miditok's own layout, minus version strings
    tok_hash = sha256_bytes(tok_text.encode("utf-8"))
    s_hash, s_agrees = split_hash(pieces, split_report)
    info = TokenInfo(tokenizer=cfg.tokenizer, model=cfg.model, vocab_size=len(tokenizer),
                     base_vocab_size=base_vocab, pad_id=int(tokenizer.pad_token_id),
                     bos_id=int(tokenizer.vocab["BOS_None"]),
                     eos_id=int(tokenizer.vocab["EOS_None"]),
                     one_token_stream=bool(base.one_token_stream),
                     tokenizer_hash=tok_hash, split_hash=s_hash)
    train_shas = sorted(trained_on)
    metrics = {**stats, **info.to_dict(),
               "model_trained_on_pieces": len(train_shas),
               "model_trained_on_hash": sha256_json(train_shas),
               "split_hash_matches_split_report": s_agrees}
    write_text(tokenizer_out, tok_text)
    info.write(tokens_dir / "info.json")
    write_json(report, metrics)
    join_all(closing)
    t_write = time.perf_counter()
    compacted = cache.compact() if cache is not None else 0
    t_compact = time.perf_counter()

    pruned = 0
    if prune_cache and cache is not None:
        pruned = cache.prune(keys)
    encoded = len(jobs)
    write_sidecar(report.with_name(report.stem + ".env.json"), {
        "seconds": {"plan": t_plan - t0, "encode": t_encode - t_plan,
                    "train": t_train - t_encode, "assemble": t_assemble - t_train,
                    "write": t_write - t_assemble, "cache_compact": t_compact - t_write,
                    "total": time.perf_counter() - t0},
        # summed over worker processes: encoding (all of it), of which the round-trip check
        # and writing cache segments
        "worker_seconds": {k: worker_s.get(k, 0.0) for k in ("encode", "check", "cache_write")},
        "workers": runtime.n_workers(), "files_encoded": encoded,
        "files_reused": len(wanted) - encoded, "cache_key": key,
        "cache_segments_merged": compacted, "cache_pruned": pruned})
    return TokenizeSummary(pieces=len(pieces), rows=stats["sequences"],
                           vocab_size=len(tokenizer), encoded=encoded,
                           reused=len(wanted) - encoded, flagged=stats["flagged_pieces"],
                           pruned=pruned)


def _segment_ids(cache: TokenCache | None) -> dict[Path, int]:
    """Each segment's inode: a segment rewritten under the same name (atomically) gets another."""
    return {seg: seg.stat().st_ino for seg in cache.segments()} if cache is not None else {}


def make_tokenizer_checked(cfg: TokenizeConfig) -> Any:
    """Base tokenizer for ``cfg``; a vocabulary too small to train is a ParamsError."""
    tok = make_tokenizer(cfg.tokenizer, cfg.config)
    if cfg.model != "none" and cfg.vocab_size <= len(tok.vocab):
        raise ParamsError(f"params.yaml: tokenize.vocab_size = {cfg.vocab_size}: must exceed the "
                          f"base vocabulary of {cfg.tokenizer} ({len(tok.vocab)} tokens) when "
                          f"model = {cfg.model}")
    return tok


# ---- trained vocabulary and output tables -------------------------------------------------


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


def train_model(cfg: TokenizeConfig, tokenizer: Any, pieces: pd.DataFrame,
                entries: Entries) -> tuple[Any, list[str]]:
    """Train ``tokenizer`` (in place) with ``cfg.model`` on the train split's base encodings."""
    if cfg.model == "none":
        return tokenizer, []
    train = sorted(s for s, p in zip(pieces["sha256"], pieces["split"], strict=True)
                   if p == "train" and (s, 0) in entries)
    corpus = TrainingCorpus(tokenizer, base_byte_table(tokenizer), entries, train)
    tokenizer.train(vocab_size=cfg.vocab_size, model=cfg.model, iterator=corpus)
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
    summary = [TOKENS_SCHEMA.empty_table().drop_columns(["ids"])]  # rows without their ids,
    # for the statistics
    examples: list[dict[str, Any]] = []
    counts = Counter()
    with table_writer(tokens_path, TOKENS_SCHEMA, ROW_GROUP_ROWS) as put_tokens, \
            table_writer(augmented_path, AUGMENTED_SCHEMA, ROW_GROUP_ROWS) as put_augmented:
        shas, splits = pieces["sha256"].tolist(), pieces["split"].tolist()
        for lo in range(0, len(shas), BATCH):
            part = shas[lo : lo + BATCH]
            keys = [(sha, t) for sha in part for t in wanted.get(sha, ()) if (sha, t) in entries]
            encodings = entries.get(keys)
            final = apply_model(tokenizer, encodings)
            tokens, augmented = batch_tables(tokenizer, table, part, splits[lo : lo + BATCH],
                                             encodings, final, failures, examples)
            put_tokens(tokens)
            put_augmented(augmented)
            summary.append(tokens.drop_columns(["ids"]))
            for (_, t), enc in encodings.items():
                if t == 0:
                    counts["base_tokens"] += sum(len(s.ids) for s in enc.seqs)
                else:
                    counts["augmented_sequences"] += len(enc.seqs)
                    counts["augment_out_of_range"] += int(enc.out_of_range)
    return _stats(pa.concat_tables(summary), counts, examples)


def batch_tables(tokenizer: Any, table: tuple[np.ndarray, np.ndarray] | None,
                 shas: list[str], splits: list[str], encodings: dict[tuple[str, int], Encoding],
                 final: dict[tuple[str, int], list[np.ndarray]],
                 failures: dict[str, tuple[str, str]], examples: list[dict[str, Any]],
                 ) -> tuple[pa.Table, pa.Table]:
    """The tokens and augmented rows of the pieces ``shas`` (sorted) in ``splits``; a piece that
    could not be encoded is added to ``examples``."""
    one_stream = bool(tokenizer.one_token_stream)
    rows, ids_of = [], []
    for sha, split in zip(shas, splits, strict=True):
        enc = encodings.get((sha, 0))
        if enc is None:
            flag, detail = failures.get(sha, ("missing_source", "no ok manifest row"))
            rows.append((sha, split, -1, -1, False, 0, 0, 0, None, [flag]))
            ids_of.append(np.zeros(0, np.int32))
            examples.append({"sha256": sha, "flags": [flag], "detail": detail})
            continue
        piece_flags = []
        if sum(s.n_notes for s in enc.seqs) < enc.n_notes_input:
            piece_flags.append("notes_dropped")
        if sum(s.n_notes for s in enc.seqs) == 0:
            piece_flags.append("no_notes")
        if not enc.seqs:
            rows.append((sha, split, -1, -1, False, 0, 0, enc.n_notes_input, None,
                         sorted(piece_flags)))
            ids_of.append(np.zeros(0, np.int32))
        for s, ids in zip(enc.seqs, final[(sha, 0)], strict=True):
            flags, f1 = list(piece_flags), s.roundtrip_f1
            if table is not None and not np.array_equal(expand(ids, table), s.ids):
                flags.append("model_lossy")
                f1 = _lossy_f1(tokenizer, s, expand(ids, table), one_stream)
            if f1 < 1.0:
                flags.append("roundtrip_lossy")
            rows.append((sha, split, s.track, s.program, s.is_drum, len(ids), s.n_notes,
                         enc.n_notes_input, f1, sorted(flags)))
            ids_of.append(ids)
    tokens = _table(TOKENS_SCHEMA, rows, ids_of)
    aug_rows, aug_ids = [], []
    for (sha, t), enc in sorted(encodings.items()):
        if t != 0:
            for s, ids in zip(enc.seqs, final[(sha, t)], strict=True):
                aug_rows.append((sha, t, s.track, len(ids)))
                aug_ids.append(ids)
    return tokens, _table(AUGMENTED_SCHEMA, aug_rows, aug_ids)


def _table(schema: pa.Schema, rows: list[tuple], ids: list[np.ndarray]) -> pa.Table:
    """A table of ``schema`` from rows of its columns but ``ids``, and each row's ids (one flat
    array and offsets, not a conversion per row)."""
    names = [n for n in schema.names if n != "ids"]
    cols = list(zip(*rows, strict=True)) if rows else [[]] * len(names)
    arrays = {n: pa.array(list(c), schema.field(n).type)
              for n, c in zip(names, cols, strict=True)}
    arrays["ids"] = list_array(ids, schema.field("ids").type)
    return pa.table({n: arrays[n] for n in schema.names}, schema=schema)


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--raw-dir", type=Path, default=Path("data/raw"))
    a("--manifest", type=Path, default=Path("data/manifest.parquet"))
    a("--splits", type=Path, default=Path("data/splits.parquet"))
    a("--split-report", type=Path, default=Path("reports/split.json"))
    a("--tokenizer-out", type=Path, default=Path("data/tokenizer.json"))
    a("--tokens-dir", type=Path, default=Path("data/tokens"))
    a("--cache-dir", type=Path, default=Path(".cache/tokens"))
    a("--report", type=Path, default=Path("reports/tokenize.json"))
    a("--no-cache", action="store_true", help="encode every file; neither read nor write the cache")
    a("--prune-cache", action="store_true",
      help="after the run, delete cache entries this run did not use")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("tokenize", args.params, TokenizeConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    s = run(cfg, runtime, raw_dir=args.raw_dir, manifest=args.manifest, splits=args.splits,
            split_report=args.split_report, tokenizer_out=args.tokenizer_out,
            tokens_dir=args.tokens_dir, cache_dir=None if args.no_cache else args.cache_dir,
            report=args.report, prune_cache=args.prune_cache)
    print(f"tokenize: {s.pieces} pieces, {s.rows} sequences, vocab {s.vocab_size}; "
          f"encoded {s.encoded}, from cache {s.reused}, flagged {s.flagged}"
          + (f", pruned {s.pruned} cache entries" if s.pruned else ""))
    return 0

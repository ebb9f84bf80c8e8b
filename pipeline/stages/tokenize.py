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

A compound tokenizer (CPWord, Octuple: one id per codebook per step) writes its steps in the
tables' ``codes`` column (one list per codebook) with empty ``ids``, and ``info.json`` lists its
codebooks (:mod:`pipeline.tokens.contract`); it trains no vocabulary (``model`` must be none).
Octuple pieces longer than its ``max_bar_embedding`` bars are clipped by miditok and flagged
``truncated_bars``.
- ``.cache/tokens/``: base encodings per file, in segments (see :mod:`pipeline.tokens.store`;
  a cache, not an output: the outputs never depend on what it holds);
- ``reports/tokenize.json`` (metrics) and ``reports/tokenize.env.json`` (timings, worker
  seconds of encoding and of the round-trip check, cache hits).

With ``tokenize.also_train_on`` the trained vocabulary also learns from another corpus's train
pieces (an adaptation experiment's "source train + target train"); they are encoded for that
only, never written to the tables, and ``reports/tokenize.json`` counts them
(``model_trained_on_other_corpus``).

Invariants: the trained vocabulary sees train pieces only; outputs are byte-identical for any
worker count, file order, cache state and ``BATCH``; every piece gets a row, failures are
flagged. With the cache, memory does not grow with the corpus's tokens: encodings are read from
the store ``BATCH`` pieces at a time (:class:`pipeline.tokens.store.Entries`) and the tables are
written as they are assembled.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from pydantic import Field, field_validator, model_validator

from pipeline.core.artifacts import (
    read_json,
    read_table,
    sha256_bytes,
    sha256_json,
    write_json,
    write_sidecar,
    write_text,
)
from pipeline.core.config import ParamsError, RuntimeConfig, StageConfig, load_section
from pipeline.core.parallel import join_all
from pipeline.core.segments import StoreChanged, rerun_if_store_changed
from pipeline.core.splits import split_hash as compute_split_hash
from pipeline.tokens.contract import TokenInfo
from pipeline.tokens.encoding import encode_missing
from pipeline.tokens.store import Entries, TokenCache, config_key
from pipeline.tokens.tables import train_model, write_tables
from pipeline.tokens.tokenizer import (
    COMPOUND,
    EXTRA_CONFIG,
    MODELS,
    REFUSED,
    SUPPORTED,
    codebooks,
    is_compound,
    make_tokenizer,
    tokenizer_config_args,
    tokenizer_hash,
    tokenizer_text,
)

HELP = "miditok tokenizer (BPE on train only) and token tables"


class AlsoTrainOn(StageConfig):
    """``tokenize.also_train_on``: another pipeline's corpus, by its stage outputs (paths
    relative to where the stage runs)."""

    raw_dir: str
    manifest: str
    splits: str


class TokenizeConfig(StageConfig):
    """``tokenize`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "tokenize"

    tokenizer: str = "REMI"
    config: dict[str, Any] = Field(default_factory=lambda: {"use_programs": True})
    program: int | None = Field(0, ge=0, le=127)
    """Every pitched track is encoded as this General MIDI program (None: each keeps its own);
    kept in the tokenizer (:func:`pipeline.tokens.tokenizer.prepare_score`)."""
    model: str = "BPE"
    vocab_size: int = Field(1000, ge=1)
    transpose: list[int] = Field(default_factory=lambda: [-2, -1, 1, 2])
    timeout_s: float = Field(120.0, gt=0)
    from_: str | None = Field(None, alias="from")
    """A saved tokenizer (``tokenizer.json`` of another run, e.g. a pretraining corpus's) used
    as it is, its trained vocabulary included, instead of training one on this split: runs that
    share it share every id (:func:`load_shared`). ``tokenizer``, ``config``, ``model`` and
    ``vocab_size`` must describe it."""
    also_train_on: AlsoTrainOn | None = None
    """Another corpus whose *train* pieces the trained vocabulary (BPE) also learns from, beside
    this split's train pieces: the declared set "source train + target train" of an adaptation
    experiment. Its pieces are encoded for training only, never written to the token tables."""

    @model_validator(mode="after")
    def _one_vocabulary(self) -> TokenizeConfig:
        if self.also_train_on is not None and self.from_ is not None:
            raise ValueError("also_train_on trains the vocabulary and from reuses a trained "
                             "one: set at most one of them")
        if self.also_train_on is not None and self.model == "none":
            raise ValueError("also_train_on needs a trained vocabulary: model is none")
        return self

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

    @model_validator(mode="after")
    def _compound_trains_nothing(self) -> TokenizeConfig:
        # after the fields, so that the default model (BPE) is refused too
        if self.tokenizer in COMPOUND and self.model != "none":
            raise ValueError(f"tokenize.model: {self.model} — {self.tokenizer} has several "
                             "vocabularies (one id per codebook per step); miditok trains "
                             "BPE/WordPiece on single-stream tokenizers only; use "
                             "tokenize.model: none")
        return self

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
            if key in EXTRA_CONFIG:  # checked against the tokenizer by make_tokenizer
                continue
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
    """Every piece of ``splits`` with its source path (None when no ``ok`` manifest row; of
    several, the first path in sorted order), sorted by sha256."""
    sp = read_table(splits, columns=["sha256", "split"])
    man = read_table(manifest, columns=["path", "sha256", "status"])
    paths: dict[str, str] = {}
    for path, sha, status in zip(*(man[c].to_pylist() for c in ("path", "sha256", "status")),
                                 strict=True):
        if status == "ok" and (sha not in paths or path < paths[sha]):
            paths[sha] = path
    rows = sorted(zip(sp["sha256"].to_pylist(), sp["split"].to_pylist(), strict=True))
    shas = [sha for sha, _ in rows]
    if len(set(shas)) < len(shas):
        raise ValueError(f"{splits}: a sha256 appears twice")
    root = str(raw_dir)
    return pd.DataFrame({
        "sha256": pd.Series(shas, dtype=object), "split": pd.Series([p for _, p in rows],
                                                                    dtype=object),
        "path": pd.Series([os.path.join(root, paths[s]) if s in paths else None for s in shas],
                          dtype=object)})


def also_pieces(cfg: TokenizeConfig, own: set[str]) -> dict[str, str]:
    """``tokenize.also_train_on``'s train pieces (sha256 -> source path, sorted), less any this
    split holds itself (they are its own pieces, in whatever split it put them). A piece of that
    corpus's val or test never reaches the vocabulary."""
    if cfg.also_train_on is None:
        return {}
    a = cfg.also_train_on
    other = plan_pieces(Path(a.manifest), Path(a.splits), Path(a.raw_dir))
    train = other[(other["split"] == "train") & other["path"].notna()]
    return {sha: path for sha, path in zip(train["sha256"], train["path"], strict=True)
            if sha not in own}


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
    shas, paths = pieces["sha256"].tolist(), pieces["path"].tolist()
    train_offsets = tuple(sorted((0, *cfg.transpose)))
    for sha, split, path in zip(shas, pieces["split"].tolist(), paths, strict=True):
        if path is not None:
            wanted[sha] = train_offsets if split == "train" else (0,)
    also = also_pieces(cfg, set(wanted))  # encoded for the vocabulary's training only
    keys = {(sha, t) for sha, ts in wanted.items() for t in ts} | {(sha, 0) for sha in also}
    entries = Entries()
    before = _segment_ids(cache)
    if cache is not None:
        entries.where = cache.locate(keys, groups=entries.groups)
    jobs = []
    for sha, path in zip(shas, paths, strict=True):
        if path is None:
            continue
        todo = tuple(t for t in wanted[sha] if (sha, t) not in entries)
        if todo:
            jobs.append((sha, path, todo))
    jobs += [(sha, path, (0,)) for sha, path in also.items() if (sha, 0) not in entries]
    t_plan = time.perf_counter()
    failures: dict[str, tuple[str, str]] = {}
    closing: list[threading.Thread] = []  # idle pools shutting down while the tables are built
    factory = (make_tokenizer, cfg.tokenizer, cfg.config, cfg.program)
    results, worker_s = encode_missing(jobs, factory, cache, workers=runtime.n_workers(),
                                       timeout_s=cfg.timeout_s, show_progress=runtime.progress,
                                       closing=closing)
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
        if any(seg in before for seg in added):  # a segment rewritten under its own name:
            entries.groups.clear()  # what the check held of it is stale
        entries.where.update(cache.locate(fresh, check=False, segments=added))
        if lost := fresh - entries.where.keys():
            raise StoreChanged(f"{cache.dir}: {len(lost)} entries written in this run are "
                               "missing")
    t_encode = time.perf_counter()

    # a compound tokenizer's vocab is a list of codebooks: its size is their sum (miditok's len)
    base_vocab = len(base) if is_compound(base) else len(base.vocab)
    if cfg.from_ is not None:
        tokenizer, trained_on = load_shared(cfg, base, Path(cfg.from_)), []
    else:
        tokenizer, trained_on = train_model(cfg.model, cfg.vocab_size, base, pieces, entries,
                                            sorted(also))
    t_train = time.perf_counter()
    stats = write_tables(tokenizer, pieces, wanted, entries, failures,
                         tokens_dir / "tokens.parquet", tokens_dir / "augmented.parquet")
    entries.close()
    t_assemble = time.perf_counter()

    tok_text = tokenizer_text(tokenizer)
    tok_hash = tokenizer_hash(tokenizer)
    s_hash, s_agrees = split_hash(pieces, split_report)
    books = codebooks(tokenizer)
    first = books[0] if books else {"pad_id": tokenizer.pad_token_id,
                                    "bos_id": tokenizer.vocab["BOS_None"],
                                    "eos_id": tokenizer.vocab["EOS_None"]}
    info = TokenInfo(tokenizer=cfg.tokenizer, model=cfg.model, vocab_size=len(tokenizer),
                     base_vocab_size=base_vocab, pad_id=int(first["pad_id"]),
                     bos_id=int(first["bos_id"]), eos_id=int(first["eos_id"]),
                     one_token_stream=bool(base.one_token_stream),
                     tokenizer_hash=tok_hash, split_hash=s_hash,
                     compound=True if books else None, codebooks=books or None)
    train_shas = sorted(trained_on)
    metrics = {**stats, **info.to_dict(),
               "model_trained_on_pieces": len(train_shas),
               "model_trained_on_hash": sha256_json(train_shas),
               **({"model_trained_on_other_corpus": {
                   "pieces": len(set(train_shas) & set(also)),
                   "failed": sorted(sha for sha in also if sha in failures)}}
                  if cfg.also_train_on is not None else {}),
               "tokenizer_from_sha256": (sha256_bytes(Path(cfg.from_).read_bytes())
                                         if cfg.from_ is not None else None),
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
        # summed over worker processes: encoding (the round-trip check included), of which
        # the check, and writing cache segments (pipeline.tokens.encoding.PHASES)
        "worker_seconds": worker_s,
        "workers": runtime.n_workers(), "files_encoded": encoded,
        "files_reused": len(wanted) - encoded, "cache_key": key,
        "cache_segments_merged": compacted, "cache_pruned": pruned})
    return TokenizeSummary(pieces=len(pieces), rows=stats["sequences"],
                           vocab_size=len(tokenizer), encoded=encoded,
                           reused=len(wanted) - encoded, flagged=stats["flagged_pieces"],
                           pruned=pruned)


def _segment_ids(cache: TokenCache | None) -> dict[Path, int]:
    """Each segment's inode: a segment rewritten under the same name (atomically) gets another."""
    return {seg: seg.stat().st_ino for seg in cache.refresh()} if cache is not None else {}


def make_tokenizer_checked(cfg: TokenizeConfig) -> Any:
    """Base tokenizer for ``cfg``; a vocabulary too small to train is a ParamsError."""
    tok = make_tokenizer(cfg.tokenizer, cfg.config, cfg.program)
    if cfg.model != "none" and cfg.vocab_size <= len(tok.vocab):
        raise ParamsError(f"params.yaml: tokenize.vocab_size = {cfg.vocab_size}: must exceed the "
                          f"base vocabulary of {cfg.tokenizer} ({len(tok.vocab)} tokens) when "
                          f"model = {cfg.model}")
    return tok


def load_shared(cfg: TokenizeConfig, base: Any, path: Path) -> Any:
    """The tokenizer saved at ``path`` (``tokenize.from``), checked against ``cfg``: the same
    miditok class and configuration as ``base`` (this run's base encodings are made with it),
    and the trained vocabulary ``cfg.model`` / ``cfg.vocab_size`` say. Any difference is a
    ParamsError naming the key, what the file holds and what params say, so params always
    describe the tokenizer in use. Its JSON round-trips exactly, so its ``tokenizer_hash`` in
    info.json is the source run's."""
    from pipeline.tokens.tokenizer import encoded_program, load_tokenizer

    where = f"params.yaml: tokenize.from = {str(path)!r}"
    if not path.is_file():
        raise ParamsError(f"{where}: no such file (a tokenizer.json written by symkit tokenize)")
    try:
        tok = load_tokenizer(path)
    except (OSError, ValueError, KeyError, TypeError) as e:  # ArtifactError is a ValueError
        raise ParamsError(f"{where}: not a miditok tokenizer ({e})") from None
    name = type(tok).__name__
    if name != cfg.tokenizer:
        raise ParamsError(f"{where}: a {name} tokenizer, but tokenize.tokenizer = "
                          f"{cfg.tokenizer}; set it to {name}")
    if (theirs_program := encoded_program(tok)) != cfg.program:
        raise ParamsError(f"{where}: it encodes tracks as program {theirs_program}, but "
                          f"tokenize.program = {cfg.program}; set it to {theirs_program}")
    theirs, ours = (json.loads(json.dumps(t.config.to_dict(serialize=True)))  # tuples: lists
                    for t in (tok, base))
    if theirs != ours:
        keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise ParamsError(f"{where}: its configuration differs from tokenize.config: "
                          + ", ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here"
                                      for k in keys))
    model = json.loads(tok._model.to_str())["model"]["type"] if tok.is_trained else "none"
    if model != cfg.model:
        raise ParamsError(f"{where}: its trained vocabulary is {model}, but tokenize.model = "
                          f"{cfg.model}; set it to {model}")
    if model != "none" and len(tok) != cfg.vocab_size:
        raise ParamsError(f"{where}: {len(tok)} tokens, but tokenize.vocab_size = "
                          f"{cfg.vocab_size}; set it to {len(tok)}")
    return tok


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
    a("--from", dest="from_", type=Path, default=None, metavar="TOKENIZER_JSON",
      help="override tokenize.from: tokenise with this saved tokenizer instead of training one "
           "(another pipeline's data/tokenizer.json); tokenize's other keys must describe it")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("tokenize", args.params, TokenizeConfig)
    if args.from_ is not None:
        cfg = cfg.model_copy(update={"from_": args.from_.as_posix()})
    runtime = load_section("runtime", args.params, RuntimeConfig)
    s = run(cfg, runtime, raw_dir=args.raw_dir, manifest=args.manifest, splits=args.splits,
            split_report=args.split_report, tokenizer_out=args.tokenizer_out,
            tokens_dir=args.tokens_dir, cache_dir=None if args.no_cache else args.cache_dir,
            report=args.report, prune_cache=args.prune_cache)
    print(f"tokenize: {s.pieces} pieces, {s.rows} sequences, vocab {s.vocab_size}; "
          f"encoded {s.encoded}, from cache {s.reused}, flagged {s.flagged}"
          + (f", pruned {s.pruned} cache entries" if s.pruned else ""))
    return 0

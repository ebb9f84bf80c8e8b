"""``symkit evaluate``: score every model on val and test with one protocol, and on a train subset.

Scoring protocol (``docs/artifacts.md``; the same for every model):

- A piece's sequences are the rows of ``data/tokens/tokens.parquet`` (one per track, or one per
  piece for single-stream tokenizers). BOS, EOS and PAD ids found inside a sequence are removed
  first (counted in ``excluded``), so special tokens are never targets.
- Each sequence ``x_1..x_n`` is scored as the ``n + 1`` targets ``x_1..x_n, EOS``, each exactly
  once, given BOS and as much left context as the model allows: that is the model's
  ``token_nll`` (``models.base.SequenceModel``); the transformer slides windows, the n-gram keeps
  ``order - 1`` tokens.
- A piece's NLL (nats) is the sum over its sequences; ``n_tokens`` counts its targets (EOS
  included). Per-note and per-second figures use the manifest's ``n_notes``/``duration_s`` (the
  source file, not a tokenizer's preprocessed count), so they compare across tokenizers.
- Aggregates are ratios of sums over the pieces of a split (total NLL / total tokens, notes or
  seconds), with percentile intervals from a bootstrap over ``group_id``
  (``pipeline.stats.bootstrap``); paired differences reuse the same replicates for both models.
- A pair's relative improvement ``(A − B) / A`` is formed inside each of those replicates, with
  two robustness summaries beside it (median piece effect, effect without the top 3 groups).
- The transformer slides windows of ``max_seq_len`` tokens by ``evaluate.stride``.
- A model trained over several seeds (``data/transformer/replicates/index.json``) is scored once
  per seed; aggregates average each piece's NLL over its seeds, and every interval adds a
  Student-t term over the per-seed statistics to the group bootstrap, so it includes training
  variance (:mod:`pipeline.stats.aggregate`).
- Generalisation gap: every model also scores a fixed subset of train pieces, ``train_pieces``
  of them, or as many as the held-out (val and test) pieces when 0 (:func:`draw_train_subset`),
  by the same scorers (the transformer's is in eval mode: no dropout). ``gap.<model>`` is the
  held-out pieces, pooled, minus that subset, per note and per token, with an interval from
  independent group bootstraps of the two sets (:func:`generalisation`).
- ``power.<a>_minus_<b>``: the minimum detectable effect of the relative improvement on the test
  groups, estimated from val's per-group sums (:func:`pipeline.stats.power.detectable_effect`).

- A conditioned transformer (``condition.use``, docs/conditioning.md) scores every piece with the
  piece's own conditions, in the model's vocabulary; its targets, and so every NLL's count, are
  those of the unconditioned protocol, so it compares with the n-gram on the same tokens.
  ``conditioning`` adds the shuffled-condition diagnostic on val
  (:mod:`pipeline.conditions.diagnostics`): NLL per note with each piece's own, shuffled and
  removed conditions, averaged over the training seeds, and the paired gaps with their group
  bootstrap intervals (each seed's beside them).

- Compound tokens (CPWord, Octuple; docs/transformer.md): a sequence is its steps, one id per
  codebook (``codes``); the transformer scores each of the ``n + 1`` target steps with the same
  windows, each codebook's distribution renormalised over the ids that can be targets (its PAD
  and BOS and CPWord's ``Ignore_None`` removed; an ``Ignore_None`` target adds 0). A step's NLL
  is the sum over codebooks (the joint NLL), so ``n_tokens`` counts steps (EOS included), NLL per
  note is comparable with a single-stream run, and per_piece.parquet adds ``nll_nats_<codebook>``
  per codebook (they add up to ``nll_nats``); eval.json adds ``codebooks``. The n-gram is not
  applicable (``train-ngram`` says why) and is listed under ``unavailable``, so no pair is formed.

Inputs: ``data/tokens/tokens.parquet``, ``data/tokens/info.json``, ``data/manifest.parquet``,
``data/splits.parquet``, ``data/conditions.parquet`` (read only for a conditioned model), model
folders (``data/ngram``, ``data/transformer``). Outputs:
``reports/eval/per_piece.parquet`` (``sha256``, ``split``, ``model``, ``seed`` (null without
training seeds), ``group_id``, ``nll_nats``, ``n_tokens``, ``n_notes``, ``duration_s``; sorted by
model, seed, split, sha256; the train subset's rows have split ``train``),
``reports/eval.json`` (``protocol``, ``models``, ``paired``, ``gap``, ``power``, ``seeds``,
``train_subset``, ``unavailable``, ``excluded``, ``fidelity``: the scored pieces whose tokens lose
notes, see :func:`fidelity_block`; ``conditioning`` for a conditioned model only) and
the timing sidecar ``reports/eval.env.json``. A model whose folder is missing or does not load is
listed under ``unavailable`` with the reason; the stage still scores the others.

Every scoring of test pieces is a *look*: the test rows are read through
:func:`pipeline.decision.looks.test_tokens`, which appends the look to the test-access ledger
``reports/ledger.jsonl`` with the registration in force and the judging code's digest before
returning them; the digest of the test scores follows once they are computed. The ledger is a
log kept in git, not an output: it holds the time and commit of the event, and a look already
recorded (the same rows, registration and code) is not appended again. Called as a library
without ``ledger_path`` the look is recorded nowhere (tests); ``symkit evaluate`` always passes
it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator

from pipeline.conditions.assign import model_vocab, with_vocab
from pipeline.conditions.diagnostics import gap_summary, variant_sums
from pipeline.conditions.table import read_conditions
from pipeline.core.artifacts import (
    read_json,
    read_parquet,
    write_json,
    write_parquet,
    write_sidecar,
)
from pipeline.core.config import (
    ParamsError,
    RuntimeConfig,
    StageConfig,
    load_section,
    parse_section,
)
from pipeline.decision import ledger, looks
from pipeline.inference.loading import (
    ModelSpec,
    add_model_arguments,
    default_specs,
    load_models,
    replicate_specs,
    set_torch_threads,
)
from pipeline.inference.pieces import (
    match_facts,
    per_piece_schema,
    piece_facts,
    piece_table,
    score_codebooks,
    score_rows,
)
from pipeline.inference.protocol import clean_rows
from pipeline.stats.aggregate import (
    HELDOUT,
    aggregate,
    draw_train_subset,
    generalisation,
    power_blocks,
)
from pipeline.tokens.contract import TokenInfo, read_tokens

HELP = "score every model on val/test with one protocol"

SPLITS = ("val", "test")
class EvaluateConfig(StageConfig):
    """``evaluate`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "evaluate"

    splits: list[Literal["val", "test"]] = Field(default_factory=lambda: ["val", "test"],
                                                 min_length=1)
    n_boot: int = Field(2000, ge=100, le=100_000)
    ci_level: float = Field(0.95, gt=0.5, lt=1.0)
    seed: int = Field(0, ge=0)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    stride: int = Field(64, ge=1)
    train_pieces: int = Field(256, ge=0)

    @field_validator("splits")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("must not repeat a split")
        return v


def protocol_block(cfg: EvaluateConfig, info: TokenInfo) -> dict[str, Any]:
    """What is scored and how; ``symkit report`` compares it with the pre-registered one."""
    return {
        "targets": "each sequence x_1..x_n scored as x_1..x_n then EOS, every target once",
        "context": "BOS plus as much left context as the model allows",
        "transformer_stride": cfg.stride,
        "never_targets": "BOS, PAD and special ids inside sequences (removed before scoring)",
        "piece": "sum over the piece's sequences (tracks)",
        "units": "nats",
        "aggregate": "ratio of sums over pieces: total NLL / total tokens, notes or seconds",
        "notes_and_seconds_from": "data/manifest.parquet (n_notes, duration_s)",
        "bootstrap": {"unit": "group_id (data/splits.parquet)", "method": "percentile",
                      "n_boot": cfg.n_boot, "ci_level": cfg.ci_level, "seed": cfg.seed},
        "splits": list(cfg.splits),
        "training_seeds": "every training seed of a model is scored; its aggregates average each "
                          "piece's NLL over the seeds; the group bootstrap's interval of that "
                          "average is widened on each side, in quadrature, by a Student-t term "
                          "over the per-seed statistics (t at S - 1 degrees of freedom times "
                          "their standard deviation over sqrt(S); Welch-Satterthwaite when both "
                          "models have seeds)",
        "gap": "held-out pieces (val and test, those scored, pooled) minus the train subset",
        "train_subset": (f"{cfg.train_pieces} train pieces" if cfg.train_pieces
                         else "as many train pieces as held-out scored pieces")
                        + " (all when train has fewer): "
                        "the first of a permutation of the sorted usable train sha256s drawn "
                        "by default_rng([seed, 'train_subset' label, 0]); bootstrap replicates "
                        "from [seed, label, 1], the held-out side's from [seed, label, 2]",
        "vocab_size": info.vocab_size,
        "special_ids": {"bos_id": info.bos_id, "eos_id": info.eos_id, "pad_id": info.pad_id},
        "tokenizer_hash": info.tokenizer_hash,
        "split_hash": info.split_hash,
        **({} if not info.compound else {"compound": {
            "codebooks": [c["name"] for c in info.codebooks or []],
            "targets": "each of the n + 1 target steps (x_1..x_n, then a step of every "
                       "codebook's EOS) once; a step's NLL is the sum over its codebooks",
            "support": "each codebook's distribution renormalised without its PAD and BOS and "
                       "its masked ids (CPWord's Ignore_None, whose targets add 0)",
            "n_tokens": "steps"}}),
    }


@dataclass(frozen=True)
class EvaluateSummary:
    scored: dict[str, dict[str, float]]
    unavailable: dict[str, str]
    n_excluded: int
    gap: dict[str, float] = field(default_factory=dict)
    """Val minus train subset, nats per token, by model."""


def registration_check(path: Path | None, cfg: EvaluateConfig,
                       info: TokenInfo) -> dict[str, Any]:
    """Does this evaluation follow ``reports/preregistration.json``'s identity (its split hash and
    its ``evaluate`` section)? Recorded for readers of eval.json; the report's check
    (:func:`pipeline.decision.preregistration.check`) is the one that decides. ``None`` where the
    registration does not say (no file, or a record without an identity)."""
    registered = read_json(path) if path is not None and Path(path).exists() else None
    if not isinstance(registered, dict):
        return {"registered": False, "split_hash_matches": None, "protocol_matches": None}
    ident = registered.get("identity")
    if not isinstance(ident, dict):
        return {"registered": True, "split_hash_matches": None, "protocol_matches": None}
    try:
        frozen = parse_section("evaluate", (ident.get("params") or {}).get("evaluate"),
                               EvaluateConfig)
        same_protocol = frozen.model_dump() == cfg.model_dump()
    except ParamsError:
        same_protocol = False
    return {"registered": True, "split_hash_matches": ident.get("split_hash") == info.split_hash,
            "protocol_matches": same_protocol}


def run(cfg: EvaluateConfig, runtime: RuntimeConfig, *, tokens: Path, info: Path,
        manifest: Path, splits: Path, specs: Sequence[ModelSpec], per_piece: Path,
        report: Path, preregistration: Path | None = None,
        ledger_path: Path | None = None, conditions: Path | None = None) -> EvaluateSummary:
    """Score every available model on ``cfg.splits``; write the per-piece table and eval.json.
    A conditioned model reads its pieces' conditions from ``conditions``."""
    t0 = time.perf_counter()
    tok_info = TokenInfo.read(info)
    books = list(tok_info.codebook_keys())  # compound tokens: one key per codebook
    columns = ["sha256", "split", "track", "ids", *(["codes"] if books else []), "flags"]
    all_rows = read_tokens(tokens, columns, splits=[*(s for s in cfg.splits if s != "test"),
                                                    "train"])
    look = None
    if "test" in cfg.splits:  # a look: recorded in the ledger before the rows are read
        test, look = looks.test_tokens("evaluate", tokens, columns, ledger_path=ledger_path,
                                       registration=preregistration)
        all_rows = pd.concat([all_rows, test], ignore_index=True).sort_values(
            ["sha256", "track"], kind="stable").reset_index(drop=True)
    is_train = all_rows["split"] == "train"
    fidelity = fidelity_block(all_rows[~is_train])
    rows, excluded = clean_rows(all_rows[~is_train].reset_index(drop=True), tok_info)
    facts = piece_facts(read_parquet(manifest), read_parquet(splits))
    rows, more = match_facts(rows, facts)
    excluded["pieces"] = sorted(excluded["pieces"] + more, key=lambda p: p["sha256"])
    pieces = facts[facts["sha256"].isin(set(rows["sha256"]))]
    n_held = rows.loc[rows["split"].isin(HELDOUT), "sha256"].nunique()
    train, train_block = _train_subset(all_rows[is_train].reset_index(drop=True), tok_info,
                                       facts, (cfg.train_pieces or n_held) if n_held else 0,
                                       cfg.seed)
    train_pieces = facts[facts["sha256"].isin(set(train["sha256"]))]

    specs = [r for spec in specs for r in replicate_specs(spec)]
    set_torch_threads(runtime.torch_threads, [s.key for s in specs])  # results depend on it
    models, unavailable = load_models(specs, cfg.device, tok_info)
    cond_of = _condition_ids(models, conditions)
    tables, seconds, row_nll = [], {}, {}

    def scored(model: Any, key: str, part: pd.DataFrame, facts_of: pd.DataFrame,
               spec: ModelSpec) -> pd.DataFrame:
        if books:  # compound: the joint NLL and each codebook's share of it
            nll, shares = score_codebooks(model, list(part["ids"]))
            return piece_table(part, nll, facts_of, spec.name, spec.seed,
                               dict(zip(books, shares.T, strict=True)))
        nll = score_rows(model, list(part["ids"]), cond_of(key, part["sha256"]))
        if part is rows:  # a conditioned model's val rows are its diagnostic's "correct" side
            row_nll[key] = nll
        return piece_table(part, nll, facts_of, spec.name, spec.seed)

    for spec in sorted((s for s in specs if s.key in models), key=lambda s: s.key):
        model, key = models[spec.key], spec.key
        t = time.perf_counter()
        tables.append(scored(model, key, rows, pieces, spec))
        seconds[key] = time.perf_counter() - t
        if len(train):  # scored apart, so val/test scores never depend on the subset
            t = time.perf_counter()
            tables.append(scored(model, key, train, train_pieces, spec))
            seconds[f"{key}.train_subset"] = time.perf_counter() - t
    schema = per_piece_schema(books)
    table = (pd.concat(tables, ignore_index=True) if tables
             else pd.DataFrame({c: [] for c in schema.names}))
    table = table.sort_values(["model", "seed", "split", "sha256"]).reset_index(drop=True)
    names = sorted(set(table["model"]))
    write_parquet(per_piece, pa.Table.from_pandas(table, schema=schema, preserve_index=False))
    if look is not None:  # the scores of the look, before anyone reads them
        look.scored(ledger.results_digest(ledger.test_rows(table)))
    agg, paired = aggregate(table, cfg, names)
    train_metrics, gap = generalisation(table, cfg, names)
    for name, block in train_metrics.items():
        agg[name]["train_subset"] = block
    t = time.perf_counter()
    is_val = (rows["split"] == "val").to_numpy()
    conditioning = conditioning_block(models, specs, cond_of, rows[is_val], facts, cfg,
                                      {k: v[is_val] for k, v in row_nll.items()})
    if conditioning:
        seconds["conditioning"] = time.perf_counter() - t
    n_test_groups = facts.loc[facts["split"] == "test", "group_id"].nunique()
    excluded_counts: dict[str, int] = {}
    for p in excluded["pieces"]:
        excluded_counts[p["reason"]] = excluded_counts.get(p["reason"], 0) + 1
    write_json(report, {
        "protocol": protocol_block(cfg, tok_info),
        "models": agg,
        "paired": paired,
        "gap": gap,
        "power": power_blocks(table, cfg, names, n_test_groups),
        "seeds": {n: [int(x) for x in sorted(table.loc[table["model"] == n, "seed"].dropna()
                                            .unique())] for n in names},
        "train_subset": train_block,
        "unavailable": unavailable,
        "excluded": {**excluded, "counts": excluded_counts},
        "fidelity": fidelity,
        "preregistration": registration_check(preregistration, cfg, tok_info),
        **({"conditioning": conditioning} if conditioning else {}),
        **({"codebooks": codebook_block(table, books)} if books else {}),
    })
    write_sidecar(report.with_name(report.stem + ".env.json"),
                  {"seconds": {**seconds, "total": time.perf_counter() - t0},
                   "device": cfg.device, "torch_threads": runtime.torch_threads})
    scored = {n: {s: agg[n][s]["nats_per_token"]["value"] for s in cfg.splits} for n in agg}
    return EvaluateSummary(scored, unavailable, len(excluded["pieces"]),
                           {n: g["nats_per_token"]["value"] for n, g in gap.items()})


def codebook_block(table: pd.DataFrame, books: Sequence[str]) -> dict[str, Any]:
    """eval.json's ``codebooks`` (compound tokens): per model and split, each codebook's NLL
    per note and per step (ratios of sums over the split's pieces, training seeds pooled), and
    its share of the joint NLL."""
    out: dict[str, Any] = {}
    for (name, split), part in table.groupby(["model", "split"], sort=True):
        total, notes, steps = part["nll_nats"].sum(), part["n_notes"].sum(), part["n_tokens"].sum()
        out.setdefault(str(name), {})[str(split)] = {
            key: {"nats_per_note": float(part[f"nll_nats_{key}"].sum() / max(notes, 1)),
                  "nats_per_token": float(part[f"nll_nats_{key}"].sum() / max(steps, 1)),
                  "share": float(part[f"nll_nats_{key}"].sum() / total) if total else None}
            for key in books}
    return out


def _condition_ids(models: dict[str, Any], conditions: Path | None):
    """``cond_of(key, sha256s)``: the (N, K) condition ids of pieces for the model ``key`` (in its
    own vocabulary), or None for an unconditioned model. The table is read only when a model is
    conditioned."""
    vocabs = {k: model_vocab(getattr(m, "condition", None)) for k, m in models.items()}
    vocabs = {k: v for k, v in vocabs.items() if v is not None}
    if not vocabs:
        return lambda key, shas: None
    if conditions is None:
        key = sorted(vocabs)[0]
        raise ParamsError(f"{key} is conditioned on {list(vocabs[key].names)}: pass the "
                          "condition table (--conditions data/conditions.parquet)")
    table = read_conditions(conditions)
    bound = {k: with_vocab(table, v) for k, v in vocabs.items()}

    def cond_of(key: str, shas: Sequence[str]) -> np.ndarray | None:
        return bound[key].many(list(shas)) if key in bound else None
    return cond_of


def conditioning_block(models: dict[str, Any], specs: Sequence[ModelSpec], cond_of: Any,
                       val: pd.DataFrame, facts: pd.DataFrame, cfg: EvaluateConfig,
                       scored: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """eval.json's ``conditioning``: per conditioned model, the shuffled-condition diagnostic on
    val (:mod:`pipeline.conditions.diagnostics`), its sums averaged over the training seeds, and
    each seed's own. ``scored``: each model's NLL of the ``val`` rows with their own conditions,
    already computed by the scoring pass (only shuffled and removed are scored here). Empty when
    no model is conditioned or val was not scored."""
    if val.empty:
        return {}
    fact = facts.set_index("sha256").loc[val["sha256"]]
    groups = fact["group_id"].astype(str).tolist()
    first = ~val["sha256"].duplicated().to_numpy()  # a piece's notes count on its first row
    notes = np.where(first, fact["n_notes"].to_numpy(dtype=np.float64), 0.0)
    by_model: dict[str, list[tuple[int | None, dict[str, np.ndarray]]]] = {}
    names: dict[str, list[str]] = {}
    for spec in sorted((s for s in specs if s.key in models), key=lambda s: s.key):
        cond = cond_of(spec.key, val["sha256"])
        if cond is None:
            continue
        vocab = model_vocab(models[spec.key].condition)
        sums = variant_sums(models[spec.key], list(val["ids"]), cond, vocab.none_ids(), cfg.seed,
                            correct=(scored or {}).get(spec.key))
        by_model.setdefault(spec.name, []).append((spec.seed, sums))
        names[spec.name] = list(vocab.names)
    out = {}
    for name, runs in sorted(by_model.items()):
        mean = {k: np.mean([r[k] for _, r in runs], axis=0) for k in runs[0][1]}
        kw = {"seed": cfg.seed, "n_boot": cfg.n_boot, "level": cfg.ci_level}
        out[name] = {"split": "val", "conditions": names[name],
                     "shuffle_seed": cfg.seed,
                     **gap_summary(mean, groups, notes, **kw),
                     "per_seed": {str(seed): gap_summary(sums, groups, notes, **kw)
                                  for seed, sums in runs if seed is not None}}
    return out


def _train_subset(rows: pd.DataFrame, info: TokenInfo, facts: pd.DataFrame, n: int, seed: int
                  ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The train subset's token rows (the protocol's rules applied, as for val and test) and the
    ``train_subset`` block of eval.json. Pieces are drawn among the usable ones, so the subset
    has val's size whenever train has enough; excluded train pieces are counted, not listed."""
    usable, excluded = clean_rows(rows, info)
    usable, more = match_facts(usable, facts)
    chosen = draw_train_subset(usable["sha256"], n, seed)
    subset = usable[usable["sha256"].isin(set(chosen))].reset_index(drop=True)
    return subset, {"n_pieces": len(chosen), "n_wanted": int(n),
                    "n_usable": int(usable["sha256"].nunique()),
                    "n_excluded": len(excluded["pieces"]) + len(more)}


LOSSY_FLAGS = ("model_lossy", "notes_dropped", "roundtrip_lossy")
"""tokenize's flags of a sequence whose tokens do not give back the piece's notes exactly."""


def fidelity_block(rows: pd.DataFrame) -> dict[str, Any]:
    """eval.json's ``fidelity``: the pieces (of the scored splits) whose tokens lose notes.

    Such a piece is still scored, per *source* note, like every other: within one run every model
    reads the same tokens, so the comparison between models is fair. Across tokenizers it is not (a
    tokenizer that drops notes has less to predict), so ``symkit compare`` leaves out every piece
    that some arm lists here. ``pieces``: ``sha256``, ``split``, ``flags`` (the lossy flags of any
    of its sequences), sorted by sha256; ``counts``: pieces per split.
    """
    lossy: dict[str, tuple[str, set[str]]] = {}
    for sha, split, flags in zip(rows["sha256"], rows["split"], rows["flags"], strict=True):
        found = {str(f) for f in (flags if flags is not None else []) if str(f) in LOSSY_FLAGS}
        if found:
            lossy.setdefault(sha, (split, set()))[1].update(found)
    pieces = [{"sha256": sha, "split": split, "flags": sorted(flags)}
              for sha, (split, flags) in sorted(lossy.items())]
    counts: dict[str, int] = {}
    for p in pieces:
        counts[p["split"]] = counts.get(p["split"], 0) + 1
    return {"pieces": pieces, "counts": dict(sorted(counts.items()))}


# ---- CLI ---------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    a("--info", type=Path, default=Path("data/tokens/info.json"))
    a("--manifest", type=Path, default=Path("data/manifest.parquet"))
    a("--splits", type=Path, default=Path("data/splits.parquet"))
    add_model_arguments(parser)
    a("--per-piece", type=Path, default=Path("reports/eval/per_piece.parquet"))
    a("--report", type=Path, default=Path("reports/eval.json"))
    a("--preregistration", type=Path, default=Path("reports/preregistration.json"))
    a("--conditions", type=Path, default=Path("data/conditions.parquet"),
      help="condition table (`symkit conditions`); read only for a conditioned model")
    a("--ledger", type=Path, default=ledger.LEDGER,
      help="test-access ledger this run's test scores are appended to")
    a("--pilot", type=Path, default=None, metavar="DIR",
      help="a val pilot: score val (and the train subset) only, whatever evaluate.splits says, "
           "and write eval.json and per_piece.parquet into DIR, for `symkit preregister` "
           "(no test piece is read)")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("evaluate", args.params, EvaluateConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    per_piece, report, book = args.per_piece, args.report, args.ledger
    if args.pilot is not None:  # val only: nothing to record, no test row read
        cfg = cfg.model_copy(update={"splits": ["val"]})
        per_piece, report, book = args.pilot / "per_piece.parquet", args.pilot / "eval.json", None
    summary = run(cfg, runtime, tokens=args.tokens, info=args.info, manifest=args.manifest,
                  splits=args.splits,
                  specs=default_specs(args.ngram_dir, args.transformer_dir, stride=cfg.stride),
                  per_piece=per_piece, report=report,
                  preregistration=args.preregistration, ledger_path=book,
                  conditions=args.conditions)
    for name, by_split in summary.scored.items():
        figures = ", ".join(f"{s} {v:.4f}" for s, v in by_split.items())
        gap = summary.gap.get(name)
        figures += "" if gap is None else f"; held-out - train subset {gap:+.4f}"
        print(f"evaluate: {name}: nats/token {figures}")
    for name, reason in summary.unavailable.items():
        print(f"evaluate: {name} not scored ({reason})", file=sys.stderr)
    if summary.n_excluded:
        print(f"evaluate: {summary.n_excluded} pieces excluded (see {args.report})",
              file=sys.stderr)
    return 0

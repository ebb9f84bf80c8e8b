"""``symkit evaluate``: score every model on val and test with one protocol.

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
  (``pipeline.scoring.bootstrap``); paired differences reuse the same replicates for both models.
- A pair's relative improvement ``(A − B) / A`` is formed inside each of those replicates, with
  two robustness summaries beside it (median piece effect, effect without the top 3 groups).
- The transformer slides windows of ``max_seq_len`` tokens by ``evaluate.stride``.

Inputs: ``data/tokens/tokens.parquet``, ``data/tokens/info.json``, ``data/manifest.parquet``,
``data/splits.parquet``, model folders (``data/ngram``, ``data/transformer``). Outputs:
``reports/eval/per_piece.parquet`` (``sha256``, ``split``, ``model``, ``group_id``,
``nll_nats``, ``n_tokens``, ``n_notes``, ``duration_s``; sorted by model, split, sha256),
``reports/eval.json`` (``protocol``, ``models``, ``paired``, ``unavailable``, ``excluded``) and
the timing sidecar ``reports/eval.env.json``. A model whose folder is missing or does not load is
listed under ``unavailable`` with the reason; the stage still scores the others.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator

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
from pipeline.scoring.bootstrap import (
    bootstrap_weights,
    effect_without_top_groups,
    group_sums,
    median_piece_effect,
    paired_diff_ci,
    paired_rel_ci,
    ratio_ci,
)
from pipeline.scoring.loading import (
    ModelSpec,
    add_model_arguments,
    default_specs,
    load_models,
    set_torch_threads,
)
from pipeline.scoring.protocol import clean_sequences
from pipeline.tokens.contract import TokenInfo, read_tokens

SPLITS = ("val", "test")
PER_PIECE_SCHEMA = pa.schema([
    ("sha256", pa.string()), ("split", pa.string()), ("model", pa.string()),
    ("group_id", pa.string()), ("nll_nats", pa.float64()), ("n_tokens", pa.int64()),
    ("n_notes", pa.int64()), ("duration_s", pa.float64()),
])


class EvaluateConfig(StageConfig):
    """``evaluate`` section of params.yaml; each key is documented there, beside its value."""

    splits: list[Literal["val", "test"]] = Field(default_factory=lambda: ["val", "test"],
                                                 min_length=1)
    n_boot: int = Field(2000, ge=100, le=100_000)
    ci_level: float = Field(0.95, gt=0.5, lt=1.0)
    seed: int = Field(0, ge=0)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    stride: int = Field(64, ge=1)

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
        "vocab_size": info.vocab_size,
        "special_ids": {"bos_id": info.bos_id, "eos_id": info.eos_id, "pad_id": info.pad_id},
        "tokenizer_hash": info.tokenizer_hash,
        "split_hash": info.split_hash,
    }


# ---- scoring ---------------------------------------------------------------------------------
def score_rows(model: Any, ids: Sequence[np.ndarray]) -> np.ndarray:
    """Total NLL (nats) of each sequence under the protocol; checks the target count."""
    per = model.token_nll(list(ids))
    for i, (t, s) in enumerate(zip(per, ids, strict=True)):
        if len(t) != len(s) + 1:
            raise ValueError(f"{type(model).__name__}.token_nll returned {len(t)} values for a "
                             f"sequence of {len(s)} tokens (row {i}); the protocol needs len + 1")
    return np.array([math.fsum(t) for t in per], dtype=np.float64)


def piece_table(rows: pd.DataFrame, nll: np.ndarray, pieces: pd.DataFrame, name: str
                ) -> pd.DataFrame:
    """Per-piece sums for one model: rows (one per sequence) -> one row per piece."""
    df = pd.DataFrame({"sha256": rows["sha256"].to_numpy(), "nll_nats": nll,
                       "n_tokens": np.array([len(s) + 1 for s in rows["ids"]], dtype=np.int64)})
    agg = df.groupby("sha256", sort=True).sum().reset_index()
    out = agg.merge(pieces, on="sha256", how="inner", validate="one_to_one")
    out["model"] = name
    out["n_notes"] = out["n_notes"].astype(np.int64)
    return out[PER_PIECE_SCHEMA.names]


def split_metrics(pp: pd.DataFrame, weights: np.ndarray, codes: np.ndarray, n_groups: int,
                  level: float) -> dict[str, Any]:
    """Aggregates of one model on one split (``pp`` rows follow ``codes``)."""
    nll = group_sums(codes, pp["nll_nats"], n_groups)
    out: dict[str, Any] = {
        "n_pieces": len(pp), "n_groups": int(np.count_nonzero(np.bincount(codes,
                                                                           minlength=n_groups))),
        "n_tokens": int(pp["n_tokens"].sum()), "n_notes": int(pp["n_notes"].sum()),
        "duration_s": float(pp["duration_s"].sum()), "nll_nats": float(pp["nll_nats"].sum()),
    }
    for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes"),
                     ("nats_per_second", "duration_s")):
        out[key] = ratio_ci(nll, group_sums(codes, pp[col], n_groups), weights, level)
    npt = out["nats_per_token"]
    out["bits_per_token"] = {k: v / math.log(2) for k, v in npt.items()}
    out["perplexity"] = {k: math.exp(v) if math.isfinite(v) else v for k, v in npt.items()}
    return out


def paired_metrics(a: pd.DataFrame, b: pd.DataFrame, weights: np.ndarray, codes: np.ndarray,
                   group_names: np.ndarray, level: float) -> dict[str, Any]:
    """A − B on the same pieces (rows aligned) and the same bootstrap replicates, and B's relative
    improvement over A, ``(A − B) / A``, formed inside each replicate."""
    n_groups = len(group_names)

    def g(df: pd.DataFrame, col: str) -> np.ndarray:
        return group_sums(codes, df[col], n_groups)

    out: dict[str, Any] = {"n_pieces": len(a)}
    for key, col in (("nats_per_token", "n_tokens"), ("nats_per_note", "n_notes"),
                     ("nats_per_second", "duration_s")):
        out[key] = paired_diff_ci(g(a, "nll_nats"), g(a, col), g(b, "nll_nats"), g(b, col),
                                  weights, level)
    # Both models score the same pieces, so notes, seconds or tokens cancel in (A − B) / A:
    # one relative improvement serves every unit (per note is computed).
    rel = paired_rel_ci(g(a, "nll_nats"), g(a, "n_notes"), g(b, "nll_nats"), g(b, "n_notes"),
                        weights, level)
    rel["median_piece_effect"] = median_piece_effect(a["nll_nats"].to_numpy(),
                                                     b["nll_nats"].to_numpy())
    top = effect_without_top_groups(g(a, "nll_nats"), g(b, "nll_nats"), k=3)
    rel["without_top3_groups"] = {"value": top["value"],
                                  "dropped_groups": [str(group_names[i]) for i in top["dropped"]]}
    out["rel_improvement"] = rel
    return out


def aggregate(per_piece: pd.DataFrame, cfg: EvaluateConfig, names: Sequence[str]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(models, paired)`` blocks of eval.json from the per-piece table."""
    models: dict[str, Any] = {n: {} for n in names}
    paired: dict[str, Any] = {f"{a}_minus_{b}": {} for a, b in itertools.combinations(names, 2)}
    for i, split in enumerate(cfg.splits):
        part = per_piece[per_piece["split"] == split]
        shas = sorted(set(part["sha256"]))
        groups = part.drop_duplicates("sha256").set_index("sha256").loc[shas, "group_id"]
        group_names, codes = np.unique(groups.to_numpy(dtype=str), return_inverse=True)
        # One Generator per split, from (seed, split index): adding a split changes no other.
        rng = np.random.default_rng([cfg.seed, i])
        weights = bootstrap_weights(len(group_names), cfg.n_boot, rng)
        aligned = {n: part[part["model"] == n].set_index("sha256").loc[shas] for n in names}
        for n in names:
            models[n][split] = split_metrics(aligned[n], weights, codes, len(group_names),
                                             cfg.ci_level)
        for a, b in itertools.combinations(names, 2):
            paired[f"{a}_minus_{b}"][split] = paired_metrics(
                aligned[a], aligned[b], weights, codes, group_names, cfg.ci_level)
    return models, paired


def piece_facts(manifest: pd.DataFrame, splits: pd.DataFrame) -> pd.DataFrame:
    """sha256 -> split, group_id, n_notes, duration_s (manifest rows of equal bytes agree)."""
    man = manifest.assign(_ok=manifest["status"] != "ok") if "status" in manifest else manifest
    man = man.sort_values([c for c in ("sha256", "_ok") if c in man]).drop_duplicates("sha256")
    facts = splits[["sha256", "split", "group_id"]].merge(
        man[["sha256", "n_notes", "duration_s"]], on="sha256", how="left", validate="one_to_one")
    facts["group_id"] = facts["group_id"].astype(str)
    return facts


@dataclass(frozen=True)
class EvaluateSummary:
    scored: dict[str, dict[str, float]]
    unavailable: dict[str, str]
    n_excluded: int


def registration_check(path: Path | None, cfg: EvaluateConfig,
                       info: TokenInfo) -> dict[str, Any]:
    """Does this evaluation follow ``reports/preregistration.json``? (Recorded, never enforced:
    the report states any deviation prominently.)"""
    registered = read_json(path) if path is not None and Path(path).exists() else None
    if not isinstance(registered, dict):
        return {"registered": False, "split_hash_matches": None, "protocol_matches": None}
    try:
        frozen = parse_section("evaluate", (registered.get("protocol") or {}).get("params"),
                               EvaluateConfig)
        same_protocol = frozen.model_dump() == cfg.model_dump()
    except ParamsError:
        same_protocol = False
    return {"registered": True,
            "split_hash_matches": registered.get("split_hash") == info.split_hash,
            "protocol_matches": same_protocol}


def run(cfg: EvaluateConfig, runtime: RuntimeConfig, *, tokens: Path, info: Path,
        manifest: Path, splits: Path, specs: Sequence[ModelSpec], per_piece: Path,
        report: Path, preregistration: Path | None = None) -> EvaluateSummary:
    """Score every available model on ``cfg.splits``; write the per-piece table and eval.json."""
    t0 = time.perf_counter()
    tok_info = TokenInfo.read(info)
    rows = read_tokens(tokens, ["sha256", "split", "track", "ids"], splits=cfg.splits)
    rows, excluded = clean_sequences(rows, tok_info)
    facts = piece_facts(read_parquet(manifest), read_parquet(splits))
    rows, more = _match_facts(rows, facts)
    excluded["pieces"] = sorted(excluded["pieces"] + more, key=lambda p: p["sha256"])
    pieces = facts[facts["sha256"].isin(set(rows["sha256"]))]

    models, unavailable = load_models(specs, cfg.device, tok_info)
    set_torch_threads(runtime.torch_threads, list(models))  # results depend on it
    tables, seconds = [], {}
    for name in sorted(models):
        t = time.perf_counter()
        nll = score_rows(models[name], list(rows["ids"]))
        tables.append(piece_table(rows, nll, pieces, name))
        seconds[name] = time.perf_counter() - t
    table = (pd.concat(tables, ignore_index=True) if tables
             else pd.DataFrame({c: [] for c in PER_PIECE_SCHEMA.names}))
    table = table.sort_values(["model", "split", "sha256"]).reset_index(drop=True)
    write_parquet(per_piece, pa.Table.from_pandas(table, schema=PER_PIECE_SCHEMA,
                                                  preserve_index=False))
    agg, paired = aggregate(table, cfg, sorted(models))
    excluded_counts: dict[str, int] = {}
    for p in excluded["pieces"]:
        excluded_counts[p["reason"]] = excluded_counts.get(p["reason"], 0) + 1
    write_json(report, {
        "protocol": protocol_block(cfg, tok_info),
        "models": agg,
        "paired": paired,
        "unavailable": unavailable,
        "excluded": {**excluded, "counts": excluded_counts},
        "preregistration": registration_check(preregistration, cfg, tok_info),
    })
    write_sidecar(report.with_name(report.stem + ".env.json"),
                  {"seconds": {**seconds, "total": time.perf_counter() - t0},
                   "device": cfg.device, "torch_threads": runtime.torch_threads})
    scored = {n: {s: agg[n][s]["nats_per_token"]["value"] for s in cfg.splits} for n in agg}
    return EvaluateSummary(scored, unavailable, len(excluded["pieces"]))


def _match_facts(rows: pd.DataFrame, facts: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
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


def main(args: argparse.Namespace) -> int:
    cfg = load_section("evaluate", args.params, EvaluateConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    summary = run(cfg, runtime, tokens=args.tokens, info=args.info, manifest=args.manifest,
                  splits=args.splits,
                  specs=default_specs(args.ngram_dir, args.transformer_dir, stride=cfg.stride),
                  per_piece=args.per_piece, report=args.report,
                  preregistration=args.preregistration)
    for name, by_split in summary.scored.items():
        figures = ", ".join(f"{s} {v:.4f}" for s, v in by_split.items())
        print(f"evaluate: {name}: nats/token {figures}")
    for name, reason in summary.unavailable.items():
        print(f"evaluate: {name} not scored ({reason})", file=sys.stderr)
    if summary.n_excluded:
        print(f"evaluate: {summary.n_excluded} pieces excluded (see {args.report})",
              file=sys.stderr)
    return 0

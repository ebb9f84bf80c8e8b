"""The descriptive sections of the report: data card, models, metrics, memorisation, music,
samples, environment. Each function reads only what it is given and degrades to "not available"
when an input is missing; none raises on a missing key or column.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from pipeline.core.artifacts import read_table_or_none
from pipeline.core.config import StageConfig
from pipeline.decision.metrics import flatten, labelled
from pipeline.music.descriptors import STATS
from pipeline.render.audio import midi_to_flac, notes_to_flac
from pipeline.render.document import (
    NA,
    Audio,
    Details,
    Document,
    Figure,
    Heading,
    Para,
    Table,
    fmt,
)
from pipeline.render.figures import (
    band_png,
    count_bars_png,
    grouped_bars_png,
    histograms_png,
    pair_rolls_png,
)
from pipeline.report.conditioning_section import conditioning


class ReportConfig(StageConfig):
    """``report`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "report"

    title: str = Field("symkit experiment report", min_length=1)
    max_samples_shown: int = Field(8, ge=0, le=1000)
    nll_unit: Literal["note", "token", "second"] = "note"
    nll_split: Literal["val", "test"] = "test"
    digits: int = Field(4, ge=1, le=12)


def kv_rows(obj: Any, prefix: str, digits: int, limit: int = 200) -> list[list[str]]:
    flat = flatten(obj, prefix) if obj is not None else {}
    return [[k, fmt(v, digits)] for k, v in list(flat.items())[:limit]]


def _na(doc: Document, what: str) -> None:
    doc.add(Para(f"{what}: {NA}.", "note"))


def kv_block(obj: Any, stem: str, digits: int) -> Details | Para:
    """A stage report's every value, folded away under a one-line summary (reference material,
    not reading matter), or a "not available" note."""
    rows = kv_rows(obj, stem, digits)
    return Details(f"Every value in reports/{stem}.json ({len(rows)})",
                   [Table(["key", "value"], rows)]) if rows else \
        Para(f"reports/{stem}.json: {NA}.", "note")


def _counts(df: pd.DataFrame | None, col: str) -> list[list[str]]:
    if df is None or col not in df.columns:
        return []
    vc = df[col].fillna("").astype(str).value_counts()
    return [[k or "(none)", str(int(vc[k]))] for k in sorted(vc.index)]


def read_notes(path: Path, shas: list[str]) -> dict[str, dict[str, Any]] | None:
    """The notes (onset, duration, pitch) of the pieces ``shas`` from data/notes.parquet, read
    for those rows only; None when the file is missing or unreadable."""
    try:
        table = pq.read_table(path, columns=["sha256", "onset", "duration", "pitch"],
                              filters=[("sha256", "in", shas)]).to_pandas()
    except (OSError, ValueError, pa.ArrowException):
        return None
    return {r["sha256"]: r for r in table.to_dict("records")}


TIER_WORDS = {"note": "the same notes saved differently",
              "transposed": "the same music transposed or uniformly time-scaled",
              "melody": "the same top-voice melody under other harmony",
              "near": "a near duplicate, confirmed by shingle similarity or by alignment of the "
                      "notes or melodies"}


def dedupe_tiers(dedupe: Any) -> list[Figure]:
    """Pairs per dedupe tier, zeros included, and the near candidates verification rejected,
    from reports/dedupe.json."""
    if not isinstance(dedupe, dict):
        return []
    rows = [("byte-identical files", dedupe.get("byte_duplicates"))]
    rows += [(f"{tier}: {TIER_SHORT[tier]}", dedupe.get(f"{tier}_pairs")) for tier in TIER_SHORT]
    rows += [(f"near, confirmed by {key.removeprefix('near_by_')}", v)
             for key, v in dedupe.items() if key.startswith("near_by_")]
    rows.append(("near: candidates rejected", dedupe.get("near_rejected")))
    rows = [(label, int(v)) for label, v in rows if isinstance(v, int | float)]
    if not rows:
        return []
    return [Figure(
        "Duplicates found by each dedupe tier, in the order the tiers run (a pair counts for the "
        "first tier that links it; byte-identical files are set aside at ingest), the rule that "
        "confirmed each near pair, and the near-duplicate candidates that verification "
        "rejected. Look for a tier far above what the corpus's provenance suggests (over-"
        "merging) or empty where copies are expected.",
        count_bars_png([r[0] for r in rows], [r[1] for r in rows], "files or pairs"))]


TIER_SHORT = {"note": "same notes", "transposed": "transposed or time-scaled",
              "melody": "same melody", "near": "near duplicates"}


def dedupe_examples(pairs: pd.DataFrame | None, notes_path: Path) -> list[Figure | Para]:
    """One example pair per dedupe tier, the most similar (ties: smallest sha256s), as
    side-by-side piano rolls of their first 32 beats."""
    if pairs is None or pairs.empty or not {"a", "b", "tier"} <= set(pairs.columns):
        return []
    sim = pairs["similarity"] if "similarity" in pairs.columns else 0.0
    ranked = pairs.assign(rank_sim=sim).sort_values(["tier", "rank_sim", "a", "b"],
                                               ascending=[True, False, True, True])
    examples = ranked.drop_duplicates("tier")
    wanted = sorted(set(examples["a"]) | set(examples["b"]))
    by_sha = read_notes(notes_path, wanted)
    if by_sha is None:
        return [Para(f"Example pairs of duplicates: data/notes.parquet {NA}.", "note")]
    out: list[Figure | Para] = []
    for row in examples.itertuples():
        if row.a not in by_sha or row.b not in by_sha:
            continue
        similarity = f", similarity {row.rank_sim:.2f}" if "similarity" in pairs.columns else ""
        out.append(Figure(
            f"Dedupe tier {row.tier} ({TIER_WORDS.get(row.tier, row.tier)}): the most similar "
            f"pair{similarity}, pieces {row.a[:12]} and {row.b[:12]}, first 32 beats. The two "
            "rolls should share their material as the tier says; a pair that looks unrelated "
            "would be a false link.",
            pair_rolls_png(by_sha[row.a], by_sha[row.b], (row.a[:12], row.b[:12]))))
    return out


def split_notes(splits: pd.DataFrame | None, manifest: pd.DataFrame | None) -> dict[str, int]:
    """split -> total notes of its pieces ({} without the tables or their columns)."""
    if splits is None or manifest is None or "n_notes" not in manifest.columns \
            or not {"split", "sha256"} <= set(splits.columns):
        return {}
    notes = manifest.drop_duplicates("sha256").set_index("sha256")["n_notes"]
    joined = splits.assign(n=splits["sha256"].map(notes).fillna(0))
    return {str(k): int(v) for k, v in joined.groupby("split")["n"].sum().items()}


def split_counts(splits: pd.DataFrame | None) -> dict[str, tuple[int, int]]:
    """split -> (pieces, groups) from data/splits.parquet ({} without it or its columns)."""
    if splits is None or not {"split", "sha256", "group_id"} <= set(splits.columns):
        return {}
    out = {}
    for s in sorted(splits["split"].astype(str).unique()):
        part = splits[splits["split"].astype(str) == s]
        out[s] = (len(part), int(part["group_id"].nunique()))
    return out


def data_card(doc: Document, cfg: ReportConfig, reports: Mapping[str, Any],
              inputs: Mapping[str, Path]) -> None:
    d = cfg.digits
    doc.add(Heading("Data card"))
    manifest = read_table_or_none(inputs["manifest"])
    if manifest is None:
        _na(doc, "data/manifest.parquet")
    else:
        reasons = _counts(manifest[manifest["status"] == "quarantined"]
                          if "status" in manifest.columns else None, "reason")
        doc.add(Para(f"{len(manifest)} files found."),
                Table(["status", "files"], _counts(manifest, "status")),
                Table(["quarantine reason", "files"], reasons) if reasons
                else Para("No file was quarantined.", "note"))
        lic = next((c for c in ("licence", "license", "licence_name") if c in manifest.columns),
                   None)
        if lic:
            doc.add(Table(["licence", "files"], _counts(manifest, lic)))
        else:
            doc.add(Para("Licences: not given in the metadata.", "note"))
    pairs = read_table_or_none(inputs["pairs"])
    doc.add(Heading("Deduplication", 3),
            Table(["tier", "duplicate pairs"], _counts(pairs, "tier")) if pairs is not None
            else Para(f"data/dedupe/pairs.parquet: {NA}.", "note"),
            *dedupe_tiers(reports.get("dedupe")))
    doc.add(*dedupe_examples(pairs, Path(inputs["notes"])),
            kv_block(reports.get("dedupe"), "dedupe", d))
    splits = read_table_or_none(inputs["splits"])
    counts = split_counts(splits)
    doc.add(Heading("Split", 3))
    if counts:
        notes = split_notes(splits, manifest)
        order = [s for s in ("train", "val", "test") if s in counts]
        order += sorted(set(counts) - set(order))
        doc.add(Table(["split", "pieces", "groups", "notes"],
                      [[s, str(counts[s][0]), str(counts[s][1]), fmt(notes.get(s))]
                       for s in order]))
        total = {k: sum(v[i] for v in counts.values()) for i, k in enumerate(("pieces",
                                                                              "groups"))}
        shares = {"pieces": [counts[s][0] / total["pieces"] for s in order],
                  "groups": [counts[s][1] / total["groups"] for s in order]}
        if notes and sum(notes.values()):
            shares["notes"] = [notes.get(s, 0) / sum(notes.values()) for s in order]
        doc.add(Figure("Share of pieces, groups and notes in each split. The three bars of a "
                       "split should be about equal: a split whose share of notes is far from "
                       "its share of pieces holds unusually long or short pieces, and one whose "
                       "share of groups is far from its share of pieces holds unusually large "
                       "or small groups.", grouped_bars_png(order, shares)))
    else:
        _na(doc, "data/splits.parquet")
    doc.add(kv_block(reports.get("split"), "split", d), Heading("Leakage audit", 3))
    leak_png = Path(inputs["leakage_png"])
    if leak_png.is_file():
        doc.add(Figure("Similarity (exact shingle Jaccard) of each test piece to its nearest "
                       "neighbour, for this grouped split and for a random split of the same "
                       "pieces. Look at the right tail: test pieces close to a train piece are "
                       "leaks; a grouped split should have fewer there than the random one.",
                       leak_png.read_bytes(),
                       Path(os.path.relpath(leak_png, Path(inputs["md_out"]).parent))
                       .as_posix()))
    doc.add(kv_block(reports.get("leakage"), "leakage", d),
            Heading("Contamination against other corpora", 3),
            *contamination(reports.get("contamination"), Path(inputs["contamination_dir"]), d),
            Heading("Tokenisation", 3),
            *tokenisation_table(reports.get("tokenize"), d),
            kv_block(reports.get("tokenize"), "tokenize", d))


MAX_MATCHES_SHOWN = 10


def contamination(summary: Any, folder: Path, d: int) -> list[Table | Para]:
    """What ``symkit contamination`` found: per reference corpus its files, per held-out split
    the pieces with a match in any of them by strongest tier, and the first matches."""
    if not isinstance(summary, dict):
        return [Para(f"reports/contamination.json: {NA}.", "note")]
    refs = [r for r in summary.get("references") or [] if isinstance(r, dict)]
    if not refs:
        return [Para("No reference corpus declared: name one in contamination.against "
                     "(docs/contamination.md) to learn which held-out pieces also appear in "
                     "another corpus, such as a model's pretraining set.", "note")]
    def reasons(r: dict) -> str:
        why = ", ".join(f"{k} {v}" for k, v in (r.get("by_reason") or {}).items())
        return fmt((r.get("by_status") or {}).get("quarantined")) + (f" ({why})" if why else "")

    out: list[Table | Para] = [Para(
        "Each held-out piece was compared with every piece of these corpora by dedupe's tiers "
        "and rules (docs/contamination.md): a match means its music, or a near copy of it, also "
        "lies there, and a model trained on that corpus has seen it."), Table(
        ["reference corpus", "files", "ok", "quarantined", "byte duplicates",
         "its pieces matched"],
        [[str(r.get("reference")), fmt(r.get("files")),
          fmt((r.get("by_status") or {}).get("ok")), reasons(r),
          fmt((r.get("by_status") or {}).get("duplicate")), fmt(r.get("pieces_matched"))]
         for r in refs])]
    tiers = list(summary.get("tiers") or TIER_SHORT)
    by_split = summary.get("by_split") or {}
    order = [s for s in summary.get("splits") or by_split if s in by_split]
    out.append(Table(
        ["split", "pieces", "with a match", *(f"strongest: {t}" for t in tiers)],
        [[s, fmt(by_split[s].get("pieces")), fmt(by_split[s].get("in_reference")),
          *(fmt((by_split[s].get("by_tier") or {}).get(t)) for t in tiers)]
         for s in order if isinstance(by_split[s], dict)]))
    matches = read_table_or_none(folder / "matches.parquet")
    if matches is not None and len(matches):
        shown = matches.drop_duplicates("sha256").head(MAX_MATCHES_SHOWN)
        out.append(Table(
            ["split", "held-out piece", "tier (rule)", "similarity", "reference piece"],
            [[r.split, r.path, r.tier + (f" ({r.rule})" if isinstance(r.rule, str) else ""),
              fmt(r.alignment if r.tier == "near" and pd.notna(r.alignment) else r.similarity,
                  d),
              f"{r.reference}: {r.ref_path}"] for r in shown.itertuples()]))
        more = matches["sha256"].nunique() - len(shown)
        out.append(Para(
            f"Each held-out piece's strongest match{f' ({more} more pieces)' if more > 0 else ''};"
            " every match is in reports/contamination/matches.parquet. A near match's similarity "
            "is its alignment for the alignment rules and its shingle Jaccard otherwise.", "note"))
    return out


def tokenisation_table(tok: Any, d: int) -> list[Table]:
    """The tokenizer and what it did to the corpus, under human labels ([] without the
    report)."""
    if not isinstance(tok, dict):
        return []
    by_split = tok.get("tokens_by_split") if isinstance(tok.get("tokens_by_split"), dict) else {}
    pieces = tok.get("pieces_by_split") if isinstance(tok.get("pieces_by_split"), dict) else {}
    model = tok.get("model")
    rows = [["tokenizer", fmt(tok.get("tokenizer"))],
            ["trained vocabulary", f"{fmt(model)}, {fmt(tok.get('vocab_size'))} tokens "
             f"(base {fmt(tok.get('base_vocab_size'))}), learned on "
             f"{fmt(tok.get('model_trained_on_pieces'))} train pieces"
             if model and model != "none" else "none"],
            ["compression", f"{fmt(tok.get('compression'), d)} base tokens per token"],
            ["tokens per split", ", ".join(
                f"{s} {fmt(by_split[s])} ({fmt(pieces.get(s))} "
                f"piece{'' if pieces.get(s) == 1 else 's'})"
                for s in ("train", "val", "test") if s in by_split) or NA],
            ["round trip (notes back from tokens)",
             f"mean F1 {fmt(tok.get('roundtrip_f1_mean'), d)}, lowest "
             f"{fmt(tok.get('roundtrip_f1_min'), d)}; {fmt(tok.get('roundtrip_below_1'))} "
             f"pieces below 1, {fmt(tok.get('flagged_pieces'))} flagged"]]
    return [Table(["tokenisation", ""], rows)]


def ngram_table(ngram: Any, d: int) -> list[Table]:
    """Each n-gram order's val NLL per token, the chosen one marked ([] without the report)."""
    orders = ngram.get("orders") if isinstance(ngram, dict) else None
    if not isinstance(orders, dict) or not orders:
        return []
    best = ngram.get("best_order")
    rows = [[str(k), fmt((v or {}).get("val_nats_per_token"), d),
             fmt((v or {}).get("val_perplexity"), d), "chosen" if str(k) == str(best) else ""]
            for k, v in sorted(orders.items(), key=lambda kv: int(kv[0]))]
    return [Table(["n-gram order", "val NLL (nats/token)", "val perplexity", ""], rows)]


CONFIG_LABELS = (
    ("model.n_layer", "blocks"), ("model.n_head", "attention heads"), ("model.n_embd", "width"),
    ("model.max_seq_len", "context (tokens)"), ("model.dropout", "dropout"),
    ("optim.lr", "peak learning rate (AdamW)"), ("optim.schedule", "learning-rate schedule"),
    ("optim.weight_decay", "weight decay"), ("train.micro_batch", "windows per batch"),
    ("train.grad_accum", "gradient accumulation"), ("train.max_steps", "optimiser steps"),
    ("train.patience", "early-stopping patience (evaluations)"),
    ("precision", "precision setting"), ("device", "device setting"))
"""The transformer settings the report shows, with human labels (params.yaml documents all)."""


def transformer_config(params: Mapping[str, Any] | None) -> list[Table]:
    """The transformer's architecture and training settings from params.yaml."""
    section = (params or {}).get("transformer")
    if not isinstance(section, dict):
        return []
    rows = []
    for key, label in CONFIG_LABELS:
        value: Any = section
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            rows.append([label, fmt(value)])
    return [Table(["transformer setting", "value"], rows)] if rows else []


def models(doc: Document, cfg: ReportConfig, reports: Mapping[str, Any],
           params: Mapping[str, Any] | None = None) -> None:
    d = cfg.digits
    doc.add(Heading("Models"), *transformer_config(params))
    train = reports.get("train") or {}
    seeds = train.get("seeds") if isinstance(train.get("seeds"), list) else []
    rows = [["transformer parameters", fmt(train.get("params"), d) if not isinstance(
        train.get("params"), dict) else ", ".join(f"{k}={fmt(v, d)}" for k, v in
                                                  sorted(train["params"].items()))],
            ["training seeds", ", ".join(str(x) for x in seeds) if seeds else NA],
            ["tokens seen (first seed)", fmt(train.get("tokens"), d)],
            ["steps (first seed)", fmt(train.get("steps"), d)],
            ["best val loss (first seed)", fmt(train.get("best_val_loss"), d)],
            ["final train loss (first seed)", fmt(train.get("final_train_loss"), d)],
            ["precision", fmt(train.get("precision"), d)],
            ["training compute, all seeds (6 x parameters x tokens)",
             _training_flops(train)]]
    doc.add(Table(["transformer", "value"], rows),
            Para("Timings, throughput and the device are in reports/train.env.json, a sidecar "
                 "that is neither a DVC output nor tracked by git, so that re-running an "
                 "unchanged experiment changes no tracked file.", "note"),
            *ngram_table(reports.get("ngram"), d),
            kv_block(reports.get("ngram"), "ngram", d))


def _training_flops(train: Mapping[str, Any]) -> str:
    """6 x trainable parameters x tokens, summed over the seeds (each seed's tokens from its
    steps at the first seed's tokens per step): the usual dense-transformer estimate of
    training FLOPs, attention and evaluation left out."""
    params = train.get("params")
    n = params.get("trainable") if isinstance(params, dict) else params
    tokens, steps = train.get("tokens"), train.get("steps")
    if not all(isinstance(v, int | float) and v > 0 for v in (n, tokens, steps)):
        return NA
    reps = train.get("replicates")
    per_seed = [r.get("steps") for r in reps.values()] if isinstance(reps, dict) else [steps]
    total = sum(int(x) for x in per_seed if isinstance(x, int | float)) * tokens / steps
    return f"{6 * n * total:.3g} FLOP"


def metrics_section(doc: Document, cfg: ReportConfig, reports: Mapping[str, Any],
                    metrics: Mapping[str, Any], inputs: Mapping[str, Path]) -> None:
    d = cfg.digits
    doc.add(Heading("Metrics"))
    rows = []
    for m in labelled():  # the metric table's labelled metrics, in its order
        digits = d if m.digits is None else m.digits
        rows.append([m.row_label, *(fmt(metrics.get(m.key + suffix), digits)
                                    for suffix in ("", ".ci_low", ".ci_high"))])
    level = metrics.get("eval.protocol.bootstrap.ci_level")  # evaluate.ci_level, as scored
    level = level if isinstance(level, float) else 0.95
    doc.add(Table(["metric", "value", f"{level:.0%} CI low", f"{level:.0%} CI high"], rows),
            Details(f"Every value in reports/eval.json "
                    f"({sum(k.startswith('eval.') for k in metrics)})",
                    [Table(["key", "value"], [[k, fmt(v, d)] for k, v in metrics.items()
                                              if k.startswith("eval.")])]))
    training_seeds(doc, cfg, reports)
    per_piece = read_table_or_none(inputs["per_piece"])
    doc.add(Heading("NLL distributions", 3))
    den = {"note": "n_notes", "token": "n_tokens", "second": "duration_s"}[cfg.nll_unit]
    need = {"model", "nll_nats", den}
    if per_piece is not None and need <= set(per_piece.columns):
        groups = piece_nll(per_piece, cfg.nll_split, den)
        scatter = model_scatter(per_piece, cfg.nll_split, den, cfg.nll_unit)
        if scatter is not None:
            doc.add(scatter)
        doc.add(Figure(f"Per-piece NLL per {cfg.nll_unit} (nats) on {cfg.nll_split}, one "
                       "curve per model. A curve further left is the better model on typical "
                       "pieces; a long right tail marks pieces a model finds hard.",
                       histograms_png(groups, f"nats per {cfg.nll_unit}")))
    else:
        _na(doc, f"reports/eval/per_piece.parquet with columns {', '.join(sorted(need))}")


def model_scatter(per_piece: pd.DataFrame, split: str, den: str, unit: str,
                  models: tuple[str, str] = ("ngram", "transformer")) -> Figure | None:
    """Each piece's NLL per ``unit`` under one model against the other (averaged over training
    seeds), on the pieces both scored; None without both models."""
    part = per_piece[per_piece["split"] == split] if "split" in per_piece.columns else per_piece
    if "sha256" not in part.columns or not set(models) <= set(part["model"].astype(str)):
        return None
    agg = part.groupby(["model", "sha256"], sort=True, as_index=False).agg(
        nll=("nll_nats", "mean"), den=(den, "first"))
    agg = agg[agg["den"] > 0]
    wide = (agg.assign(v=agg["nll"] / agg["den"])
            .pivot(index="sha256", columns="model", values="v").dropna())
    if wide.empty:
        return None
    from pipeline.render.compare_figures import scatter_png

    a, b = models
    return Figure(f"Per-piece NLL per {unit} on {split}: the {a} (x) against the {b} (y), "
                  "averaged over training seeds. Points below the diagonal are pieces where the "
                  f"{b} is better: a cloud shifted below is a gain shared by most pieces, a few "
                  "far points a gain carried by a few.",
                  scatter_png(a, wide[a].to_numpy(), [(b, wide[b].to_numpy())]))


def piece_nll(per_piece: pd.DataFrame, split: str, den: str) -> dict[str, np.ndarray]:
    """Per-piece NLL divided by column ``den``, by model, on ``split``; a model scored under
    several training seeds contributes each piece once, its NLL averaged over the seeds."""
    part = per_piece[per_piece["split"] == split] if "split" in per_piece.columns else per_piece
    if {"seed", "sha256"} <= set(part.columns):
        part = part.groupby(["model", "sha256"], sort=True, as_index=False).agg(
            nll_nats=("nll_nats", "mean"), **{den: (den, "first")})
    groups = {}
    for m in sorted(part["model"].astype(str).unique()):
        sel = part[part["model"].astype(str) == m]
        d_ = sel[den].to_numpy(dtype=float)
        groups[m] = np.where(d_ > 0, sel["nll_nats"].to_numpy(dtype=float) /
                             np.where(d_ > 0, d_, 1.0), np.nan)
    return groups


def train_logs(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """The per-step training logs: a folder of ``seed-<s>.tsv`` (one per training seed, labelled
    ``seed <s>``) or one TSV file (unlabelled). Unreadable files are left out."""
    path = Path(path)
    files = (sorted(path.glob("seed-*.tsv"), key=lambda f: (len(f.stem), f.stem))
             if path.is_dir() else [path])
    out = {}
    for f in files:
        log = read_table_or_none(f)
        if log is None or "step" not in log.columns:
            continue
        label = f.stem.replace("seed-", "seed ") if path.is_dir() else ""
        out[label] = {c: pd.to_numeric(log[c], errors="coerce").to_numpy(dtype=float)
                      for c in ("step", "train_loss", "val_loss") if c in log.columns}
    return out


def training_seeds(doc: Document, cfg: ReportConfig, reports: Mapping[str, Any]) -> None:
    """The spread over training seeds: per seed, the transformer's best val loss, test NLL,
    relative improvement over the n-gram and generalisation gap."""
    d = cfg.digits
    doc.add(Heading("Training seeds", 3))
    train = reports.get("train") if isinstance(reports.get("train"), dict) else {}
    ev = reports.get("eval") if isinstance(reports.get("eval"), dict) else {}
    seeds = [str(x) for x in train.get("seeds") or []]
    if not seeds:
        _na(doc, "reports/train.json: seeds")
        return
    if len(seeds) == 1:
        doc.add(Para(f"The transformer was trained once (seed {seeds[0]}): its intervals cover "
                     "the sampling of test pieces, not training variance. Set "
                     "transformer.replicates to 2 or more to measure it."))
        return

    def get(obj: Any, *keys: str) -> Any:
        for k in keys:
            obj = obj.get(k) if isinstance(obj, dict) else None
        return obj

    per_note = get(ev, "models", "transformer", "test", "per_seed") or {}
    rel = get(ev, "paired", "ngram_minus_transformer", "test", "rel_improvement") or {}
    gap = get(ev, "gap", "transformer", "nats_per_note", "per_seed") or {}
    replicates = train.get("replicates") if isinstance(train.get("replicates"), dict) else {}
    columns = {
        "best val loss (nats/token)": {s: get(replicates, s, "best_val_loss") for s in seeds},
        "test NLL (nats/note)": {s: get(per_note, s, "nats_per_note") for s in seeds},
        "gain over n-gram (test)": {s: get(rel, "per_seed", s) for s in seeds},
        "held-out − train gap (nats/note)": {s: gap.get(s) for s in seeds},
    }
    rows = [[s, *(fmt(col[s], d) for col in columns.values())] for s in seeds]
    for label, fn in (("mean", np.mean), ("sd", lambda v: np.std(v, ddof=1))):
        cells = []
        for col in columns.values():
            v = [x for x in col.values() if isinstance(x, int | float)]
            cells.append(fmt(float(fn(v)), d) if len(v) >= 2 else NA)
        rows.append([label, *cells])
    judged = get(reports.get("audit"), "judged", "transformer") or {}
    if judged.get("seeds"):
        audit_seeds = ("The audit judges every seed as well: generate shares the samples out "
                       "among the seeds, the flag rate and membership (the seeds' mean AUC) "
                       "take the seeds' Student-t term, extraction counts a piece any seed "
                       "reproduces, and quality judges the pooled samples.")
    else:
        audit_seeds = (f"Samples, copying and quality use the first seed's model (seed "
                       f"{seeds[0]}); membership and extraction run on every seed and judge "
                       "the first.")
    split_terms = ""
    if all(isinstance(rel.get(k), int | float) for k in ("groups_ci_low", "groups_ci_high",
                                                         "seed_half_width")):
        split_terms = (f" For the gain over the n-gram the groups alone give "
                       f"{fmt(rel['groups_ci_low'], d)} to {fmt(rel['groups_ci_high'], d)}; the "
                       f"seeds' term, ±{fmt(rel['seed_half_width'], d)}, widens it to "
                       f"{fmt(rel.get('ci_low'), d)} to {fmt(rel.get('ci_high'), d)}.")
    doc.add(Para(f"The transformer was trained {len(seeds)} times, with seeds "
                 f"{', '.join(seeds)} (transformer.seed, transformer.replicates) on the same "
                 "split. Its test NLL, the comparison with the n-gram and the gap average each "
                 "piece's NLL over the seeds. Their intervals take the group bootstrap of that "
                 "average and add, in quadrature on each side, a Student-t term over the "
                 f"per-seed values ({len(seeds) - 1} degrees of freedom), so they include "
                 f"training variance.{split_terms} {audit_seeds}"),
            Table(["seed", *columns], rows))


def memorisation(doc: Document, cfg: ReportConfig, audit: Any,
                 inputs: Mapping[str, Path]) -> None:
    d = cfg.digits
    doc.add(Heading("Memorisation audit"))
    if not isinstance(audit, dict):
        _na(doc, "reports/audit.json")
        return
    doc.add(Para("Every measure is computed for generated samples and for held-out human pieces "
                 "against the training set; thresholds are calibrated on the val human pieces."))
    doc.add(Table(["flag threshold", "value"],
                  [[k, fmt(v, d)] for k, v in sorted((audit.get("thresholds") or {}).items())]))
    groups = {"human val": (audit.get("human") or {}).get("val") or {},
              "human test": (audit.get("human") or {}).get("test") or {}}
    for name, block in sorted((audit.get("samples") or {}).items()):
        if name != "all" and isinstance(block, dict):
            groups[f"samples {name}"] = block.get("all") or {}
    cols = ["n", "flag_rate", "lcs_tokens_median", "lcs_tokens_max", "lcs_bars_max",
            "novelty_tok_8_mean", "novelty_tok_16_mean", "novelty_int_8_mean", "nn_jaccard_mean",
            "decode_failures"]
    doc.add(Table(["group", *cols], [[g, *[fmt(b.get(c), d) for c in cols]]
                                     for g, b in groups.items()]))
    fr = audit.get("flag_rate") or {}
    doc.add(Para(f"Flag rate: samples {fmt(fr.get('samples'), d)} vs human test pieces "
                 f"{fmt(fr.get('human_test'), d)} (excess {fmt(fr.get('excess'), d)})."))
    ext = audit.get("extraction") or {}
    doc.add(Table(["model", "train exact", "test exact", "exact gap", "train token match",
                   "test token match"],
                  [[m, *[fmt(e.get(k), d) for k in ("train_exact", "test_exact", "exact_gap",
                                                    "train_token_match", "test_token_match")]]
                   for m, e in sorted(ext.items())]))
    mem = audit.get("membership") or {}
    doc.add(Table(["model", "membership AUC (0.5 = no signal)", "TPR at the FPR (chance = FPR)",
                   "FPR", "train pieces", "held-out pieces"],
                  [[m, fmt(e.get("auc"), d), fmt(e.get("tpr"), d), fmt(e.get("fpr"), d),
                    fmt(e.get("n_train")), fmt(e.get("n_heldout", e.get("n_test")))]
                   for m, e in sorted(mem.items())]))
    seed_rows = []
    for m, block in sorted((audit.get("judged") or {}).items()):
        per_seed = (block or {}).get("per_seed") or {}
        for seed, c in sorted(per_seed.items(), key=lambda x: int(x[0])):
            auc, ext = c.get("membership_auc") or {}, (c.get("extraction_rate") or {})
            excess = ext.get("excess") or {}
            seed_rows.append([m, seed, fmt(auc.get("value"), d),
                              f"{fmt(auc.get('ci_low'), d)} to {fmt(auc.get('ci_high'), d)}",
                              fmt((auc.get("tpr") or {}).get("value"), d),
                              fmt((ext.get("train") or {}).get("value"), d),
                              f"{fmt(excess.get('ci_low'), d)} to {fmt(excess.get('ci_high'), d)}"])
    if seed_rows:
        pooled = any((b or {}).get("seeds") for b in (audit.get("judged") or {}).values())
        doc.add(Para("Membership and extraction of every training seed, on the same pieces "
                     + ("(the criteria judge the seeds together: their mean AUC with the "
                        "seeds' t term, and a piece extracted when any seed reproduces it):"
                        if pooled else
                        "(the criteria judge the first seed, whose samples are audited):")),
                Table(["model", "seed", "membership AUC", "AUC CI", "TPR at the FPR",
                       "train exact", "extraction excess CI"], seed_rows))
    table = read_table_or_none(inputs["per_sample"])
    if table is not None and {"lcs_tokens", "model", "kind"} <= set(table.columns):
        hist = {"human test": table[(table["model"] == "human") & (table["kind"] == "test")]}
        for m in sorted(set(table["model"].astype(str)) - {"human"}):
            hist[f"samples {m}"] = table[table["model"] == m]
        doc.add(Figure("Longest run of tokens each sequence shares with any training piece: "
                       "samples of each model against windows of held-out human test pieces "
                       "(which never saw training). A sample distribution shifted right of the "
                       "human one means the model copies longer stretches than chance overlap "
                       "explains.",
                       histograms_png({k: v["lcs_tokens"].to_numpy(dtype=float)
                                       for k, v in hist.items()}, "tokens")))


def music(doc: Document, cfg: ReportConfig, audit: Any) -> None:
    d = cfg.digits
    doc.add(Heading("Music statistics"))
    block = (audit or {}).get("music") if isinstance(audit, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("test"), dict):
        _na(doc, "music statistics in reports/audit.json")
        return
    names = sorted(k for k, v in block.items() if isinstance(v, dict) and k != "test"
                   and not k.endswith("_abs_diff"))
    stats = list(STATS)
    doc.add(Table(["statistic", "human test", *names],
                  [[s, fmt(block["test"].get(s), d), *[fmt(block[n].get(s), d) for n in names]]
                   for s in stats]))
    ratios = {}
    for n in names:
        ratios[n] = [(block[n].get(s) / block["test"][s])
                     if block[n].get(s) is not None and block["test"].get(s) else np.nan
                     for s in stats]
    if names:
        doc.add(Figure("Each music statistic of the samples, as a ratio to held-out human test "
                       "music (1 = the same on average; the dashed line). Bars far from 1 name "
                       "what the model gets wrong; the human band and which statistics fall "
                       "outside it are in the memorisation audit's quality table.",
                       grouped_bars_png(stats, ratios, reference=1.0)))
    judged = audit.get("judged") if isinstance(audit.get("judged"), dict) else {}
    for model in sorted(judged):
        q = (judged[model] or {}).get("quality") if isinstance(judged[model], dict) else None
        per_stat = (q or {}).get("stats") if isinstance(q, dict) else None
        if not isinstance(per_stat, dict) or not per_stat:
            continue
        order = sorted(per_stat)
        rows = [[s.replace("_", " "), fmt(per_stat[s].get("sample_mean"), d),
                 fmt(per_stat[s].get("human_mean"), d), fmt(per_stat[s].get("overlap"), d),
                 fmt(per_stat[s].get("band_low"), d),
                 "inside" if per_stat[s].get("inside") else "outside"] for s in order]
        doc.add(Heading(f"{model} against the human band", 3),
                Table(["statistic", "samples (mean)", "human (mean)", "overlap",
                       "band lower end", "verdict"], rows),
                Figure(f"How far each statistic of the {model}'s samples overlaps held-out "
                       "human music, against the lower end of the band that sets of human "
                       "windows themselves reach (the tick). An orange bar ending left of its "
                       "tick is a statistic outside the human band: there the samples are "
                       "unlike human music.",
                       band_png(order, [float(per_stat[s].get("overlap") or np.nan)
                                        for s in order],
                                [float(per_stat[s].get("band_low") or np.nan) for s in order],
                                [bool(per_stat[s].get("inside")) for s in order])))


def samples(doc: Document, cfg: ReportConfig, audit: Any, inputs: Mapping[str, Path],
            params: Mapping[str, Any] | None = None) -> None:
    doc.add(Heading("Samples"))
    table = read_table_or_none(inputs["per_sample"])
    if table is not None and "source" in table.columns:
        s = table[table["source"] == "sample"]
        failed = int((~s["decode_ok"].astype(bool)).sum()) if "decode_ok" in s.columns else None
        doc.add(Para(f"{len(s)} samples audited; {fmt(failed)} failed to decode (counted, not "
                     "dropped)."))
    folder = Path(inputs["samples_dir"])
    pngs = sorted(folder.glob("*.png")) if folder.is_dir() else []
    if not pngs:
        _na(doc, "sample piano rolls (reports/samples/)")
        return
    shown = pick_samples(pngs, cfg.max_samples_shown)
    report_dir = Path(inputs["md_out"]).parent
    doc.add(Para(f"{len(shown)} of {len(pngs)} samples, the first of each model and kind in "
                 "turn. Each has its piano roll and, rendered from its MIDI file with a sine "
                 f"synthesiser (pretty_midi), its first {AUDIO_SECONDS:g} seconds as audio. A "
                 "continuation "
                 "starts with the test piece's own opening (the prompt, grey in its piano "
                 "roll, up to the dashed line), then the model's notes (blue).", "note"))
    neighbours = shared_spans(table, shown, Path(inputs["spans"]))
    limits = audit.get("thresholds", {}) if isinstance(audit, dict) else {}
    quantile = ((params or {}).get("audit") or {}).get("flag_quantile")
    for p in shown:
        model, kind, index = _sample_parts(p.stem)
        title = f"{model}, {kind} sample {index}"
        doc.add(Heading(title, 3))
        try:
            rel = Path(os.path.relpath(p, report_dir)).as_posix()
        except ValueError:
            rel = None
        doc.add(Figure(f"Piano roll of the {title}", p.read_bytes(), rel))
        mid = p.with_suffix(".mid")
        flac = None
        if mid.is_file():
            try:
                flac = midi_to_flac(mid.read_bytes(), sample_rate=AUDIO_RATE,
                                    max_seconds=AUDIO_SECONDS)
            except ValueError as e:
                doc.add(Para(f"Audio of the {title}: {e}.", "note"))
        if flac is not None:
            doc.add(Audio(f"the {title}, at most its first {AUDIO_SECONDS:g} s", flac))
        doc.add(*span_blocks(title, neighbours.get(p.stem), limits.get("lcs_tokens"), quantile))
    if len(pngs) > len(shown):
        doc.add(Para(f"{len(pngs) - len(shown)} more piano rolls and every MIDI file are in "
                     f"{folder.name}/.", "note"))


AUDIO_SECONDS = 10.0
AUDIO_RATE = 8000
"""The players' length and sample rate. The sine synthesiser sounds fundamentals only, and an
8 kHz rate carries every one up to 4 kHz (MIDI pitch 107) without aliasing; 16 players of 10 s
are about 0.75 MB, so report.html stays small enough to track in git."""
SAMPLE_BPM = 120.0
"""Tempo at which a training piece's notes (in beats) are played beside a sample: the tempo
miditok writes into the samples' MIDI files, so both play at one speed."""


SPAN_MARGIN = 2.0
"""Beats shown either side of a shared span in its pair of piano rolls."""


def shared_spans(table: pd.DataFrame | None, shown: list[Path],
                 spans_path: Path) -> dict[str, dict[str, Any]]:
    """For each shown sample (by file stem): its audit row (``lcs_*`` and ``nn_*`` measures)
    and, from the audit's spans.parquet, the notes of the sample and of the training piece with
    the longest shared span marked (``sample`` / ``train``, absent when not recorded)."""
    need = {"source", "model", "kind", "index", "lcs_tokens"}
    if table is None or not need <= set(table.columns):
        return {}
    spans = read_table_or_none(spans_path)
    out = {}
    samples = table[table["source"] == "sample"]

    def pick(df: pd.DataFrame, stem: str) -> pd.DataFrame:
        model, kind, index = _sample_parts(stem)
        return df[(df["model"] == model) & (df["kind"] == kind)
                  & (df["index"].astype(str) == index)]

    for p in shown:
        hit = pick(samples, p.stem)
        if not len(hit):
            continue
        entry = {"audit": hit.iloc[0].to_dict()}
        if spans is not None and {"model", "side", "in_span"} <= set(spans.columns):
            for _, r in pick(spans, p.stem).iterrows():
                entry[str(r["side"])] = r.to_dict()
        out[p.stem] = entry
    return out


def _span_range(side: Mapping[str, Any]) -> tuple[float, float] | None:
    """Beats from the span's first onset to its last note's end, with SPAN_MARGIN either side
    (at least 8 beats in all); None when the span holds no whole note."""
    mask = np.asarray(side["in_span"], dtype=bool)
    if not mask.any():
        return None
    onset = np.asarray(side["onset"], dtype=float)[mask]
    end = onset + np.asarray(side["duration"], dtype=float)[mask]
    lo = max(0.0, float(onset.min()) - SPAN_MARGIN)
    return lo, max(float(end.max()) + SPAN_MARGIN, lo + 8.0)


def span_blocks(title: str, entry: dict[str, Any] | None, limit: float | None = None,
                quantile: float | None = None) -> list[Any]:
    """Beside one sample: the audit's longest shared span with the training set, as two piano
    rolls (the sample and the training piece, the span's notes orange) and the training excerpt
    as audio; and the nearest training piece by shingle Jaccard, in words."""
    if entry is None:
        return []
    row = entry["audit"]
    n = int(row.get("lcs_tokens") or 0)
    nn = row.get("nn_sha256")
    near = (f" The nearest training piece by shingle Jaccard is {str(nn)[:12]} "
            f"({fmt(row.get('nn_jaccard'), 3)})" if isinstance(nn, str) else "")
    if not n or "sample" not in entry or "train" not in entry:
        why = "shares no ids with any training piece" if not n else \
            "shares a span with training whose notes could not be decoded"
        return [Para(f"This sample {why}.{near}{'.' if near else ''}", "note")]
    sha = str(row.get("lcs_train_sha256"))[:12]
    same = ", the same piece." if nn == row.get("lcs_train_sha256") else "."
    sample, train = entry["sample"], entry["train"]
    ranges = _span_range(sample), _span_range(train)
    if limit is None:
        context = " The audit's flag thresholds are in the memorisation section."
    else:
        of = f"the {quantile:g} quantile of" if quantile is not None else "set from"
        context = (f" The audit flags a run longer than {fmt(limit)} ids ({of} the runs of "
                   f"held-out val windows); this one is {'' if n > limit else 'not '}flagged.")
    out: list[Any] = [Para(
        f"Nearest training excerpt: the longest run of ids this sample shares with any training "
        f"piece is {n} ids ({fmt(row.get('lcs_bars'))} bars), with training piece {sha}; the "
        f"whole notes of that run are orange in both rolls below.{context}{near}{same}",
        "note")]
    if None in ranges:
        out.append(Para("The shared run holds no whole note (only time or bar ids), so no "
                        "notes are marked.", "note"))
        return out
    out.append(Figure(
        f"The {title} (left) and training piece {sha} (right), each cut to their longest shared "
        f"run of ids and {SPAN_MARGIN:g} beats around it; the run's notes are orange",
        pair_rolls_png(sample, train, ("this sample", f"training piece {sha}"),
                       ranges=ranges, marked=(sample["in_span"], train["in_span"]),
                       marked_label="longest run of ids shared with the training piece")))
    lo = ranges[1][0]
    onset = np.asarray(train["onset"], dtype=float)
    keep = (onset >= lo) & (onset < lo + AUDIO_SECONDS * SAMPLE_BPM / 60.0)
    excerpt = {"onset": onset[keep] - lo,
               **{k: np.asarray(train[k])[keep] for k in ("duration", "pitch")}}
    flac = notes_to_flac(excerpt, bpm=SAMPLE_BPM, sample_rate=AUDIO_RATE,
                         max_seconds=AUDIO_SECONDS) if keep.any() else None
    if flac is not None:
        out.append(Audio(f"training piece {sha} from beat {lo:g} ({SPAN_MARGIN:g} beats before "
                         f"the shared run), at most {AUDIO_SECONDS:g} s", flac))
    return out


def _sample_parts(stem: str) -> tuple[str, str, str]:
    """``<model>_<kind>_<index>`` -> its parts (a stem of another shape: itself, "", "")."""
    parts = stem.rsplit("_", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (stem, "", "")


def pick_samples(pngs: list[Path], n: int) -> list[Path]:
    """Up to ``n`` samples, the lowest index of each (model, kind) in turn, so that every model
    and kind is shown before any second sample of one."""
    by_kind: dict[tuple[str, str], list[tuple[int, Path]]] = {}
    for p in pngs:
        model, kind, index = _sample_parts(p.stem)
        by_kind.setdefault((model, kind), []).append(
            (int(index) if index.isdigit() else 10**9, p))
    queues = [sorted(v) for _, v in sorted(by_kind.items())]
    out: list[Path] = []
    depth = 0
    while len(out) < n and any(depth < len(q) for q in queues):
        out += [q[depth][1] for q in queues if depth < len(q)][: n - len(out)]
        depth += 1
    return out


def environment(doc: Document, cfg: ReportConfig, env: Any, registered: Any) -> None:
    doc.add(Heading("Environment"))
    env = env if isinstance(env, dict) else {}
    source = env.get("environment") or {}
    # the architecture, not the platform string: a kernel update must not change the report
    rows = [["python", fmt(source.get("python"))], ["machine", fmt(source.get("machine"))]]
    rows += [[f"package {k}", fmt(v)] for k, v in sorted((source.get("packages") or {}).items())]
    doc.add(Table(["fact", "value"], rows))
    doc.add(Heading("Registration record", 3))
    ident = registered.get("identity") if isinstance(registered, dict) else None
    if isinstance(ident, dict):
        git = env.get("git") or {}
        rows = [["identity hash", fmt(registered.get("identity_hash"))],
                ["split hash", fmt(ident.get("split_hash"))],
                ["test pieces registered",
                 fmt(len((ident.get("pieces") or {}).get("test") or []))],
                ["forced over earlier looks", fmt(registered.get("forced"))],
                ["looks before registering", fmt(len(registered.get("looks_before") or []))],
                ["registration commit", fmt(git.get("registration_commit"))],
                ["results commit", fmt(git.get("results_commit"))],
                ["registration precedes results", fmt(git.get("registration_precedes_results"))]]
        rows += [[f"frozen package {k}", fmt(v)]
                 for k, v in sorted((ident.get("packages") or {}).items())]
        doc.add(Table(["field", "value"], rows))
    else:
        _na(doc, "reports/preregistration.json (schema 3)")


def add_sections(doc: Document, cfg: ReportConfig, reports: Mapping[str, Any],
                 metrics: Mapping[str, Any], inputs: Mapping[str, Path], registered: Any,
                 env: Any, params: Mapping[str, Any] | None = None) -> None:
    """Append every descriptive section, in reading order."""
    data_card(doc, cfg, reports, inputs)
    models(doc, cfg, reports, params)
    metrics_section(doc, cfg, reports, metrics, inputs)
    conditioning(doc, cfg.digits, reports)
    memorisation(doc, cfg, reports.get("audit"), inputs)
    music(doc, cfg, reports.get("audit"))
    samples(doc, cfg, reports.get("audit"), inputs, params)
    environment(doc, cfg, env, registered)

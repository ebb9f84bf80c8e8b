"""The report's models section: the transformer's settings from params.yaml, its size, seeds,
tokens and training compute from reports/train.json, and each n-gram order's val NLL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.render.document import NA, Document, Heading, Para, Table, fmt
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import kv_block


def ngram_table(ngram: Any, d: int) -> list[Table | Para]:
    """Each n-gram order's val NLL per token, the chosen one marked ([] without the report); for
    compound tokens, where train-ngram fits none, the reason it is not applicable."""
    if isinstance(ngram, dict) and ngram.get("applicable") is False:
        return [Para(f"n-gram baseline: not applicable ({ngram.get('reason', NA)}).", "note")]
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


def render(doc: Document, ctx: ReportContext) -> None:
    d, reports, params = ctx.digits, ctx.reports, ctx.params
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

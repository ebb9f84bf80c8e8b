"""The report's NLL distributions: per-piece NLL of each model (a replicated model's averaged
over its seeds), as histograms and as a scatter of one model against the other."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.artifacts import read_table_or_none
from pipeline.render.document import Document, Figure, Heading
from pipeline.render.figures import histograms_png
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available


def render(doc: Document, ctx: ReportContext) -> None:
    """Per-piece NLL of each model on ``report.nll_split``, per ``report.nll_unit``: a scatter
    of the n-gram against the transformer, and the distributions."""
    cfg = ctx.cfg
    per_piece = read_table_or_none(ctx.inputs["per_piece"])
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
        not_available(doc, f"reports/eval/per_piece.parquet with columns {', '.join(sorted(need))}")


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

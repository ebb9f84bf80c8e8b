"""The report's NLL distributions (pipeline.report.sections.nll_distributions): per-piece NLL
per unit of each model (a replicated model's averaged over its seeds), as histograms and as a
scatter of one model against the other."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core import artifacts
from pipeline.render.document import NA, Document, Figure
from pipeline.report.sections import nll_distributions
from pipeline.report.sections.nll_distributions import model_scatter, piece_nll
from tests.report.test_context import make_context, rendered

PER_PIECE = pd.DataFrame({
    "sha256": ["a", "b", "a", "b", "a", "b", "c"],
    "split": ["test"] * 6 + ["val"],
    "model": ["ngram", "ngram", "transformer", "transformer", "transformer", "transformer",
              "ngram"],
    "seed": pd.array([None, None, 1, 1, 2, 2, None], dtype="Int64"),
    "nll_nats": [40.0, 90.0, 20.0, 60.0, 30.0, 80.0, 1.0],
    "n_notes": [10, 0, 10, 0, 10, 0, 5], "n_tokens": [20, 30, 20, 30, 20, 30, 5]})


def test_piece_nll_averages_seeds_per_piece_and_per_unit():
    per_note = piece_nll(PER_PIECE, "test", "n_notes")
    assert sorted(per_note) == ["ngram", "transformer"]
    np.testing.assert_allclose(per_note["ngram"], [4.0, np.nan])  # b has no notes
    np.testing.assert_allclose(per_note["transformer"], [2.5, np.nan])  # (20 + 30) / 2 / 10
    per_token = piece_nll(PER_PIECE, "test", "n_tokens")
    np.testing.assert_allclose(per_token["transformer"], [1.25, 70 / 30])
    np.testing.assert_allclose(piece_nll(PER_PIECE, "val", "n_notes")["ngram"], [0.2])


def test_the_scatter_needs_both_models_on_common_pieces():
    fig = model_scatter(PER_PIECE, "test", "n_tokens", "token")
    assert isinstance(fig, Figure) and fig.png[:4] == b"\x89PNG"
    assert "Per-piece NLL per token on test: the ngram (x) against the transformer (y)" in \
        fig.caption
    assert model_scatter(PER_PIECE, "val", "n_notes", "note") is None  # only the n-gram
    assert model_scatter(PER_PIECE, "test", "n_notes", "note") is not None
    no_units = PER_PIECE.assign(n_notes=0)
    assert model_scatter(no_units, "test", "n_notes", "note") is None


def test_without_the_table_or_its_columns_it_is_not_available(tmp_path):
    ctx = make_context(tmp_path)
    md = rendered(nll_distributions.render, ctx)
    assert f"reports/eval/per_piece.parquet with columns model, n_notes, nll_nats: {NA}." in md
    artifacts.write_parquet(ctx.inputs["per_piece"], PER_PIECE.drop(columns="n_tokens"))
    md = rendered(nll_distributions.render, make_context(tmp_path, nll_unit="token"))
    assert f"with columns model, n_tokens, nll_nats: {NA}." in md


def test_the_histograms_and_scatter_on_the_configured_split_and_unit(tmp_path):
    ctx = make_context(tmp_path, nll_unit="token", nll_split="test")
    artifacts.write_parquet(ctx.inputs["per_piece"], PER_PIECE)
    doc = Document("t")
    nll_distributions.render(doc, ctx)
    scatter, hist = (b for b in doc.blocks if isinstance(b, Figure))
    assert scatter.caption.startswith("Per-piece NLL per token on test")
    assert hist.caption.startswith("Per-piece NLL per token (nats) on test, one curve per model")

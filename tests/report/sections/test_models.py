"""The report's models section (pipeline.report.sections.models): the transformer's settings
from params.yaml, its size, seeds and training compute from reports/train.json, and the n-gram
orders."""

from __future__ import annotations

from pipeline.render.document import NA
from pipeline.report.sections import models
from pipeline.report.sections.models import ngram_table, transformer_config
from tests.report.test_context import make_context, rendered


def _rows(md: str) -> dict[str, str]:
    return {cells[1].strip(): cells[2].strip() for line in md.splitlines()
            if line.startswith("| ") and len(cells := line.split("|")) >= 4}


def test_without_train_or_ngram_reports_the_figures_are_not_available(tmp_path):
    md = rendered(models.render, make_context(tmp_path))
    rows = _rows(md)
    assert rows["training seeds"] == NA and rows["tokens seen (first seed)"] == NA
    assert rows["training compute, all seeds (6 x parameters x tokens)"] == NA
    assert f"reports/ngram.json: {NA}." in md
    assert "transformer setting" not in md and "n-gram order" not in md


def test_the_transformer_settings_shown_are_those_params_yaml_sets():
    (table,) = transformer_config({"transformer": {
        "model": {"n_layer": 4, "n_embd": 128}, "optim": {"lr": 0.003}, "device": "cpu",
        "seed": 1234}})
    assert table.rows == [["blocks", "4"], ["width", "128"],
                          ["peak learning rate (AdamW)", "0.003"], ["device setting", "cpu"]]
    assert transformer_config({"transformer": {"seed": 1}}) == []
    assert transformer_config(None) == [] and transformer_config({"transformer": 3}) == []


def test_size_seeds_and_training_compute_over_every_seed(tmp_path):
    train = {"params": {"trainable": 1000, "total": 1200}, "tokens": 500, "steps": 10,
             "seeds": [11, 12], "replicates": {"11": {"steps": 10}, "12": {"steps": 20}},
             "best_val_loss": 1.25, "precision": "fp32"}
    rows = _rows(rendered(models.render, make_context(tmp_path, reports={"train": train})))
    assert rows["transformer parameters"] == "total=1200, trainable=1000"
    assert rows["training seeds"] == "11, 12" and rows["best val loss (first seed)"] == "1.25"
    # 6 x 1000 trainable parameters x (10 + 20 steps at 500 / 10 tokens a step)
    assert rows["training compute, all seeds (6 x parameters x tokens)"] == "9e+06 FLOP"
    one = {"params": 1000, "tokens": 500, "steps": 10}
    rows = _rows(rendered(models.render, make_context(tmp_path, reports={"train": one})))
    assert rows["transformer parameters"] == "1000"
    assert rows["training compute, all seeds (6 x parameters x tokens)"] == "3e+06 FLOP"


def test_ngram_orders_have_a_readable_table():
    (ng,) = ngram_table({"best_order": 3, "orders": {"10": {"val_nats_per_token": 4.0},
                                                     "3": {"val_nats_per_token": 3.5}}}, 4)
    assert [r[0] for r in ng.rows] == ["3", "10"] and ng.rows[0][3] == "chosen"
    assert ngram_table({}, 4) == []

"""The report's training seeds (pipeline.report.sections.training_seeds): per seed, the
transformer's best val loss, test NLL, gain over the n-gram and generalisation gap with their
mean and spread; and the per-seed training logs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core import artifacts
from pipeline.render.document import NA
from pipeline.report.sections import training_seeds
from pipeline.report.sections.nll_distributions import piece_nll
from pipeline.report.sections.training_seeds import train_logs
from tests.report.test_context import make_context, rendered
from tests.stages.test_report import make_inputs, report, write_params


def test_without_seeds_it_is_not_available(tmp_path):
    for train in (None, {}, {"seeds": []}):
        md = rendered(training_seeds.render, make_context(tmp_path, reports={"train": train}))
        assert f"reports/train.json: seeds: {NA}." in md


def test_train_logs_read_seeds_in_numeric_order_and_skip_unreadable_ones(tmp_path):
    logs = tmp_path / "train_log"
    for seed in (10, 9, 100):
        artifacts.write_text(logs / f"seed-{seed}.tsv",
                             f"step\ttrain_loss\tval_loss\n0\t{seed}.5\t\n5\t1.0\t2.0\n")
    artifacts.write_text(logs / "seed-7.tsv", "no step column\n1\n")
    artifacts.write_text(logs / "notes.tsv", "step\n1\n")  # not a seed's log
    got = train_logs(logs)
    assert list(got) == ["seed 9", "seed 10", "seed 100"]
    np.testing.assert_array_equal(got["seed 10"]["train_loss"], [10.5, 1.0])
    np.testing.assert_array_equal(got["seed 10"]["val_loss"], [np.nan, 2.0])
    one = tmp_path / "train_log.tsv"
    artifacts.write_text(one, "step\ttrain_loss\n0\t3.0\n")
    assert list(train_logs(one)) == [""] and set(train_logs(one)[""]) == {"step", "train_loss"}
    assert train_logs(tmp_path / "missing.tsv") == {}


def test_the_mean_and_sd_rows_count_only_the_seeds_with_a_value(tmp_path):
    train = {"seeds": [1, 2, 3], "replicates": {"1": {"best_val_loss": 1.0},
                                                "2": {"best_val_loss": 2.0},
                                                "3": {"best_val_loss": 4.0}}}
    ev = {"models": {"transformer": {"test": {"per_seed": {"1": {"nats_per_note": 2.0}}}}},
          "paired": {"ngram_minus_transformer": {"test": {"rel_improvement": {
              "value": 0.05, "ci_low": 0.0, "ci_high": 0.1, "groups_ci_low": 0.02,
              "groups_ci_high": 0.08, "seed_half_width": 0.03}}}}}
    md = rendered(training_seeds.render, make_context(tmp_path, reports={"train": train,
                                                                         "eval": ev}))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in md.splitlines() if line.startswith("| ")}
    assert rows["mean"][0] == "2.333" and rows["sd"][0] == "1.528"  # 1, 2, 4
    assert rows["mean"][1:] == [NA] * 3 and rows["1"][1] == "2"  # one seed: no spread
    assert "the groups alone give 0.02 to 0.08; the seeds' term, ±0.03, widens it to 0 to " \
           "0.1." in md
    assert "3 times, with seeds 1, 2, 3" in md and "(2 degrees of freedom)" in md


def test_training_seeds_are_shown_with_their_spread(tmp_path):
    """Three training seeds: one row each with its figures, a mean and an sd row, one loss curve
    per seed (a folder of seed-<s>.tsv), and per-piece NLL averaged over seeds for the plot."""
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    train = artifacts.read_json(p.train)
    seeds = [11, 12, 13]
    artifacts.write_json(p.train, {**train, "seeds": seeds, "replicates": {
        str(s): {"best_val_loss": 1.4 + k / 10} for k, s in enumerate(seeds)}})
    ev = artifacts.read_json(p.eval)
    ev["models"]["transformer"]["test"]["per_seed"] = {
        str(s): {"nats_per_note": 1.8 + k / 10} for k, s in enumerate(seeds)}
    ev["paired"]["ngram_minus_transformer"]["test"]["rel_improvement"] = {
        "value": 0.05, "ci_low": 0.01, "ci_high": 0.09,
        "per_seed": {"11": 0.1, "12": 0.05, "13": 0.0}, "per_seed_of": "b"}
    artifacts.write_json(p.eval, ev)
    p.train_log.unlink()
    for s in seeds:
        artifacts.write_text(p.train_log / f"seed-{s}.tsv",
                             f"step\ttrain_loss\tval_loss\n1\t3.{s}\t\n2\t2.{s}\t2.5\n")
    per_piece = artifacts.read_parquet(p.per_piece)
    tr = per_piece[per_piece["model"] == "transformer"]
    replicated = pd.concat([per_piece[per_piece["model"] == "ngram"].assign(seed=pd.NA),
                            *(tr.assign(seed=s) for s in seeds)], ignore_index=True)
    artifacts.write_parquet(p.per_piece, replicated.astype({"seed": "Int64"}))
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    section = md[md.index("Training seeds"):md.index("NLL distributions")]
    assert "seeds 11, 12, 13" in section and "first seed's model (seed 11)" in section
    audit = artifacts.read_json(p.audit)  # an audit over every seed says so instead
    audit.setdefault("judged", {}).setdefault("transformer", {})["seeds"] = seeds
    artifacts.write_json(p.audit, audit)
    report(tmp_path, params, p)
    section = p.md_out.read_text()
    section = section[section.index("Training seeds"):section.index("NLL distributions")]
    assert "The audit judges every seed as well" in section
    assert "first seed's model" not in section
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("|")}
    assert {"11", "12", "13", "mean", "sd"} <= set(rows)
    assert "0.1" in rows["11"] and "1.5" in rows["12"]  # gain of seed 11, best val of seed 12
    assert "0.05" in rows["mean"] and "0.05" in rows["sd"]  # gains 0.1, 0.05, 0: mean, sd .05
    assert "per training seed" in md
    nll = piece_nll(artifacts.read_parquet(p.per_piece), "test", "n_notes")
    assert len(nll["transformer"]) == 10  # each piece once, not once per seed
    np.testing.assert_allclose(nll["transformer"], tr.sort_values("sha256")["nll_nats"] / 40)


def test_one_training_seed_says_what_the_interval_leaves_out(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    artifacts.write_json(p.train, {**artifacts.read_json(p.train), "seeds": [5]})
    report(tmp_path, params, p)
    assert "trained once (seed 5)" in p.md_out.read_text()

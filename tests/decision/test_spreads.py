"""pipeline.decision.spreads: the spreads the controls simulate at, read from a val pilot or
from the run, never from constants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.decision.spreads import (
    Spreads,
    SpreadsUnavailable,
    auc_for_gap,
    from_pilot,
    from_run,
    piece_sd,
    robust_sd,
)

ROOT = Path(__file__).resolve().parents[2]


def table(splits=("val", "train"), n=40, seeds=(1, 2)) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"sha256": f"{s}{i}", "split": s, "model": "transformer", "seed": seed,
             "nll_nats": float(rng.normal(40, 5)), "n_notes": 10}
            for s in splits for i in range(n) for seed in seeds]
    return pd.DataFrame(rows)


def test_the_pieces_spread_is_robust_to_a_far_out_piece():
    values = np.random.default_rng(1).normal(4.0, 0.5, 400)
    assert robust_sd(values) == pytest.approx(0.5, rel=0.1)
    assert robust_sd(np.append(values, [36.0, 40.0])) == pytest.approx(robust_sd(values), rel=0.02)
    assert piece_sd(table(), ("val",)) == pytest.approx(0.5, rel=0.3)
    with pytest.raises(SpreadsUnavailable):
        piece_sd(table(), ("test",))


def test_a_gap_converts_to_the_auc_of_a_loss_attack():
    assert auc_for_gap(0.0, 0.5) == 0.5
    assert auc_for_gap(0.2, 0.5) == pytest.approx(0.611, abs=1e-3)
    assert auc_for_gap(0.5, 0.5) == pytest.approx(0.760, abs=1e-3)
    assert auc_for_gap(1.0, 0.5) > auc_for_gap(0.5, 0.5)


def test_the_pilot_gives_spreads_rescaled_to_the_registered_counts():
    report = {"power": {"ngram_minus_transformer": {
                  "se_groups": 0.02, "seed_sd": 0.01, "n_seeds": 2, "n_groups": 24,
                  "n_groups_observed": 26}},
              "gap": {"transformer": {
                  "n_pieces_heldout": 40, "n_pieces_train": 40,
                  "per_seed": {"1": {"nats_per_note": {"ci_low": 0.2, "ci_high": 0.6},
                                     "nats_per_token": {"ci_low": 0.1, "ci_high": 0.3}}}}}}
    same = from_pilot(report, table(), held_out=40, train_pieces=40, flag_quantile=0.95,
                      level=0.95)
    assert same.gain_se_groups == 0.02 and same.gain_seed_sd == 0.01
    assert same.gap_se_note == pytest.approx(0.4 / 3.92, rel=1e-3)
    assert same.human_flag_rate == pytest.approx(0.05)
    assert same.gap_seed_sd_note is None  # one seed: the seeds' spread is not measured
    two = {**report, "gap": {"transformer": {**report["gap"]["transformer"], "per_seed": {
        k: {"nats_per_note": {"value": v, "ci_low": v - 0.2, "ci_high": v + 0.2},
            "nats_per_token": {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}}
        for k, v in (("1", 0.4), ("2", 0.5))}}}}
    seeds = from_pilot(two, table(), held_out=160, train_pieces=160, flag_quantile=0.95,
                       level=0.95)
    assert seeds.gap_seed_sd_note == pytest.approx(np.std([0.4, 0.5], ddof=1))  # not rescaled
    assert Spreads.from_dict({k: v for k, v in seeds.to_dict().items()
                              if not k.startswith("gap_seed")}).gap_seed_sd_note is None
    bigger = from_pilot(report, table(), held_out=160, train_pieces=160, flag_quantile=0.95,
                        level=0.95)
    assert bigger.gap_se_note == pytest.approx(same.gap_se_note / 2, rel=1e-6)
    assert "val pilot" in bigger.source["gap_se_note"]
    with pytest.raises(SpreadsUnavailable, match="val pilot"):
        from_pilot({}, table(), held_out=1, train_pieces=1, flag_quantile=0.95, level=0.95)


def test_the_committed_run_gives_its_own_spreads():
    eval_report = json.loads((ROOT / "reports" / "eval.json").read_text())
    audit = json.loads((ROOT / "reports" / "audit.json").read_text())
    per_piece = pd.read_parquet(ROOT / "reports" / "eval" / "per_piece.parquet")
    s = from_run(eval_report, per_piece, audit, level=0.95)
    rel = eval_report["paired"]["ngram_minus_transformer"]["test"]["rel_improvement"]
    assert s.gain_se_groups == pytest.approx(
        (rel["groups_ci_high"] - rel["groups_ci_low"]) / 3.92, rel=1e-3)
    assert s.gain_seed_sd == pytest.approx(np.std(list(rel["per_seed"].values()), ddof=1))
    assert s.human_flag_rate == audit["flag_rate"]["human_test"]
    gaps = [b["nats_per_note"]["value"]
            for b in eval_report["gap"]["transformer"]["per_seed"].values()]
    assert s.gap_seed_sd_note == pytest.approx(np.std(gaps, ddof=1))
    assert s.gap_seed_sd_note < s.gap_se_note  # the seeds agree: the pieces' noise dominates
    assert Spreads.from_dict(s.to_dict()) == s

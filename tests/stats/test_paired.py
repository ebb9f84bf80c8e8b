"""pipeline.stats.paired: one arm's scores, two arms lined up (or refused), the paired
bootstrap's p-value and intervals, Holm, and which parameters differ.

Arms are synthetic per-piece scores (:func:`simulate`), also used by tests/tools/test_compare.py
to build arm folders for ``symkit compare``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from pipeline.stats.bootstrap import hierarchical_paired_ci
from pipeline.stats.paired import (
    Refusal,
    apply_holm,
    arm_scores,
    bootstrap_p_value,
    comparable_metrics,
    compare_pair,
    conclusion,
    design_label,
    flatten_params,
    holm,
    pair,
    pair_summary,
    params_diff,
    protocol_diff,
)

PARAMS = {"runtime": {"workers": "auto"}, "report": {"title": "x"},
          "tokenize": {"tokenizer": "REMI", "vocab_size": 1000, "transpose": []},
          "transformer": {"seed": 1234, "replicates": 3,
                          "train": {"max_steps": 400, "micro_batch": 16}},
          "evaluate": {"n_boot": 2000, "seed": 0, "stride": 64}}
PER_NOTE = [("nats_per_note", "n_notes")]


# ---- synthetic arms ---------------------------------------------------------------------------
def pieces(rng: np.random.Generator, n_groups: int = 20, per_group: int = 2) -> pd.DataFrame:
    """Pieces with groups, units and a base NLL per note that varies between groups."""
    n = n_groups * per_group
    notes = rng.integers(40, 160, n)
    group = np.repeat(np.arange(n_groups), per_group)
    per_note = 4.0 + rng.normal(0, 0.3, n_groups)[group] + rng.normal(0, 0.1, n)
    return pd.DataFrame({"sha256": [f"{i:064x}" for i in range(n)],
                         "group_id": [f"g{g:03d}" for g in group],
                         "n_notes": notes, "n_tokens": (notes * 1.1).astype(np.int64),
                         "duration_s": notes * 0.5, "base": per_note * notes})


def scored(p: pd.DataFrame, factor: np.ndarray, seeds: list[int], rng: np.random.Generator,
           seed_sd: float = 0.0, model: str = "transformer", split: str = "val") -> pd.DataFrame:
    """Per-piece rows of one arm: NLL = base · factor · (1 + its seed's deviation)."""
    rows = []
    for s in seeds or [None]:
        dev = rng.normal(0, seed_sd) if seed_sd else 0.0
        rows.append(p.assign(nll_nats=p["base"] * factor * (1 + dev), seed=s, model=model,
                             split=split))
    return pd.concat(rows, ignore_index=True).drop(columns="base")


def simulate(rng: np.random.Generator, effect: float, *, n_groups: int = 30,
             per_group: int = 3, seeds: tuple[int, ...] = (), seed_sd: float = 0.0,
             group_sd: float = 0.02, piece_sd: float = 0.005) -> tuple[pd.DataFrame, ...]:
    """Baseline A and arm B whose NLL is ``1 − effect`` times A's, with a relative deviation
    shared by a group's pieces (``group_sd``) and one per piece (``piece_sd``)."""
    p = pieces(rng, n_groups, per_group)
    g = p["group_id"].str[1:].astype(int).to_numpy()
    factor = 1 - effect + rng.normal(0, group_sd, n_groups)[g] + rng.normal(0, piece_sd, len(p))
    return (scored(p, np.ones(len(p)), list(seeds), rng, seed_sd),
            scored(p, factor, list(seeds), rng, seed_sd))


# ---- the p-value's error rates ----------------------------------------------------------------
def _p_values(effect: float, ignore_groups: bool = False, n_sims: int = 40) -> np.ndarray:
    out = []
    for i in range(n_sims):
        a, b = simulate(np.random.default_rng([7, i]), effect)
        if ignore_groups:  # a broken analysis: every piece its own group
            a, b = (df.assign(group_id=df["sha256"]) for df in (a, b))
        p = pair(arm_scores(a, "A"), arm_scores(b, "B"), "A", "B", "val")
        st = compare_pair(p, PER_NOTE, n_boot=400, level=0.95, rng=np.random.default_rng(i),
                          margin=0.005)
        out.append(st["nats_per_note"]["p_value"])
    return np.array(out)


def test_a_planted_effect_is_detected_and_a_planted_null_is_not():
    """Detection of a clear effect in 40 datasets; false positives in 200 null datasets.

    The percentile group bootstrap is slightly liberal with few groups: in 1000 null datasets
    like these (30 groups) it rejected at 5% about 6.5% of the time (5.0% with 100 groups), so
    the limit is the 99.9th percentile of Binomial(200, alpha), about 10%. A p-value that ignores
    the groups rejects about a third of the null datasets and fails it.
    """
    alpha = 0.05
    limit = binom.ppf(0.999, 200, alpha) / 200
    detected = np.mean(_p_values(0.015) <= alpha)
    false_pos = np.mean(_p_values(0.0, n_sims=200) <= alpha)
    assert detected >= 0.8, detected
    assert false_pos <= limit, (false_pos, limit)
    # The check can fail: resampling pieces where the effect varies by group makes p too small.
    assert np.mean(_p_values(0.0, ignore_groups=True) <= alpha) > limit


def test_the_p_value_agrees_with_the_interval():
    """p ≤ alpha exactly when the 1 − alpha interval of A − B excludes 0, up to the resolution
    of the replicates near the boundary."""
    seen = set()
    for i, effect in enumerate(np.linspace(-0.01, 0.01, 21)):
        a, b = simulate(np.random.default_rng([10, i]), float(effect))
        p = pair(arm_scores(a, "A"), arm_scores(b, "B"), "A", "B", "val")
        st = compare_pair(p, PER_NOTE, n_boot=500, level=0.95, rng=np.random.default_rng(i),
                          margin=0.005)["nats_per_note"]
        excludes = st["diff"]["ci_low"] > 0 or st["diff"]["ci_high"] < 0
        seen.add(excludes)
        assert st["p_value"] <= 0.06 if excludes else st["p_value"] >= 0.04, (effect, st)
        assert (st["diff"]["value"] > 0) == (st["rel_improvement"]["value"] > 0)
    assert seen == {True, False}


# ---- Holm, conclusions, comparable metrics ----------------------------------------------------
def test_holm_matches_a_hand_computation():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> max so far 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.3, 0.6, 0.9]) == pytest.approx([0.9, 1.0, 1.0])  # capped at 1, monotone
    assert holm([0.2]) == [0.2]
    got = holm([0.02, float("nan"), 0.01])
    assert got[0] == pytest.approx(0.02) and np.isnan(got[1]) and got[2] == pytest.approx(0.02)


def test_conclusions_follow_holm_then_equivalence():
    def block(significant: bool, diff: float, equivalent: bool) -> dict:
        return {"significant": significant, "diff": {"value": diff}, "equivalent": equivalent}

    assert conclusion(block(True, 0.1, False)) == "arm_lower"  # A − B > 0: the arm's NLL lower
    assert conclusion(block(True, -0.1, True)) == "arm_higher"
    assert conclusion(block(False, 0.1, True)) == "equivalent"
    assert conclusion(block(False, -0.1, False)) == "inconclusive"


def test_per_token_is_comparable_only_under_one_tokenizer():
    same, omitted = comparable_metrics({"tokenizer_hash": "a" * 64}, {"tokenizer_hash": "a" * 64})
    assert [k for k, _ in same] == ["nats_per_note", "nats_per_second", "nats_per_token"]
    assert omitted == {}
    for b in ({"tokenizer_hash": "b" * 64}, {}):
        metrics, omitted = comparable_metrics({"tokenizer_hash": "a" * 64}, b)
        assert [k for k, _ in metrics] == ["nats_per_note", "nats_per_second"]
        assert omitted["nats_per_token"].startswith(f"tokenizer_hash differs ({'a' * 12} vs ")
    assert comparable_metrics({}, {})[1]  # two unknown tokenizers are not the same one


# ---- which params differ ----------------------------------------------------------------------
def test_flatten_and_diff_params():
    flat = flatten_params(PARAMS)
    assert flat["transformer.train.max_steps"] == 400 and flat["tokenize.transpose"] == []
    assert not any(k.startswith(("runtime.", "report.")) for k in flat)
    other = {**PARAMS, "tokenize": {**PARAMS["tokenize"], "transpose": [-1, 1]},
             "ngram": {"orders": [1, 2]}}
    diff = params_diff(flat, flatten_params(other))
    assert diff == [{"key": "ngram.orders", "baseline": None, "arm": [1, 2], "absent": "baseline"},
                    {"key": "tokenize.transpose", "baseline": [], "arm": [-1, 1],
                     "absent": None}]
    assert [design_label(n) for n in (0, 1, 2, 5)] == ["identical", "controlled", "confounded",
                                                        "confounded"]


# ---- training seeds ----------------------------------------------------------------------------
def _rel_width(seed_sd: float) -> float:
    a, b = simulate(np.random.default_rng(5), 0.02, seeds=(1, 2, 3), seed_sd=seed_sd)
    p = pair(arm_scores(a, "A"), arm_scores(b, "B"), "A", "B", "val")
    rel = compare_pair(p, PER_NOTE, n_boot=400, level=0.95, rng=np.random.default_rng(0),
                       margin=0.005)["nats_per_note"]["rel_improvement"]
    return rel["ci_high"] - rel["ci_low"]


def test_seed_variance_widens_the_interval():
    assert _rel_width(0.03) > 1.5 * _rel_width(0.0)


def test_unpaired_seeds_follow_hierarchical_paired_ci():
    """Different seed labels: each arm's seeds drawn on their own, as the eval's scheme."""
    rng = np.random.default_rng(6)
    p0 = pieces(rng)
    a = scored(p0, np.ones(len(p0)), [1, 2, 3], rng, 0.02)
    b = scored(p0, np.full(len(p0), 0.97), [4, 5], rng, 0.02)
    p = pair(arm_scores(a, "A"), arm_scores(b, "B"), "A", "B", "val")
    assert p.seed_pairing == "independent"
    got = compare_pair(p, PER_NOTE, n_boot=300, level=0.9, rng=np.random.default_rng(11),
                       margin=0.005)["nats_per_note"]
    want = hierarchical_paired_ci(p.a.nll, p.b.nll, p.a.units["n_notes"], p.codes, p.n_groups,
                                  300, np.random.default_rng(11), 0.9)
    for k in ("value", "ci_low", "ci_high", "share_a_lower"):
        assert got["diff"][k] == pytest.approx(want["diff"][k], rel=1e-12)
    for k in ("value", "ci_low", "ci_high"):
        assert got["rel_improvement"][k] == pytest.approx(want["rel_improvement"][k], rel=1e-12)


# ---- one arm, one pair -------------------------------------------------------------------------
def test_an_arm_s_scores_are_sorted_by_piece_one_row_per_seed():
    p = pieces(np.random.default_rng(0), n_groups=3, per_group=2)
    rows = scored(p, np.ones(len(p)), [2, 1], np.random.default_rng(1), seed_sd=0.1)
    arm = arm_scores(rows.iloc[::-1], "A")
    assert arm.seeds == [1, 2] and arm.n_seeds == 2 and arm.nll.shape == (2, 6)
    assert arm.shas.tolist() == sorted(p["sha256"])
    seed2 = rows[rows["seed"] == 2].sort_values("sha256")
    np.testing.assert_array_equal(arm.nll[1], seed2["nll_nats"].to_numpy())
    np.testing.assert_array_equal(arm.units["n_notes"], seed2["n_notes"].to_numpy())
    plain = arm_scores(scored(p, np.ones(len(p)), [], np.random.default_rng(1)), "B")
    assert plain.seeds == [] and plain.n_seeds == 1


def test_an_arm_that_cannot_be_read_as_one_model_is_refused():
    p = pieces(np.random.default_rng(0), n_groups=3, per_group=2)
    rows = scored(p, np.ones(len(p)), [1, 2], np.random.default_rng(1))
    with pytest.raises(Refusal, match="arm 'A': no rows to compare"):
        arm_scores(rows.iloc[:0], "A")
    mixed = rows.astype({"seed": object})
    mixed.loc[0, "seed"] = None
    with pytest.raises(Refusal, match="some rows have a training seed and some have none"):
        arm_scores(mixed, "A")
    with pytest.raises(Refusal, match=rf"piece {p['sha256'][0][:12]} is scored 2 times by seed 1"):
        arm_scores(pd.concat([rows, rows.iloc[:1]]), "A")
    with pytest.raises(Refusal, match="seed 2 scored 5 pieces and seed 1 6, not the same set"):
        arm_scores(rows.drop(index=len(p) + 3), "A")


def test_pairs_refuse_other_pieces_or_groups_and_say_how_seeds_pair():
    p = pieces(np.random.default_rng(0), n_groups=4, per_group=2)
    rng = np.random.default_rng(1)
    a = arm_scores(scored(p, np.ones(len(p)), [1, 2], rng), "A")
    b = arm_scores(scored(p, np.full(len(p), 0.9), [1, 2], rng), "B")
    paired = pair(a, b, "A", "B", "val")
    assert (paired.n_pieces, paired.n_groups, paired.seed_pairing) == (8, 4, "paired")
    assert paired.group_names[paired.codes].tolist() == a.group_ids.tolist()
    assert pair_summary(paired) == {"n_pieces": 8, "n_groups": 4, "n_seeds_baseline": 2,
                                    "n_seeds_arm": 2, "seed_pairing": "paired",
                                    "median_piece_effect": pytest.approx(0.1)}
    other = arm_scores(scored(p, np.ones(len(p)), [3, 4], rng), "C")
    single = arm_scores(scored(p, np.ones(len(p)), [], rng), "D")
    assert pair(a, other, "A", "C", "val").seed_pairing == "independent"
    assert pair(a, single, "A", "D", "val").seed_pairing == "independent"
    assert pair(single, single, "D", "D", "val").seed_pairing == "none"
    fewer = arm_scores(scored(p.iloc[1:], np.ones(len(p) - 1), [], rng), "E")
    with pytest.raises(Refusal, match=r"'A' 8, 'E' 7, 7 shared; 1 only in 'A' \(0{12}\); "
                                      r"0 only in 'E'"):
        pair(a, fewer, "A", "E", "val")
    moved = arm_scores(scored(p.assign(group_id="g999"), np.ones(len(p)), [], rng), "F")
    with pytest.raises(Refusal, match="put 8 shared test pieces in different groups"):
        pair(a, moved, "A", "F", "test")


def test_bootstrap_p_value_counts_the_data_as_one_replicate():
    assert bootstrap_p_value(np.zeros(99)) == 1.0  # a run against itself
    assert bootstrap_p_value(np.ones(9)) == pytest.approx(2 * 1 / 10)  # the floor 2 / (n + 1)
    # 3 of 9 replicates at or below 0: 2 * (1 + 3) / 10
    assert bootstrap_p_value(np.array([-2.0, -1, 0, 1, 2, 3, 4, 5, 6])) == pytest.approx(0.8)
    # only finite replicates count: n = 3 here
    assert bootstrap_p_value(np.array([1.0, 2, 3, np.nan, np.inf, -np.inf])) == pytest.approx(0.5)
    assert math.isnan(bootstrap_p_value(np.array([np.nan])))


def test_a_run_against_itself_differs_by_exactly_zero_in_every_replicate():
    a, _ = simulate(np.random.default_rng(3), 0.0, seeds=(1, 2, 3), seed_sd=0.02)
    arm = arm_scores(a, "A")
    st = compare_pair(pair(arm, arm, "A", "A", "val"), PER_NOTE, n_boot=200, level=0.95,
                      rng=np.random.default_rng(0), margin=0.005)["nats_per_note"]
    assert st["diff"] == {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "share_a_lower": 0.0}
    assert st["p_value"] == 1.0 and st["equivalent"] is True
    assert st["baseline"] == st["arm"]


def test_apply_holm_adjusts_each_metric_over_the_comparisons_that_report_it():
    stats = [{"x": {"p_value": 0.01}, "y": {"p_value": 0.04}},
             {"x": {"p_value": 0.03}},
             {"x": {"p_value": float("nan")}, "y": {"p_value": 0.02}}]
    apply_holm(stats, alpha=0.05)
    assert [s["x"]["p_holm"] for s in stats[:2]] == pytest.approx([0.02, 0.03])
    assert math.isnan(stats[2]["x"]["p_holm"]) and stats[2]["x"]["significant"] is False
    assert [s["x"]["significant"] for s in stats[:2]] == [True, True]
    assert [stats[0]["y"]["p_holm"], stats[2]["y"]["p_holm"]] == pytest.approx([0.04, 0.04])
    assert stats[0]["y"]["significant"] and stats[2]["y"]["significant"]


def test_protocol_diff_lists_only_what_changes_scores():
    base = {"split_hash": "a", "transformer_stride": 64,
            "bootstrap": {"n_boot": 2000, "ci_level": 0.95, "seed": 0}}
    arm = {**base, "split_hash": "b", "bootstrap": {**base["bootstrap"], "n_boot": 500}}
    assert protocol_diff(base, arm) == [
        {"key": "bootstrap.n_boot", "baseline": 2000, "arm": 500, "absent": None}]
    assert protocol_diff(base, {k: v for k, v in base.items() if k != "transformer_stride"}) == [
        {"key": "transformer_stride", "baseline": 64, "arm": None, "absent": "arm"}]
    assert protocol_diff(base, base) == []

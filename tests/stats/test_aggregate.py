"""pipeline.stats.aggregate: eval.json's blocks from the per-piece table, checked against sums
done by hand, paired effects planted exactly, the training seeds' spread, the generalisation gap
and the power block's choice of group count."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from pipeline.stats.aggregate import (
    TRAIN_SUBSET_STREAM,
    aggregate,
    draw_train_subset,
    generalisation,
    power_blocks,
)


@dataclass(frozen=True)
class Plan:
    """What the aggregates read of the ``evaluate`` params."""

    splits: tuple[str, ...] = ("val", "test")
    n_boot: int = 200
    ci_level: float = 0.9
    seed: int = 0


def per_piece(split: str, n_groups: int, factors: dict[str, float], seeds: dict[str, list],
              seed: int = 0, per_group: int = 3) -> pd.DataFrame:
    """Rows of per_piece.parquet for one split: each model's NLL is a piece's base NLL times the
    model's factor, times ``1 + 0.01 · s`` for its training seed ``s`` (``None``: no seeds)."""
    rng = np.random.default_rng([seed, len(split)])
    n = n_groups * per_group
    notes = rng.integers(20, 80, n)
    base = notes * (3.0 + rng.normal(0, 0.3, n_groups).repeat(per_group))
    pieces = pd.DataFrame({"sha256": [f"{split}{i:04d}" for i in range(n)], "split": split,
                           "group_id": [f"{split}-g{i // per_group}" for i in range(n)],
                           "n_notes": notes, "n_tokens": notes * 2,
                           "duration_s": notes * 0.25})
    rows = [pieces.assign(model=m, seed=s, nll_nats=base * f * (1 + 0.01 * (s or 0)))
            for m, f in factors.items() for s in seeds.get(m, [None])]
    return pd.concat(rows, ignore_index=True)


def test_train_subset_draw_is_seeded_and_nested():
    shas = [f"{i:03d}" for i in range(40)]
    draw = draw_train_subset(shas, 12, seed=0)
    assert len(draw) == 12 and draw == sorted(draw) and set(draw) <= set(shas)
    assert draw_train_subset(shas[::-1] + shas[:5], 12, seed=0) == draw  # order, repeats
    assert draw_train_subset(shas, 12, seed=1) != draw
    assert set(draw_train_subset(shas, 11, seed=0)) < set(draw)  # a prefix: one fewer, one out
    assert draw_train_subset(shas[:7], 12, seed=0) == shas[:7]  # fewer than wanted: all
    assert draw_train_subset([], 3, seed=0) == []
    rng = np.random.default_rng([0, TRAIN_SUBSET_STREAM, 0])  # the documented stream
    assert draw == sorted(shas[i] for i in rng.permutation(40)[:12])


def test_a_model_s_block_is_its_ratios_of_sums():
    table = per_piece("val", 8, {"a": 1.0}, {})
    models, paired = aggregate(table, Plan(splits=("val",)), ["a"])
    assert paired == {}
    m = models["a"]["val"]
    assert (m["n_pieces"], m["n_groups"], m["n_seeds"]) == (24, 8, 1)
    assert m["nll_nats"] == pytest.approx(table["nll_nats"].sum())
    for key, col in [("nats_per_note", "n_notes"), ("nats_per_token", "n_tokens"),
                     ("nats_per_second", "duration_s")]:
        assert m[key]["value"] == pytest.approx(table["nll_nats"].sum() / table[col].sum())
        assert m[key]["ci_low"] < m[key]["value"] < m[key]["ci_high"]
    npt = m["nats_per_token"]
    assert m["bits_per_token"]["value"] == pytest.approx(npt["value"] / math.log(2))
    assert m["perplexity"]["ci_high"] == pytest.approx(math.exp(npt["ci_high"]))
    assert "per_seed" not in m


def test_a_planted_relative_improvement_is_found_in_every_replicate():
    """B's NLL is 0.9 times A's on every piece: (A − B) / A is 0.1 in every replicate, so its
    interval has no width, while A − B per note varies with the groups drawn."""
    table = per_piece("val", 10, {"a": 1.0, "b": 0.9}, {})
    _, paired = aggregate(table, Plan(splits=("val",)), ["a", "b"])
    block = paired["a_minus_b"]["val"]
    a = table[table["model"] == "a"]
    assert block["n_pieces"] == 30
    assert block["nats_per_note"]["value"] == pytest.approx(0.1 * a["nll_nats"].sum()
                                                            / a["n_notes"].sum())
    assert block["nats_per_note"]["ci_low"] < block["nats_per_note"]["ci_high"]
    rel = block["rel_improvement"]
    assert (rel["value"], rel["ci_low"], rel["ci_high"]) == pytest.approx((0.1, 0.1, 0.1))
    assert rel["median_piece_effect"] == pytest.approx(0.1)
    assert rel["without_top3_groups"]["value"] == pytest.approx(0.1)
    assert len(rel["without_top3_groups"]["dropped_groups"]) == 3
    assert "per_seed" not in rel


def test_each_split_s_draws_are_its_own_and_repeatable():
    table = pd.concat([per_piece("val", 6, {"a": 1.0, "b": 0.95}, {}),
                       per_piece("test", 5, {"a": 1.0, "b": 0.95}, {})])
    both = aggregate(table, Plan(), ["a", "b"])
    assert both == aggregate(table.sample(frac=1, random_state=1), Plan(), ["a", "b"])
    val_only = aggregate(table, Plan(splits=("val",)), ["a", "b"])
    assert val_only[0]["a"]["val"] == both[0]["a"]["val"]  # adding test moved nothing of val
    assert aggregate(table, Plan(seed=1), ["a", "b"])[0]["a"]["val"] != both[0]["a"]["val"]


def test_training_seeds_are_averaged_and_their_spread_is_reported():
    table = per_piece("val", 6, {"a": 1.0, "b": 0.9}, {"b": [1, 2, 3]})
    models, paired = aggregate(table, Plan(splits=("val",)), ["a", "b"])
    b = models["b"]["val"]
    assert b["n_seeds"] == 3 and sorted(b["per_seed"]) == ["1", "2", "3"]
    rows = table[table["model"] == "b"]
    per_seed = {str(s): g["nll_nats"].sum() / g["n_notes"].sum() for s, g in rows.groupby("seed")}
    assert {s: v["nats_per_note"] for s, v in b["per_seed"].items()} == pytest.approx(per_seed)
    assert b["nats_per_note"]["value"] == pytest.approx(np.mean(list(per_seed.values())))
    rel = paired["a_minus_b"]["val"]["rel_improvement"]
    total_a = table.loc[table["model"] == "a", "nll_nats"].sum()
    want = {str(s): 1 - g["nll_nats"].sum() / total_a for s, g in rows.groupby("seed")}
    assert rel["per_seed_of"] == "b" and rel["per_seed"] == pytest.approx(want)
    # seeds that disagree widen the interval beyond the groups' one (0.9 · (1 + 0.01 s) each)
    assert rel["ci_high"] - rel["ci_low"] > 0.01
    # the baseline's seeds, when only it has several: B at its total against each of A's seeds
    table = per_piece("val", 6, {"a": 1.0, "b": 0.9}, {"a": [1, 2]})
    rel = aggregate(table, Plan(splits=("val",)), ["a", "b"])[1]["a_minus_b"]["val"][
        "rel_improvement"]
    total_b = table.loc[table["model"] == "b", "nll_nats"].sum()
    rows = table[table["model"] == "a"]
    want = {str(s): 1 - total_b / g["nll_nats"].sum() for s, g in rows.groupby("seed")}
    assert rel["per_seed_of"] == "a" and rel["per_seed"] == pytest.approx(want)


def test_the_gap_is_held_out_minus_train_per_note():
    held = per_piece("val", 5, {"a": 1.0}, {})
    train = per_piece("train", 5, {"a": 0.8}, {}, seed=3)
    metrics, gap = generalisation(pd.concat([held, train]), Plan(), ["a"])
    g = gap["a"]
    assert g["heldout"] == ["val", "test"] and (g["n_pieces_heldout"], g["n_pieces_train"]) == (
        15, 15)
    want = (held["nll_nats"].sum() / held["n_notes"].sum()
            - train["nll_nats"].sum() / train["n_notes"].sum())
    assert g["nats_per_note"]["value"] == pytest.approx(want)
    assert g["nats_per_note"]["ci_low"] <= want <= g["nats_per_note"]["ci_high"]
    assert metrics["a"]["n_pieces"] == 15
    assert generalisation(held, Plan(), ["a"]) == ({}, {})  # no train rows
    assert generalisation(pd.concat([held, train]), Plan(splits=("train",)), ["a"]) == ({}, {})


def test_each_training_seed_has_its_own_gap_on_the_same_replicates():
    """A model trained over seeds: ``gap.<model>.per_seed.<seed>`` is that seed's gap with the
    interval of its scores alone, exactly the gap of a table holding that seed only (the same
    groups drawn), and no seed term; the mean's block keeps its t term over the seeds."""
    held = per_piece("val", 6, {"a": 1.0}, {"a": [1, 5, 9]})
    train = per_piece("train", 6, {"a": 0.8}, {"a": [1, 5, 9]}, seed=3)
    train["nll_nats"] *= 1 - 0.03 * train["seed"]  # the seeds' gaps differ by design
    table = pd.concat([held, train])
    _, gap = generalisation(table, Plan(), ["a"])
    g = gap["a"]
    assert sorted(g["per_seed"]) == ["1", "5", "9"]
    for s, own in g["per_seed"].items():
        alone = generalisation(table[table["seed"] == int(s)], Plan(), ["a"])[1]["a"]
        for unit in ("nats_per_token", "nats_per_note"):
            assert own[unit] == alone[unit]
            assert own[unit]["value"] == pytest.approx(g[unit]["per_seed"][s])
    mean = g["nats_per_note"]
    assert mean["seed_half_width"] > 0
    widest = max(o["nats_per_note"]["ci_high"] - o["nats_per_note"]["ci_low"]
                 for o in g["per_seed"].values())
    assert mean["ci_high"] - mean["ci_low"] > widest
    one = generalisation(pd.concat([per_piece("val", 6, {"a": 1.0}, {}),
                                    per_piece("train", 6, {"a": 0.8}, {}, seed=3)]),
                         Plan(), ["a"])[1]["a"]
    assert "per_seed" not in one  # a model trained once has no seed blocks


@pytest.mark.parametrize(("splits", "with_test", "listed", "n_groups", "source"), [
    (("val", "test"), True, 0, 4, "test (scored)"),
    (("val",), True, 7, 7, "test (data/splits.parquet)"),
    (("val",), False, 0, 6, "val"),
])
def test_the_power_block_counts_the_groups_the_rule_will_judge(splits, with_test, listed,
                                                               n_groups, source):
    parts = [per_piece("val", 6, {"a": 1.0, "b": 0.97}, {})]
    if with_test:
        parts.append(per_piece("test", 4, {"a": 1.0, "b": 0.97}, {}))
    out = power_blocks(pd.concat(parts), Plan(splits=splits), ["a", "b"], listed)
    block = out["a_minus_b"]
    assert (block["n_groups"], block["n_groups_of"]) == (n_groups, source)
    assert block["estimated_from"] == "val" and block["n_groups_observed"] == 6
    assert block["power"] == 0.8 and block["mde"] > 0


def test_no_power_block_without_val():
    table = per_piece("test", 4, {"a": 1.0, "b": 0.97}, {})
    assert power_blocks(table, Plan(), ["a", "b"], 0) == {}
    assert power_blocks(per_piece("val", 3, {"a": 1.0, "b": 0.9}, {}), Plan(splits=("test",)),
                        ["a", "b"], 0) == {}

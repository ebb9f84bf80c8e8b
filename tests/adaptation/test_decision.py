"""Measures per arm and the adaptation decision: the gain of pretraining judged on test, the
forgetting bound, and the smallest adequate arm."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.adaptation.decision import decide, measures
from pipeline.core.config import parse_section


def _iv(v: float, half: float = 0.0) -> dict[str, float]:
    return {"value": v, "ci_low": v - half, "ci_high": v + half}


def _decide(forgetting: dict[str, float], share: float) -> dict[str, Any]:
    """Four arms: scratch, full (best on val), lora (0.5% behind full, fewest parameters) with
    the given forgetting, and zero_shot; pretraining taught the source 0.4 nats per note."""
    cfg = parse_section("adaptation", {
        "arms": {"scratch": {"kind": "scratch"}, "full": {"kind": "full"},
                 "lora": {"kind": "lora", "lora_rank": 4}},
        "decision": {"forgetting_share": share}}, AdaptationConfig)
    val = {"scratch": 3.0, "full": 2.5, "lora": 2.5125, ZERO_SHOT: 2.9}
    src = {ZERO_SHOT: 2.0, "scratch": 2.4}
    params = {ZERO_SHOT: 0, "scratch": 1000, "full": 1000, "lora": 20}
    m = {}
    for n in cfg.arm_names:
        m[n] = {"kind": cfg.kind_of(n), "params_trainable": params[n],
                "val": _iv(val[n], 0.01), "test": _iv(val[n], 0.01),
                "source_val": _iv(src.get(n, 2.0 + forgetting.get(n, 0.0)), 0.01),
                "forgetting": None if n == ZERO_SHOT else _iv(
                    src.get(n, 2.0 + forgetting.get(n, 0.0)) - 2.0, 0.02)}
    paired = {}
    for a in m:
        for b in m:
            if a != b:  # rel_improvement of b over a: (a - b) / a
                rel = (val[a] - val[b]) / val[a]
                paired[f"{a}_minus_{b}"] = {s: {"rel_improvement": _iv(rel, 0.004)}
                                            for s in ("val", "test")}
    return decide(cfg, m, paired)


def test_an_arm_over_the_forgetting_bound_is_never_chosen():
    # lora forgets 0.25 of the 0.4 taught: over the bound at share 0.5 (0.2), within it at 0.75
    over = _decide({"lora": 0.25, "full": 0.1}, share=0.5)
    assert over["forgetting_bound_nats_per_note"] == pytest.approx(0.2)
    assert over["standing"]["lora"]["equivalent"] and not over["standing"]["lora"]["adequate"]
    assert "forgetting up to" in over["standing"]["lora"]["why_not"][0]
    assert over["smallest_adequate"] == "full"
    within = _decide({"lora": 0.25, "full": 0.1}, share=0.75)
    assert within["smallest_adequate"] == "lora"
    # full over the bound too: nothing is adequate, and scratch (which forgets all) is not picked
    none = _decide({"lora": 0.25, "full": 0.3}, share=0.5)
    assert none["smallest_adequate"] is None
    assert none["pretraining_helps"]["arm"] == "full"
    assert none["pretraining_helps"]["verdict"] == "PASS"  # 2.5 vs 3.0: 16.7% > 2%



def test_pretraining_helps_is_judged_on_the_whole_interval():
    cfg = parse_section("adaptation", {
        "arms": {"scratch": {"kind": "scratch"}, "full": {"kind": "full"}},
        "decision": {"min_gain": 0.1}}, AdaptationConfig)
    m = {n: {"kind": cfg.kind_of(n), "params_trainable": 10, "val": _iv(v), "test": _iv(v),
             "source_val": _iv(s), "forgetting": None if n == ZERO_SHOT else _iv(s - 2.0)}
         for n, v, s in ((ZERO_SHOT, 2.9, 2.0), ("scratch", 3.0, 2.4), ("full", 2.5, 2.1))}

    def verdict(gain: float, half: float) -> str:
        paired = {f"{a}_minus_{b}": {s: {"rel_improvement": _iv(0.0)} for s in ("val", "test")}
                  for a in m for b in m if a != b}
        paired["scratch_minus_full"]["test"]["rel_improvement"] = _iv(gain, half)
        d = decide(cfg, m, paired)
        assert d["pretraining_helps"]["arm"] == "full" and d["best_arm"] == "full"
        return d["pretraining_helps"]["verdict"]

    assert verdict(0.15, 0.04) == "PASS"
    assert verdict(0.05, 0.04) == "FAIL"
    assert verdict(0.10, 0.04) == "INCONCLUSIVE"
    assert verdict(0.1, 0.0) == "PASS"  # an interval that starts at min_gain passes


def test_no_arm_is_adequate_when_pretraining_taught_the_source_nothing():
    d = _decide({"lora": 0.0, "full": 0.0}, share=0.5)
    assert d["note"] is None and d["taught_nats_per_note"] == pytest.approx(0.4)
    cfg = parse_section("adaptation", {"arms": {"scratch": {"kind": "scratch"}}}, AdaptationConfig)
    m = {n: {"kind": cfg.kind_of(n), "params_trainable": p, "val": _iv(3.0, 0.01),
             "test": _iv(3.0), "source_val": _iv(2.0),
             "forgetting": None if n == ZERO_SHOT else _iv(0.0, 0.01)}
         for n, p in ((ZERO_SHOT, 0), ("scratch", 100))}
    paired = {f"{a}_minus_{b}": {s: {"rel_improvement": _iv(0.0, 0.001)} for s in ("val", "test")}
              for a in m for b in m if a != b}
    d = decide(cfg, m, paired)
    assert d["taught_nats_per_note"] == 0.0 and "taught the source nothing" in d["note"]
    assert d["smallest_adequate"] == ZERO_SHOT  # forgets nothing, trains nothing


def _block(v: float) -> dict[str, Any]:
    return {"nats_per_note": _iv(v, 0.1)}


def test_measures_read_each_arm_from_the_aggregates():
    cfg = parse_section("adaptation", {
        "arms": {"scratch": {"kind": "scratch"}, "full": {"kind": "full"},
                 "lora": {"kind": "lora", "lora_rank": 4}}}, AdaptationConfig)
    names = cfg.arm_names
    models = {n: {s: _block(v + k) for s, k in (("val", 0.0), ("test", 0.1), ("source_val", 1.0))}
              for n, v in zip(names, (2.9, 3.0, 2.5, 2.6), strict=True)}
    paired = {f"{a}_minus_{b}": {s: {"rel_improvement": _iv(0.01 * i + j), "nats_per_note":
                                     _iv(-0.5 * i)}
                                 for j, s in enumerate(("val", "test", "source_val"))}
              for i, (a, b) in enumerate((a, b) for a in names for b in names if a != b)}
    params = {ZERO_SHOT: {"total": 100, "trainable": 0}, "scratch": {"total": 100,
                                                                    "trainable": 100},
              "full": {"total": 100, "trainable": 100}, "lora": {"total": 120, "trainable": 20}}
    m = measures(cfg, models, paired, params)
    assert list(m) == names
    lora = m["lora"]
    assert (lora["kind"], lora["params_total"], lora["params_trainable"], lora["bytes_to_ship"]) \
        == ("lora", 120, 20, 80)
    assert lora["val"] == _iv(2.6, 0.1) and lora["source_val"] == _iv(3.6, 0.1)
    assert lora["vs_scratch"] == {s: paired["scratch_minus_lora"][s]["rel_improvement"]
                                  for s in ("val", "test")}
    assert lora["vs_full"]["test"] == paired["full_minus_lora"]["test"]["rel_improvement"]
    assert lora["forgetting"] == paired["lora_minus_zero_shot"]["source_val"]["nats_per_note"]
    assert m["scratch"]["vs_scratch"] is None and m["full"]["vs_full"] is None
    assert m[ZERO_SHOT]["forgetting"] is None and m[ZERO_SHOT]["bytes_to_ship"] == 0

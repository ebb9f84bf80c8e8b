"""Measures per arm and the adaptation decision, from the aggregates of the per-piece scores.

Every interval here comes from :func:`pipeline.stats.aggregate.aggregate` (group bootstrap over
the pieces' groups, widened by a Student-t term over the training seeds), so the arms are judged
by the one evaluation protocol. Splits: the target's ``val`` and ``test``, and ``source_val``
(the source corpus's val pieces: retention is never measured on pieces the pretraining trained
on).

The decision (``adaptation.decision``, rationale in the experiment's params.yaml):

- **pretraining helps** when the adapted arm with the lowest target val NLL per note (any arm but
  ``scratch``) beats ``scratch`` on target *test* by at least ``min_gain`` relative NLL per note
  over its whole interval (PASS), by less over its whole interval (FAIL), or straddles
  (INCONCLUSIVE). The arm is chosen on val and judged on test, so the choice does not inflate it.
- **forgetting** of an arm is its source val NLL per note minus the pretrained model's
  (``zero_shot``), paired on the same pieces; its bound is ``forgetting_share`` of what
  pretraining taught the source, ``scratch``'s source val NLL minus the pretrained model's: an
  arm within it keeps at least ``1 - forgetting_share`` of that.
- **the smallest adequate arm** is, among the arms whose target val NLL per note exceeds the
  best arm's by at most ``margin`` (relative) over the whole interval and whose forgetting's
  upper bound stays within the bound, the one with the fewest trainable parameters (ties: the
  lower val NLL). ``scratch`` forgets everything pretraining taught by construction, so it is
  adequate only when ``forgetting_share`` is 1. An arm over the bound is never chosen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig

UNIT = "nats_per_note"


def _iv(block: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(block[k]) for k in ("value", "ci_low", "ci_high")}


def _neg(iv: Mapping[str, float]) -> dict[str, float]:
    return {"value": -iv["value"], "ci_low": -iv["ci_high"], "ci_high": -iv["ci_low"]}


def pair(paired: Mapping[str, Any], a: str, b: str, split: str) -> dict[str, Any]:
    """Paired block of ``a − b`` on ``split`` (both orders are in ``paired``)."""
    return paired[f"{a}_minus_{b}"][split]


def measures(cfg: AdaptationConfig, models: Mapping[str, Any], paired: Mapping[str, Any],
             params: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """Per arm: kind, trainable and total parameters, bytes to ship, NLL per note on target val
    and test and on source val, the relative gain over ``scratch`` and ``full`` ((other − arm)
    / other, > 0 when the arm is better) on val and test, and forgetting on source val.

    ``models``/``paired``: :func:`~pipeline.stats.aggregate.aggregate`'s blocks over the arms,
    with ``paired`` holding both orders of every pair; ``params``: each arm's ``total`` and
    ``trainable`` counts."""
    scratch, zero, full = cfg.name_of("scratch"), ZERO_SHOT, cfg.name_of("full")
    out = {}
    for name in cfg.arm_names:
        m: dict[str, Any] = {"kind": cfg.kind_of(name),
                             "params_total": int(params[name]["total"]),
                             "params_trainable": int(params[name]["trainable"])}
        # what ships beside the pretrained model: the trained tensors in fp32 (a LoRA arm's
        # adapters, a partial arm's unfrozen tensors); scratch and full ship a whole model
        m["bytes_to_ship"] = 4 * m["params_trainable"]
        for split in ("val", "test", "source_val"):
            m[split] = _iv(models[name][split][UNIT])
        for other, key in ((scratch, "vs_scratch"), (full, "vs_full")):
            if other is None or other == name:
                m[key] = None
                continue
            m[key] = {s: _iv(pair(paired, other, name, s)["rel_improvement"])
                      for s in ("val", "test")}
        m["forgetting"] = (None if name == zero else
                           _iv(pair(paired, name, zero, "source_val")[UNIT]))
        out[name] = m
    return out


def _verdict(iv: Mapping[str, float], threshold: float) -> str:
    if iv["ci_low"] >= threshold:
        return "PASS"
    if iv["ci_high"] < threshold:
        return "FAIL"
    return "INCONCLUSIVE"


def decide(cfg: AdaptationConfig, m: Mapping[str, Mapping[str, Any]],
           paired: Mapping[str, Any]) -> dict[str, Any]:
    """The two registered judgements (see the module docstring) and every arm's standing."""
    d = cfg.decision
    scratch, zero = cfg.name_of("scratch"), ZERO_SHOT
    taught = m[scratch]["source_val"]["value"] - m[zero]["source_val"]["value"]
    bound = d.forgetting_share * taught
    best = min(m, key=lambda n: (m[n]["val"]["value"], n))
    adapted = [n for n in m if n != scratch]
    best_adapted = min(adapted, key=lambda n: (m[n]["val"]["value"], n))
    gain = _iv(pair(paired, scratch, best_adapted, "test")["rel_improvement"])
    standing = {}
    for name in m:
        if name == best:
            excess = {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0}  # the best, by definition
        else:
            excess = _neg(_iv(pair(paired, best, name, "val")["rel_improvement"]))
        forgetting = m[name]["forgetting"] or {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0}
        equivalent = excess["ci_high"] <= d.margin
        retains = name == zero or forgetting["ci_high"] <= bound  # zero_shot forgets nothing
        reasons = []
        if not equivalent:
            reasons.append(f"val NLL per note up to {excess['ci_high']:.1%} above {best}'s "
                           f"(margin {d.margin:.1%})")
        if not retains:
            reasons.append(f"forgetting up to {forgetting['ci_high']:.4f} nats per note on source "
                           f"val (bound {bound:.4f})")
        standing[name] = {"excess_over_best": excess, "equivalent": equivalent,
                          "within_forgetting_bound": retains, "adequate": equivalent and retains,
                          "why_not": reasons}
    adequate = [n for n in m if standing[n]["adequate"]]
    chosen = (min(adequate, key=lambda n: (m[n]["params_trainable"], m[n]["val"]["value"], n))
              if adequate else None)
    if taught <= 0 or not math.isfinite(taught):
        note = ("pretraining taught the source nothing measurable (scratch's source val NLL is "
                "not above the pretrained model's), so no trained arm can stay within the bound")
    else:
        note = None
    return {
        "pretraining_helps": {
            "arm": best_adapted, "split": "test", "metric": "(scratch − arm) / scratch, "
            "NLL per note", "threshold": d.min_gain, "interval": gain,
            "verdict": _verdict(gain, d.min_gain)},
        "best_arm": best,
        "taught_nats_per_note": taught,
        "forgetting_bound_nats_per_note": bound,
        "smallest_adequate": chosen,
        "standing": standing,
        "note": note,
    }

"""Evaluated runs lined up for ``symkit compare``: one split, the same pieces, each arm's scores.

:func:`check_split_hashes` refuses arms scored on different splits; :func:`model_rows` picks an
arm's rows of one model on one split; :func:`exclusions` lists, per arm, the pieces it encodes
lossily or did not score, and :func:`compared_scores` leaves every such piece out of every arm
before turning each arm's rows into :class:`pipeline.stats.paired.ArmScores`.
:func:`judge_registered` scores the pairs of the baseline's registered comparisons the same way
and has :mod:`pipeline.decision.registered_comparisons` judge them; :func:`reads_test` says
whether any of that reads test scores (then ``compare`` reads them through the test-access
gate). The runs are read by :mod:`pipeline.tools.runs`; the statistics are
:mod:`pipeline.stats.paired`'s.

A library of the tools, not a command (it declares no ``HELP``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from pipeline.decision import registered_comparisons as registered
from pipeline.decision.registered_comparisons import REGISTRATION, ComparisonRule
from pipeline.stats import paired as stats
from pipeline.stats.paired import Refusal
from pipeline.tools.runs import EVAL, EvaluatedRun


def check_split_hashes(arms: Sequence[EvaluatedRun]) -> None:
    """:class:`Refusal` unless every arm's ``protocol.split_hash`` is present and the same."""
    hashes = {a.label: a.protocol.get("split_hash") for a in arms}
    listed = "; ".join(f"{label!r}: {h}" for label, h in hashes.items())
    if any(not h for h in hashes.values()):
        raise Refusal(f"no protocol.split_hash in {EVAL} of some arms ({listed}); re-run "
                      "`dvc repro evaluate` for them")
    if len(set(hashes.values())) > 1:
        raise Refusal(f"the arms were scored on different splits (protocol.split_hash): {listed}. "
                      "Scores on different pieces cannot be paired; compare runs of one split")


def model_rows(arm: EvaluatedRun, model: str, split: str) -> pd.DataFrame:
    """The arm's rows of ``model`` on ``split``; :class:`Refusal` when there are none."""
    pp = arm.per_piece
    rows = pp[(pp["model"] == model) & (pp["split"] == split)]
    if rows.empty:
        have = sorted(set(pp.loc[pp["split"] == split, "model"]))
        raise Refusal(f"arm {arm.label!r} has no {model!r} scores on {split} (models scored "
                      f"there: {', '.join(have) or 'none'}); choose another --model or --split")
    return rows


def exclusions(arms: Sequence[EvaluatedRun], split: str,
               model: str) -> dict[str, list[dict[str, str]]]:
    """Per arm (by label), the ``split`` pieces its evaluate lists as encoded lossily
    (``fidelity.pieces``: scored, but its tokens lose notes) or as not scored with a reason
    (``excluded.pieces``, e.g. ``not_encoded``), restricted to pieces some arm scored with
    ``model`` on ``split``. Every piece listed for any arm is left out of every comparison: a
    tokenizer that drops notes, or fails on the hardest pieces, must not look better for it."""
    scored: set[str] = set()
    for a in arms:
        pp = a.per_piece
        scored.update(pp.loc[(pp["model"] == model) & (pp["split"] == split), "sha256"])
    out = {}
    for a in arms:
        items: dict[str, str] = {}
        for p in (a.eval.get("fidelity") or {}).get("pieces") or []:
            if p.get("split") == split and p.get("sha256") in scored:
                items[p["sha256"]] = "lossy: " + ", ".join(p.get("flags") or [])
        for p in (a.eval.get("excluded") or {}).get("pieces") or []:
            if p.get("sha256") in scored:
                items.setdefault(p["sha256"], f"not scored: {p.get('reason')}")
        out[a.label] = [{"sha256": sha, "reason": r} for sha, r in sorted(items.items())]
    return out


def dropped(arms: Sequence[EvaluatedRun], split: str, model: str) -> set[str]:
    """Every piece :func:`exclusions` lists for some arm."""
    return {p["sha256"] for items in exclusions(arms, split, model).values() for p in items}


def compared_scores(arms: Sequence[EvaluatedRun], split: str, model: str,
                    drop: set[str] | None = None) -> list[stats.ArmScores]:
    """Each arm's scores of ``model`` on ``split``, without the pieces in ``drop`` (default:
    every piece :func:`exclusions` lists for some arm)."""
    if drop is None:
        drop = dropped(arms, split, model)
    out = []
    for a in arms:
        rows = model_rows(a, model, split)
        out.append(stats.arm_scores(rows[~rows["sha256"].isin(drop)], a.label))
    return out


def reads_test(split: str, baseline: EvaluatedRun) -> bool:
    """Does comparing on ``split`` read test scores: on test, or with a comparison registered
    on test in ``baseline``'s registration (:func:`judge_registered` scores its pairs)?"""
    if split == "test":
        return True
    if baseline.registration is None:
        return False
    reg = registered.read_registration(baseline.registration, baseline.label)
    return not isinstance(reg, str) and any(r.split == "test" for r in reg.config.rules)


def judge_registered(arms: Sequence[EvaluatedRun]) -> dict[str, Any]:
    """The baseline's registered comparisons judged on ``arms``
    (:func:`pipeline.decision.registered_comparisons.judge`): each rule's pair is scored like a
    comparison,
    on its own model and split, with the registered ``n_boot`` and ``seed``, and with the
    generator of the comparison of arm ``j`` when the pair's baseline is the first arm
    (``default_rng([seed, j])``; ``[seed, i, j]`` otherwise)."""
    infos = [registered.ArmInfo(a.label, stats.flatten_params(a.params), a.params.get("compare"),
                                a.registration) for a in arms]
    base = arms[0]
    if base.registration is None:
        out = registered.judge(None, infos, _no_scorer)
        out["note"] = (f"{base.label} (the baseline) holds no {REGISTRATION}: no comparison was "
                       "registered (`symkit preregister` freezes params.yaml's compare section)")
        return out
    reg = registered.read_registration(base.registration, base.label)
    if isinstance(reg, str):
        out = registered.judge(None, infos, _no_scorer)
        out["note"] = reg
        return out
    drops: dict[tuple[str, str], set[str]] = {}

    def score(i: int, j: int, rule: ComparisonRule, level: float) -> dict[str, Any]:
        key = (rule.split, rule.model)
        if key not in drops:
            drops[key] = dropped(arms, rule.split, rule.model)
        a, b = arms[i], arms[j]
        sa, sb = (stats.arm_scores(rows[~rows["sha256"].isin(drops[key])], arm.label)
                  for arm, rows in ((a, model_rows(a, rule.model, rule.split)),
                                    (b, model_rows(b, rule.model, rule.split))))
        p = stats.pair(sa, sb, a.label, b.label, rule.split)
        rng = np.random.default_rng([reg.config.seed, j] if i == 0 else
                                    [reg.config.seed, i, j])
        metrics = stats.compare_pair(p, stats.comparable_metrics(a.protocol, b.protocol)[0],
                                     n_boot=reg.config.n_boot, level=level, rng=rng,
                                     margin=reg.config.equivalence_margin)
        return {"metrics": metrics, "n_pieces": p.n_pieces, "n_groups": p.n_groups,
                "n_seeds": [p.a.n_seeds, p.b.n_seeds]}

    return registered.judge(reg, infos, score)


def _no_scorer(i: int, j: int, rule: ComparisonRule, level: float) -> dict[str, Any]:
    raise AssertionError("nothing is scored without a registration")

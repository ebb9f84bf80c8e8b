"""Decision criteria: parsing (errors name the key), verdicts, planted leak."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.model_selection import GroupShuffleSplit

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, load_section, parse_section
from pipeline.decision.criteria import (
    CriteriaConfig,
    Criterion,
    evaluate,
    evaluate_all,
    overall,
)
from pipeline.decision.metrics import build_metrics

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"

RULE = {"name": "r", "metric": "m", "op": ">=", "threshold": 0.02, "rationale": "why"}


def rule(**kw) -> Criterion:
    return Criterion(**{**RULE, **kw})


def test_default_criteria_parse():
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    names = [r.name for r in cfg.rules]
    assert names == ["transformer_beats_ngram", "no_test_near_copies",
                     "transformer_copies_no_more_than_humans",
                     "transformer_membership_near_chance", "transformer_extraction_at_chance",
                     "transformer_samples_human_like", "transformer_gap_bounded",
                     "transformer_gap_not_negative"]
    # none is judged on a count the split makes 0 by construction
    assert not any(r.metric.startswith("leakage.crossing") for r in cfg.rules)


@pytest.mark.parametrize(("rules", "key"), [
    ([{**RULE, "op": "=>"}], "criteria.rules.0.op"),
    ([RULE, {**RULE, "name": "s", "threshold": "high"}], "criteria.rules.1.threshold"),
    ([{k: v for k, v in RULE.items() if k != "metric"}], "criteria.rules.0.metric"),
    ([{**RULE, "ci": "lower>1"}], "criteria.rules.0.ci"),
    ([{**RULE, "thresold": 1.0}], "criteria.rules.0.thresold"),
    ([{**RULE, "rationale": ""}], "criteria.rules.0.rationale"),
    ([{**RULE, "name": "has space"}], "criteria.rules.0.name"),
    ([], "criteria.rules"),
])
def test_parsing_errors_name_the_bad_key(rules, key):
    with pytest.raises(ParamsError) as e:
        parse_section("criteria", {"rules": rules}, CriteriaConfig)
    assert f"params.yaml: {key} = " in str(e.value)


def test_cross_field_errors_say_what_to_do():
    with pytest.raises(ParamsError, match=r"criteria.*name 'r' is used twice"):
        parse_section("criteria", {"rules": [RULE, RULE]}, CriteriaConfig)
    with pytest.raises(ParamsError, match=r"ci_metric.*set ci to"):
        parse_section("criteria", {"rules": [{**RULE, "ci_metric": "x"}]}, CriteriaConfig)
    with pytest.raises(ParamsError, match=r"criteria.ruels.*unknown key"):
        parse_section("criteria", {"ruels": [RULE]}, CriteriaConfig)


@pytest.mark.parametrize(("metrics", "kw", "status"), [
    ({"m": 0.05}, {}, "PASS"),
    ({"m": 0.01}, {}, "FAIL"),
    ({}, {}, "INCONCLUSIVE"),
    ({"m": "text"}, {}, "INCONCLUSIVE"),
    ({"m": 0.05, "m.ci_low": 0.01, "m.ci_high": 0.09}, {"ci": "lower>0"}, "PASS"),
    ({"m": 0.05, "m.ci_low": -0.01, "m.ci_high": 0.09}, {"ci": "lower>0"}, "INCONCLUSIVE"),
    ({"m": 0.05, "m.ci_low": -0.09, "m.ci_high": -0.01}, {"ci": "lower>0"}, "FAIL"),
    ({"m": 0.05}, {"ci": "lower>0"}, "INCONCLUSIVE"),
    ({"m": 0.05, "d.ci_low": 0.2, "d.ci_high": 0.3}, {"ci": "excludes_zero", "ci_metric": "d"},
     "PASS"),
    ({"m": 0.0}, {"op": "==", "threshold": 0.0}, "PASS"),
    ({"m": 1}, {"op": "==", "threshold": 0.0}, "FAIL"),
])
def test_verdicts(metrics, kw, status):
    v = evaluate(rule(**kw), metrics)
    assert v.status == status, v.evidence
    assert v.name == "r" and v.evidence


@pytest.mark.parametrize(("lo", "hi", "op", "status"), [
    (0.03, 0.07, ">=", "PASS"),          # the whole interval clears 0.02
    (0.01, 0.07, ">=", "INCONCLUSIVE"),  # the point (0.04) clears it, the lower bound does not
    (-0.02, 0.015, ">=", "FAIL"),        # no value in the interval reaches 0.02
    (0.0, 0.015, "<=", "PASS"),
    (0.01, 0.05, "<=", "INCONCLUSIVE"),
    (0.03, 0.05, "<", "FAIL"),
])
def test_interval_judging_applies_the_threshold_to_the_bounds(lo, hi, op, status):
    r = rule(op=op, threshold=0.02, judge="interval")
    v = evaluate(r, {"m": 0.04, "m.ci_low": lo, "m.ci_high": hi}, ci_level=0.9)
    assert v.status == status, v.evidence
    assert "90% CI" in v.evidence and v.evidence.endswith(".")
    assert evaluate(r, {"m": 0.04}).status == "INCONCLUSIVE"  # no interval, no verdict


@pytest.mark.parametrize(("lo", "hi", "op", "status"), [
    (-0.3, -0.1, ">=", "FAIL"),    # the whole interval below 0: the data refute "not negative"
    (-0.3, 0.1, ">=", "PASS"),     # straddles: not refuted
    (0.1, 0.3, ">=", "PASS"),
    (0.6, 0.9, "<=", "FAIL"),      # as an upper bound of 0.5
    (0.4, 0.9, "<=", "PASS"),
])
def test_a_refute_rule_fails_only_when_the_whole_interval_does(lo, hi, op, status):
    r = rule(op=op, threshold=0.0 if op == ">=" else 0.5, judge="refute")
    v = evaluate(r, {"m": (lo + hi) / 2, "m.ci_low": lo, "m.ci_high": hi})
    assert v.status == status, v.evidence
    assert ("refute" in v.evidence) and v.judge == "refute"
    assert evaluate(r, {"m": 0.1}).status == "INCONCLUSIVE"  # no interval, no verdict


def test_a_zero_width_interval_never_passes_but_a_failing_value_still_fails():
    # extraction at 0 of 64 train and 0 of 45 test pieces resampled to [0, 0]: it would pass
    # "<= 0.05" although 0 of 64 alone allows a rate up to 5.7%
    v = evaluate(rule(op="<=", threshold=0.05, judge="interval"),
                 {"m": 0.0, "m.ci_low": 0.0, "m.ci_high": 0.0})
    assert v.status == "INCONCLUSIVE" and "zero width" in v.evidence
    # a membership AUC of 1 in every replicate (perfect separation) is the failure itself
    assert evaluate(rule(op="<=", threshold=0.6, judge="interval"),
                    {"m": 1.0, "m.ci_low": 1.0, "m.ci_high": 1.0}).status == "FAIL"


def test_interval_rules_refuse_equality_and_a_second_ci():
    with pytest.raises(ParamsError, match="judge: interval needs op"):
        parse_section("criteria", {"rules": [{**RULE, "op": "==", "judge": "interval"}]},
                      CriteriaConfig)
    with pytest.raises(ParamsError, match="drop ci"):
        parse_section("criteria", {"rules": [{**RULE, "judge": "interval", "ci": "lower>0"}]},
                      CriteriaConfig)


def test_overall_decision():
    cfg = CriteriaConfig(rules=[rule(name="a"), rule(name="b", metric="n")])
    assert overall(evaluate_all(cfg, {"m": 1.0, "n": 1.0})) == "PASS"
    assert overall(evaluate_all(cfg, {"m": 1.0})) == "INCONCLUSIVE"
    assert overall(evaluate_all(cfg, {"n": -1.0})) == "FAIL"


def crossing(groups: np.ndarray, split: np.ndarray) -> int:
    """Groups whose pieces lie in more than one split."""
    return sum(len(set(split[groups == g])) > 1 for g in np.unique(groups))


def test_planted_leak_fails_the_leakage_criterion(tmp_path):
    # 40 tunes with 3 arrangements each; a row-level random split scatters tunes across splits,
    # so test pieces have a near copy (another arrangement) in train; a grouped split has none
    groups = np.repeat(np.arange(40), 3)
    rng = np.random.default_rng(0)
    leaky = rng.choice(np.array(["train", "val", "test"]), size=groups.size, p=[0.8, 0.1, 0.1])
    train_idx, held_idx = next(GroupShuffleSplit(n_splits=1, test_size=0.2, random_state=0)
                               .split(groups, groups=groups))
    grouped = np.empty(groups.size, dtype=object)
    grouped[train_idx], grouped[held_idx] = "train", "test"
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    results = {}
    for name, split in (("leaky", leaky), ("grouped", grouped)):
        in_train = {g for g, s in zip(groups, split, strict=True) if s == "train"}
        near = sum(s == "test" and g in in_train for g, s in zip(groups, split, strict=True))
        path = tmp_path / f"{name}_leakage.json"
        artifacts.write_json(path, {"independent": {"test_near_train": near}})
        metrics = build_metrics({"leakage": artifacts.read_json(path)})
        results[name] = {v.name: v for v in evaluate_all(cfg, metrics)}
    assert results["leaky"]["no_test_near_copies"].status == "FAIL"
    assert results["leaky"]["no_test_near_copies"].value > 0
    assert results["grouped"]["no_test_near_copies"].status == "PASS"


def _judged(flag=(-0.1, -0.15, -0.05), auc=(0.52, 0.45, 0.58), extraction=(0.0, -0.03, 0.02),
            quality=1.0) -> dict:
    def ci(v):
        return {"value": v[0], "ci_low": v[1], "ci_high": v[2]}

    return {"judged": {"transformer": {"flag_rate": {"excess": ci(flag)},
                                       "membership_auc": ci(auc),
                                       "extraction_rate": {"excess": ci(extraction)},
                                       "quality": {"score": quality,
                                                   "score_band_low": 6 / 7}}}}


def _eval(rel=(0.06, 0.04, 0.08), gap=(0.2, 0.1, 0.3)) -> dict:
    def ci(v):
        return {"value": v[0], "ci_low": v[1], "ci_high": v[2]}

    return {"paired": {"ngram_minus_transformer": {"test": {"rel_improvement": ci(rel)}}},
            "gap": {"transformer": {"nats_per_token": ci(gap), "nats_per_note": ci(gap)}}}


@pytest.mark.parametrize(("planted", "reports", "failing"), [
    ("a sound experiment", {}, set()),
    ("a transformer worse than the n-gram", {"eval": _eval(rel=(-0.03, -0.05, -0.01))},
     {"transformer_beats_ngram"}),
    ("a copying model", {"audit": _judged(flag=(0.68, 0.61, 0.75), auc=(1.0, 1.0, 1.0),
                                          extraction=(0.97, 0.92, 1.0))},
     {"transformer_copies_no_more_than_humans", "transformer_membership_near_chance",
      "transformer_extraction_at_chance"}),
    ("a noise model", {"audit": _judged(quality=0.14)}, {"transformer_samples_human_like"}),
    ("a silent model", {"audit": _judged(quality=0.0)}, {"transformer_samples_human_like"}),
    ("an overfit model", {"eval": _eval(gap=(1.74, 1.60, 1.88))}, {"transformer_gap_bounded"}),
    ("a negative gap", {"eval": _eval(gap=(-0.2, -0.3, -0.1))}, {"transformer_gap_not_negative"}),
    ("an edited copy in test", {"leakage": {"independent": {"test_near_train": 1}}},
     {"no_test_near_copies"}),
])
def test_each_registered_default_rule_fails_on_its_planted_failure(planted, reports, failing):
    """The shipped criteria, fed the evidence a planted failure produces (the stage tests show
    the planted models produce it), fail exactly the rules aimed at it."""
    base = {"eval": _eval(), "audit": _judged(),
            "leakage": {"independent": {"test_near_train": 0}}}
    metrics = build_metrics({**base, **reports})
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    verdicts = {v.name: v.status for v in evaluate_all(cfg, metrics)}
    assert {n for n, s in verdicts.items() if s == "FAIL"} == failing, planted
    assert {n for n, s in verdicts.items() if s != "FAIL"} == \
        {n for n, s in verdicts.items() if s == "PASS"}, verdicts  # the rest pass


# --- guards judged on every training seed -------------------------------------------------------

MEMBERSHIP = "memorisation.transformer.membership_auc"
GAP = "generalisation.gap_per_note.transformer"
REPO_REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _seeded(key: str, blocks: dict[str, tuple[float, float, float]],
            pooled: tuple[float, float, float] | None = None) -> dict:
    """Flat metrics holding ``key``'s seed blocks (value, ci_low, ci_high) and, optionally, the
    seeds' pooled block."""
    from pipeline.decision.metrics import seed_metrics

    out: dict = {}
    if pooled is not None:
        out.update({key: pooled[0], f"{key}.ci_low": pooled[1], f"{key}.ci_high": pooled[2]})
    for seed, (v, lo, hi) in blocks.items():
        out.update(seed_metrics(key, seed, {"value": v, "ci_low": lo, "ci_high": hi}))
    return out


BOUND = rule(name="bound", metric=MEMBERSHIP, op="<=", threshold=0.65, judge="interval")
NOT_NEGATIVE = rule(name="leak", metric=GAP, op=">=", threshold=0.0, judge="refute")


@pytest.mark.parametrize(("blocks", "status", "decider"), [
    ({"1": (0.5, 0.45, 0.55), "2": (0.55, 0.5, 0.6), "3": (0.52, 0.47, 0.57)}, "PASS", "2"),
    ({"1": (0.5, 0.45, 0.55), "2": (0.64, 0.6, 0.7), "3": (0.52, 0.47, 0.57)},
     "INCONCLUSIVE", "2"),
    ({"1": (0.5, 0.45, 0.55), "2": (0.8, 0.7, 0.9), "3": (0.9, 0.85, 0.95)}, "FAIL", "2"),
    ({"1": (0.5, 0.45, 0.55), "2": (0.6, 0.55, None), "3": (0.52, 0.47, 0.57)},
     "INCONCLUSIVE", "2"),
])
def test_a_guard_fails_when_any_seed_fails_and_passes_only_when_every_seed_passes(
        blocks, status, decider):
    """Each seed judged with the rule's own judge; the verdict carries the deciding seed's
    value and interval (the first failing seed, else the one nearest to failing), and the
    evidence names every seed. The pooled block beside them is not what is judged."""
    v = evaluate(BOUND, _seeded(MEMBERSHIP, blocks, pooled=(0.6, 0.3, 0.9)))
    assert v.status == status and v.seed == decider
    assert (v.value, v.ci_low, v.ci_high) == blocks[decider]
    assert [(s.seed, s.status) for s in v.seeds] == [
        (k, evaluate(BOUND, _seeded(MEMBERSHIP, {}, pooled=b)).status)
        for k, b in blocks.items()]
    for seed, (value, _, _) in blocks.items():
        assert f"seed {seed} {value:.4g}" in v.evidence
    assert v.to_dict()["seeds"][0]["seed"] == "1"


def test_seeds_are_ordered_by_number_and_a_pooled_block_alone_is_judged_as_before():
    blocks = {"10": (0.5, 0.45, 0.55), "9": (0.5, 0.45, 0.55)}
    assert [s.seed for s in evaluate(BOUND, _seeded(MEMBERSHIP, blocks)).seeds] == ["9", "10"]
    # no seed blocks (a model trained once, an older report): the metric itself, as before
    v = evaluate(BOUND, _seeded(MEMBERSHIP, {}, pooled=(0.6, 0.3, 0.9)))
    assert (v.status, v.seeds, v.seed) == ("INCONCLUSIVE", (), None)
    # a metric the metric table does not judge per seed ignores keys shaped like seed blocks
    gain = rule(metric="test.nll_per_note.rel_improvement", judge="interval")
    v = evaluate(gain, _seeded(gain.metric, {"1": (-0.1, -0.2, 0.0)}, pooled=(0.06, 0.04, 0.08)))
    assert (v.status, v.seeds) == ("PASS", ())


def _spread_statuses(r: Criterion, mean: float, half: float, offsets: np.ndarray,
                     steps: np.ndarray, per_seed: bool) -> list[str]:
    """The verdict of ``r`` as seeds spread around a fixed mean: seed ``i`` at
    ``mean + step · offsets[i]`` with an interval of ``± half``; ``per_seed`` False judges the
    seeds' mean with a Student-t term over them instead (the old judging)."""
    from scipy import stats

    out = []
    for step in steps:
        values = mean + step * offsets
        if per_seed:
            metrics = _seeded(r.metric, {str(1234 + i): (x, x - half, x + half)
                                         for i, x in enumerate(values)})
        else:
            k = len(values)
            t = stats.t.ppf(0.975, k - 1) * values.std(ddof=1) / np.sqrt(k)
            wide = float(np.hypot(half, t))  # the seeds share the pieces: half stays
            metrics = _seeded(r.metric, {}, pooled=(values.mean(), values.mean() - wide,
                                                    values.mean() + wide))
        out.append(evaluate(r, metrics).status)
    return out


@pytest.mark.parametrize("guard", [BOUND, NOT_NEGATIVE], ids=["interval bound", "refute"])
def test_more_disagreement_between_seeds_never_means_fewer_fails(guard):
    """The issue's property: the seeds' mean held fixed, seeds spread further apart step by
    step; the count of FAIL verdicts over many experiments never decreases, and no single
    experiment turns from FAIL back. Judging the mean with the seeds' t term breaks it."""
    rng = np.random.default_rng(0)
    steps = np.linspace(0.0, 0.6, 13)
    spots = [(float(rng.uniform(guard.threshold - 0.3, guard.threshold + 0.3)),
              float(rng.uniform(0.01, 0.15)), rng.normal(size=3)) for _ in range(300)]
    spots = [(m, h, (o - o.mean()) / o.std()) for m, h, o in spots]  # mean 0: the mean fixed
    per_seed = [_spread_statuses(guard, m, h, o, steps, True) for m, h, o in spots]
    fails = [sum(s[i] == "FAIL" for s in per_seed) for i in range(len(steps))]
    assert fails == sorted(fails) and fails[-1] > fails[0], fails
    for s in per_seed:
        first = s.index("FAIL") if "FAIL" in s else len(s)
        assert all(x == "FAIL" for x in s[first:]), s
    old = [_spread_statuses(guard, m, h, o, steps, False) for m, h, o in spots]
    old_fails = [sum(s[i] == "FAIL" for s in old) for i in range(len(steps))]
    assert old_fails[-1] < old_fails[0], old_fails  # the defect the per-seed judging removes


def test_the_committed_membership_is_judged_on_every_seed():
    """The committed reports: each seed's own membership interval is judged against the
    registered limit. The registration of cfdddef (models trained without transposed copies)
    had every seed's interval above it, a FAIL on each; the current one's models have every
    interval below it, a PASS on each. The gap rules judge each seed's gap too."""
    reports = {stem: artifacts.read_json(REPO_REPORTS / f"{stem}.json")
               for stem in ("eval", "audit")}
    metrics = build_metrics(reports)
    cfg = load_section("criteria", REPO_PARAMS, CriteriaConfig)
    verdicts = {v.name: v for v in evaluate_all(cfg, metrics)}
    membership = verdicts["transformer_membership_near_chance"]
    limit = next(r.threshold for r in cfg.rules if r.name == membership.name)
    seeds = [str(x) for x in reports["eval"]["seeds"]["transformer"]]
    assert membership.metric == MEMBERSHIP and membership.status == "PASS"
    assert [s.seed for s in membership.seeds] == seeds and len(seeds) > 1
    assert all(s.ci_high < limit and s.status == "PASS" for s in membership.seeds)
    per_seed = reports["audit"]["judged"]["transformer"]["per_seed"]
    assert [(s.value, s.ci_low, s.ci_high) for s in membership.seeds] == [
        tuple(per_seed[k]["membership_auc"][p] for p in ("value", "ci_low", "ci_high"))
        for k in seeds]
    assert [s.seed for s in verdicts["transformer_gap_bounded"].seeds] == seeds

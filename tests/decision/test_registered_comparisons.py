"""Registered comparisons (pipeline.decision.registered_comparisons): the ``compare`` section, its
record, and ``symkit compare``'s verdicts on it (``symkit preregister --comparisons-only``, which
writes the record, is tested in tests/tools/test_preregister.py).

Arms are folders in ``tmp_path`` built from synthetic per-piece scores (the helpers of
tests/tools/test_compare.py): never the repository's own ``reports/``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.core import artifacts
from pipeline.core.config import ParamsError, parse_section
from pipeline.decision.registered_comparisons import (
    REGISTRATION,
    ArmInfo,
    CompareConfig,
    check_against,
    judge,
    matches,
    multiplicity,
    read_registration,
    record,
)
from pipeline.stats.paired import flatten_params
from tests.tools.test_compare import PARAMS, pieces, scored, simulate, write_arm

RULE = {"name": "tsd_beats_remi", "baseline": {"tokenize.tokenizer": "REMI"},
        "arm": {"tokenize.tokenizer": "TSD"}, "metric": "nats_per_note.rel_improvement",
        "op": ">=", "threshold": 0.02, "judge": "interval", "rationale": "r"}
SECTION = {"n_boot": 300, "ci_level": 0.95, "seed": 0, "equivalence_margin": 0.005,
           "multiplicity": "bonferroni", "rules": [RULE]}


def params_with(section: dict | None = None, **tokenize: Any) -> dict:
    """The test arms' params with the tokenize values given and a compare section."""
    p = copy.deepcopy(PARAMS)
    p["tokenize"].update(tokenize)
    if section is not None:
        p["compare"] = copy.deepcopy(section)
    return p


def arm(root: Path, rows, params: dict, registration: dict | None = None) -> Path:
    """An arm folder, with ``reports/preregistration_compare.json`` when given."""
    write_arm(root, rows, params)
    if registration is not None:
        artifacts.write_json(root / REGISTRATION, registration)
    return root


def compare(tmp_path: Path, monkeypatch, *arms: str, extra: tuple[str, ...] = ()) -> dict:
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--n-boot", "300", "--no-figures", "--out", "out", *extra,
                 *arms]) == 0
    return json.loads((tmp_path / "out" / "compare.json").read_text())


def cfg(section: dict = SECTION) -> CompareConfig:
    return parse_section("compare", section, CompareConfig)


# ---- the section ----------------------------------------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"metric": "test.nll_per_note.rel_improvement"}, "not a comparison metric"),
    ({"arm": {"tokenize.vocab_size": 2000}}, "must name the same params"),
    ({"arm": {"tokenize.tokenizer": "REMI"}}, "at least one param whose value differs"),
    ({"baseline": {"runtime.workers": 1}, "arm": {"runtime.workers": 2}},
     "section that shapes results"),
    ({"baseline": {"tokenizer": "REMI"}, "arm": {"tokenizer": "TSD"}}, "not a dotted"),
    ({"split": "train"}, "compare.rules.0.split"),
])
def test_bad_rules_are_refused_with_the_reason(change, words):
    with pytest.raises(ParamsError, match=words):
        cfg({**SECTION, "rules": [{**RULE, **change}]})


def test_rule_names_are_unique_and_rules_are_required():
    with pytest.raises(ParamsError, match="used twice"):
        cfg({**SECTION, "rules": [RULE, RULE]})
    with pytest.raises(ParamsError, match=r"compare\.rules"):
        cfg({k: v for k, v in SECTION.items() if k != "rules"})
    assert cfg({**SECTION, "rules": []}).rules == []


def test_rule_keys_and_values_are_checked_against_the_params():
    from pipeline.core.config import read_params

    params = read_params(Path(__file__).resolve().parents[2] / "params.yaml")
    good = cfg({**SECTION, "rules": [{**RULE, "baseline": {"tokenize.tokenizer": "REMI"},
                                      "arm": {"tokenize.tokenizer": "TSD"}}]})
    check_against(good, params)
    typo = cfg({**SECTION, "rules": [{**RULE, "baseline": {"tokenize.tokenzier": "REMI"},
                                      "arm": {"tokenize.tokenzier": "TSD"}}]})
    with pytest.raises(ParamsError, match=r"'tokenize\.tokenzier' is not a param"):
        check_against(typo, params)
    bad = cfg({**SECTION, "rules": [{**RULE, "arm": {"tokenize.tokenizer": "TSDX"}}]})
    with pytest.raises(ParamsError, match=r"rules\[0\].arm .*invalid tokenize section"):
        check_against(bad, params)


def test_the_repository_plans_comparisons_its_registration_freezes():
    root = Path(__file__).resolve().parents[2]
    from pipeline.core.config import read_params

    params = read_params(root / "params.yaml")
    section = cfg(params["compare"])
    check_against(section, params)
    reg = read_registration(artifacts.read_json(root / REGISTRATION), "repository")
    assert not isinstance(reg, str) and reg.problems == ()
    assert reg.raw == params["compare"], "params.yaml's compare section differs from its " \
        "registration: run `symkit preregister --comparisons-only` and commit both"
    assert all(r.rationale for r in section.rules)


# ---- judging ----------------------------------------------------------------------------------
def planted(rng_seed: int, effect: float) -> tuple:
    return simulate(np.random.default_rng(rng_seed), effect, seeds=(1, 2, 3), seed_sd=0.004)


def test_a_registered_rule_judges_its_pair_pass_and_fail(tmp_path, monkeypatch, capsys):
    reg = record(SECTION)
    a, b = planted(1, 0.06)  # TSD 6% better: the whole interval clears 2%
    arm(tmp_path / "remi", a, params_with(SECTION), reg)
    arm(tmp_path / "tsd", b, params_with(SECTION, tokenizer="TSD"), reg)
    out = compare(tmp_path, monkeypatch, "remi", "tsd")
    (rule,) = out["registered"]["rules"]
    assert (rule["baseline"], rule["arm"], rule["status"]) == ("remi", "tsd", "PASS")
    assert rule["ci_low"] > 0.02 and rule["deviations"] == [] and rule["changes"] == [
        "tokenize.tokenizer"]
    assert out["comparisons"][0]["registered_rules"] == ["tsd_beats_remi"]
    assert "registered tsd_beats_remi: PASS" in capsys.readouterr().out
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "## Registered comparisons" in md and "Registered: tsd_beats_remi (PASS)" in md
    # a planted null: no gain at all, so no value in the interval reaches 2%
    a, b = planted(2, 0.0)
    arm(tmp_path / "remi", a, params_with(SECTION), reg)
    arm(tmp_path / "tsd", b, params_with(SECTION, tokenizer="TSD"), reg)
    (rule,) = compare(tmp_path, monkeypatch, "remi", "tsd")["registered"]["rules"]
    assert rule["status"] == "FAIL" and rule["ci_high"] < 0.02


def test_rules_use_the_registered_settings_not_the_options(tmp_path, monkeypatch):
    none = {**SECTION, "multiplicity": "none"}
    reg = record(none)
    a, b = planted(3, 0.03)
    arm(tmp_path / "remi", a, params_with(none), reg)
    arm(tmp_path / "tsd", b, params_with(none, tokenizer="TSD"), reg)
    out = compare(tmp_path, monkeypatch, "remi", "tsd")  # --n-boot 300, seed 0: as registered
    rel = out["comparisons"][0]["metrics"]["nats_per_note"]["rel_improvement"]
    (rule,) = out["registered"]["rules"]
    assert (rule["ci_low"], rule["ci_high"], rule["level"]) == (rel["ci_low"], rel["ci_high"],
                                                                 0.95)
    other = compare(tmp_path, monkeypatch, "remi", "tsd",
                    extra=("--seed", "7", "--ci-level", "0.8"))
    assert other["registered"]["rules"][0]["ci_low"] == rule["ci_low"]
    assert other["comparisons"][0]["metrics"]["nats_per_note"]["rel_improvement"] != rel


def test_bonferroni_widens_the_rules_intervals_over_the_registered_family():
    two = cfg({**SECTION, "rules": [RULE, {**RULE, "name": "second"}]})
    assert multiplicity(two, [1, 1]) == (2, pytest.approx(0.975))
    assert multiplicity(two, [3, 0]) == (4, pytest.approx(0.9875))  # a rule per pair it judges
    assert multiplicity(cfg({**SECTION, "multiplicity": "none"}), [2]) == (2, 0.95)
    assert multiplicity(cfg(), [1]) == (1, 0.95)


def test_a_rule_is_judged_on_a_pair_without_the_baseline(tmp_path, monkeypatch):
    """In a 2 x 2 grid the rule pinned at vocabulary 2000 compares two arms, neither of which
    is the command's baseline; arms with the baseline's params count once."""
    rule = {**RULE, "baseline": {"tokenize.tokenizer": "REMI", "tokenize.vocab_size": 2000},
            "arm": {"tokenize.tokenizer": "TSD", "tokenize.vocab_size": 2000}}
    section = {**SECTION, "rules": [rule]}
    reg = record(section)
    p = pieces(np.random.default_rng(4), 20, 2)
    rng = np.random.default_rng(5)
    rows = {name: scored(p, np.full(len(p), f), [1, 2, 3], rng)
            for name, f in [("base", 1.0), ("same", 1.0), ("r2000", 0.99), ("t2000", 0.9)]}
    arm(tmp_path / "base", rows["base"], params_with(section), reg)
    arm(tmp_path / "same", rows["same"], params_with(section), reg)
    arm(tmp_path / "r2000", rows["r2000"], params_with(section, vocab_size=2000), reg)
    arm(tmp_path / "t2000", rows["t2000"], params_with(section, tokenizer="TSD",
                                                       vocab_size=2000), reg)
    out = compare(tmp_path, monkeypatch, "base", "same", "r2000", "t2000")
    (judged,) = out["registered"]["rules"]
    assert (judged["baseline"], judged["arm"], judged["status"]) == ("r2000", "t2000", "PASS")
    assert judged["value"] == pytest.approx(1 - 0.9 / 0.99, rel=1e-9)
    assert [c["registered_rules"] for c in out["comparisons"]] == [[], [], []]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert md.count("NOT REGISTERED: no registered rule covers this comparison") == 3


@pytest.mark.parametrize("case", ["no registration", "another registration", "edited rules",
                                  "edited file", "confounded"])
def test_a_registration_not_followed_is_deviated_and_says_how(tmp_path, monkeypatch, case):
    reg = record(SECTION)
    a, b = planted(6, 0.06)
    arm_params, arm_reg = params_with(SECTION, tokenizer="TSD"), copy.deepcopy(reg)
    base_reg = copy.deepcopy(reg)
    if case == "no registration":
        arm_reg = None
    elif case == "another registration":
        arm_reg = record({**SECTION, "rules": [{**RULE, "threshold": 0.01}]})
    elif case == "edited rules":
        arm_params["compare"]["rules"][0]["threshold"] = 0.0
    elif case == "edited file":
        base_reg["compare"]["rules"][0]["threshold"] = 0.0  # hash no longer matches
        arm_reg = base_reg
        arm_params["compare"]["rules"][0]["threshold"] = 0.0
    else:
        arm_params["tokenize"]["vocab_size"] = 2000
    arm(tmp_path / "remi", a, params_with(SECTION) if case != "edited file" else
        params_with(base_reg["compare"]), base_reg)
    arm(tmp_path / "tsd", b, arm_params, arm_reg)
    (rule,) = compare(tmp_path, monkeypatch, "remi", "tsd")["registered"]["rules"]
    assert rule["status"] == "DEVIATED" and rule["judged"] == "PASS"
    words = {"no registration": "tsd holds no reports/preregistration_compare.json",
             "another registration": "tsd was run with another registration",
             "edited rules": "tsd's params.yaml: compare rule 'tsd_beats_remi'.threshold: "
                             "registered 0.02, now 0.0",
             "edited file": "edited after registration",
             "confounded": "also differ in tokenize.vocab_size"}[case]
    assert any(words in d for d in rule["deviations"]), rule["deviations"]


def test_without_a_registration_every_comparison_is_not_registered(tmp_path, monkeypatch):
    a, b = planted(7, 0.05)
    arm(tmp_path / "remi", a, params_with(SECTION))
    arm(tmp_path / "tsd", b, params_with(SECTION, tokenizer="TSD"), record(SECTION))
    out = compare(tmp_path, monkeypatch, "remi", "tsd")
    assert out["registered"]["registered"] is False and out["registered"]["rules"] == []
    assert "remi (the baseline) holds no" in out["registered"]["note"]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "Every comparison below is exploratory" in md


def test_rules_these_arms_do_not_cover_are_not_run_with_the_reason(tmp_path, monkeypatch):
    section = {**SECTION, "rules": [RULE, {**RULE, "name": "on_ngram", "model": "ngram"}]}
    reg = record(section)
    a, b = planted(8, 0.05)
    arm(tmp_path / "remi", a, params_with(section), reg)
    arm(tmp_path / "remi2", b, params_with(section), reg)
    out = compare(tmp_path, monkeypatch, "remi", "remi2")
    reasons = {e["rule"]: e["reason"] for e in out["registered"]["not_run"]}
    assert reasons["tsd_beats_remi"] == 'no arm has tokenize.tokenizer="TSD"'
    assert set(reasons) == {"tsd_beats_remi", "on_ngram"}
    # a matching pair whose model was not scored is not run, and says why
    arm(tmp_path / "tsd", b, params_with(section, tokenizer="TSD"), reg)
    out = compare(tmp_path, monkeypatch, "remi", "tsd")
    reasons = {e["rule"]: e["reason"] for e in out["registered"]["not_run"]}
    assert "no 'ngram' scores on val" in reasons["on_ngram"]
    assert [e["rule"] for e in out["registered"]["rules"]] == ["tsd_beats_remi"]


def test_matching_prefers_the_controlled_pair_and_counts_identical_arms_once():
    rule = cfg().rules[0]

    def info(label: str, **tok: Any) -> ArmInfo:
        return ArmInfo(label, flatten_params(params_with(None, **tok)), None, None)

    arms = [info("remi"), info("remi-again"), info("tsd-2000", tokenizer="TSD", vocab_size=2000),
            info("tsd", tokenizer="TSD")]
    assert [(m.i, m.j, m.extra) for m in matches(rule, arms)] == [(0, 3, ())]
    assert [(m.i, m.j, m.extra) for m in matches(rule, arms[:3])] == [
        (0, 2, ("tokenize.vocab_size",))]
    assert judge(None, arms, lambda *a: {})["registered"] is False

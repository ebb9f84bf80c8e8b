"""The pre-registration record and its check (pipeline.decision.preregistration): what the
identity freezes, the record's hash, every kind of deviation, the status order, and the power
note on the comparison rule.

The planted-record tests call :func:`check` directly; the others register and report on a
small set of stage outputs (``tests.stages.test_report``), as ``dvc repro`` would."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import artifacts
from pipeline.core.artifacts import RESULT_PACKAGES
from pipeline.decision import ledger, preregistration
from pipeline.decision.preregistration import (
    FROZEN_SECTIONS,
    LATER_DEFAULTS,
    SCHEMA_VERSION,
    Check,
    Evidence,
    build,
    check,
    diff_flat,
    identity,
)
from tests.stages.test_report import (
    GIT_SHOWS_ORDER,
    HISTORY_CHECKED,
    RULES,
    SPLIT,
    make_inputs,
    register,
    report,
    write_params,
)

PARAMS = {"criteria": {"rules": RULES}, "evaluate": {"n_boot": 200},
          "tokenize": {"tokenizer": "REMI"}, "runtime": {"workers": 2}, "report": {"title": "t"}}
PACKAGES = {"numpy": "2.0.0", "torch": "2.3.0", "dvc": "3.0", "symkit": "0.1"}
PIECES = {"test": ["t2", "t1"], "val": ["v1"], "train": ["a"]}


def _current(**params) -> dict:
    return identity({**PARAMS, **params}, "hash-1", PACKAGES, PIECES)


def _registered(root: Path):
    p = make_inputs(root)
    params = write_params(root)
    register(root, params, p, before_scores=True)
    return p, params


# ---- the record, on planted identities --------------------------------------------------------
def test_the_identity_freezes_the_sorted_bound_pieces_the_frozen_sections_and_result_packages():
    ident = _current()
    assert ident["split_hash"] == "hash-1"
    assert ident["pieces"] == {"val": ["v1"], "test": ["t1", "t2"]}  # no train, sorted
    assert list(ident["params"]) == list(FROZEN_SECTIONS)
    assert ident["params"]["evaluate"] == {"n_boot": 200} and ident["params"]["ngram"] is None
    assert "runtime" not in ident["params"] and "report" not in ident["params"]
    assert list(ident["packages"]) == list(RESULT_PACKAGES)
    assert ident["packages"]["torch"] == "2.3.0" and ident["packages"]["scipy"] is None
    assert "dvc" not in ident["packages"] and "symkit" not in ident["packages"]
    assert identity(PARAMS, None, PACKAGES)["pieces"] is None


def test_the_record_hashes_its_identity_and_states_the_looks_it_was_forced_over():
    rec = build(_current())
    assert rec["schema"] == SCHEMA_VERSION and not rec["forced"] and rec["looks_before"] == []
    assert rec["identity_hash"] == artifacts.sha256_json(rec["identity"])
    assert build(_current(evaluate={"n_boot": 50}))["identity_hash"] != rec["identity_hash"]
    look = {"source": "git", "commit": "c" * 40, "time": "2024-01-01T00:00:00Z",
            "n_pieces": 2, "results_sha256": "r", "pieces": ["t1", "t2"],
            "registration": {"identity_hash": "old", "identity": {}}}
    forced = build(_current(), [look])
    assert forced["forced"] and forced["identity_hash"] == rec["identity_hash"]
    assert forced["looks_before"] == [{"source": "git", "commit": "c" * 40,
                                       "time": "2024-01-01T00:00:00Z", "n_pieces": 2,
                                       "results_sha256": "r", "registration": "old"}]


def test_the_status_is_the_strictest_that_applies():
    assert check(None, _current()).status == "NOT REGISTERED"
    assert Check(True, None, ["x"], n_looks=2, order_shown=True).status == "DEVIATED"
    assert Check(True, None, ["x"], unverified="no git").status == "DEVIATED"
    assert Check(True, None, n_looks=2, order_shown=True, unverified="no git").status == \
        "UNVERIFIED"
    assert Check(True, None, n_looks=1, order_shown=True).status == "FOLLOWED AFTER 1 LOOK"
    assert Check(True, None, n_looks=3).status == "FOLLOWED AFTER 3 LOOKS, ORDER NOT SHOWN"
    assert Check(True, None).status == "FOLLOWED, ORDER NOT SHOWN"
    assert Check(True, None, order_shown=True).status == "FOLLOWED"
    assert Check(True, None, n_looks=1, order_shown=True, amendments=[{}]).status == \
        "FOLLOWED AFTER 1 LOOK WITH 1 AMENDMENT"
    assert Check(True, None, order_shown=True, replaced=[{}, {}], test_sets=[{}]).status == \
        "FOLLOWED, REPLACING 2 REGISTRATIONS, AFTER 1 EARLIER TEST SET"


def test_an_unchanged_experiment_follows_its_registration_and_is_judged_by_its_rules():
    rec = build(_current())
    assert check(rec, _current()).status == "UNVERIFIED"  # history not checked
    followed = check(rec, _current(), evidence=Evidence(history=HISTORY_CHECKED))
    assert followed.deviations == [] and followed.status == "FOLLOWED, ORDER NOT SHOWN"
    assert [r.name for r in followed.criteria.rules] == [r["name"] for r in RULES]
    shown = check(rec, _current(), evidence=Evidence(git={"registration_precedes_results": True},
                                                     history=HISTORY_CHECKED))
    assert shown.status == "FOLLOWED"
    # the registered rules judge, not params.yaml's: a rule removed now is still judged
    loosened = check(rec, _current(criteria={"rules": RULES[:1]}))
    assert len(loosened.criteria.rules) == len(RULES)
    assert loosened.deviations == [
        "criterion 'memorisation_at_human_level' was registered but is no longer in params.yaml",
        "criterion 'no_crossing_groups' was registered but is no longer in params.yaml"]
    added = {**RULES[0], "name": "another"}
    assert check(rec, _current(criteria={"rules": [*RULES, added]})).deviations == [
        "criterion 'another' was added to params.yaml after registration"]


@pytest.mark.parametrize(("record", "named"), [
    ({"schema": 1}, "has schema 1, not 4"),
    ("not a record", "has schema None, not 4"),
    ({"schema": SCHEMA_VERSION}, "has no identity block"),
])
def test_an_unusable_record_is_a_deviation_with_no_rules(record, named):
    c = check(record, _current())
    assert c.status == "DEVIATED" and c.criteria is None
    assert len(c.deviations) == 1 and named in c.deviations[0]


def test_a_record_with_unparsable_rules_or_no_pieces_names_both():
    ident = {**_current(), "pieces": None}
    ident["params"] = {**ident["params"], "criteria": {"rules": [{"name": "x"}]}}
    c = check(build(ident), _current(), evidence=Evidence(scored={"test": ["t1"]}))
    assert c.criteria is None and c.status == "DEVIATED"
    assert any(d.startswith("the registered criteria do not parse") for d in c.deviations)
    assert "the registration lists no pieces, so the scored pieces cannot be checked" in \
        c.deviations


def test_other_scored_pieces_are_counted_each_way():
    rec = build(_current())
    scored = {"test": ["t1", "t3", "t4"], "val": ["v1"]}
    assert check(rec, _current(), evidence=Evidence(scored=scored)).deviations == [
        "test pieces: 2 registered, 3 scored in reports/eval/per_piece.parquet, 2 of them not "
        "registered and 1 registered ones not scored"]
    # a split the table did not score is no deviation (val alone scored, test not yet)
    assert check(rec, _current(), evidence=Evidence(scored={"val": ["v1"]})).deviations == []


def test_scores_under_this_registration_missing_from_the_ledger_deviate():
    rec = build(_current())
    table = pd.DataFrame({"sha256": ["t1", "t2"], "split": "test", "model": "ngram",
                          "nll_nats": [1.0, 2.0]})
    digest = ledger.results_digest(ledger.test_rows(table))
    missing = check(rec, _current(), evidence=Evidence(results_sha256=digest))
    assert any("holds no record of the test scores" in d for d in missing.deviations)
    look = ledger.look_record(table, rec, source="evaluate", commit=None, time=None)
    recorded = check(rec, _current(), evidence=Evidence(results_sha256=digest, records=[look]))
    assert recorded.deviations == [] and recorded.n_looks == 0


def test_earlier_looks_are_counted_and_rules_changed_after_one_deviate():
    old = build(_current(criteria={"rules": [RULES[0], {**RULES[1], "threshold": 1}, RULES[2]]}))
    rec = build(_current())
    table = pd.DataFrame({"sha256": ["t1", "t2"], "split": "test", "model": "ngram",
                          "nll_nats": [1.0, 2.0]})
    then = ledger.look_record(table, old, source="evaluate", commit=None, time=None)
    changed = check(rec, _current(), evidence=Evidence(records=[then]))
    assert changed.n_looks == 1 and changed.status == "DEVIATED"
    assert changed.deviations == [
        "the criteria changed after look 1 (time unknown, no commit) scored 2 of these test "
        f"pieces under registration {old['identity_hash'][:12]}: 'no_crossing_groups' changed"]
    unregistered = ledger.look_record(table, None, source="git", commit=None, time=None)
    after = check(rec, _current(), evidence=Evidence(records=[unregistered],
                                                     history=HISTORY_CHECKED))
    assert after.deviations == [] and after.status == "FOLLOWED AFTER 1 LOOK, ORDER NOT SHOWN"
    # a forced record counts the looks it was registered over, if the ledger shows fewer
    assert check(build(_current(), [unregistered, then]), _current()).n_looks == 2


# ---- diff_flat ---------------------------------------------------------------------------------
def test_diff_flat_names_each_changed_key_with_both_values_and_types():
    old = {"seed": 1, "optim": {"lr": 0.001}, "tags": ["a", "b"], "on": True}
    new = {"seed": 1.0, "optim": {"lr": 0.002}, "tags": ["a"], "on": 1}
    assert diff_flat(old, new, "transformer") == [
        "transformer.on: registered True, now 1",
        "transformer.optim.lr: registered 0.001, now 0.002",
        "transformer.seed: registered 1, now 1.0",
        "transformer.tags.1: registered 'b', now '<absent>'"]
    assert diff_flat(None, {"x": 1}, "ngram") == ["ngram: registered None, now '<absent>'",
                                                  "ngram.x: registered '<absent>', now 1"]


def test_a_later_key_at_its_earlier_behaviour_is_no_deviation():
    assert LATER_DEFAULTS["transformer.data.pack"] is False
    before = {"data": {"use_augmented": False}}
    assert diff_flat(before, {"data": {"use_augmented": False, "pack": False}},
                     "transformer") == []
    assert diff_flat(before, {"data": {"use_augmented": False, "pack": 0}}, "transformer") == [
        "transformer.data.pack: registered '<absent>', now 0"]  # 0 is not the bool False
    assert diff_flat({"data": {"pack": True}}, {"data": {"pack": False}}, "transformer") == [
        "transformer.data.pack: registered True, now False"]  # registered, then changed


leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
sections = st.recursive(st.dictionaries(st.text(min_size=1), leaves, max_size=4),
                        lambda inner: st.dictionaries(st.text(min_size=1), inner | leaves,
                                                      max_size=4), max_leaves=12)


@given(sections, st.text(min_size=1))
def test_a_section_never_differs_from_itself_and_a_changed_leaf_is_named(section, key):
    assert diff_flat(section, section, "s") == []
    changed = {**section, key: "changed value"}
    if section.get(key) != "changed value":
        assert any(d.startswith(f"s.{key}: registered") for d in diff_flat(section, changed, "s"))


# ---- test_scores_exist -------------------------------------------------------------------------
def test_test_scores_exist_only_for_test_scores_of_this_split():
    test_scores_exist = preregistration.test_scores_exist  # not imported bare: not a test
    scored = {"protocol": {"split_hash": "h"}, "models": {"ngram": {"test": {"nll": 1.0}}}}
    assert test_scores_exist(scored, "h") and test_scores_exist(scored, None)
    assert not test_scores_exist(scored, "other")  # another split's scores
    assert test_scores_exist({**scored, "protocol": {}}, "h")  # unknown split: assume this one
    assert not test_scores_exist({"models": {"ngram": {"val": {"nll": 1.0}}}}, "h")
    assert not test_scores_exist({"models": {"ngram": {"test": {}}}}, "h")
    assert not test_scores_exist(None, "h") and not test_scores_exist([], "h")


# ---- through the report ------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key", "value", "named"), [
    ("tokenize", "tokenizer", "TSD", "tokenize.tokenizer: registered 'REMI', now 'TSD'"),
    ("transformer", "seed", 7, "transformer.seed: registered 1234, now 7"),
    ("audit", "flag_quantile", 0.5, "audit.flag_quantile: registered 0.99, now 0.5"),
    ("evaluate", "n_boot", 50, "evaluate.n_boot: registered 200, now 50"),
])
def test_a_changed_param_that_shapes_results_is_deviated(tmp_path, section, key, value, named):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    data = yaml.safe_load(params.read_text())
    base = {"tokenize": {"tokenizer": "REMI"}, "transformer": {"seed": 1234},
            "audit": {"flag_quantile": 0.99}}
    data.update({k: v for k, v in base.items() if k not in data})
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    register(tmp_path, params, p, before_scores=True)
    data[section] = {**data[section], key: value}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    assert s.decision == "DEVIATED" and s.n_deviations == 1
    assert named in p.md_out.read_text()


@pytest.mark.parametrize(("pack", "deviated"), [(False, False), (True, True)])
def test_a_key_added_after_registration_deviates_only_when_it_changes_behaviour(
        tmp_path, pack, deviated):
    # transformer.data.pack did not exist when older registrations were written; pack: false is
    # what those runs did, so writing it out is the same experiment
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    data = yaml.safe_load(params.read_text())
    data["transformer"] = {**(data.get("transformer") or {}), "data": {"use_augmented": False}}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    register(tmp_path, params, p, before_scores=True)
    data["transformer"]["data"]["pack"] = pack
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    assert (s.decision == "DEVIATED") is deviated
    assert ("transformer.data.pack: registered '<absent>', now True"
            in p.md_out.read_text()) is deviated


@pytest.mark.parametrize(("value", "deviated"), [(None, False), ("other/tokenizer.json", True)])
def test_tokenize_from_written_out_as_null_is_the_registered_experiment(tmp_path, value,
                                                                        deviated):
    # tokenize.from came after the committed registration; null trains the tokenizer here, as
    # every run before it did
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    data = yaml.safe_load(params.read_text())
    data["tokenize"] = {k: v for k, v in (data.get("tokenize") or {}).items() if k != "from"}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    register(tmp_path, params, p, before_scores=True)
    data["tokenize"]["from"] = value
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    assert (s.decision == "DEVIATED") is deviated
    assert ("tokenize.from: registered '<absent>'" in p.md_out.read_text()) is deviated


def test_other_split_packages_and_edited_hash_are_deviated(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    register(tmp_path, params, p, before_scores=True)
    artifacts.write_json(p.split, {**artifacts.read_json(p.split), "split_hash": "zzz"})
    env = artifacts.read_json(p.env)
    env["environment"]["packages"]["torch"] = "0.0.1"
    artifacts.write_json(p.env, env)
    assert report(tmp_path, params, p).n_deviations == 2
    md = p.md_out.read_text()
    assert f"split_hash: registered '{SPLIT}', now 'zzz' (the split changed)" in md
    assert "package.torch: registered" in md and "now '0.0.1'" in md
    eval_json = artifacts.read_json(p.eval)
    artifacts.write_json(p.eval, {**eval_json, "protocol": {"split_hash": "other"}})
    assert report(tmp_path, params, p).n_deviations == 3
    assert "reports/eval.json scored split 'other'" in p.md_out.read_text()

    q = make_inputs(tmp_path / "edited")
    params = write_params(tmp_path / "edited")
    rec = register(tmp_path / "edited", params, q, before_scores=True)
    rec["identity"]["params"]["criteria"]["rules"][0]["threshold"] = 0.0  # edited by hand
    artifacts.write_json(q.preregistration, rec)
    s = report(tmp_path / "edited", params, q)
    assert s.decision == "DEVIATED"
    md = q.md_out.read_text()
    assert "identity_hash does not match the registered identity" in md


def test_an_old_schema_registration_is_deviated(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    artifacts.write_json(p.preregistration, {"schema": 1, "criteria": RULES})
    s = report(tmp_path, params, p)
    assert s.decision == "DEVIATED"
    assert "has schema 1, not 4" in p.md_out.read_text()


def test_power_is_stated_by_the_one_function():
    from pipeline.decision.criteria import CriteriaConfig
    from pipeline.decision.preregistration import power_sentence
    from pipeline.stats.power import gain_at_power, gain_pass_probability

    rule = {"name": "beats", "metric": "test.nll_per_note.rel_improvement", "op": ">=",
            "threshold": 0.02, "judge": "interval", "rationale": "r"}
    criteria = CriteriaConfig.model_validate({"rules": [rule]})
    # one seed: lower bound >= 2% at 95% needs 2% + (1.96 + 0.84) * 0.0136 = 5.81%
    assert gain_at_power(0.02, 0.0136, 0.0, 1, 0.95) == pytest.approx(0.0581, abs=1e-4)
    said = power_sentence(criteria, 0.0136, 0.0, 1, 0.95, "the val pilot's spreads")
    assert "only a true gain of 5.81% or more" in said and "at the val pilot's spreads" in said
    # seeds: wider, and more seeds narrow it; the statement is where 80% pass
    three = gain_at_power(0.02, 0.0051, 0.0112, 3, 0.95)
    assert three > gain_at_power(0.02, 0.0051, 0.0112, 8, 0.95) > 0.02
    assert gain_pass_probability(three, 0.02, 0.0051, 0.0112, 3, 0.95) == pytest.approx(0.8)
    assert power_sentence(CriteriaConfig.model_validate({"rules": [{**rule, "judge": "point"}]}),
                          0.01, 0.0, 1, 0.95, "x") is None


@pytest.mark.parametrize(("section", "deviation"), [
    (None, None),
    ({"use": [], "dropout": 0.3}, None),  # no condition in use: still the unconditioned model
    ({"use": ["key"]}, "condition.use: registered unconditioned, now ['key']"),
])
def test_conditions_after_an_unconditioned_registration(tmp_path, section, deviation):
    # the condition section came after the committed registration, which registered an
    # unconditioned model; only conditions in use change that experiment
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    data = {k: v for k, v in yaml.safe_load(params.read_text()).items() if k != "condition"}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    register(tmp_path, params, p, before_scores=True)
    if section is not None:
        data["condition"] = section
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    assert (s.decision == "DEVIATED") is (deviation is not None)
    if deviation:
        assert deviation in p.md_out.read_text()


def test_a_conditioned_registration_freezes_its_conditions(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    data = yaml.safe_load(params.read_text())
    data["condition"] = {"use": ["key", "density"], "dropout": 0.1}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    rec = register(tmp_path, params, p, before_scores=True)
    assert rec["identity"]["params"]["condition"]["use"] == ["key", "density"]
    assert report(tmp_path, params, p).n_deviations == 0
    data["condition"]["dropout"] = 0.5
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    s = report(tmp_path, params, p)
    assert s.decision == "DEVIATED"
    assert "condition.dropout: registered 0.1, now 0.5" in p.md_out.read_text()


def test_scored_pieces_are_compared_with_the_registered_ones(tmp_path):
    p, params = _registered(tmp_path)
    table = pd.read_parquet(p.per_piece)
    artifacts.write_parquet(p.per_piece, table[table["sha256"] != "0003"])
    s = report(tmp_path, params, p)
    assert s.decision == "DEVIATED"
    assert ("test pieces: 10 registered, 9 scored in reports/eval/per_piece.parquet, 0 of them "
            "not registered and 1 registered ones not scored") in p.md_out.read_text()


def test_scores_missing_from_the_ledger_deviate(tmp_path):
    p, params = _registered(tmp_path)
    s = report(tmp_path, params, p, look=False)  # evaluate never recorded these scores
    assert s.decision == "DEVIATED"
    assert "holds no record of the test scores" in p.md_out.read_text()


def test_the_order_git_shows_is_part_of_the_status(tmp_path):
    p, params = _registered(tmp_path)
    env = artifacts.read_json(p.env)
    no_git = {"checked": False, "why_not": "no git history"}
    for facts, hist, status in ((GIT_SHOWS_ORDER, HISTORY_CHECKED, "PASS"),
                                ({"git": False}, no_git, "UNVERIFIED"),
                                ({**GIT_SHOWS_ORDER, "registration_precedes_results": False},
                                 HISTORY_CHECKED, "FOLLOWED, ORDER NOT SHOWN")):
        artifacts.write_json(p.env, {**env, "git": facts, "history": hist})
        assert report(tmp_path, params, p).decision == status

"""The adaptation experiment's registration: its identity (target and source splits, frozen
params, packages), the record written before any target test score, and the check that names
every way the judged experiment differs from the registered one."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.adaptation import adaptation_registration as registration
from pipeline.adaptation.config import AdaptationConfig, DecisionSection
from pipeline.core.artifacts import (
    RESULT_PACKAGES,
    ArtifactError,
    read_json,
    sha256_json,
    write_json,
    write_parquet,
)
from pipeline.core.config import load_section
from pipeline.core.splits import split_hash
from pipeline.training.config import TransformerStageConfig

PACKAGES = {p: "1.0" for p in RESULT_PACKAGES}


def _splits(folder, prefix: str) -> dict:
    table = pd.DataFrame({"sha256": [f"{prefix}{k}" for k in range(6)],
                          "split": ["train", "train", "val", "val", "test", "test"]})
    write_parquet(folder / f"{prefix}.parquet", table)
    return {"path": folder / f"{prefix}.parquet",
            "hash": split_hash(table["sha256"], table["split"])}


@pytest.fixture
def experiment(tmp_path, monkeypatch):
    """An adaptation experiment's params.yaml and both corpora's split tables, in a folder
    outside any git repository (no history to read)."""
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "tokenize": {"vocab_size": 1000},
        "adaptation": {"pretrained": "pre", "steps": 6, "decision": {"min_gain": 0.05}}}))
    return {"params": params, "target": _splits(tmp_path, "tgt"),
            "source": _splits(tmp_path, "src"), "root": tmp_path}


def _identity(e, **kw):
    return registration.identity(
        e["params"], target_splits=e["target"]["path"],
        target_split_report=e["root"] / "none.json", source_splits=e["source"]["path"],
        source_split_report=e["root"] / "none.json", packages=PACKAGES, **kw)


def test_is_adaptation_reads_the_params_section(tmp_path, experiment):
    assert registration.is_adaptation(experiment["params"])
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"adaptation": 3, "tokenize": {}}))
    assert not registration.is_adaptation(tmp_path / "other.yaml")


def test_the_identity_names_both_splits_the_frozen_params_and_packages(experiment):
    ident = _identity(experiment)
    assert ident["kind"] == "adaptation" and ident["split_hash"] == experiment["target"]["hash"]
    assert ident["pieces"] == {"val": ["tgt2", "tgt3"], "test": ["tgt4", "tgt5"]}
    assert ident["source"] == {"split_hash": experiment["source"]["hash"],
                               "pieces": {"val": ["src2", "src3"]}}
    assert ident["packages"] == PACKAGES
    params = ident["params"]
    assert list(params) == list(registration.SECTIONS)
    assert params["tokenize"] == {"vocab_size": 1000} and params["split"] is None
    assert params["transformer"] == TransformerStageConfig().model_dump(mode="json")
    section = load_section("adaptation", experiment["params"], AdaptationConfig)
    assert params["decision"] == section.decision.model_dump(mode="json")
    assert params["decision"]["min_gain"] == 0.05 and "decision" not in params["adaptation"]
    assert params["adaptation"]["steps"] == 6


def test_a_split_report_of_another_split_is_refused(experiment):
    write_json(experiment["root"] / "split.json", {"split_hash": "f" * 64})
    with pytest.raises(ArtifactError, match=r"names split ffffffffffff but .*tgt\.parquet hashes "
                                            r"to .*re-run the split stage"):
        registration.identity(
            experiment["params"], target_splits=experiment["target"]["path"],
            target_split_report=experiment["root"] / "split.json",
            source_splits=experiment["source"]["path"],
            source_split_report=experiment["root"] / "none.json", packages=PACKAGES)


def _register(e):
    root = e["root"]
    return registration.register(
        e["params"], target_splits=e["target"]["path"],
        target_split_report=root / "none.json", source_splits=e["source"]["path"],
        source_split_report=root / "none.json", out=root / "reports" / "preregistration.json",
        ledger_path=root / "reports" / "ledger.jsonl", per_piece=root / "per_piece.parquet",
        report=root / "adaptation.json")


def test_register_writes_the_record_once(experiment):
    record = _register(experiment)
    path = experiment["root"] / "reports" / "preregistration.json"
    assert read_json(path) == record
    assert (record["schema"], record["kind"], record["forced"], record["looks_before"]) == (
        registration.SCHEMA_VERSION, "adaptation", False, [])
    assert record["identity_hash"] == sha256_json(record["identity"])
    assert record["identity"]["pieces"]["test"] == ["tgt4", "tgt5"]
    before = path.read_bytes()
    assert _register(experiment) == record and path.read_bytes() == before
    decision = registration.registered_decision(record)
    assert decision == DecisionSection(min_gain=0.05)


@pytest.mark.parametrize("record", [None, {}, {"identity": {"params": {}}},
                                    {"identity": {"params": {"decision": {"min_gain": 5.0}}}}],
                         ids=["none", "empty", "no_decision", "bad_decision"])
def test_a_record_without_a_usable_decision_has_none(record):
    assert registration.registered_decision(record) is None


def _record(ident: dict) -> dict:
    return {"schema": registration.SCHEMA_VERSION, "kind": registration.KIND,
            "identity": ident, "identity_hash": sha256_json(ident), "looks_before": []}


EMPTY = pd.DataFrame({"sha256": [], "split": []})


def test_check_names_every_difference_from_the_registration(experiment):
    ident = _identity(experiment)
    check, decision = registration.check(None, ident, EMPTY, [])
    assert check.status == "NOT REGISTERED" and decision is None
    check, decision = registration.check(_record(ident), ident, EMPTY, [])
    assert check.status == "FOLLOWED, ORDER NOT SHOWN" and check.deviations == []
    assert decision == DecisionSection(min_gain=0.05)
    check, _ = registration.check({"kind": "default", "schema": 1}, ident, EMPTY, [])
    assert check.status == "DEVIATED" and "not an adaptation registration" in check.deviations[0]

    now = {**ident, "split_hash": "other",
           "params": {**ident["params"], "decision": {**ident["params"]["decision"],
                                                      "min_gain": 0.4}}}
    edited = {**_record(ident), "identity_hash": "0" * 64}
    check, decision = registration.check(edited, now, EMPTY, [])
    assert decision == DecisionSection(min_gain=0.05)  # judged with the registered decision
    text = "\n".join(check.deviations)
    assert "was edited after registration" in text
    assert f"split_hash: registered {ident['split_hash']!r}, now 'other'" in text
    assert "decision.min_gain: registered 0.05, now 0.4" in text


def test_scored_pieces_must_be_the_registered_ones(experiment):
    ident = _identity(experiment)
    table = pd.DataFrame({"sha256": ["tgt4", "tgt9", "src2", "src3"],
                          "split": ["test", "test", "source_val", "source_val"],
                          "model": "m", "nll_nats": 1.0})
    check, _ = registration.check(_record(ident), ident, table, [])
    text = "\n".join(check.deviations)
    assert "test pieces: 2 registered, 2 scored, 1 of them not registered" in text
    assert "source_val pieces" not in text  # the source's val pieces are those registered
    assert "holds no record of these target test scores" in text  # nothing in the ledger


def test_every_earlier_look_at_the_target_test_pieces_counts_and_this_run_s_do_not(experiment):
    """Four scorings of the target test pieces before this run's, under other registrations
    (none, then three with other params) and with other scores, read FOLLOWED AFTER 4 LOOKS:
    this run's own scores and its audit of the same pieces, under this registration and code,
    are not earlier looks; a look with other judging code is one."""
    from pipeline.decision import ledger, looks

    root = experiment["root"]
    ident = _identity(experiment)
    tokens = root / "tokens.parquet"
    write_parquet(tokens, pd.read_parquet(experiment["target"]["path"]).assign(track=0))
    path = root / "ledger.jsonl"

    def scores(shift: float) -> pd.DataFrame:
        return pd.DataFrame({"sha256": ["tgt4", "tgt5"], "split": "test", "model": "m",
                             "nll_nats": [1.0 + shift, 2.0 + shift]})

    def evaluate(reg: Path, shift: float) -> looks.Look:
        _, look = looks.test_tokens("adapt_evaluate", tokens, ["sha256", "split"],
                                    ledger_path=path, registration=reg)
        look.scored(ledger.results_digest(ledger.test_rows(scores(shift))))
        return look

    evaluate(root / "none.json", 0.1)  # before any registration
    for i in range(3):  # under registrations of other params (not of the decision)
        other = {**ident, "params": {**ident["params"], "tokenize": {"vocab_size": 2000 + i}}}
        write_json(root / f"other{i}.json", _record(other))
        evaluate(root / f"other{i}.json", 0.2 + i)
    reg = root / "preregistration.json"
    write_json(reg, _record(ident))
    mine = evaluate(reg, 1.0)
    _, audit = looks.test_tokens("adapt_audit", tokens, ["sha256", "split"], ledger_path=path,
                                 registration=reg)
    audit.scored(looks.digest_of({"m": {"flag_rate": 0.1}}), "audit")

    check, _ = registration.check(read_json(reg), ident, scores(1.0), ledger.read(path))
    assert check.deviations == [] and check.n_looks == 4
    assert check.status.startswith("FOLLOWED AFTER 4 LOOKS")
    looks.record("adapt_evaluate", ["tgt4", "tgt5"], "other inputs", ledger_path=path,
                 registration=reg, code=mine.record["code"][::-1])  # other judging code
    check, _ = registration.check(read_json(reg), ident, scores(1.0), ledger.read(path),
                                  code=mine.record["code"])
    assert check.n_looks == 5

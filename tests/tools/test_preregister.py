"""``symkit preregister`` (pipeline.tools.preregister): the split it freezes, its refusal when
test scores exist (unless forced), the power it states before training, the same registration
written once, and the planned comparisons registered on their own.

The record and its check are tested in tests/decision/test_preregistration.py; the experiment is
the small set of stage outputs of tests/stages/test_report.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.cli import main
from pipeline.core import artifacts
from pipeline.core.artifacts import ArtifactError
from pipeline.core.splits import split_hash
from pipeline.decision.ledger import AlreadyScored
from pipeline.decision.registered_comparisons import REGISTRATION, record
from pipeline.tools.preregister import register_comparisons, split_counts, split_pieces
from tests.decision.test_registered_comparisons import RULE, SECTION, params_with
from tests.stages.test_report import (
    RULES,
    SPLIT,
    SPLITS,
    make_inputs,
    register,
    report,
    without_test_scores,
    write_params,
)


# ---- the split it freezes ----------------------------------------------------------------------
def test_the_split_is_hashed_and_its_val_and_test_pieces_listed(tmp_path):
    artifacts.write_parquet(tmp_path / "splits.parquet", SPLITS)
    digest, pieces = split_pieces(tmp_path / "splits.parquet", tmp_path / "no-report.json")
    assert digest == SPLIT == split_hash(SPLITS["sha256"], SPLITS["split"])
    assert pieces == {"val": ["c"], "test": sorted(SPLITS.loc[SPLITS["split"] == "test",
                                                              "sha256"])}
    artifacts.write_json(tmp_path / "split.json", {"split_hash": SPLIT})
    assert split_pieces(tmp_path / "splits.parquet", tmp_path / "split.json")[0] == SPLIT
    assert split_counts(tmp_path / "splits.parquet") == {"test": (10, 5), "train": (2, 1),
                                                         "val": (1, 1)}


def test_a_split_report_of_another_split_is_refused_naming_both(tmp_path):
    artifacts.write_parquet(tmp_path / "splits.parquet", SPLITS)
    artifacts.write_json(tmp_path / "split.json", {"split_hash": "f" * 64})
    with pytest.raises(ArtifactError) as e:
        split_pieces(tmp_path / "splits.parquet", tmp_path / "split.json")
    assert str(e.value) == (f"{tmp_path / 'split.json'} names split ffffffffffff but "
                            f"{tmp_path / 'splits.parquet'} hashes to {SPLIT[:12]}: re-run "
                            "`dvc repro split`")


def test_the_same_registration_again_is_not_rewritten_even_after_scoring(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    rec = register(tmp_path, params, p, before_scores=True)
    before = p.preregistration.read_bytes()
    # the scores exist now, but the identity is the registered one: nothing to refuse or write
    assert register(tmp_path, params, p) == rec
    assert p.preregistration.read_bytes() == before
    changed = write_params(tmp_path, rules=RULES[:1])
    with pytest.raises(AlreadyScored):
        register(tmp_path, changed, p)
    assert p.preregistration.read_bytes() == before


def test_the_command_says_what_it_froze_and_when_power_is_stated(tmp_path, monkeypatch, capsys):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    without_test_scores(p)
    p.per_piece.unlink()
    p.ledger.unlink(missing_ok=True)
    monkeypatch.chdir(tmp_path)
    assert main(["preregister", "--params", str(params), "--power-draws", "0"]) == 0
    rec = artifacts.read_json(p.preregistration)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"preregister: 3 criteria, split {SPLIT[:12]} (1 val, 10 test pieces), "
                      f"identity {rec['identity_hash'][:12]} -> reports/preregistration.json "
                      "(commit it before the results)")
    assert out[1] == ("preregister: publish this hash outside the repository (a post, an "
                      "e-mail, a registry), so no later edit of the file can pass for it: "
                      f"{rec['identity_hash']}")
    assert out[2] == f"preregister: no compare section in {params}: no comparison registered"
    assert "power" not in rec and not rec["forced"]



def test_preregistering_after_test_scores_is_refused_unless_forced(tmp_path):
    p = make_inputs(tmp_path)  # the per-piece table and eval.json hold test scores
    params = write_params(tmp_path)
    with pytest.raises(AlreadyScored, match="--force"):
        register(tmp_path, params, p)
    assert not p.preregistration.exists()
    # scores of other pieces do not block a registration of these
    table = pd.read_parquet(p.per_piece)
    artifacts.write_parquet(p.per_piece, table.assign(sha256="other-" + table["sha256"]))
    artifacts.write_json(p.eval, {**artifacts.read_json(p.eval),
                                  "protocol": {"split_hash": "old-split"}})
    p.ledger.unlink()
    assert not register(tmp_path, params, p)["forced"]
    p = make_inputs(tmp_path / "forced")
    params = write_params(tmp_path / "forced")
    rec = register(tmp_path / "forced", params, p, force=True)
    assert rec["forced"] and [r["source"] for r in rec["looks_before"]] == ["workspace"]
    assert register(tmp_path / "forced", params, p, force=True) == rec  # stable
    s = report(tmp_path / "forced", params, p)
    assert s.decision == "FOLLOWED AFTER 1 LOOK" and s.n_deviations == 0
    md = p.md_out.read_text()
    assert "## Earlier looks at the test pieces" in md and "This test set is spent" in md
    metrics = artifacts.read_json(p.metrics_out)
    assert metrics["decision.rules"] == "PASS" and metrics["decision.earlier_looks"] == 1


def test_registration_before_scores_can_be_replaced_freely(tmp_path):
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    without_test_scores(p)
    first = register(tmp_path, params, p, before_scores=True)
    params = write_params(tmp_path, rules=RULES[:2])
    second = register(tmp_path, params, p, before_scores=True)
    assert first["identity_hash"] != second["identity_hash"]
    assert len(second["identity"]["params"]["criteria"]["rules"]) == 2


def write_pilot(root: Path) -> tuple[Path, Path]:
    """A val pilot (eval.json and per_piece.parquet of val and a train subset) and a token
    table of val pieces, as `symkit evaluate --pilot` and tokenize would leave them."""
    pilot = root / "reports" / "pilot"
    rng = np.random.default_rng(0)
    rows = [{"sha256": f"{split}{i}", "split": split, "model": "transformer",
             "seed": pd.NA, "nll_nats": float(rng.normal(40 if split == "val" else 30, 5)),
             "n_notes": 10, "n_tokens": 12}
            for split in ("val", "train") for i in range(12)]
    artifacts.write_parquet(pilot / "per_piece.parquet", pd.DataFrame(rows).astype(
        {"seed": "Int64"}))
    artifacts.write_json(pilot / "eval.json", {
        "models": {"transformer": {"val": {}}},
        "power": {"ngram_minus_transformer": {"se_groups": 0.01, "seed_sd": 0.004,
                                              "n_seeds": 3, "n_groups": 5,
                                              "n_groups_observed": 4}},
        "gap": {"transformer": {"n_pieces_heldout": 12, "n_pieces_train": 12,
                                "nats_per_note": {"groups_ci_low": 0.6, "groups_ci_high": 1.4},
                                "nats_per_token": {"groups_ci_low": 0.5, "groups_ci_high": 1.1}}}})
    tokens = root / "data" / "tokens" / "tokens.parquet"
    artifacts.write_parquet(tokens, pd.DataFrame({"sha256": ["v1", "v2"], "split": "val",
                                                  "n_tokens": [100, 300]}))
    return pilot, tokens


def before_scores_with_an_interval_rule(tmp_path):
    """The report's inputs without test scores yet, the first rule judged on its interval."""
    p = make_inputs(tmp_path)
    interval = {**RULES[0], "judge": "interval"}
    interval.pop("ci"), interval.pop("ci_metric")
    params = write_params(tmp_path, rules=[interval, *RULES[1:]])
    for f in (p.per_piece, p.eval):
        f.unlink()
    return p, params


def test_preregister_states_power_before_any_test_look_and_the_report_repeats_it(tmp_path):
    """`symkit preregister` simulates each rule, and all rules together on the good and bad
    models, at the registered sizes and the val pilot's spreads; the report shows them; without
    a pilot the record says why power is not stated."""
    p, params = before_scores_with_an_interval_rule(tmp_path)
    missing = register(tmp_path, params, p, before_scores=True, power_draws=20)
    assert "val pilot" in missing["power"]["not_stated"]
    pilot, tokens = write_pilot(tmp_path)
    p.preregistration.unlink()  # the same identity again would be kept as it is
    rec = register(tmp_path, params, p, before_scores=True, power_draws=20, pilot=pilot,
                   tokens=tokens)
    power = rec["power"]
    assert power["draws"] == 20 and power["spreads"]["gain_se_groups"] == 0.01
    assert "val pilot" in power["spreads"]["source"]["gap_se_note"]
    # the registered split's sizes, not the default experiment's
    counts = SPLITS.groupby("split")["sha256"].nunique()
    assert power["sizes"]["human_pieces"] == counts["test"]
    # 100 ids: one window of 128; 300 ids: windows at 0, 64 and 128; (1 + 3) / 2 a piece
    assert power["sizes"]["human_windows"] == counts["test"] * 2
    gain = next(r for r in power["rules"] if r["metric"] == "test.nll_per_note.rel_improvement")
    assert gain["controls"] and gain["resolved_at_80_percent"] > 0.02
    assert power["joint"]["good"]["rules"] and len(power["joint"]["bad"]) == 5
    make_inputs(tmp_path)
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    assert "### Power: the good model and the bad ones" in md
    row = next(x for x in md.splitlines() if x.startswith("| all rules together, good model"))
    assert f"| {power['joint']['good']['all']:.0%} |" in row


def test_an_amendment_restates_power_and_the_report_shows_the_restated_statement(
        tmp_path, monkeypatch):
    """An amendment carries the power statement as the amended code gives it (the
    registration's own stays as stated); the report shows the newest and says whose it is."""
    from pipeline.decision import bound_code
    from pipeline.decision.preregistration import stated_power
    from pipeline.tools.preregister import amend_registration, restated_power

    p, params = before_scores_with_an_interval_rule(tmp_path)
    pilot, tokens = write_pilot(tmp_path)
    rec = register(tmp_path, params, p, before_scores=True, power_draws=20, pilot=pilot,
                   tokens=tokens)
    assert stated_power(rec) == (rec["power"], None)
    code = bound_code.bound_code()
    changed = {**code, "judging": {**code["judging"], "pipeline/decision/spreads.py": "0" * 64}}
    monkeypatch.setattr("pipeline.tools.preregister.bound_code", lambda: changed)
    amended = amend_registration(p.preregistration, "draw the seeds' gaps with shared pieces",
                                 p.ledger, restated_power(params, p.splits, pilot, tokens, 20))
    power = amended["amendments"][0]["power"]
    assert power["draws"] == 20 and power["joint"]["good"]["rules"]
    assert amended["power"] == rec["power"]  # as it was stated
    assert stated_power(amended) == (power, 1)
    make_inputs(tmp_path)
    report(tmp_path, params, p)
    md = p.md_out.read_text()
    assert "at the registration's spreads, restated by amendment 1" in md


# ---- the planned comparisons -------------------------------------------------------------------
def test_comparisons_are_registered_only_from_a_compare_section(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(params_with(None)))
    assert register_comparisons(params, tmp_path / "c.json") is None
    assert not (tmp_path / "c.json").exists()
    params.write_text(yaml.safe_dump(params_with(SECTION)))
    rec = register_comparisons(params, tmp_path / "c.json")
    assert rec["compare"] == SECTION and artifacts.read_json(tmp_path / "c.json") == rec


def test_preregister_writes_the_comparisons_alone_and_stably(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(SECTION)))
    monkeypatch.chdir(tmp_path)
    assert main(["preregister", "--comparisons-only"]) == 0
    assert "1 planned comparison (tsd_beats_remi)" in capsys.readouterr().out
    rec = artifacts.read_json(tmp_path / REGISTRATION)
    assert rec == record(SECTION) and rec["hash"] == artifacts.sha256_json(SECTION)
    assert not (tmp_path / "reports" / "preregistration.json").exists()
    before = (tmp_path / REGISTRATION).read_bytes()
    assert main(["preregister", "--comparisons-only"]) == 0
    assert (tmp_path / REGISTRATION).read_bytes() == before
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(None)))
    assert main(["preregister", "--comparisons-only"]) == 1
    assert "no compare section" in capsys.readouterr().out


def test_preregister_refuses_a_rule_naming_a_missing_param(tmp_path, monkeypatch, capsys):
    bad = {**SECTION, "rules": [{**RULE, "baseline": {"tokenize.nope": 1},
                                 "arm": {"tokenize.nope": 2}}]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(bad)))
    monkeypatch.chdir(tmp_path)
    assert main(["preregister", "--comparisons-only"]) == 2
    assert "'tokenize.nope' is not a param" in capsys.readouterr().err
    assert not (tmp_path / REGISTRATION).exists()

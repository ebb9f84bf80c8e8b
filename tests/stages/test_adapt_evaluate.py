"""``symkit adapt-evaluate`` (pipeline.stages.adapt_evaluate): the pieces it scores, the
licences and decontamination it reports, the arms' memorisation it carries, and its Markdown
report with the choice first.

Its own functions on planted inputs; scoring trained arms end to end is tested in
tests/adaptation/."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.core.artifacts import read_parquet, write_json, write_parquet
from pipeline.core.config import parse_section
from pipeline.stages import adapt_evaluate
from pipeline.stages.adapt_evaluate import (
    SOURCE_VAL,
    decontamination,
    licences,
    memorisation,
    piece_set,
    render_markdown,
)
from pipeline.tokens.contract import TokenInfo
from tests._transformer_data import write_token_data

CFG = parse_section("adaptation", {"arms": {"scratch": {"kind": "scratch"},
                                            "lora": {"kind": "lora", "lora_rank": 4}}},
                    AdaptationConfig)


def _iv(v: float, half: float = 0.01) -> dict[str, float]:
    return {"value": v, "ci_low": v - half, "ci_high": v + half}


def _out(chosen: str | None = "lora", **extra: Any) -> dict[str, Any]:
    """adaptation.json's content for zero_shot, scratch and lora, lora the smallest adequate."""
    arm = {"val": _iv(2.5), "test": _iv(2.6), "forgetting": _iv(0.05), "estimate_bytes": 3 << 20,
           "bytes_to_ship": 40 << 10}
    m = {ZERO_SHOT: {**arm, "kind": ZERO_SHOT, "params_trainable": 0, "forgetting": None,
                     "vs_scratch": None, "estimate_bytes": None, "bytes_to_ship": 0},
         "scratch": {**arm, "kind": "scratch", "params_trainable": 1_250_000,
                     "vs_scratch": None, "bytes_to_ship": 5 << 20},
         "lora": {**arm, "kind": "lora", "params_trainable": 2048,
                  "vs_scratch": {"test": _iv(0.1, 0.02)}}}
    standing = {n: {"excess_over_best": _iv(0.001, 0.002), "adequate": n == chosen,
                    "why_not": [] if n == chosen else ["val NLL per note up to 3.0% above"]}
                for n in m}
    decision = {"smallest_adequate": chosen, "best_arm": "lora", "standing": standing,
                "forgetting_bound_nats_per_note": 0.2, "taught_nats_per_note": 0.4,
                "pretraining_helps": {"verdict": "PASS", "arm": "lora",
                                      "interval": _iv(0.1, 0.02), "threshold": 0.02}}
    return {"arms": m, "decision": decision, "pieces": {"val": 3, "test": 4, SOURCE_VAL: 5},
            **extra}


# ---- the pieces scored -------------------------------------------------------------------------
def test_a_piece_set_keeps_the_wanted_splits_with_facts_and_names_the_excluded(tmp_path):
    data = write_token_data(tmp_path, n_pieces=20, mean_len=30, seed=2, name="src")
    tokens = read_parquet(data["tokens"])
    val = sorted(tokens.loc[tokens["split"] == "val", "sha256"])
    assert len(val) == 2
    no_facts, moved = val[0], val[1]
    write_parquet(tmp_path / "manifest.parquet", pd.DataFrame({
        "sha256": [s for s in tokens["sha256"] if s != no_facts], "status": "ok",
        "n_notes": 10, "duration_s": 5.0}))
    splits = tokens[["sha256", "split"]].assign(group_id="g")
    splits.loc[splits["sha256"] == moved, "split"] = "test"  # splits.parquet disagrees
    write_parquet(tmp_path / "splits.parquet", splits)
    info = TokenInfo.read(data["info"])
    got = piece_set(tokens[tokens["split"] == "val"][adapt_evaluate.COLUMNS], info,
                    tmp_path / "manifest.parquet", tmp_path / "splits.parquet",
                    {"val": SOURCE_VAL})
    assert got.rows.empty and got.pieces.empty  # both val pieces excluded, no other split read
    assert got.excluded == sorted([{"sha256": no_facts, "reason": "not_in_manifest"},
                                   {"sha256": moved, "reason": "split_mismatch"}],
                                  key=lambda p: p["sha256"])
    test = piece_set(tokens[tokens["split"] == "test"][adapt_evaluate.COLUMNS], info,
                     tmp_path / "manifest.parquet", tmp_path / "splits.parquet",
                     {"val": SOURCE_VAL})
    assert set(test.rows["split"]) == {"test"} and test.excluded == []
    assert sorted(test.pieces["sha256"]) == sorted(test.rows["sha256"]) == sorted(
        tokens.loc[tokens["split"] == "test", "sha256"])


# ---- what the report says beside the measures --------------------------------------------------
@pytest.mark.parametrize(("header", "column"), [("license", "license"), ("licence", "licence"),
                                                ("rights", "rights")])
def test_licences_count_each_value_of_the_licence_column(tmp_path, header, column):
    path = tmp_path / "raw_metadata.csv"
    path.write_text(f"path,{header}\na.mid,CC0\nb.mid, PD \nc.mid,CC0\nd.mid,\n",
                    encoding="utf-8")
    assert licences(path) == {"column": column, "counts": {"(empty)": 1, "CC0": 2, "PD": 1},
                              "note": None}


def test_licences_without_a_file_or_column_say_why(tmp_path):
    assert licences(tmp_path / "none.csv")["note"] == f"{(tmp_path / 'none.csv').as_posix()} " \
                                                      "not found"
    (tmp_path / "m.csv").write_text("path,title\na.mid,x\n", encoding="utf-8")
    assert licences(tmp_path / "m.csv") == {"column": None, "counts": {},
                                            "note": "no license, licence or rights column"}


def test_decontamination_joins_the_matches_and_what_the_split_kept_out(tmp_path):
    write_json(tmp_path / "c.json", {"matches": 6, "by_split": {
        "val": {"in_reference": 1}, "test": {"in_reference": 2}}})
    write_json(tmp_path / "s.json", {"exclude_train_listed": 9, "exclude_train_groups": 3,
                                     "exclude_train_pieces": 5, "exclude_train_moved": 2})
    assert decontamination(tmp_path / "c.json", tmp_path / "s.json") == {
        "target_pieces_with_a_copy": {"test": 2, "val": 1}, "matches": 6, "listed": 9,
        "groups_kept_out_of_train": 3, "pieces_kept_out_of_train": 5, "moved_from_train": 2}
    assert decontamination(tmp_path / "none.json", tmp_path / "none.json") == {
        "target_pieces_with_a_copy": {}, "matches": None, "listed": None,
        "groups_kept_out_of_train": None, "pieces_kept_out_of_train": None,
        "moved_from_train": None}


def test_memorisation_keeps_each_arm_s_judged_intervals_per_reference():
    judged = {"flag_rate": {"value": 0.1, "ci_low": 0.0, "ci_high": 0.2,
                            "excess": {"value": 0.05, "ci_low": -0.01, "ci_high": 0.11}},
              "extraction_rate": {"excess": {"value": 0.0, "ci_low": 0.0, "ci_high": 0.02}},
              "membership_auc": {"value": 0.55, "ci_low": 0.45, "ci_high": 0.65, "n": 9},
              "quality": {"score": 0.8, "score_band_low": 0.6, "stats": {}}}
    audit = {"references": {"target": {"judged": {"lora": judged}, "human_flag_rate": {
        "test": 0.04}, "human_pieces": {"test": 12}}}}
    got = memorisation(audit, ["lora", "scratch"])
    assert got == {"target": {"human_test_flag_rate": 0.04, "human_test_pieces": 12, "arms": {
        "lora": {"flag_rate": {"value": 0.05, "ci_low": -0.01, "ci_high": 0.11},
                 "extraction_rate": {"value": 0.0, "ci_low": 0.0, "ci_high": 0.02},
                 "membership_auc": {"value": 0.55, "ci_low": 0.45, "ci_high": 0.65},
                 "flag_rate_value": 0.1, "quality": {"score": 0.8, "score_band_low": 0.6}},
        "scratch": {}}}}


# ---- the Markdown report -----------------------------------------------------------------------
def test_the_report_names_the_choice_and_why_in_its_first_lines():
    lines = render_markdown(CFG, _out()).splitlines()
    assert lines[0] == "# Adaptation: which arm, and why"
    assert lines[2].startswith("**Choice: `lora`** (lora, 2.0 k trainable parameters, 40 KiB to "
                               "ship beside the pretrained model).")
    assert "stays within 0.2000 nats per note (50% of the 0.4000 that pretraining taught" in \
        lines[2]
    assert lines[4] == "- target val NLL per note: 2.5000 [2.4900, 2.5100]; test: 2.6000 " \
                       "[2.5900, 2.6100]"
    assert lines[5] == "- above the best arm on val: +0.10% [-0.10%, +0.30%]"
    text = "\n".join(lines)
    assert "**Does pretraining help?** PASS: `lora`" in text
    assert "| `scratch` | scratch | 1.25 M |" in text and "| 5.0 MiB | no: val NLL" in text
    assert "| `zero_shot` | zero_shot | 0 | 2.5000 [2.4900, 2.5100] | 2.6000 [2.5900, 2.6100] " \
           "| – | – | – | 0 KiB | no:" in text  # no gain, forgetting or estimate
    assert "## Memorisation" not in text and "**Registration" not in text


def test_no_adequate_arm_a_registration_and_memorisation_are_said(tmp_path):
    reg = {"status": "NOT REGISTERED", "deviations": ["decision.margin: registered 0.01"],
           "judged_with": "params.yaml's adaptation.decision", "identity_hash": None}
    mem = {"target": {"human_test_flag_rate": 0.05, "human_test_pieces": 12, "arms": {
        "lora": {"flag_rate": _iv(0.02), "membership_auc": _iv(float("nan")),
                 "quality": {"score": 0.75, "score_band_low": None}}}}}
    text = render_markdown(CFG, _out(chosen=None, registration=reg, memorisation=mem))
    lines = text.splitlines()
    assert lines[2] == ("**Registration: NOT REGISTERED** (params.yaml's adaptation.decision).")
    assert lines[3] == "- deviation: decision.margin: registered 0.01"
    assert lines[4].startswith("- register with `symkit preregister` in this folder")
    assert lines[6].startswith(f"**No arm is adequate.** None is within "
                               f"{CFG.decision.margin:.0%} of the best arm (lora)")
    assert "target test windows flagged at 5.0% (12 pieces)" in text
    assert "| `lora` | +2.0 [+1.0, +3.0] | – | n/a | 0.75 |" in text
    assert "- decontamination: target pieces with a copy in the source: not checked" in text
    assert "- source licences (none recorded): –" in text


def test_the_cli_stops_in_one_line_on_a_missing_split(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    (tmp_path / "params.yaml").write_text("adaptation: {}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["adapt-evaluate", "--splits", "missing.parquet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.parquet" in err[0]
    assert not (tmp_path / "reports").exists()


def test_zero_shot_trains_nothing_of_the_pretrained_model(tmp_path):
    write_json(tmp_path / "model.json", {"params": {"total": 1234}})
    cfg = CFG.model_copy(update={"pretrained": str(tmp_path)})
    assert adapt_evaluate._zero_shot_params(cfg) == {"total": 1234, "trainable": 0,
                                                      "frozen": 1234}


def test_compound_tokens_are_refused_before_the_test_rows_are_read(compound_tokens, tmp_path):
    from pipeline.core.config import ParamsError, RuntimeConfig

    cfg = parse_section("adaptation", {"pretrained": "pre", "arms": {"scratch": {
        "kind": "scratch"}}}, AdaptationConfig)
    with pytest.raises(ParamsError,
                       match=r"tokenize\.tokenizer: CPWord — symkit adapt-evaluate reads"):
        adapt_evaluate.run(cfg, RuntimeConfig(), target=compound_tokens,
                           source=compound_tokens, arms_dir=tmp_path / "arms",
                           arm_reports=tmp_path / "reports", per_piece=tmp_path / "pp.parquet",
                           report=tmp_path / "r.json", markdown=tmp_path / "r.md",
                           figure=tmp_path / "f.png")
    assert not (tmp_path / "r.json").exists()

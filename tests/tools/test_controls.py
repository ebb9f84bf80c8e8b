"""``symkit controls`` (pipeline.tools.controls): each rule's pass rates under its good and bad
controls as a Markdown table, rules without controls listed, and exit status 1 while a control
misses the standard. The controls themselves are tested in
tests/decision/test_criteria_controls.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main as cli
from pipeline.decision.criteria_controls import Rate
from pipeline.tools import controls
from tests.decision.test_criteria_controls import planted

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
PARAMS = ("criteria:\n  rules:\n"
          "    - {name: beats, metric: test.nll_per_note.rel_improvement, op: '>=',\n"
          "       threshold: 0.02, judge: interval, rationale: r}\n"
          "    - {name: other, metric: toy.metric, op: '>=', threshold: 1, rationale: r}\n")


@pytest.mark.parametrize(("good", "bad", "status"), [
    (0.8, 0.05, 0), (0.79, 0.0, 1), (1.0, 0.06, 1)])
def test_the_table_and_the_exit_status_follow_the_standard(tmp_path, monkeypatch, capsys, good,
                                                           bad, status):
    (tmp_path / "params.yaml").write_text(PARAMS)
    seen = {}

    def rates(cfg, sizes, draws, seed):
        seen.update(rules=[r.name for r in cfg.rules], draws=draws, seed=seed)
        return [Rate("beats", "good", "true gain 5%", good, draws),
                Rate("beats", "bad", "true gain 0%", bad, draws)]

    monkeypatch.setattr(controls, "rates", rates)
    monkeypatch.setattr(controls, "sizes_of", lambda args, params: planted())
    monkeypatch.setattr(controls, "joint_block", lambda *a: {
        "good": {"truth": "t", "all": 1.0}, "bad": [], "meets_standard": True})
    assert cli(["controls", "--params", str(tmp_path / "params.yaml"), "--draws", "20",
                "--seed", "3"]) == status
    assert seen == {"rules": ["beats", "other"], "draws": 20, "seed": 3}
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("|")][:5]
    met = {True: "met", False: "MISSED"}
    assert lines == [
        "| criterion | control | planted truth | passes (of 20) | standard |",
        "|---|---|---|---|---|",
        f"| beats | good | true gain 5% | {good:.1%} | >= 80%: {met[good >= 0.8]} |",
        f"| beats | bad | true gain 0% | {bad:.1%} | <= 5%: {met[bad <= 0.05]} |",
        "| other | - | no control for toy.metric | - | - |"]


def test_cli_prints_the_spreads_both_tables_and_fails_while_a_rule_misses(monkeypatch, capsys):
    monkeypatch.setattr(controls, "sizes_of", lambda args, params: planted())
    assert cli(["controls", "--params", str(REPO_PARAMS), "--draws", "20"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("spread gain_se_groups = 0.0051 (planted by the test)")
    assert "| criterion | control | planted truth | passes (of 20) |" in out
    assert "transformer_membership_near_chance | good | true AUC 0.5 (chance)" in out
    assert "| all rules together | model | passes (of 20) | standard |" in out
    assert "| bad: memorises |" in out and "MISSED" in out


def test_without_a_pilot_it_says_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["controls", "--params", str(REPO_PARAMS), "--draws", "20"]) == 2
    assert "holds no eval.json and per_piece.parquet of a val pilot" in capsys.readouterr().err

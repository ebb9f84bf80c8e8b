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

    def rates(cfg, draws, seed):
        seen.update(rules=[r.name for r in cfg.rules], draws=draws, seed=seed)
        return [Rate("beats", "good", "true gain 5%", good, draws),
                Rate("beats", "bad", "true gain 0%", bad, draws)]

    monkeypatch.setattr(controls, "rates", rates)
    assert cli(["controls", "--params", str(tmp_path / "params.yaml"), "--draws", "20",
                "--seed", "3"]) == status
    assert seen == {"rules": ["beats", "other"], "draws": 20, "seed": 3}
    lines = capsys.readouterr().out.splitlines()
    met = {True: "met", False: "MISSED"}
    assert lines == [
        "| criterion | control | planted truth | passes (of 20) | standard |",
        "|---|---|---|---|---|",
        f"| beats | good | true gain 5% | {good:.1%} | >= 80%: {met[good >= 0.8]} |",
        f"| beats | bad | true gain 0% | {bad:.1%} | <= 5%: {met[bad <= 0.05]} |",
        "| other | - | no control for toy.metric | - | - |"]


def test_cli_prints_a_table_and_fails_while_a_rule_misses(capsys):
    assert cli(["controls", "--params", str(REPO_PARAMS), "--draws", "50"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("| criterion | control | planted truth | passes (of 50) |")
    assert "transformer_membership_near_chance | good | true AUC 0.5 (chance)" in out
    assert "MISSED" in out

"""``symkit reproduce``: a re-run checked against the committed experiment (artifacts byte for
byte, verdicts, model metrics within a tolerance)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.cli import main
from pipeline.decision.preregistration import reproduction_tolerance
from pipeline.tools.reproduce import artifact_check, lock_outputs, verdict_check
from tests.tools.test_compare import pieces, scored, write_arm

LOCK = {"schema": "2.0", "stages": {
    "tokenize": {"cmd": "symkit tokenize", "outs": [
        {"path": "data/tokens", "hash": "md5", "md5": "a" * 32 + ".dir"}]},
    "train_transformer": {"cmd": "symkit train-transformer", "outs": [
        {"path": "data/transformer/model.safetensors", "hash": "md5", "md5": "b" * 32},
        {"path": "reports/train.json", "hash": "md5", "md5": "c" * 32}]}}}
DECISION = {"decision.overall": "FAIL", "decision.registration": "FOLLOWED",
            "decision.criteria.transformer_beats_ngram": "PASS", "test.nll_per_note.ngram": 4.3}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=repo,
                   check=True, capture_output=True)


def _write_run(root: Path, rows: pd.DataFrame, lock: dict, metrics: dict) -> None:
    write_arm(root, rows)
    ev = json.loads((root / "reports" / "eval.json").read_text())
    ev["protocol"]["splits"] = ["val", "test"]
    ev["models"] = {"transformer": {}}
    (root / "reports" / "eval.json").write_text(json.dumps(ev))
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    (root / "reports" / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> tuple[Path, pd.DataFrame]:
    """A committed experiment (3 training seeds, val and test) and a workspace equal to it."""
    rng = np.random.default_rng(3)
    p = pieces(rng, n_groups=15, per_group=2)
    rows = pd.concat([scored(p, np.ones(len(p)), [1, 2, 3], rng, 0.01, split=s)
                      for s in ("val", "test")], ignore_index=True)
    _write_run(tmp_path, rows, LOCK, DECISION)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "results")
    monkeypatch.chdir(tmp_path)
    return tmp_path, rows


def _record(root: Path) -> dict:
    return json.loads((root / "reports" / "reproduce.json").read_text())


def test_an_identical_rerun_is_byte_identical(repo, capsys):
    root, _ = repo
    assert main(["reproduce"]) == 0
    r = _record(root)
    assert r["conclusion"] == "byte-identical" and r["reasons"] == []
    assert r["artifacts"]["identical"] and r["verdicts"]["equal"]
    assert [(m["model"], m["split"]) for m in r["metrics"]["models"]] == [
        ("transformer", "val"), ("transformer", "test")]
    assert all(m["rel_difference"] == 0.0 and m["within_tolerance"]
               for m in r["metrics"]["models"])
    assert "reproduce: byte-identical" in capsys.readouterr().out


def test_training_drift_within_the_margin_is_within_tolerance(repo, capsys):
    """Another CPU model: the training outputs' hashes differ and the NLL moves in the 6th
    digit, but verdicts are equal: reproduced within tolerance, naming what differs."""
    root, rows = repo
    lock = json.loads(json.dumps(LOCK))
    lock["stages"]["train_transformer"]["outs"][0]["md5"] = "d" * 32
    drift = rows.assign(nll_nats=rows["nll_nats"] * (1 + 1e-6))
    _write_run(root, drift, lock, DECISION)
    assert main(["reproduce"]) == 0
    r = _record(root)
    assert r["conclusion"] == "within tolerance"
    assert r["artifacts"]["stages"]["train_transformer"]["differ"] == [
        "data/transformer/model.safetensors"]
    assert r["artifacts"]["stages"]["tokenize"]["differ"] == []
    assert all(m["within_tolerance"] and m["rel_difference"] != 0.0
               for m in r["metrics"]["models"])
    assert "train_transformer (data/transformer/model.safetensors)" in capsys.readouterr().out


def test_comparing_the_test_scores_is_a_look(repo):
    """Both runs' test rows are read through the gate: the committed run and an identical
    re-run are one look (command reproduce) in the working directory's ledger; a re-run with
    other test scores is another."""
    from pipeline.decision import ledger

    root, rows = repo
    assert main(["reproduce"]) == 0
    path = root / "reports" / "ledger.jsonl"
    (look,) = ledger.read(path)
    assert look["command"] == "reproduce" and look["registration"] is None
    assert look["pieces"] == sorted(set(rows.loc[rows["split"] == "test", "sha256"]))
    _write_run(root, rows.assign(nll_nats=rows["nll_nats"] * (1 + 1e-6)), LOCK, DECISION)
    assert main(["reproduce"]) == 0
    assert [r["command"] for r in ledger.read(path)] == ["reproduce", "reproduce"]


def test_a_changed_verdict_is_not_reproduced(repo, capsys):
    root, rows = repo
    _write_run(root, rows, LOCK, {**DECISION, "decision.overall": "PASS",
                                  "test.nll_per_note.ngram": 4.2})
    assert main(["reproduce"]) == 1
    r = _record(root)
    assert r["conclusion"] == "not reproduced"
    assert r["verdicts"]["differ"] == [{"key": "decision.overall", "committed": "FAIL",
                                        "rerun": "PASS"}]  # only decision keys count
    assert "decision.overall FAIL -> PASS" in capsys.readouterr().out


def _registered(root: Path, threshold: float = 0.02) -> None:
    """Commit a registration whose comparison rule has ``threshold`` (tolerance: half)."""
    rule = {"name": "beats", "metric": "test.nll_per_note.rel_improvement", "op": ">=",
            "threshold": threshold, "judge": "interval", "rationale": "r"}
    ident = {"params": {"criteria": {"rules": [rule]}},
             "reproduction": reproduction_tolerance({"rules": [rule]})}
    (root / "reports" / "preregistration.json").write_text(json.dumps({"identity": ident}))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "registered")


@pytest.mark.parametrize(("times", "conclusion"), [(0.5, "within tolerance"),
                                                   (2.0, "not reproduced")])
def test_a_shift_is_judged_against_the_registered_tolerance(repo, times, conclusion):
    """The registered 2% threshold fixes a 1% tolerance: half of it is within, twice it is not,
    whatever the seeds' spread (which once widened the tolerance to 9.8%)."""
    root, rows = repo
    _registered(root)
    shifted = rows.assign(nll_nats=rows["nll_nats"] * np.where(
        rows["split"] == "test", 1 + times * 0.01, 1.0))
    lock = json.loads(json.dumps(LOCK))
    lock["stages"]["train_transformer"]["outs"][0]["md5"] = "d" * 32
    _write_run(root, shifted, lock, DECISION)
    main(["reproduce"])
    r = _record(root)
    assert r["conclusion"] == conclusion, r["reasons"]
    test = next(m for m in r["metrics"]["models"] if m["split"] == "test")
    assert test["tolerance"] == pytest.approx(0.01) and test["from"] == "registered"


def test_other_params_are_not_a_reproduction(repo):
    root, _ = repo
    (root / "params.yaml").write_text("transformer:\n  seed: 1\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "params")
    (root / "params.yaml").write_text("transformer:\n  seed: 2\n")
    assert main(["reproduce"]) == 1
    assert _record(root)["reasons"] == [
        "params that shape results differ: transformer.seed: registered 1, now 2"]


def test_other_judging_code_is_not_a_reproduction(repo):
    """The revision holds the code too (as a real repository does): a judging file changed
    since, here the criteria, is not the experiment that was run."""
    import shutil

    root, _ = repo
    code = Path(__file__).resolve().parents[2]
    for pkg in ("pipeline", "models"):
        shutil.copytree(code / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "code")
    assert main(["reproduce"]) == 0  # the same code: reproduced
    criteria = root / "pipeline" / "decision" / "criteria.py"
    criteria.write_text(criteria.read_text() + "\nEXTRA = 1\n")
    _git(root, "commit", "-q", "-am", "code as it was")
    assert main(["reproduce"]) == 1
    (reason,) = _record(root)["reasons"]
    assert reason.startswith("the code that judges, trains or stops training differs: judging: "
                             "pipeline/decision/criteria.py changed")


def test_a_real_change_is_not_reproduced(repo):
    """Another learning rate, say: every seed's model 5% worse on test."""
    root, rows = repo
    worse = rows.assign(nll_nats=rows["nll_nats"] * np.where(rows["split"] == "test", 1.05, 1.0))
    _write_run(root, worse, LOCK, DECISION)
    assert main(["reproduce"]) == 1
    r = _record(root)
    by = {m["split"]: m for m in r["metrics"]["models"]}
    assert by["val"]["within_tolerance"] and not by["test"]["within_tolerance"]
    assert by["test"]["rel_difference"] == pytest.approx(-0.05)
    assert r["reasons"] == ["NLL per note moved beyond its tolerance: transformer on test"]


def test_missing_files_and_folders_are_refused(repo, capsys):
    root, _ = repo
    assert main(["reproduce", "--against", "reports"]) == 2
    assert "is a folder" in capsys.readouterr().err
    (root / "dvc.lock").unlink()
    assert main(["reproduce"]) == 2
    assert "dvc.lock does not exist" in capsys.readouterr().err


def test_the_pure_checks():
    committed = lock_outputs(yaml.safe_dump(LOCK).encode())
    assert committed["train_transformer"]["reports/train.json"] == "c" * 32
    rerun = {"tokenize": committed["tokenize"]}  # a stage missing from the re-run
    check = artifact_check(committed, rerun)
    assert not check["identical"]
    assert check["stages"]["train_transformer"]["differ"] == [
        "data/transformer/model.safetensors", "reports/train.json"]
    assert verdict_check(DECISION, dict(DECISION))["equal"]
    assert verdict_check(DECISION, {})["differ"][0]["rerun"] is None

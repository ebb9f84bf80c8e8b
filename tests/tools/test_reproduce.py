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
from pipeline.tools.reproduce import artifact_check, lock_outputs, tolerance_for, verdict_check
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


def test_another_cpu_models_drift_is_within_tolerance(repo):
    """The finding behind issue 34: a re-run on another CPU model moved the transformer's val
    NLL per note by -0.17%, each piece by up to about a percent either way; an equivalence test
    over 27 pieces could not show +-0.5% and said "not reproduced". The seed spread (about 1%
    here) says that is training noise."""
    root, rows = repo
    rng = np.random.default_rng(11)
    per_piece = rng.normal(1.0017, 0.01, len(rows))
    drift = rows.assign(nll_nats=rows["nll_nats"] * per_piece)
    lock = json.loads(json.dumps(LOCK))
    lock["stages"]["train_transformer"]["outs"][0]["md5"] = "d" * 32
    _write_run(root, drift, lock, DECISION)
    assert main(["reproduce"]) == 0
    r = _record(root)
    assert r["conclusion"] == "within tolerance", r["reasons"]
    for m in r["metrics"]["models"]:
        assert m["from"] == "seed spread" and m["n_seeds"] == 3
        assert abs(m["rel_difference"]) < m["tolerance"]


def test_a_real_change_is_not_reproduced(repo):
    """Another learning rate, say: every seed's model 5% worse on test, far beyond what
    re-drawing the seeds would move the mean."""
    root, rows = repo
    worse = rows.assign(nll_nats=rows["nll_nats"] * np.where(rows["split"] == "test", 1.05, 1.0))
    _write_run(root, worse, LOCK, DECISION)
    assert main(["reproduce"]) == 1
    r = _record(root)
    by = {m["split"]: m for m in r["metrics"]["models"]}
    assert by["val"]["within_tolerance"] and not by["test"]["within_tolerance"]
    assert by["test"]["rel_difference"] == pytest.approx(-0.05)
    assert r["reasons"] == ["NLL per note moved beyond its tolerance: transformer on test"]


def test_the_tolerance_follows_the_seed_spread_above_its_floor():
    seeds = pd.Series([4.0, 4.04, 3.96])  # 1% seed sd
    t = tolerance_for(seeds, floor=0.001)
    assert t["seed_sd"] == pytest.approx(0.01)
    assert t["tolerance"] == pytest.approx(1.959964 * 0.01 * (2 / 3) ** 0.5, rel=1e-5)
    one = tolerance_for(pd.Series([4.0]), floor=0.001)  # a model without seeds: the floor
    assert one == {"tolerance": 0.001, "seed_sd": None, "n_seeds": 1, "from": "stated tolerance"}


def test_weights_perturbed_by_fp32_noise_stay_within_tolerance_unlike_a_retrained_model():
    """On real weights: a tiny transformer's scores with every weight moved by a few fp32 ulps
    stay within the floor; with its weights scaled as a changed learning rate might leave
    them they do not."""
    import torch

    from models.transformer import GPT, TransformerConfig

    model = GPT(TransformerConfig(vocab_size=32, max_seq_len=16, n_layer=1, n_head=2, n_embd=16),
                generator=torch.Generator().manual_seed(0))
    model.eval()
    ids = torch.randint(3, 32, (8, 16), generator=torch.Generator().manual_seed(1))

    def nll(m) -> float:
        with torch.no_grad():
            _, loss = m(ids[:, :-1], ids[:, 1:])
        return float(loss)

    base = nll(model)
    noisy, changed = GPT(model.config), GPT(model.config)
    noisy.load_state_dict(model.state_dict())
    changed.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in noisy.parameters():
            p.mul_(1 + 4 * torch.finfo(torch.float32).eps * torch.randn(p.shape, generator=g))
        for p in changed.parameters():
            p.mul_(1.5)
    noisy.eval()
    changed.eval()
    floor = tolerance_for(pd.Series([base]), floor=0.001)["tolerance"]
    assert abs(nll(noisy) - base) / base <= floor
    assert abs(nll(changed) - base) / base > floor


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

"""Adaptation experiments (``experiments/adaptation``) end to end: what each arm trains, where
retention is measured, the report, and the registration judged by adapt-evaluate.

Synthetic tokens (:mod:`pipeline.training.synthetic`) stand for the two corpora: one tokenizer
hash, other pieces and other splits. A tiny model is pretrained on the source; every arm trains a
few steps from it."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from safetensors.torch import load_file

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.core.artifacts import read_json, read_parquet, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.decision import ledger
from pipeline.inference.loading import load_transformer
from pipeline.inference.pieces import score_rows
from pipeline.stages import adapt_evaluate, adapt_train
from pipeline.stages.train_transformer import run as train_run
from pipeline.tokens.contract import TokenInfo
from tests._transformer_data import tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)
LORA_TARGETS = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
ARMS = {"scratch": {"kind": "scratch"}, "full": {"kind": "full", "lr": 0.001},
        "partial": {"kind": "partial", "freeze": ["wte", "wpe", "blocks.0."]},
        "lora": {"kind": "lora", "lora_rank": 2}}


def _facts(tokens: Path, folder: Path) -> dict[str, Path]:
    """A manifest and a split table for a synthetic token table (each piece its own group)."""
    df = read_parquet(tokens)
    man = pd.DataFrame({"sha256": df["sha256"], "status": "ok",
                        "n_notes": df["n_notes"].astype("int64"), "duration_s": 10.0})
    splits = pd.DataFrame({"sha256": df["sha256"], "split": df["split"],
                           "group_id": "g-" + df["sha256"].str[:6]})
    write_parquet(folder / "manifest.parquet", man)
    write_parquet(folder / "splits.parquet", splits)
    return {"manifest": folder / "manifest.parquet", "splits": folder / "splits.parquet"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("adaptation")
    source = write_token_data(root / "source", n_pieces=30, mean_len=80, seed=0, name="src",
                              info_extra={"split_hash": "source-split"})
    target = write_token_data(root / "target", n_pieces=30, mean_len=80, seed=1, name="tgt",
                              info_extra={"split_hash": "target-split"})
    source |= _facts(source["tokens"], root / "source")
    target |= _facts(target["tokens"], root / "target")
    pre = root / "pretrain"
    train_run(tiny_config(), RUNTIME, tokens=source["tokens"], info=source["info"],
              augmented=None, out_dir=pre, summary=root / "pretrain.json", log_dir=root / "log",
              env=root / "pretrain.env.json")
    cfg = parse_section("adaptation", {"pretrained": str(pre), "seed": 7, "seeds": 3,
                                       "steps": 6, "arms": ARMS}, AdaptationConfig)
    for arm in cfg.arms:
        adapt_train.run(cfg, tiny_config(), RUNTIME, arm, tokens=target["tokens"],
                        info=target["info"], out_dir=root / "arms" / arm,
                        summary=root / "arm_reports" / f"{arm}.json",
                        log_dir=root / "logs" / arm, env=root / "arm_reports" / f"{arm}.env.json")
    return {"root": root, "source": source, "target": target, "pre": pre, "cfg": cfg}


def _evaluate(world: dict[str, Any], out: Path, cfg: AdaptationConfig | None = None,
              source: dict[str, Path] | None = None) -> dict[str, Any]:
    root = world["root"]
    return adapt_evaluate.run(
        cfg or world["cfg"], RUNTIME, target=world["target"], source=source or world["source"],
        arms_dir=root / "arms", arm_reports=root / "arm_reports",
        per_piece=out / "per_piece.parquet", report=out / "adaptation.json",
        markdown=out / "adaptation.md", figure=out / "adaptation.png")


@pytest.fixture(scope="module")
def evaluated(world, tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("evaluated")
    return {"out": out, "report": _evaluate(world, out)}


# ---------------------------------------------------------------------------------- adapt-train
def test_adapt_train_refuses_zero_shot(world, monkeypatch, tmp_path, capsys):
    from pipeline.cli import main

    (tmp_path / "params.yaml").write_text(
        f"adaptation:\n  pretrained: {world['pre'].as_posix()}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["adapt-train", "zero_shot"]) == 2
    assert "zero_shot trains nothing" in capsys.readouterr().err
    assert main(["adapt-train", "nonesuch"]) == 2
    assert "no trained arm 'nonesuch'" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


# -------------------------------------------------------------------------- what arms change
def _weights(folder: Path) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in load_file(folder / "model.safetensors").items()}


def _changed(world, arm: str) -> dict[str, set[str]]:
    """Per seed of ``arm``: the tensors that differ from the pretrained model's."""
    before = _weights(world["pre"])
    index = read_json(world["root"] / "arms" / arm / "replicates" / "index.json")
    out = {}
    for seed in index["seeds"]:
        after = _weights(world["root"] / "arms" / arm / "replicates" / f"seed-{seed}")
        assert set(after) == set(before)
        out[seed] = {k for k in before if not np.array_equal(before[k], after[k])}
    assert len(out) == 3
    return out


def test_partial_changes_exactly_the_unfrozen_tensors(world):
    frozen = ("wte", "wpe", "blocks.0.")
    for changed in _changed(world, "partial").values():
        names = set(_weights(world["pre"]))
        assert changed and not {k for k in changed if k.startswith(frozen)}
        # everything that trains (2-D weights, biases and gains alike) moved
        assert changed == {k for k in names if not k.startswith(frozen)}


def test_lora_changes_only_the_adapted_weights(world):
    names = set(_weights(world["pre"]))
    targets = {k for k in names if k.endswith(".weight") and any(
        f".{t}." in f".{k}" for t in LORA_TARGETS)}
    assert len(targets) == 2 * len(LORA_TARGETS)  # two blocks
    for changed in _changed(world, "lora").values():
        assert changed == targets  # merged adapters; biases, LayerNorms, embeddings untouched
    summary = read_json(world["root"] / "arm_reports" / "lora.json")
    assert 0 < summary["params"]["trainable"] < summary["params"]["total"] / 10
    assert summary["estimate"]["params_trainable"] == summary["params"]["trainable"]


def test_full_changes_every_tensor_and_scratch_starts_elsewhere(world):
    names = set(_weights(world["pre"]))
    for changed in _changed(world, "full").values():
        assert changed == names
    scratch = read_json(world["root"] / "arm_reports" / "scratch.json")
    assert scratch["init_from"] is None and scratch["params"]["trainable"] == scratch[
        "params"]["total"]


# ----------------------------------------------------------------------------- adapt-evaluate
def test_zero_shot_is_the_pretrained_model_untrained(world, evaluated, monkeypatch):
    table = read_parquet(evaluated["out"] / "per_piece.parquet")
    zs = table[table["model"] == ZERO_SHOT].sort_values(["split", "sha256"])
    assert list(zs["seed"].dropna().unique()) == [7]  # the pretraining's one seed
    assert not (world["root"] / "arms" / ZERO_SHOT).exists()
    info = TokenInfo.read(world["target"]["info"])
    rows = read_parquet(world["target"]["tokens"], columns=["sha256", "split", "track", "ids"])
    rows = rows[rows["split"].isin(["val", "test"])].sort_values(["sha256", "track"])
    model = load_transformer(world["pre"] / "replicates" / "seed-7")
    direct = score_rows(model, [np.asarray(i, dtype=np.int64) for i in rows["ids"]])
    mine = zs[zs["split"] != "source_val"].set_index("sha256").loc[rows["sha256"], "nll_nats"]
    np.testing.assert_allclose(mine.to_numpy(), direct, rtol=1e-12)
    assert info.vocab_size == model.vocab_size
    params = evaluated["report"]["arms"][ZERO_SHOT]
    assert params["params_trainable"] == 0 and params["forgetting"] is None

    import pipeline.training.loop as loop

    def no_training(*a, **k):
        raise AssertionError("adapt-evaluate trained a model")

    monkeypatch.setattr(loop, "train", no_training)
    _evaluate(world, evaluated["out"] / "again")  # scoring trains nothing
    assert (evaluated["out"] / "again" / "adaptation.json").read_bytes() == (
        evaluated["out"] / "adaptation.json").read_bytes()


def test_retention_is_measured_on_source_val_never_source_train(world, evaluated):
    table = read_parquet(evaluated["out"] / "per_piece.parquet")
    source = read_parquet(world["source"]["tokens"])
    target = read_parquet(world["target"]["tokens"])
    assert set(table["split"]) == {"val", "test", "source_val"}
    scored = set(table.loc[table["split"] == "source_val", "sha256"])
    assert scored == set(source.loc[source["split"] == "val", "sha256"])
    assert not scored & set(source.loc[source["split"] != "val", "sha256"])
    for split in ("val", "test"):
        assert set(table.loc[table["split"] == split, "sha256"]) == set(
            target.loc[target["split"] == split, "sha256"])
    report = evaluated["report"]
    n_source_val = int((source["split"] == "val").sum())
    assert report["pieces"]["source_val"] == n_source_val
    for arm, m in report["arms"].items():
        assert m["source_val"]["ci_low"] <= m["source_val"]["value"] <= m["source_val"]["ci_high"]
        if arm != ZERO_SHOT:  # forgetting: the arm minus the pretrained model, on source val
            diff = (report["models"][arm]["source_val"]["nll_nats"]
                    - report["models"][ZERO_SHOT]["source_val"]["nll_nats"])
            notes = report["models"][arm]["source_val"]["n_notes"]
            assert m["forgetting"]["value"] == pytest.approx(diff / notes)


def test_the_report_names_the_choice_first_and_is_deterministic(world, evaluated, tmp_path):
    report, out = evaluated["report"], evaluated["out"]
    d = report["decision"]
    assert d["pretraining_helps"]["verdict"] in {"PASS", "FAIL", "INCONCLUSIVE"}
    assert set(report["arms"]) == {ZERO_SHOT, *ARMS}
    text = (out / "adaptation.md").read_text(encoding="utf-8").splitlines()
    first = "\n".join(text[:4])
    if d["smallest_adequate"] is None:
        assert "No arm is adequate" in first
    else:
        assert f"Choice: `{d['smallest_adequate']}`" in first and "[" in first
    assert (out / "adaptation.png").read_bytes()[:4] == b"\x89PNG"
    _evaluate(world, tmp_path)
    for name in ("adaptation.json", "per_piece.parquet", "adaptation.md", "adaptation.png"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_a_source_of_another_tokenizer_is_refused_naming_both(world, tmp_path):
    info = read_json(world["source"]["info"])
    other = tmp_path / "info.json"
    other.write_text(json.dumps({**info, "tokenizer_hash": "other-hash"}), encoding="utf-8")
    with pytest.raises(ParamsError, match=r"tokenizer tok-hash.*other-hash"):
        _evaluate(world, tmp_path, source={**world["source"], "info": other})


def test_a_pretrained_model_of_another_tokenizer_is_refused(world, tmp_path):
    import shutil

    from pipeline.inference.loading import ModelUnavailable

    pre = tmp_path / "pre"
    shutil.copytree(world["pre"], pre)
    meta_path = pre / "replicates" / "seed-7" / "model.json"
    meta = read_json(meta_path)
    meta_path.write_text(json.dumps({**meta, "tokenizer_hash": "other-hash"}), encoding="utf-8")
    cfg = world["cfg"].model_copy(update={"pretrained": str(pre)})
    with pytest.raises(ModelUnavailable, match=r"zero_shot.*tokenizer_hash other-hash"):
        _evaluate(world, tmp_path / "out", cfg=cfg)


# ------------------------------------------------------------------------------- registration
def _experiment(world: dict[str, Any], folder: Path, min_gain: float = 0.02) -> Path:
    """An adaptation experiment's params.yaml for ``world`` (paths absolute)."""
    import yaml

    params = folder / "params.yaml"
    params.write_text(yaml.safe_dump({
        "tokenize": {"vocab_size": 1000},
        "adaptation": {"pretrained": str(world["pre"]), "seed": 7, "seeds": 3, "steps": 6,
                       "arms": ARMS, "decision": {"min_gain": min_gain}}}), encoding="utf-8")
    return params


def _identity(world: dict[str, Any], params: Path) -> dict[str, Any]:
    from pipeline.adaptation import adaptation_registration as registration

    missing = params.parent / "no-split-report.json"
    return registration.identity(
        params, target_splits=world["target"]["splits"], target_split_report=missing,
        source_splits=world["source"]["splits"], source_split_report=missing)


def _registered_evaluate(world: dict[str, Any], out: Path, params: Path) -> dict[str, Any]:
    from pipeline.core.config import load_section

    root = world["root"]
    reg = adapt_evaluate.Registration(out / "preregistration.json", out / "ledger.jsonl",
                                      _identity(world, params))
    with contextlib.chdir(out):  # outside any git repository: this one's history is not read
        return adapt_evaluate.run(
            load_section("adaptation", params, AdaptationConfig), RUNTIME,
            target=world["target"], source=world["source"], arms_dir=root / "arms",
            arm_reports=root / "arm_reports", per_piece=out / "per_piece.parquet",
            report=out / "adaptation.json", markdown=out / "adaptation.md",
            figure=out / "adaptation.png", registration=reg)


def _register(world: dict[str, Any], out: Path, params: Path, force: bool = False
              ) -> dict[str, Any]:
    from pipeline.adaptation import adaptation_registration as registration

    missing = out / "no-split-report.json"
    with contextlib.chdir(out):  # outside any git repository: this one's history is not read
        return registration.register(
            params, target_splits=world["target"]["splits"], target_split_report=missing,
            source_splits=world["source"]["splits"], source_split_report=missing,
            out=out / "preregistration.json", ledger_path=out / "ledger.jsonl",
            per_piece=out / "per_piece.parquet", report=out / "adaptation.json", force=force)


def test_an_unregistered_run_says_so_and_records_its_look(world, tmp_path):
    params = _experiment(world, tmp_path)
    report = _registered_evaluate(world, tmp_path, params)
    assert report["registration"]["status"] == "NOT REGISTERED"
    assert "symkit preregister" in (tmp_path / "adaptation.md").read_text(encoding="utf-8")
    lines = (tmp_path / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    target = read_parquet(world["target"]["tokens"])
    look, scores = map(json.loads, lines)  # the look, then the digest of its scores
    assert look["kind"] == "look" and scores["kind"] == "scores"
    assert look["command"] == scores["command"] == "adapt_evaluate"
    assert look["registration"] is None and scores["look"] == look["look"]
    assert look["pieces"] == sorted(target.loc[target["split"] == "test", "sha256"])
    per_piece = read_parquet(tmp_path / "per_piece.parquet")
    assert scores["results_sha256"] == ledger.results_digest(ledger.test_rows(per_piece))
    _registered_evaluate(world, tmp_path, params)  # the same scores again: the same look
    assert (tmp_path / "ledger.jsonl").read_text(encoding="utf-8").splitlines() == lines


def test_the_registered_decision_is_judged_and_a_changed_one_deviates(world, tmp_path):
    from pipeline.decision.ledger import AlreadyScored

    params = _experiment(world, tmp_path, min_gain=0.02)
    rec = _register(world, tmp_path, params)
    assert not rec["forced"] and rec["identity"]["params"]["decision"]["min_gain"] == 0.02
    assert rec["identity"]["pieces"]["test"] and rec["identity"]["source"]["pieces"]["val"]
    report = _registered_evaluate(world, tmp_path, params)
    assert report["registration"]["status"] == "FOLLOWED, ORDER NOT SHOWN"  # no git here
    assert report["registration"]["deviations"] == []

    _experiment(world, tmp_path, min_gain=0.4)  # the rule loosened after the look
    report = _registered_evaluate(world, tmp_path, params)
    reg = report["registration"]
    assert reg["status"] == "DEVIATED" and reg["judged_with"] == "the registered decision"
    assert any("decision.min_gain: registered 0.02, now 0.4" in x for x in reg["deviations"])
    assert report["decision"]["pretraining_helps"]["threshold"] == 0.02
    assert "DEVIATED" in (tmp_path / "adaptation.md").read_text(encoding="utf-8")

    with pytest.raises(AlreadyScored, match=r"already exist \(1 look"):
        _register(world, tmp_path, params)  # the ledger holds a look at these test pieces
    rec = _register(world, tmp_path, params, force=True)  # the loosened rule, registered late
    assert rec["forced"] and len(rec["looks_before"]) == 1
    reg = _registered_evaluate(world, tmp_path, params)["registration"]
    assert reg["status"] == "DEVIATED" and reg["judged_with"] == "the registered decision"
    assert any("the decision changed after look 1" in x for x in reg["deviations"])


def test_a_registration_forced_over_a_look_follows_after_it(world, tmp_path):
    params = _experiment(world, tmp_path)
    _registered_evaluate(world, tmp_path, params)  # scored before any registration
    rec = _register(world, tmp_path, params, force=True)
    assert rec["forced"] and rec["looks_before"][0]["registration"] is None
    report = _registered_evaluate(world, tmp_path, params)
    assert report["registration"]["status"].startswith("FOLLOWED AFTER 1 LOOK")  # one, not two


def test_an_edited_registration_deviates(world, tmp_path):
    params = _experiment(world, tmp_path)
    _register(world, tmp_path, params)
    path = tmp_path / "preregistration.json"
    rec = read_json(path)
    rec["identity"]["params"]["decision"]["margin"] = 0.5
    path.write_text(json.dumps(rec), encoding="utf-8")
    reg = _registered_evaluate(world, tmp_path, params)["registration"]
    assert reg["status"] == "DEVIATED"
    assert any("was edited after registration" in x for x in reg["deviations"])


def test_preregister_in_an_adaptation_folder_registers_it(world, tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    params = _experiment(world, tmp_path)
    monkeypatch.chdir(tmp_path)  # outside any git repository: this one's history is not read
    rc = main(["preregister", "--params", str(params), "--splits",
               str(world["source"]["splits"]), "--split-report", str(tmp_path / "none.json"),
               "--target-splits", str(world["target"]["splits"]), "--target-split-report",
               str(tmp_path / "none.json"), "--out", str(tmp_path / "preregistration.json"),
               "--ledger", str(tmp_path / "ledger.jsonl")])
    assert rc == 0, capsys.readouterr().err
    rec = read_json(tmp_path / "preregistration.json")
    assert rec["kind"] == "adaptation" and "adaptation decision" in capsys.readouterr().out

"""What ``train_transformer`` writes from its replicates: each seed's deterministic summary, the
stage summary with the seeds' spread, the model folders, logs and the timing sidecar."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from models.transformer import GPT, export_state, load_model
from pipeline.core.artifacts import read_json
from pipeline.tokens.contract import TokenInfo
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.outputs import (
    LOG_COLUMNS,
    REPLICATE_KEYS,
    Replicate,
    collect,
    final_model,
    log_table,
    seed_folder,
    spread,
    stage_summary,
    summarise,
    write_outputs,
)
from tests._transformer_data import tiny_config, write_token_data

CFG = tiny_config(model={"max_seq_len": 16, "n_embd": 16},
                  train={"max_steps": 3, "eval_every": 3, "micro_batch": 2, "grad_accum": 1},
                  checkpoint={"every": 3})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(info, corpus, result) of a 3-step run of a 2-layer, 16-dim model."""
    paths = write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=20, mean_len=30)
    info = TokenInfo.read(paths["info"])
    corpus = load_corpus(paths["tokens"], info)
    r = train(CFG, info, corpus, tmp_path_factory.mktemp("ck"), threads=1, echo=lambda _: None)
    return info, corpus, r


def _rep(seed: int, best: float | None) -> Replicate:
    summary = {"steps": 5, "best_step": 5, "best_val_loss": best, "final_train_loss": 1.0,
               "stop_reason": "max_steps", "epochs": 1.0, "config_hash": f"h{seed}"}
    return Replicate(seed=seed, model=torch.nn.Linear(1, 1), meta={}, summary=summary, log=[],
                     timing={}, device="cpu", precision="fp32", reproducible=True)


def test_spread_of_best_val_loss():
    s = stage_summary([_rep(1, 2.0), _rep(2, 4.0), _rep(3, 3.0)])
    assert s["best_val_loss_spread"] == {"mean": 3.0, "sd": 1.0, "min": 2.0, "max": 4.0}
    assert s["seeds"] == [1, 2, 3] and s["best_val_loss"] == 2.0 and s["config_hash"] == "h1"
    s = stage_summary([_rep(1, None), _rep(2, 4.0)])  # a seed without validation is left out
    assert s["best_val_loss_spread"] == {"mean": 4.0, "sd": None, "min": 4.0, "max": 4.0}
    s = stage_summary([_rep(1, None)])
    assert s["best_val_loss_spread"] == {"mean": None, "sd": None, "min": None, "max": None}


def test_seed_folders_logs_and_spread():
    assert seed_folder(7) == "seed-7"
    rows = [{"step": 1, "train_loss": 2.0 / 3, "val_loss": None, "lr": 1e-3, "grad_norm": 10},
            {"step": 1234567, "train_loss": 1.25, "val_loss": 1.5, "lr": 0.0005,
             "grad_norm": 0.5}]  # integers whole, floats to 6 significant digits
    assert log_table(rows) == ("step\ttrain_loss\tval_loss\tlr\tgrad_norm\n"
                               "1\t0.666667\t\t0.001\t10\n1234567\t1.25\t1.5\t0.0005\t0.5\n")
    assert log_table([]).splitlines() == ["\t".join(LOG_COLUMNS)]
    assert spread([1.0, 2.0, 3.0]) == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0}
    assert spread([5.0]) == {"mean": 5.0, "sd": None, "min": 5.0, "max": 5.0}
    assert spread([]) == {"mean": None, "sd": None, "min": None, "max": None}


def test_a_replicates_summary_holds_counts_and_losses_only(trained):
    info, corpus, r = trained
    s = summarise(CFG.train, info, corpus, r)
    assert (s["steps"], s["stop_reason"], s["effective_batch"], s["examples"]) == (
        3, "max_steps", 2, 6)
    assert s["epochs"] == pytest.approx(6 / len(corpus.train))
    assert s["final_train_loss"] == r.state.log[-1]["train_loss"]
    assert s["best_val_ppl"] == pytest.approx(math.exp(s["best_val_loss"]))
    assert s["finetune"] == {"init_from": None, "frozen_tensors": 0, "lora_layers": 0}
    assert (s["tokenizer_hash"], s["split_hash"], s["vocab_size"]) == ("tok-hash", "split-hash",
                                                                       64)
    assert s["config_hash"] == r.fingerprint["config_hash"] and "condition" not in s
    assert set(REPLICATE_KEYS) <= set(s)
    text = json.dumps(s)
    assert "seconds" not in text and "cpu" not in text  # no timings, devices or paths


def test_the_final_model_is_a_plain_gpt_with_the_best_weights_on_cpu(trained):
    _, _, r = trained
    model = final_model(r)
    assert isinstance(model, GPT) and model is not r.model
    weights = export_state(model)
    assert sorted(weights) == sorted(r.best)
    assert all(torch.equal(weights[k], r.best[k]) for k in weights)


def _outputs(trained, tmp_path: Path, seeds: list[int]) -> list[Replicate]:
    info, corpus, r = trained
    reps = [collect(s, r, info, summarise(CFG.train, info, corpus, r)) for s in seeds]
    write_outputs(reps, stage_summary(reps), out_dir=tmp_path / "model",
                  summary=tmp_path / "train.json", log_dir=tmp_path / "log",
                  env=tmp_path / "train.env.json", threads=1, world_size=1)
    return reps


def test_write_outputs_writes_the_first_seed_and_every_replicate(trained, tmp_path):
    reps = _outputs(trained, tmp_path, [7, 8])
    out = tmp_path / "model"
    for name in ("model.safetensors", "model.json"):
        assert (out / name).read_bytes() == (out / "replicates" / "seed-7" / name).read_bytes()
    assert read_json(out / "replicates" / "index.json") == {
        "seeds": [7, 8], "folders": {"7": "seed-7", "8": "seed-8"}}
    _, meta = load_model(out / "replicates" / "seed-8")
    assert meta["seed"] == 8 and meta["best_step"] == reps[0].meta["best_step"]
    assert meta["tokenizer_hash"] == "tok-hash" and meta["params"]["total"] > 0
    assert read_json(tmp_path / "train.json") == json.loads(json.dumps(stage_summary(reps)))
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["seed-7.tsv", "seed-8.tsv"]
    assert (tmp_path / "log" / "seed-8.tsv").read_text() == log_table(reps[1].log)
    env = read_json(tmp_path / "train.env.json")
    assert env["device"] == "cpu" and sorted(env["replicates"]) == ["7", "8"]
    assert env["steps_this_run"] == 6 and "environment" in env


def test_rewritten_outputs_keep_no_seed_that_was_not_trained(trained, tmp_path):
    _outputs(trained, tmp_path, [7, 8])
    _outputs(trained, tmp_path, [7])
    assert sorted(p.name for p in (tmp_path / "model" / "replicates").iterdir()) == [
        "index.json", "seed-7"]
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["seed-7.tsv"]

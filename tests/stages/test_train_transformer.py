"""Stage ``train_transformer``: outputs, determinism, stop rules, fine-tuning, reading steps and
packing, end to end."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import models.transformer as mt
import pipeline.training.loop as loop
from models.lora import param_counts
from pipeline.cli import main as cli_main
from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.inference.scorer import load_scorer
from pipeline.stages.train_transformer import run
from pipeline.training import checkpoint as ckpt
from pipeline.training.data import (
    TokenInfo,
    load_corpus,
)
from tests._transformer_data import (
    BOS,
    EOS,
    PAD,
    TINY_PARAMS,
    run_ckpt_dir,
    tiny_config,
    write_token_data,
)

RUNTIME = RuntimeConfig(torch_threads=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=80,
                            n_augmented=4)


def _run(cfg, data, out: Path, augmented: bool = False) -> dict:
    return run(cfg, RUNTIME, tokens=data["tokens"], info=data["info"],
               augmented=data["augmented"] if augmented else None, out_dir=out / "model",
               summary=out / "train.json", log_dir=out / "log", env=out / "env.json")


# --------------------------------------------------------------------------------------- outputs
def test_outputs_are_complete_and_deterministic(data, tmp_path):
    a = _run(tiny_config(), data, tmp_path / "a")
    _run(tiny_config(), data, tmp_path / "b")
    for name in ("model/model.safetensors", "model/model.json", "train.json", "log/seed-7.tsv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a["steps"] == 12 and a["stop_reason"] == "max_steps" and a["reproducible"] is True
    assert a["effective_batch"] == 8 and a["examples"] == 96 and a["tokens"] > 0
    assert a["epochs"] == pytest.approx(96 / a["n_train_examples"])
    assert a["best_val_loss"] < math.log(64)  # it learned something
    rows = (tmp_path / "a" / "log" / "seed-7.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["step", "train_loss", "val_loss", "lr", "grad_norm"]
    assert len(rows) == 13
    assert [r.split("\t")[2] != "" for r in rows[1:]] == [s % 4 == 0 for s in range(1, 13)]
    meta = json.loads((tmp_path / "a" / "model" / "model.json").read_text())
    assert meta["bos_id"] == BOS and meta["eos_id"] == EOS and meta["pad_id"] == PAD
    assert meta["tokenizer_hash"] == "tok-hash" and meta["split_hash"] == "split-hash"
    assert meta["params"]["total"] == a["params"]["total"] and meta["seed"] == 7
    env = json.loads((tmp_path / "a" / "env.json").read_text())
    assert env["device"] == "cpu" and env["tokens_per_s"] > 0 and "environment" in env
    assert "seconds" not in json.dumps(a)
    # the evaluation/generation entry point reads the stage's output folder
    scorer = load_scorer(tmp_path / "a" / "model")
    seqs = [np.arange(3, 20), np.arange(3, 100) % 61 + 3]
    assert [len(x) for x in scorer.token_nll(seqs)] == [18, 98]
    assert scorer.next_logprobs(seqs).shape == (2, 64) and scorer.eos_id == EOS


def test_cli_writes_dvc_paths(data, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"runtime": {"torch_threads": 1},
         "transformer": {**TINY_PARAMS, "replicates": 2,
                         "train": {**TINY_PARAMS["train"], "max_steps": 3}}}))
    rc = cli_main(["train-transformer", "--tokens", str(data["tokens"]), "--info",
                   str(data["info"])])
    assert rc == 0
    for p in ("data/transformer/model.safetensors", "data/transformer/model.json",
              "data/transformer/replicates/index.json",
              "data/transformer/replicates/seed-7/model.safetensors",
              "data/transformer/replicates/seed-8/model.json",
              "reports/train.json", "reports/plots/train_log/seed-7.tsv",
              "reports/plots/train_log/seed-8.tsv", "reports/train.env.json"):
        assert (tmp_path / p).exists(), p
    # the paths are dvc.yaml's (outs and plots of the stage)
    import pipeline.stages.train_transformer as stage

    parser = argparse.ArgumentParser()
    stage.add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    spec = yaml.safe_load((Path(__file__).parents[2] / "dvc.yaml").read_text())
    declared = {next(iter(o)) if isinstance(o, dict) else o
                for kind in ("outs", "metrics", "plots")
                for o in spec["stages"]["train_transformer"].get(kind, [])}
    assert {(defaults["out"] / "replicates").as_posix(), defaults["summary"].as_posix(),
            defaults["log"].as_posix()} <= declared
    # the timing sidecar is written but is not an output (it would change dvc.lock every run)
    assert defaults["env"].as_posix() not in declared
    assert defaults["env"].as_posix().endswith(".env.json")


def test_cli_fresh_discards_checkpoints(data, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    params = {"runtime": {"torch_threads": 1}, "transformer": TINY_PARAMS}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["train-transformer", "--tokens", str(data["tokens"]), "--info", str(data["info"])]
    assert cli_main(args) == 0
    params["transformer"] = {**TINY_PARAMS, "seed": 8}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert cli_main(args) == 0  # another run identity: its own checkpoint folder
    assert len(list((tmp_path / "data/transformer/checkpoints").glob("run-*"))) == 2
    assert cli_main([*args, "--fresh"]) == 0  # --fresh removes every run's checkpoints
    state = json.loads((run_ckpt_dir(tmp_path / "data/transformer") / "step-00000012/state.json")
                       .read_text())
    assert state["config"]["seed"] == 8


def test_augmented_rows_are_used_when_asked(data, tmp_path):
    out = _run(tiny_config(data={"use_augmented": True}, train={"max_steps": 3}), data,
               tmp_path, augmented=True)
    assert out["n_augmented_examples"] == 8


# ------------------------------------------------------------------------------------ stop rules
def test_nan_loss_stops_and_keeps_last_good_checkpoint(data, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = mt.masked_cross_entropy

    def poisoned(logits, targets, loss_mask=None, reduction="mean"):
        calls["n"] += 1
        out = real(logits, targets, loss_mask, reduction)
        # micro-batches 1..8 are steps 1..4 (grad_accum 2); then NaN
        return out * float("nan") if calls["n"] > 8 + 1 else out  # +1: the eval at step 4

    monkeypatch.setattr(mt, "masked_cross_entropy", poisoned)
    with pytest.raises(loop.NonFiniteError) as err:
        _run(tiny_config(), data, tmp_path)
    msg = str(err.value)
    assert "non-finite value at step 5" in msg and "step-00000003" in msg
    cdir = run_ckpt_dir(tmp_path / "model")
    assert [p.name for p in ckpt.list_checkpoints(cdir)] == ["step-00000003"]
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_nan_gradient_is_caught(data, tmp_path, monkeypatch):
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, max_norm: real_clip(params, max_norm) * float("inf"))
    with pytest.raises(loop.NonFiniteError, match="grad norm inf"):
        _run(tiny_config(), data, tmp_path)


def test_early_stopping_with_patience(data, tmp_path, monkeypatch):
    losses = iter([3.0, 2.9, 3.1, 3.2, 3.3, 3.4])
    monkeypatch.setattr(loop, "evaluate", lambda *a, **k: next(losses))
    out = _run(tiny_config(train={"patience": 2, "eval_every": 2}), data, tmp_path)
    assert out["stop_reason"] == "early_stopping" and out["steps"] == 8  # evals at 2, 4, 6, 8
    assert out["best_step"] == 4 and out["best_val_loss"] == 2.9


def test_max_tokens_stops_early(data, tmp_path):
    out = _run(tiny_config(train={"max_tokens": 600}), data, tmp_path)
    assert out["stop_reason"] == "max_tokens" and out["tokens"] >= 600 and out["steps"] < 12


def test_wall_clock_guard_flags_and_resumes(data, tmp_path):
    out = _run(tiny_config(train={"max_minutes": 0.000001}), data, tmp_path)
    assert out["stop_reason"] == "wall_clock" and out["reproducible"] is False and out["steps"] == 1
    out = _run(tiny_config(), data, tmp_path)  # same result config: resumes, finishes
    ref = _run(tiny_config(), data, tmp_path / "ref")
    assert out == ref and out["reproducible"] is True
    assert (tmp_path / "log/seed-7.tsv").read_bytes() == (
        tmp_path / "ref" / "log/seed-7.tsv").read_bytes()
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == (
        tmp_path / "ref" / "model" / "model.safetensors").read_bytes()


# ----------------------------------------------------------------------------------- fine-tuning
@pytest.fixture(scope="module")
def base_model(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base")
    _run(tiny_config(), data, out)
    return out / "model"


def test_freeze_counts_and_frozen_weights_unchanged(data, base_model, tmp_path):
    cfg = tiny_config(finetune={"init_from": str(base_model),
                                "freeze": ["wte", "wpe", "blocks.0."]})
    out = _run(cfg, data, tmp_path)
    base = load_file(base_model / "model.safetensors")
    new = load_file(tmp_path / "model" / "model.safetensors")
    C, V, T = 32, 64, 32
    block = sum(v.numel() for k, v in base.items() if k.startswith("blocks.0."))
    assert out["params"]["frozen"] == V * C + T * C + block
    assert out["params"]["trainable"] == out["params"]["total"] - out["params"]["frozen"]
    assert out["finetune"]["frozen_tensors"] > 0
    for k in base:
        same = torch.equal(base[k], new[k])
        assert same == k.startswith(("wte", "wpe", "blocks.0.")), k


def test_lora_trains_adapters_only_and_merges(data, base_model, tmp_path):
    cfg = tiny_config(finetune={"init_from": str(base_model), "lora_rank": 2,
                                "lora_targets": ["attn.qkv", "mlp.fc"]})
    out = _run(cfg, data, tmp_path)
    C, r, L = 32, 2, 2
    expect = L * (r * (C + 3 * C) + r * (C + 4 * C))  # A: (r, in), B: (out, r)
    assert out["params"]["trainable"] == expect and out["finetune"]["lora_layers"] == 4
    assert out["params"]["frozen"] == param_counts(mt.load_model(base_model)[0])["total"]
    base = load_file(base_model / "model.safetensors")
    new = load_file(tmp_path / "model" / "model.safetensors")
    assert sorted(base) == sorted(new)  # merged: a plain GPT again
    assert not torch.equal(base["blocks.0.attn.qkv.weight"], new["blocks.0.attn.qkv.weight"])
    assert torch.equal(base["blocks.0.attn.proj.weight"], new["blocks.0.attn.proj.weight"])


def test_init_from_a_checkpoint_folder(data, base_model, tmp_path):
    cdir = run_ckpt_dir(base_model) / "step-00000012"
    out = _run(tiny_config(finetune={"init_from": str(cdir), "freeze": ["wte"]}), data, tmp_path)
    new = load_file(tmp_path / "model" / "model.safetensors")
    assert torch.equal(new["wte.weight"], load_file(cdir / "model.safetensors")["wte.weight"])
    assert out["params"]["frozen"] == 64 * 32


def test_init_from_with_other_architecture_is_refused(data, base_model, tmp_path):
    cfg = tiny_config(model={"n_embd": 64}, finetune={"init_from": str(base_model)})
    with pytest.raises(ParamsError, match="n_embd: 32 there, 64 here"):
        _run(cfg, data, tmp_path)


def test_init_from_a_model_of_another_tokenizer_is_refused(data, base_model, tmp_path):
    """Same architecture and vocabulary size, other BPE merges: the weights would load, with
    every id meaning another token. The refusal names both tokenizers; a model or checkpoint
    that records no tokenizer is refused too."""
    import shutil

    ours = json.loads(data["info"].read_text())["tokenizer_hash"]
    other = tmp_path / "other"
    shutil.copytree(base_model, other)
    meta = json.loads((other / "model.json").read_text())
    assert meta["tokenizer_hash"] == ours  # the base model itself is accepted (tests above)
    meta["tokenizer_hash"] = "f" * 64
    (other / "model.json").write_text(json.dumps(meta))
    cfg = tiny_config(finetune={"init_from": str(other)})
    with pytest.raises(ParamsError, match=f"trained on tokenizer {'f' * 64}, this run "
                                          f"tokenises with {ours}"):
        _run(cfg, data, tmp_path / "run")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run_ckpt_dir(base_model) / "step-00000012", ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    state.pop("tokenizer_hash")
    (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(ParamsError, match="records no tokenizer hash"):
        _run(tiny_config(finetune={"init_from": str(ckpt)}), data, tmp_path / "run2")


# ------------------------------------------------------------------------------------------ gpu
@pytest.mark.gpu
def test_cuda_bf16_training(data, tmp_path):
    out = _run(tiny_config(device="cuda", precision="auto"), data, tmp_path)
    assert out["precision"] in {"bf16", "fp16"} and out["steps"] == 12


# ----------------------------------------------------------------------- reading steps, packing
def test_device_values_are_read_only_at_reading_steps(data, tmp_path, monkeypatch):
    """Losses and norms are read at step 1, multiples of log_every / eval_every /
    checkpoint.every, and the last step; the log still has every step's values."""
    read_at = []
    real = loop._read_pending

    def spy(pending, *a, **k):
        read_at.append(pending.rows[-1]["step"])
        return real(pending, *a, **k)

    monkeypatch.setattr(loop, "_read_pending", spy)
    _run(tiny_config(train={"max_steps": 14, "log_every": 5}), data, tmp_path)  # eval 4, ckpt 3
    assert read_at == [1, 3, 4, 5, 6, 8, 9, 10, 12, 14]
    rows = (tmp_path / "log" / "seed-7.tsv").read_text().splitlines()[1:]
    assert len(rows) == 14 and all(r.split("\t")[1] and r.split("\t")[4] for r in rows)


def test_nan_between_reading_steps_is_caught_and_never_saved(data, tmp_path, monkeypatch):
    """A NaN at a step that reads nothing (step 3) is found at the next reading step (4, an
    evaluation): training stops there, before evaluating, keeping best weights or saving."""
    calls = {"n": 0}
    real = mt.masked_cross_entropy

    def poisoned(logits, targets, loss_mask=None, reduction="mean"):
        calls["n"] += 1
        out = real(logits, targets, loss_mask, reduction)
        return out * float("nan") if calls["n"] == 5 else out  # step 3's first micro-batch

    saved = []
    real_save = ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint",
                        lambda d, step, **kw: saved.append((step, kw)) or real_save(d, step, **kw))
    evaluated = []
    real_eval = loop.evaluate
    monkeypatch.setattr(loop, "evaluate", lambda *a, **k: evaluated.append(1) or real_eval(*a, **k))
    monkeypatch.setattr(mt, "masked_cross_entropy", poisoned)
    with pytest.raises(loop.NonFiniteError) as err:
        _run(tiny_config(checkpoint={"every": 2}), data, tmp_path)  # reads at 1, 2, 4
    assert "non-finite value at step 3" in str(err.value) and "step-00000002" in str(err.value)
    assert "up to 4" in str(err.value)
    assert [s for s, _ in saved] == [2] and evaluated == []
    for _, kw in saved:  # nothing non-finite was ever written
        assert all(torch.isfinite(t).all() for part in ("model", "best") for t in kw[part].values())
    cdir = run_ckpt_dir(tmp_path / "model")
    assert [p.name for p in ckpt.list_checkpoints(cdir)] == ["step-00000002"]
    for f in (cdir / "step-00000002").glob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(f).values()), f
    assert not (tmp_path / "model" / "model.safetensors").exists()


@pytest.fixture(scope="module")
def short_data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("short"), n_pieces=60, mean_len=10)


def test_packing_cuts_padding_and_trains(short_data, tmp_path):
    plain = _run(tiny_config(), short_data, tmp_path / "plain")
    packed = _run(tiny_config(data={"pack": True}), short_data, tmp_path / "packed")
    assert plain["padded_share"] > 0.5 and packed["padded_share"] < 0.25
    assert packed["tokens"] > 2 * plain["tokens"] and packed["examples"] > 2 * plain["examples"]
    assert packed["epochs"] == pytest.approx(packed["examples"] / packed["n_train_examples"])
    assert packed["best_val_loss"] < math.log(64)
    assert plain["padded_share"] == pytest.approx(1 - plain["tokens"] / (12 * 8 * 32))


def test_packed_resume_after_kill_is_bitwise(short_data, tmp_path):
    cfg = tiny_config(data={"pack": True})
    _run(cfg, short_data, tmp_path / "straight")
    info = TokenInfo.read(short_data["info"])
    from pipeline.training.resume import checkpoint_dir

    def kill(state):
        if state.step == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.train(cfg, info, load_corpus(short_data["tokens"], info),
                   checkpoint_dir(tmp_path / "resumed" / "model", cfg, info, 1, 1), threads=1,
                   on_step=kill, echo=lambda _: None)
    _run(cfg, short_data, tmp_path / "resumed")  # resumes from step 6, replays step 7
    for name in ("model/model.safetensors", "train.json", "log/seed-7.tsv"):
        assert (tmp_path / "straight" / name).read_bytes() == (
            tmp_path / "resumed" / name).read_bytes(), name

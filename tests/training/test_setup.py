"""What is trained and how: the learning-rate schedule, the optimiser's groups, and the model built
fresh, from a model or checkpoint folder, partially frozen or with LoRA adapters."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from models.transformer import export_state, save_model
from pipeline.core.config import ParamsError
from pipeline.training.config import FinetuneSection, ModelSection
from pipeline.training.setup import (
    build_model,
    load_init,
    lr_factor,
    make_optimizer,
    make_scheduler,
)
from tests._transformer_data import tiny_config

V = 40
SMALL = ModelSection(max_seq_len=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def base(tmp_path) -> Path:
    """A saved 2-layer, 16-dim model trained on tokenizer ``tok-hash``."""
    model, _ = build_model(SMALL, FinetuneSection(), V, _gen(5))
    save_model(tmp_path / "base", model, {"tokenizer_hash": "tok-hash"})
    return tmp_path / "base"


# ---------------------------------------------------------------------------------- schedule
def test_lr_schedule():
    kw = {"warmup": 10, "max_steps": 100, "min_ratio": 0.1}
    cos = [lr_factor(s, schedule="cosine", **kw) for s in range(100)]
    assert cos[0] == pytest.approx(0.1) and cos[9] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(cos[9:]))
    assert lr_factor(100, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_factor(55, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(80, schedule="constant", **kw) == 1.0


def test_scheduler_follows_lr_factor_and_saves_plain_state():
    cfg = tiny_config(optim={"schedule": "linear"})
    o = cfg.optim
    opt = make_optimizer(torch.nn.Linear(3, 2), o, "cpu")
    sched = make_scheduler(opt, o, cfg.train.max_steps)
    lrs = []
    for _ in range(cfg.train.max_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    kw = {"warmup": o.warmup_steps, "max_steps": cfg.train.max_steps, "schedule": "linear",
          "min_ratio": o.min_lr / o.lr}
    assert lrs == [o.lr * lr_factor(s, **kw) for s in range(cfg.train.max_steps)]
    assert [g["weight_decay"] for g in opt.param_groups] == [o.weight_decay, 0.0]
    assert not opt.defaults["fused"] and opt.defaults["foreach"] is False  # the plain loop
    assert make_optimizer(torch.nn.Linear(3, 2), o, "cuda").defaults["fused"] is True
    # Checkpoints store this state as JSON: the factor must not add attributes to it.
    assert sched.state_dict()["lr_lambdas"] == [None, None]


@settings(max_examples=200, deadline=None)
@given(warmup=st.integers(0, 20), extra=st.integers(1, 200), step=st.integers(0, 500),
       schedule=st.sampled_from(["cosine", "linear", "constant"]),
       min_ratio=st.floats(0.0, 1.0))
def test_lr_factor_warms_up_linearly_then_stays_between_min_ratio_and_one(
        warmup, extra, step, schedule, min_ratio):
    max_steps = warmup + extra
    f = lr_factor(step, warmup=warmup, max_steps=max_steps, schedule=schedule,
                  min_ratio=min_ratio)
    if step < warmup:
        assert f == pytest.approx((step + 1) / warmup)
    else:
        assert min_ratio - 1e-12 <= f <= 1.0 + 1e-12
        if schedule != "constant" and step >= max_steps:
            assert f == pytest.approx(min_ratio)


def test_weight_decay_on_matrices_only_and_nothing_frozen_to_train():
    model, _ = build_model(SMALL, FinetuneSection(), V, _gen())
    o = tiny_config().optim
    decay, plain = make_optimizer(model, o, "cpu").param_groups
    assert decay["weight_decay"] == o.weight_decay and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert len(decay["params"]) + len(plain["params"]) == len(list(model.parameters()))
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ParamsError, match="every parameter is frozen"):
        make_optimizer(model, o, "cpu")


# ------------------------------------------------------------------------------------- models
def test_a_fresh_model_is_a_function_of_its_generator():
    a, report = build_model(SMALL, FinetuneSection(), V, _gen(3))
    b, _ = build_model(SMALL, FinetuneSection(), V, _gen(3))
    c, _ = build_model(SMALL, FinetuneSection(), V, _gen(4))
    assert report == {"init_from": None, "frozen": [], "lora_layers": []}
    assert _same(export_state(a), export_state(b)) and not _same(export_state(a), export_state(c))
    assert (a.config.vocab_size, a.config.n_layer, a.config.n_embd) == (V, 2, 16)


def test_fine_tuning_starts_from_the_model_frozen_or_adapted(base):
    ft = FinetuneSection(init_from=str(base))
    model, report = build_model(SMALL.model_copy(update={"dropout": 0.2}), ft, V, _gen(),
                                tokenizer_hash="tok-hash")  # dropout may differ: training only
    base_weights = export_state(load_init(base)[0])
    assert _same(export_state(model), base_weights)
    assert report["init_from"] == str(base) and report["init_tokenizer_hash"] == "tok-hash"
    frozen, report = build_model(SMALL, ft.model_copy(update={"freeze": ["wte", "blocks.1."]}),
                                 V, _gen())
    assert "wte.weight" in report["frozen"]
    assert all(n.startswith(("wte", "blocks.1.")) for n in report["frozen"])
    assert {n for n, p in frozen.named_parameters() if not p.requires_grad} == set(
        report["frozen"])
    lora, report = build_model(SMALL, ft.model_copy(update={"lora_rank": 2,
                                                            "lora_targets": ["mlp.fc"]}),
                               V, _gen())
    assert report["lora_layers"] == ["blocks.0.mlp.fc", "blocks.1.mlp.fc"]
    assert all(".lora_" in n for n, p in lora.named_parameters() if p.requires_grad)


def test_a_model_to_fine_tune_of_another_shape_or_tokenizer_is_refused(base):
    ft = FinetuneSection(init_from=str(base))
    with pytest.raises(ParamsError, match="n_embd: 16 there, 32 here"):
        build_model(SMALL.model_copy(update={"n_embd": 32}), ft, V, _gen())
    with pytest.raises(ParamsError, match="vocab_size: 40 there, 41 here"):
        build_model(SMALL, ft, V + 1, _gen())
    with pytest.raises(ParamsError, match="trained on tokenizer tok-hash, this run tokenises "
                                          "with other-hash"):
        build_model(SMALL, ft, V, _gen(), tokenizer_hash="other-hash")
    with pytest.raises(ParamsError, match=r"transformer\.finetune\.freeze = \['nothing\.'\]"):
        build_model(SMALL, ft.model_copy(update={"freeze": ["nothing."]}), V, _gen())


def test_load_init_reads_a_checkpoint_folder_but_not_a_lora_runs(base, tmp_path):
    model, meta = load_init(base)
    folder = tmp_path / "step-00000003"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps(
        {"model_config": model.config.to_dict(), "tokenizer_hash": "tok-hash"}))
    save_file(export_state(model), folder / "model.safetensors")
    again, meta = load_init(folder)
    assert meta == {"tokenizer_hash": "tok-hash"}
    assert _same(export_state(again), export_state(model))
    save_file({**export_state(model), "blocks.0.mlp.fc.lora_A": torch.zeros(2, 16)},
              folder / "model.safetensors")
    with pytest.raises(ParamsError, match="a checkpoint of a LoRA run"):
        load_init(folder)

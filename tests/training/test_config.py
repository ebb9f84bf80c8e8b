"""The ``transformer`` section: validation that names the key, the replicate seeds, and the part of
the configuration that determines the weights (:func:`result_config`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.core.config import ParamsError, parse_section
from pipeline.training.config import (
    LATER_KEYS,
    NON_RESULT_KEYS,
    TransformerStageConfig,
    result_config,
)
from tests._transformer_data import tiny_config


@pytest.mark.parametrize("raw", [
    {"finetune": {"freeze": ["wte"]}},
    {"finetune": {"lora_rank": 4}},
    {"optim": {"warmup_steps": 5000}},
    {"model": {"n_embd": 30, "n_head": 4}},
    {"optim": {"lr": 0.001, "min_lr": 0.01}},
    {"precision": "fp8"},
    {"seed": "042"},
], ids=lambda r: json.dumps(r))
def test_bad_params_fail_fast(raw):
    with pytest.raises(ParamsError, match="transformer"):
        parse_section("transformer", raw, TransformerStageConfig)


def test_params_yaml_section_is_valid():
    from pipeline.core.config import load_section

    cfg = load_section("transformer", Path(__file__).resolve().parents[2] / "params.yaml",
                       TransformerStageConfig)
    assert cfg.model.max_seq_len >= 128


def test_pack_enters_the_run_identity_only_when_on():
    assert "pack" not in result_config(tiny_config(), 1, 1)["data"]
    assert result_config(tiny_config(data={"pack": True}), 1, 1)["data"]["pack"] is True


@pytest.mark.parametrize("value", ["yes", 1, "true"], ids=repr)
def test_bad_activation_checkpointing_is_refused_by_name(value):
    with pytest.raises(ParamsError, match=r"transformer\.activation_checkpointing = "):
        parse_section("transformer", {"activation_checkpointing": value}, TransformerStageConfig)


def test_activation_checkpointing_stays_out_of_the_run_identity():
    """On or off, the weights are the same bit for bit (tests/training/test_resume.py), so a run
    may resume with it toggled: the resume hash never sees it."""
    on = tiny_config(activation_checkpointing=True)
    assert on.activation_checkpointing and not tiny_config().activation_checkpointing
    assert result_config(on, 1, 1) == result_config(tiny_config(), 1, 1)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"], ids=repr)
def test_bad_replicates_is_refused_by_name(value):
    with pytest.raises(ParamsError, match=r"transformer\.replicates = "):
        parse_section("transformer", {"replicates": value}, TransformerStageConfig)


def test_seeds_follow_the_first():
    cfg = tiny_config(seed=1234, replicates=3)
    assert cfg.seeds == [1234, 1235, 1236]
    assert [cfg.replicate(s).seed for s in cfg.seeds] == cfg.seeds
    assert cfg.replicate(1235).model_dump() == {**cfg.model_dump(), "seed": 1235}
    assert TransformerStageConfig().replicates == 12


@pytest.mark.parametrize(("raw", "message"), [
    ({"model": {"n_embd": 30, "n_head": 4}}, "n_embd=30 must be a multiple of n_head=4"),
    ({"optim": {"lr": 0.001, "min_lr": 0.01}}, "min_lr=0.01 must not exceed lr=0.001"),
    ({"optim": {"warmup_steps": 50}, "train": {"max_steps": 50}},
     "optim.warmup_steps=50 must be below train.max_steps=50"),
    ({"finetune": {"init_from": "m", "freeze": ["wte"], "lora_rank": 2}},
     "use either freeze or lora_rank"),
    ({"finetune": {"lora_rank": 2}}, "need finetune.init_from"),
], ids=["heads", "min_lr", "warmup", "freeze_and_lora", "lora_without_init"])
def test_a_refusal_says_what_is_wrong_with_the_values(raw, message):
    with pytest.raises(ParamsError, match="transformer") as err:
        parse_section("transformer", raw, TransformerStageConfig)
    assert message in str(err.value)


def test_a_replicate_is_a_copy_and_the_config_is_frozen():
    cfg = tiny_config(seed=5, replicates=2)
    other = cfg.replicate(6)
    assert (cfg.seed, other.seed, other.replicates) == (5, 6, 2)
    with pytest.raises(ValidationError):
        cfg.seed = 9


def test_result_config_keeps_only_what_changes_the_weights():
    cfg = tiny_config()
    conf = result_config(cfg, torch_threads=3, world_size=2)
    assert (conf["torch_threads"], conf["world_size"]) == (3, 2)
    for key, sub in NON_RESULT_KEYS.items():
        if sub is None:
            assert key not in conf, key
        else:
            assert not set(sub) & set(conf[key]), key
    assert conf["train"]["max_steps"] == 12 and conf["optim"]["lr"] == 0.003
    assert conf["model"] == cfg.model.model_dump(mode="json")
    for key, defaults in LATER_KEYS.items():  # at their defaults, later keys are left out
        assert not set(defaults) & set(conf[key]), key
    assert json.dumps(conf, sort_keys=True) == json.dumps(
        result_config(tiny_config(train={"log_every": 7}, checkpoint={"keep_last": 5}), 3, 2),
        sort_keys=True)

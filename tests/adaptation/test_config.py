"""The ``adaptation`` section: arms refused by name, the arms' order and kinds, and the
``transformer`` config each trained arm trains with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig, arm_config
from pipeline.core.config import ParamsError, parse_section
from tests._transformer_data import tiny_config

ARMS = {"scratch": {"kind": "scratch"}, "full": {"kind": "full", "lr": 0.001},
        "partial": {"kind": "partial", "freeze": ["wte", "wpe", "blocks.0."]},
        "lora": {"kind": "lora", "lora_rank": 2}}


@pytest.fixture
def world() -> dict[str, Any]:
    """The section of a small experiment (no model is trained or read here)."""
    pre = Path("data") / "pretrain"
    cfg = parse_section("adaptation", {"pretrained": str(pre), "seed": 7, "seeds": 3,
                                       "steps": 6, "arms": ARMS}, AdaptationConfig)
    return {"cfg": cfg, "pre": pre}


@pytest.mark.parametrize(("arms", "match"), [
    ({"scratch": {"kind": "scratch"}, "p": {"kind": "partial"}},
     r"adaptation\.arms\.p.*needs freeze"),
    ({"scratch": {"kind": "scratch"}, "l": {"kind": "lora"}}, r"adaptation\.arms\.l.*lora_rank"),
    ({"scratch": {"kind": "scratch"}, "f": {"kind": "full", "lora_rank": 4}},
     r"adaptation\.arms\.f.*lora_rank is for lora arms"),
    ({"full": {"kind": "full"}}, r"adaptation\.arms.*0 scratch arms"),
    ({"scratch": {"kind": "scratch"}, "zero_shot": {"kind": "full"}},
     r"adaptation\.arms.*'zero_shot' is taken"),
    ({"scratch": {"kind": "scratch"}, "x": {"kind": "continued"}},
     r"adaptation\.arms\.x\.kind.*'continued'"),
])
def test_a_bad_arm_fails_fast_naming_the_key(arms, match):
    with pytest.raises(ParamsError, match=match):
        parse_section("adaptation", {"arms": arms}, AdaptationConfig)


def test_every_trained_arm_gets_the_same_budget_and_seeds(world):
    cfg, base = world["cfg"], tiny_config()
    runs = {a: arm_config(base, cfg, a) for a in cfg.arms}
    assert {(c.train.max_steps, c.train.patience, c.replicates, c.seed,
             c.train.micro_batch * c.train.grad_accum * c.model.max_seq_len)
            for c in runs.values()} == {(6, 0, 3, 7, 8 * 32)}
    assert runs["scratch"].finetune.init_from is None
    assert {runs[a].finetune.init_from for a in ("full", "partial", "lora")} == {
        str(world["pre"])}
    assert runs["full"].optim.min_lr == pytest.approx(base.optim.min_lr / 3)  # lr 0.001 of 0.003
    with pytest.raises(ParamsError, match="no trained arm 'zero_shot'"):
        arm_config(base, cfg, ZERO_SHOT)



@pytest.mark.parametrize(("raw", "match"), [
    ({"arms": {"scratch": {"kind": "scratch"}, "p": {"kind": "full", "freeze": ["wte"]}}},
     r"adaptation\.arms\.p.*freeze is for partial arms, not full"),
    ({"arms": {"scratch": {"kind": "scratch"}, "bad-name": {"kind": "full"}}},
     r"arm name 'bad-name': use letters, digits and _"),
    ({"arms": {"a": {"kind": "scratch"}, "b": {"kind": "scratch"}}}, "2 scratch arms"),
    ({"seeds": 2}, r"adaptation\.seeds"),
    ({"steps": 1}, r"adaptation\.steps"),
], ids=["freeze_not_partial", "arm_name", "two_scratch", "seeds", "steps"])
def test_a_bad_section_names_the_key_and_the_fix(raw, match):
    with pytest.raises(ParamsError, match=match):
        parse_section("adaptation", raw, AdaptationConfig)


def test_arms_are_named_in_order_with_zero_shot_first(world):
    cfg = world["cfg"]
    assert cfg.arm_names == [ZERO_SHOT, "scratch", "full", "partial", "lora"]
    assert [cfg.kind_of(n) for n in cfg.arm_names] == [ZERO_SHOT, "scratch", "full", "partial",
                                                       "lora"]
    assert cfg.name_of("lora") == "lora" and cfg.name_of(ZERO_SHOT) == ZERO_SHOT
    only = parse_section("adaptation", {"arms": {"base": {"kind": "scratch"}}}, AdaptationConfig)
    assert only.name_of("scratch") == "base" and only.name_of("full") is None
    with pytest.raises(ParamsError, match="no trained arm 'x'; trained arms: base"):
        only.arm("x")
    default = AdaptationConfig()
    assert default.arm_names[0] == ZERO_SHOT and default.name_of("scratch") == "scratch"


def test_an_arms_config_is_the_pretrainings_with_its_own_start_and_lr(world):
    cfg, base = world["cfg"], tiny_config(optim={"warmup_steps": 10}, train={"max_steps": 50})
    lora = arm_config(base, cfg, "lora")
    assert (lora.finetune.lora_rank, lora.finetune.freeze) == (2, [])
    assert lora.optim.lr == base.optim.lr and lora.optim.min_lr == base.optim.min_lr
    assert lora.optim.warmup_steps == 5  # at most steps - 1
    partial = arm_config(base, cfg, "partial")
    assert partial.finetune.freeze == ["wte", "wpe", "blocks.0."]
    assert partial.finetune.lora_rank == 0
    assert lora.model == base.model and lora.train.max_tokens == 0
    assert base.train.max_steps == 50  # the base config is left as it was

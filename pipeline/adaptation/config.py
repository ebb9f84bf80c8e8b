"""``adaptation`` section of an adaptation experiment's params.yaml (``experiments/adaptation``).

An arm is one way of reaching the target corpus from the pretrained model. ``zero_shot`` (the
pretrained model as it is, trained no further) is always an arm; ``arms`` lists the trained ones:
``scratch`` (random init, target only; required), ``full`` (every weight fine-tuned),
``partial`` (the prefixes in ``freeze`` frozen) or ``lora`` (adapters of ``lora_rank`` only).
Every trained arm is the experiment's ``transformer`` section (the
pretraining architecture and optimiser) with ``steps`` optimiser steps, so each sees the same
number of target tokens, trained with the same ``seeds`` training seeds. Each key is documented
once, in the experiment's params.yaml beside its value; the defaults here equal it (a test checks
it).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import ParamsError, StageConfig, parse_section
from pipeline.training.config import TransformerStageConfig

ArmKind = Literal["scratch", "full", "partial", "lora"]
ZERO_SHOT = "zero_shot"
"""Name (and kind) of the arm that is the pretrained model itself."""


class ArmSpec(StageConfig):
    kind: ArmKind
    freeze: list[str] = Field(default_factory=list)
    lora_rank: int = Field(0, ge=0)
    lr: float | None = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _fits_kind(self) -> ArmSpec:
        if self.kind == "partial" and not self.freeze:
            raise ValueError("a partial arm needs freeze: the parameter-name prefixes it "
                             "freezes, e.g. [wte, wpe, blocks.0.]")
        if self.kind != "partial" and self.freeze:
            raise ValueError(f"freeze is for partial arms, not {self.kind}")
        if self.kind == "lora" and not self.lora_rank:
            raise ValueError("a lora arm needs lora_rank >= 1")
        if self.kind != "lora" and self.lora_rank:
            raise ValueError(f"lora_rank is for lora arms, not {self.kind}")
        return self


def _default_arms() -> dict[str, ArmSpec]:
    return {
        "scratch": ArmSpec(kind="scratch"),
        "full": ArmSpec(kind="full", lr=0.0003),
        "partial": ArmSpec(kind="partial", freeze=["wte", "wpe", "blocks.0.", "blocks.1."],
                           lr=0.0003),
        "lora_r4": ArmSpec(kind="lora", lora_rank=4),
        "lora_r16": ArmSpec(kind="lora", lora_rank=16),
    }


class DecisionSection(StageConfig):
    min_gain: float = Field(0.02, ge=0.0, lt=1.0)
    margin: float = Field(0.02, ge=0.0, lt=1.0)
    forgetting_share: float = Field(0.5, ge=0.0, le=1.0)
    n_boot: int = Field(2000, ge=100)
    ci_level: float = Field(0.95, gt=0.0, lt=1.0)
    seed: int = Field(0, ge=0)


class AdaptationConfig(StageConfig):
    """``adaptation`` section; each key is documented in the experiment's params.yaml."""

    SECTION: ClassVar[str] = "adaptation"

    pretrained: str = "data/pretrain"
    seed: int = Field(1234, ge=0)
    seeds: int = Field(3, ge=3)
    steps: int = Field(600, ge=2)
    arms: dict[str, ArmSpec] = Field(default_factory=_default_arms)
    decision: DecisionSection = Field(default_factory=DecisionSection)

    @field_validator("arms")
    @classmethod
    def _arms_needed(cls, arms: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        n_scratch = sum(a.kind == "scratch" for a in arms.values())
        if n_scratch != 1:
            raise ValueError(f"arms holds {n_scratch} scratch arms; it needs exactly one: the "
                             "gain of pretraining is measured against it")
        if ZERO_SHOT in arms:
            raise ValueError(f"arm name {ZERO_SHOT!r} is taken: the pretrained model itself is "
                             "always that arm; arms lists the trained ones")
        bad = [n for n in arms if not n.replace("_", "").isalnum()]
        if bad:
            raise ValueError(f"arm name {bad[0]!r}: use letters, digits and _ (it names folders)")
        return arms

    @property
    def arm_names(self) -> list[str]:
        """Every arm: ``zero_shot`` first, then the trained arms in params order."""
        return [ZERO_SHOT, *self.arms]

    def kind_of(self, name: str) -> str:
        return ZERO_SHOT if name == ZERO_SHOT else self.arm(name).kind

    def arm(self, name: str) -> ArmSpec:
        """A trained arm's spec; an unknown name is a :class:`ParamsError` listing the arms."""
        if name not in self.arms:
            raise ParamsError(f"adaptation.arms: no trained arm {name!r}; trained arms: "
                              f"{', '.join(self.arms)}")
        return self.arms[name]

    def name_of(self, kind: str) -> str | None:
        """The first arm of ``kind`` (``zero_shot`` for that kind), or None."""
        return next((n for n in self.arm_names if self.kind_of(n) == kind), None)


def arm_config(base: TransformerStageConfig, cfg: AdaptationConfig, name: str
               ) -> TransformerStageConfig:
    """The ``transformer`` config arm ``name`` trains with: ``base`` (the pretraining's) with
    ``cfg.steps`` steps and no early stopping (every arm sees the same target tokens; the best
    val weights are kept), the arm's seeds, its start (``init_from``: the pretrained model,
    except ``scratch``), its frozen prefixes or LoRA rank, and its peak learning rate (``min_lr``
    scaled with it, so the schedule keeps its shape). Validated like the params section."""
    arm = cfg.arm(name)
    d = base.model_dump(mode="json")
    lr = arm.lr if arm.lr is not None else base.optim.lr
    d["seed"], d["replicates"] = cfg.seed, cfg.seeds
    d["optim"].update(lr=lr, min_lr=base.optim.min_lr * lr / base.optim.lr,
                      warmup_steps=min(base.optim.warmup_steps, cfg.steps - 1))
    d["train"].update(max_steps=cfg.steps, patience=0, max_tokens=0)
    d["finetune"].update(init_from=None if arm.kind == "scratch" else cfg.pretrained,
                         freeze=arm.freeze, lora_rank=arm.lora_rank)
    return parse_section("transformer", d, TransformerStageConfig,
                         f"adaptation.arms.{name} over transformer")

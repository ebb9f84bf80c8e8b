"""``transformer`` section of params.yaml: the transformer's architecture, data, optimiser,
training length, checkpoints and fine-tuning, plus the part of it that determines the weights.

Each key is documented once, in params.yaml beside its value; docs/transformer.md explains the
choices. The defaults here equal params.yaml's (a test checks it).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.core.config import StageConfig


class ModelSection(StageConfig):
    max_seq_len: int = Field(256, ge=2, le=65536)
    n_layer: int = Field(4, ge=1, le=128)
    n_head: int = Field(4, ge=1, le=128)
    n_embd: int = Field(128, ge=1, le=16384)
    mlp_ratio: int = Field(4, ge=1, le=16)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attn_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSection:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        return self


class DataSection(StageConfig):
    use_augmented: bool = True
    val_max_windows: int = Field(0, ge=0)
    pack: bool = False


class OptimSection(StageConfig):
    lr: float = Field(0.001, gt=0.0)
    min_lr: float = Field(0.0001, ge=0.0)
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    eps: float = Field(0.00000001, gt=0.0)
    grad_clip: float = Field(1.0, ge=0.0)
    warmup_steps: int = Field(200, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"

    @model_validator(mode="after")
    def _min_below_peak(self) -> OptimSection:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr={self.min_lr} must not exceed lr={self.lr}")
        return self


class TrainSection(StageConfig):
    micro_batch: int = Field(4, ge=1)
    grad_accum: int = Field(1, ge=1)
    max_steps: int = Field(2000, ge=1)
    max_tokens: int = Field(0, ge=0)
    eval_every: int = Field(100, ge=1)
    patience: int = Field(0, ge=0)
    log_every: int = Field(100, ge=1)
    max_minutes: float | None = Field(None, gt=0.0)


class CheckpointSection(StageConfig):
    every: int = Field(200, ge=1)
    keep_last: int = Field(2, ge=1)
    on_mismatch: Literal["refuse", "restart"] = "refuse"


class FinetuneSection(StageConfig):
    init_from: str | None = None
    freeze: list[str] = Field(default_factory=list)
    lora_rank: int = Field(0, ge=0)
    lora_alpha: float = Field(16.0, gt=0.0)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_targets: list[Literal["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]] = Field(
        default_factory=lambda: ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"])

    @model_validator(mode="after")
    def _needs_init(self) -> FinetuneSection:
        if (self.freeze or self.lora_rank) and not self.init_from:
            raise ValueError("freeze / lora_rank need finetune.init_from (a trained model folder)")
        if self.freeze and self.lora_rank:
            raise ValueError("use either freeze or lora_rank (LoRA already freezes the base)")
        return self


class TransformerStageConfig(StageConfig):
    """``transformer`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "transformer"

    seed: int = Field(1234, ge=0)
    replicates: int = Field(12, ge=1)
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    train: TrainSection = Field(default_factory=TrainSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    finetune: FinetuneSection = Field(default_factory=FinetuneSection)

    @property
    def seeds(self) -> list[int]:
        """The training seeds, in training order: ``seed, seed+1, ..., seed+replicates-1``."""
        return [self.seed + k for k in range(self.replicates)]

    def replicate(self, seed: int) -> TransformerStageConfig:
        """This config with ``seed`` as its training seed: one replicate's run."""
        return self.model_copy(update={"seed": seed})

    @model_validator(mode="after")
    def _warmup_fits(self) -> TransformerStageConfig:
        if self.optim.warmup_steps >= self.train.max_steps:
            raise ValueError(f"optim.warmup_steps={self.optim.warmup_steps} must be below "
                             f"train.max_steps={self.train.max_steps}")
        return self


# Keys that never change the trained weights: excluded from the resume hash. ``replicates`` says
# how many seeds the stage trains, not what one seed's run is: the run of seed s is the same run
# (same checkpoints folder, same weights) whatever the number of replicates.
# ``activation_checkpointing`` trades compute for memory only: the recomputed forward draws the
# first forward's dropout masks and leaves the generators where they would be, so on CPU the
# gradients, weights and checkpoints are bit-identical with it on or off
# (tests/models/test_transformer.py, tests/training/test_loop.py), and a run may resume with it
# toggled, e.g. turned on after running out of memory.
NON_RESULT_KEYS = {"compile": None, "activation_checkpointing": None, "checkpoint": None,
                   "replicates": None, "train": {"log_every", "max_minutes"}}


# Keys added after runs were first hashed: they enter the result config only when set to another
# value than this default, so every run that leaves them alone keeps its config_hash (its
# checkpoint folder changes with the training code, pipeline.training.resume.TRAIN_CODE).
LATER_KEYS = {"data": {"pack": False}}


def result_config(cfg: TransformerStageConfig, torch_threads: int, world_size: int) -> dict:
    """The part of the configuration that determines the weights (hashed for resume)."""
    d = cfg.model_dump(mode="json")
    for key, sub in NON_RESULT_KEYS.items():
        if sub is None:
            d.pop(key, None)
        else:
            d[key] = {k: v for k, v in d[key].items() if k not in sub}
    for key, defaults in LATER_KEYS.items():
        d[key] = {k: v for k, v in d[key].items() if not (k in defaults and v == defaults[k])}
    return {**d, "torch_threads": torch_threads, "world_size": world_size}

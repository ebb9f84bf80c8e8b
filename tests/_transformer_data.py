"""Shared pieces of the transformer tests: synthetic token data and a tiny configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.training.synthetic import BOS, EOS, PAD, write_token_data

__all__ = ["BOS", "EOS", "PAD", "TINY_PARAMS", "tiny_config", "write_token_data"]

TINY_PARAMS: dict[str, Any] = {
    "seed": 7, "replicates": 1, "device": "cpu", "precision": "fp32",
    "model": {"max_seq_len": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.1},
    "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
    "train": {"micro_batch": 4, "grad_accum": 2, "max_steps": 12, "eval_every": 4,
              "log_every": 100, "patience": 0},
    "checkpoint": {"every": 3, "keep_last": 2},
}
"""A configuration that trains in well under a second per run on 2 CPU cores (one seed; tests of
several seeds ask for ``replicates``)."""


def tiny_config(**overrides: Any):
    """``TransformerStageConfig`` from :data:`TINY_PARAMS`, with nested ``overrides`` merged."""
    from pipeline.training.config import TransformerStageConfig

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a.get(k, {}), v) if isinstance(v, dict) else v
        return out

    return TransformerStageConfig.model_validate(merge(TINY_PARAMS, overrides))


def run_ckpt_dir(model_dir: Path) -> Path:
    """The one run folder under ``model_dir/checkpoints``
    (``pipeline.training.resume.checkpoint_dir``)."""
    runs = sorted((Path(model_dir) / "checkpoints").glob("run-*"))
    assert len(runs) == 1, runs
    return runs[0]

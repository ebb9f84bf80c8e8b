"""The models of an adaptation experiment's arms, as scoring and sampling load them."""

from __future__ import annotations

from pathlib import Path

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.scoring.loading import ModelSpec, load_transformer, replicate_specs


def arm_specs(cfg: AdaptationConfig, arms_dir: Path) -> list[ModelSpec]:
    """One spec per arm and training seed, arms in :attr:`AdaptationConfig.arm_names` order:
    ``zero_shot`` is ``adaptation.pretrained``, a trained arm its folder under ``arms_dir``."""
    out = []
    for name in cfg.arm_names:
        folder = Path(cfg.pretrained) if name == ZERO_SHOT else Path(arms_dir) / name
        out += replicate_specs(ModelSpec(name, folder, load_transformer))
    return out

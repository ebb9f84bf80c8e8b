"""A trained transformer read back as the class that was trained: :class:`models.transformer.GPT`
for one id stream, :class:`models.compound.CompoundGPT` when ``model.json``'s config lists
``codebook_sizes`` (compound tokens).

The dispatch lives here, above both modules, so that ``models.transformer`` never imports
``models.compound`` (which builds on it). Reading and checking the files is
:func:`models.transformer.load_model`'s; this module only picks the class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.compound import CompoundGPT
from models.transformer import GPT, TransformerConfig, load_model


def model_class(cfg: TransformerConfig) -> type[GPT]:
    """``CompoundGPT`` for a configuration with ``codebook_sizes``, else ``GPT``."""
    return GPT if cfg.codebook_sizes is None else CompoundGPT


def load_trained(model_dir: Path | str, device: str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """:func:`models.transformer.load_model` building the class :func:`model_class` picks:
    ``(model in eval mode, model.json)``."""
    return load_model(Path(model_dir), device, build=model_class)

"""The models of an adaptation experiment's arms, as scoring and sampling load them."""

from __future__ import annotations

from pathlib import Path

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.core.config import ParamsError
from pipeline.inference.loading import ModelSpec, load_transformer, replicate_specs
from pipeline.tokens.contract import TokenInfo


def arm_specs(cfg: AdaptationConfig, arms_dir: Path) -> list[ModelSpec]:
    """One spec per arm and training seed, arms in :attr:`AdaptationConfig.arm_names` order:
    ``zero_shot`` is ``adaptation.pretrained``, a trained arm its folder under ``arms_dir``."""
    out = []
    for name in cfg.arm_names:
        folder = Path(cfg.pretrained) if name == ZERO_SHOT else Path(arms_dir) / name
        out += replicate_specs(ModelSpec(name, folder, load_transformer))
    return out


def same_tokenizer(target_info: Path, source_info: Path) -> TokenInfo:
    """The target's token info, once both corpora's tokens are checked to share one tokenizer;
    otherwise a :class:`ParamsError` naming both hashes and the fix."""
    info, source = TokenInfo.read(target_info), TokenInfo.read(source_info)
    if source.tokenizer_hash != info.tokenizer_hash:
        raise ParamsError(
            f"the target tokens ({Path(target_info).as_posix()}) use tokenizer "
            f"{info.tokenizer_hash}, the source's ({Path(source_info).as_posix()}) "
            f"{source.tokenizer_hash}; tokenise the target with `symkit tokenize --from` "
            "the source's tokenizer.json")
    return info

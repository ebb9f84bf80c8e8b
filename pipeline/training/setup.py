"""Pure set-up decisions for training: device, precision, learning-rate schedule, model
construction (fresh, continued, partially frozen or LoRA) and the optimiser.

Each is a small function of its arguments so it can be tested without the hardware it is about
(the CUDA/bf16 decisions take the availability flags as parameters).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from models.lora import apply_lora, freeze
from models.transformer import GPT, TransformerConfig, load_model
from pipeline.config import ParamsError

if TYPE_CHECKING:
    from pipeline.train_transformer import TransformerStageConfig


@dataclass(frozen=True)
class DistInfo:
    """Process-group coordinates; ``world_size == 1`` means no DDP."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> DistInfo:
        """Read ``torchrun``'s ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (defaults: one process)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                   int(env.get("LOCAL_RANK", 0)))


def resolve_device(pref: str, *, cuda: bool | None = None, mps: bool | None = None,
                   local_rank: int = 0) -> str:
    """``auto`` -> CUDA, else MPS, else CPU. An unavailable explicit choice is a ParamsError."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if mps is None:
        mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if pref == "auto":
        pref = "cuda" if cuda else "mps" if mps else "cpu"
    if pref == "cuda":
        if not cuda:
            raise ParamsError("transformer.device = 'cuda': no CUDA device is available "
                              "(use 'auto' or 'cpu')")
        return f"cuda:{local_rank}"
    if pref == "mps" and not mps:
        raise ParamsError("transformer.device = 'mps': MPS is not available (use 'auto' or 'cpu')")
    return pref


def resolve_precision(precision: str, device_type: str,
                      bf16_supported: bool | None = None) -> tuple[torch.dtype | None, bool, str]:
    """-> (autocast dtype or None for fp32, use a GradScaler, resolved name).

    ``auto``: bf16 on CUDA when supported, else fp16 with a GradScaler on CUDA; fp32 on CPU and
    MPS. bf16 needs no scaler (same exponent range as fp32); fp16 does (gradients underflow).
    """
    if bf16_supported is None:
        bf16_supported = device_type == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "auto":
        if device_type != "cuda":
            return None, False, "fp32"
        precision = "bf16" if bf16_supported else "fp16"
    if precision == "fp32":
        return None, False, "fp32"
    if precision == "bf16":
        if device_type == "mps" or (device_type == "cuda" and not bf16_supported):
            raise ParamsError(f"transformer.precision = 'bf16': not supported on this "
                              f"{device_type} device (use 'auto', 'fp16' or 'fp32')")
        return torch.bfloat16, False, "bf16"
    if device_type != "cuda":
        raise ParamsError(f"transformer.precision = 'fp16': only on CUDA, not {device_type} "
                          "(use 'auto' or 'fp32')")
    return torch.float16, True, "fp16"


def lr_factor(step: int, *, warmup: int, max_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimiser step ``step`` (0-based): linear warm-up over
    ``warmup`` steps, then ``cosine``/``linear`` decay to ``min_ratio`` at ``max_steps`` (or
    ``constant``)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * decay


def build_model(cfg: TransformerStageConfig, vocab_size: int,
                generator: torch.Generator) -> tuple[GPT, dict[str, Any]]:
    """Fresh model from ``cfg.model``, or the ``finetune.init_from`` model with frozen layers or
    LoRA adapters. Returns the model and a report (``init_from``, frozen names, LoRA layers)."""
    m = cfg.model
    arch = TransformerConfig(vocab_size=vocab_size, max_seq_len=m.max_seq_len, n_layer=m.n_layer,
                             n_head=m.n_head, n_embd=m.n_embd, mlp_ratio=m.mlp_ratio,
                             dropout=m.dropout, attn_dropout=m.attn_dropout, bias=m.bias)
    ft = cfg.finetune
    report: dict[str, Any] = {"init_from": ft.init_from, "frozen": [], "lora_layers": []}
    if not ft.init_from:
        return GPT(arch, generator), report
    base, meta = load_init(Path(ft.init_from))
    training_only = {"dropout", "attn_dropout"}
    ours = {k: v for k, v in arch.to_dict().items() if k not in training_only}
    theirs = {k: v for k, v in base.config.to_dict().items() if k not in training_only}
    if ours != theirs:
        diff = sorted(k for k in ours if ours[k] != theirs.get(k))
        raise ParamsError(
            "transformer.finetune.init_from = " + repr(ft.init_from) + ": its architecture differs "
            "from transformer.model (and the token vocabulary): "
            + ", ".join(f"{k}: {theirs.get(k)!r} there, {ours[k]!r} here" for k in diff))
    model = GPT(arch, generator)  # same shapes; dropout from params
    model.load_state_dict(base.state_dict())
    report["init_tokenizer_hash"] = meta.get("tokenizer_hash")
    if ft.freeze:
        try:
            report["frozen"] = freeze(model, ft.freeze)
        except ValueError as e:
            raise ParamsError(f"transformer.finetune.freeze = {ft.freeze!r}: {e}") from None
    if ft.lora_rank:
        report["lora_layers"] = apply_lora(model, ft.lora_rank, ft.lora_alpha, ft.lora_targets,
                                           ft.lora_dropout, generator)
    return model, report


def load_init(path: Path) -> tuple[GPT, dict[str, Any]]:
    """The model to fine-tune: a model folder (``model.json`` + ``model.safetensors``, e.g. a
    copy of ``data/transformer/``) or a checkpoint folder (``state.json`` + ``model.safetensors``,
    e.g. ``data/transformer/checkpoints/step-00000300``) of a run without LoRA."""
    if (path / "model.json").exists() or not (path / "state.json").exists():
        return load_model(path)
    import json

    from safetensors.torch import load_file

    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    weights = load_file(str(path / "model.safetensors"))
    if any(".lora_" in k for k in weights):
        raise ParamsError(f"transformer.finetune.init_from = {str(path)!r}: a checkpoint of a LoRA "
                          "run; use that run's merged model folder instead")
    model = GPT(TransformerConfig.from_dict(state["model_config"]),
                torch.Generator().manual_seed(0))
    model.load_state_dict(weights)
    return model, {"tokenizer_hash": state.get("tokenizer_hash")}


def make_optimizer(model: nn.Module, cfg: TransformerStageConfig,
                   device_type: str) -> torch.optim.AdamW:
    """AdamW over trainable parameters; weight decay on 2-D weights only (matrices and
    embeddings), none on biases and LayerNorm gains."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ParamsError("transformer.finetune: every parameter is frozen; nothing to train")
    o = cfg.optim
    groups = [
        {"params": [p for _, p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # foreach kernels only pay off on CUDA; the plain loop keeps CPU results simple to reason about.
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                             foreach=device_type == "cuda")

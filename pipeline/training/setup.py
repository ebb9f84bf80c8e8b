"""What is trained and how: model construction (fresh, continued, partially frozen or LoRA), the
optimiser and the learning-rate schedule.

Each function takes only its own config section (``transformer.model``, ``.finetune``, ``.optim``)
and is a small function of its arguments. Where the model runs is ``pipeline.training.device``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.loading import load_trained, model_class
from models.lora import apply_lora, freeze
from models.transformer import GPT, TransformerConfig
from pipeline.core.artifacts import read_json
from pipeline.core.config import ParamsError
from pipeline.training.config import FinetuneSection, ModelSection, OptimSection


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


def make_scheduler(opt: torch.optim.Optimizer, o: OptimSection,
                   max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The lr schedule: step ``s`` trains at ``o.lr * lr_factor(s, ...)``.

    Creating it sets step 0's lr; each ``step()`` sets the next step's. It is a LambdaLR rather
    than a bare function because its state is part of every checkpoint. The factor must be a
    plain function (not a ``partial``): LambdaLR saves the attributes of any other callable.
    """
    def factor(step: int) -> float:
        return lr_factor(step, warmup=o.warmup_steps, max_steps=max_steps, schedule=o.schedule,
                         min_ratio=o.min_lr / o.lr)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def build_model(m: ModelSection, ft: FinetuneSection, vocab_size: int,
                generator: torch.Generator, tokenizer_hash: str | None = None,
                cond_slot_sizes: tuple[int, ...] = (),
                codebook_sizes: tuple[int, ...] | None = None) -> tuple[GPT, dict[str, Any]]:
    """Fresh model from ``transformer.model``, or the ``finetune.init_from`` model with frozen
    layers or LoRA adapters. Returns the model and a report (``init_from``, frozen names, LoRA
    layers). Initial weights come from ``generator``.

    ``tokenizer_hash``: the current tokenizer's (``data/tokens/info.json``). An ``init_from``
    model must have been trained on that very tokenizer: a vocabulary of the same size with
    other BPE merges gives every id another meaning, and would load without a shape error. A
    model that records another hash, or none, is refused naming both.

    ``cond_slot_sizes``: the condition slots of a conditioned run (docs/conditioning.md). An
    ``init_from`` model without conditions gets a fresh condition embedding (an unconditioned
    model learns to follow conditions); one with conditions must have these very slots.

    ``codebook_sizes``: compound tokens (CPWord, Octuple) give a
    :class:`models.compound.CompoundGPT` with one embedding and head per codebook; fine-tuning
    one (``finetune.init_from``) is not supported yet and is refused."""
    arch = TransformerConfig(vocab_size=vocab_size, max_seq_len=m.max_seq_len, n_layer=m.n_layer,
                             n_head=m.n_head, n_embd=m.n_embd, mlp_ratio=m.mlp_ratio,
                             dropout=m.dropout, attn_dropout=m.attn_dropout, bias=m.bias,
                             cond_slot_sizes=cond_slot_sizes, codebook_sizes=codebook_sizes)
    report: dict[str, Any] = {"init_from": ft.init_from, "frozen": [], "lora_layers": []}
    if not ft.init_from:
        return model_class(arch)(arch, generator), report
    if codebook_sizes is not None:
        raise ParamsError(f"transformer.finetune.init_from = {ft.init_from!r}: fine-tuning a "
                          "model of compound tokens (CPWord, Octuple) is not supported yet; set "
                          "init_from: null to train one from scratch")
    base, meta = load_init(Path(ft.init_from))
    training_only = {"dropout", "attn_dropout"}
    if not base.config.cond_slot_sizes:
        training_only.add("cond_slot_sizes")  # conditions added on top of an unconditioned model
    ours = {k: v for k, v in arch.to_dict().items() if k not in training_only}
    theirs = {k: v for k, v in base.config.to_dict().items() if k not in training_only}
    if ours != theirs:
        diff = sorted(k for k in ours if ours[k] != theirs.get(k))
        raise ParamsError(
            "transformer.finetune.init_from = " + repr(ft.init_from) + ": its architecture differs "
            "from transformer.model (and the token vocabulary): "
            + ", ".join(f"{k}: {theirs.get(k)!r} there, {ours[k]!r} here" for k in diff))
    theirs_tok = meta.get("tokenizer_hash")
    if tokenizer_hash is not None and theirs_tok != tokenizer_hash:
        raise ParamsError(
            "transformer.finetune.init_from = " + repr(ft.init_from) + ": "
            + (f"it was trained on tokenizer {theirs_tok}, this run tokenises with "
               if theirs_tok else "it records no tokenizer hash, this run tokenises with ")
            + f"{tokenizer_hash}; its token ids would mean other tokens here. Tokenise this "
            "run with the model's own tokenizer (the same data/tokenizer.json), or train from "
            "scratch")
    model = GPT(arch, generator)  # same shapes; dropout from params
    missing, _ = model.load_state_dict(base.state_dict(), strict=not cond_slot_sizes)
    if [k for k in missing if not k.startswith("wce.")]:
        raise ParamsError(f"transformer.finetune.init_from = {ft.init_from!r}: its weights lack "
                          f"{sorted(missing)}")
    report["init_tokenizer_hash"] = theirs_tok
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
        return load_trained(path)
    from safetensors.torch import load_file

    state = read_json(path / "state.json")
    weights = load_file(str(path / "model.safetensors"))
    if any(".lora_" in k for k in weights):
        raise ParamsError(f"transformer.finetune.init_from = {str(path)!r}: a checkpoint of a LoRA "
                          "run; use that run's merged model folder instead")
    model = GPT(TransformerConfig.from_dict(state["model_config"]),
                torch.Generator().manual_seed(0))
    model.load_state_dict(weights)
    return model, {"tokenizer_hash": state.get("tokenizer_hash")}


def make_optimizer(model: nn.Module, o: OptimSection, device_type: str) -> torch.optim.AdamW:
    """AdamW over trainable parameters; weight decay on 2-D weights only (matrices and
    embeddings), none on biases and LayerNorm gains. Its lr is the peak; the schedule scales it."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ParamsError("transformer.finetune: every parameter is frozen; nothing to train")
    groups = [
        {"params": [p for _, p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # On CUDA the fused kernel, one launch for all parameters, is PyTorch's fastest AdamW (its
    # docs rank fused > foreach > for-loop); on CPU the plain loop keeps results simple.
    cuda = device_type == "cuda"
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                             fused=cuda or None, foreach=False if not cuda else None)

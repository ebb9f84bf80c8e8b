"""Low-rank adapters (LoRA, Hu et al. 2021) for the linear layers of ``models.transformer.GPT``.

Why hand-written: the standard library for this, ``peft``, depends on ``transformers`` (a large
install the project otherwise does not need) and expects Hugging Face model classes. LoRA itself
is a few lines: a frozen linear map ``W`` plus a trainable low-rank update,

    y = x Wᵀ + b + (α / r) · dropout(x) Aᵀ Bᵀ,     A: (r, in), B: (out, r)

with ``A`` drawn from a seeded generator (Kaiming-uniform, as in the paper's reference code) and
``B = 0``, so a freshly wrapped model computes exactly what the base model computes. After
training, :func:`merge_lora` folds ``(α / r) · B A`` into ``W`` and returns plain ``nn.Linear``
layers, so the saved model is an ordinary ``GPT`` and the scorer needs no LoRA code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

LORA_TARGETS = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
"""Names (suffixes) of the linear layers that can carry adapters."""


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``rank`` update scaled by ``alpha / rank``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like))
        bound = 1.0 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)) bound
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound, generator=generator)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.drop(x), self.lora_A), self.lora_B)  # (..., out)
        return self.base(x) + self.scaling * update

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing the same function (without dropout)."""
        out = copy.deepcopy(self.base)  # a copy, not nn.Linear(): no draw from the global RNG
        out.weight.add_(self.scaling * (self.lora_B @ self.lora_A))
        for p in out.parameters():
            p.requires_grad_(True)
        return out


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: Iterable[str] = LORA_TARGETS,
               dropout: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
    """Freeze every parameter of ``model``, then wrap each ``nn.Linear`` whose name ends with one
    of ``targets`` in a :class:`LoRALinear` (trainable ``lora_A``/``lora_B`` only).

    Layers are wrapped in sorted name order, so ``generator`` draws are reproducible. Returns the
    wrapped layer names.
    """
    targets = tuple(targets)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}; allowed: {list(LORA_TARGETS)}")
    for p in model.parameters():
        p.requires_grad_(False)
    names = sorted(n for n, m in model.named_modules()
                   if isinstance(m, nn.Linear) and n.endswith(targets))
    for n in names:
        _replace(model, n, LoRALinear(model.get_submodule(n), rank, alpha, dropout, generator))
    return names


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` in ``model`` (in place) by its merged ``nn.Linear``."""
    names = sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear))
    for n in names:
        _replace(model, n, model.get_submodule(n).merged())
    return model


def freeze(model: nn.Module, prefixes: Iterable[str]) -> list[str]:
    """Set ``requires_grad=False`` on parameters whose name starts with any of ``prefixes``
    (e.g. ``"wte"``, ``"wpe"``, ``"blocks.0."``). Returns the frozen names; an unmatched prefix
    is an error so a typo cannot silently train everything."""
    prefixes = tuple(prefixes)
    frozen = []
    hit = dict.fromkeys(prefixes, False)
    for name, p in model.named_parameters():
        for pre in prefixes:
            if name.startswith(pre):
                p.requires_grad_(False)
                frozen.append(name)
                hit[pre] = True
    missing = [p for p, ok in hit.items() if not ok]
    if missing:
        raise ValueError(f"freeze prefixes {missing} match no parameter")
    return frozen


def param_counts(model: nn.Module) -> dict[str, int]:
    """``{"total", "trainable", "frozen"}`` parameter counts (tied tensors counted once)."""
    seen: set[int] = set()
    trainable = frozen = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return {"total": trainable + frozen, "trainable": trainable, "frozen": frozen}

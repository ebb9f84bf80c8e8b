"""A small decoder-only transformer (nanoGPT-shaped, typed): the model, its loss, its weights.

``GPT(config)`` is a pre-LN decoder: learned token and position embeddings, ``n_layer`` blocks of
causal self-attention (``F.scaled_dot_product_attention``) and an MLP, a final LayerNorm, and an
output projection tied to the token embedding. ``forward(idx, targets, loss_mask)`` returns
``(logits, loss)``; the loss is the mean cross-entropy over *valid* target positions only
(targets equal to ``IGNORE_INDEX`` or where ``loss_mask`` is false never count), so padding can
never change it.

Conditions (``cond_slot_sizes``, docs/conditioning.md): a conditioned model also takes, per
sequence, one condition id per slot, ``cond`` (B, K). Their embeddings (``wce``, zero at
initialisation) are summed and added to the input of the window's first position, which every
later position attends to (added to every position, the vector outgrew the token embeddings
under AdamW and slowed training; docs/conditioning.md). A condition is an input only: it is never
a target, never in the logits and never in the loss or the NLL. Slot ``k`` owns ids
``offset_k .. offset_k + size_k - 1``, the first meaning "no condition"; ``cond=None`` gives every
slot its "none" id (the unconditioned model that condition dropout trains).

Activation checkpointing (``GPT.activation_checkpointing``, set by training from
``transformer.activation_checkpointing``): when on, a training forward keeps only each block's
input and recomputes the block's activations during the backward pass
(``torch.utils.checkpoint``, non-reentrant). Dropout draws from torch's default generators, whose
state the checkpoint stashes and restores for the recomputation, so the recomputed forward draws
the masks of the first one and the generators end where they would have: on CPU the gradients
and the whole run are bit-identical with it on or off (tests/models/test_transformer.py). It is
a training switch, not architecture: never in ``model.json``, and inactive in eval mode and
under ``torch.no_grad`` (scoring, generation).

Compound tokens (``codebook_sizes``): a CPWord or Octuple step is one id per codebook. The model
of such steps, :class:`models.compound.CompoundGPT`, is this GPT with one embedding table and one
tied output head per codebook; it shares everything else here (blocks, positions, conditions,
initialisation) through :meth:`GPT.token_embedding` and :meth:`GPT.hidden_states`. ``GPT`` itself
refuses a compound configuration.

``save_model``/``load_model`` write and read ``model.safetensors`` (weights) and ``model.json``
(architecture, vocabulary ids); nothing is unpickled. The scorer that makes a trained model a
``models.base.SequenceModel`` is :mod:`pipeline.inference.scorer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from models.base import IGNORE_INDEX
from pipeline.core.artifacts import read_json, write_bytes, write_json

MODEL_FORMAT = "symkit-transformer-v1"


@dataclass(frozen=True)
class TransformerConfig:
    """Architecture. Parameter count ≈ 12·n_layer·n_embd² + (vocab_size + max_seq_len)·n_embd."""

    vocab_size: int
    max_seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0  # embeddings and residual branches
    attn_dropout: float = 0.0  # attention probabilities; > 0 forces the slow math kernel on CPU
    bias: bool = True
    cond_slot_sizes: tuple[int, ...] = ()  # ids per condition slot, its "none" id included
    # None: one id stream. Otherwise the size of each codebook of a compound step (CPWord,
    # Octuple), in the tokenizer's order; vocab_size is then their sum (info.json's vocab_size).
    codebook_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cond_slot_sizes", tuple(int(n) for n in self.cond_slot_sizes))
        if any(n < 2 for n in self.cond_slot_sizes):
            raise ValueError(f"cond_slot_sizes={list(self.cond_slot_sizes)}: every slot needs its "
                             "'none' id and at least one label")
        if self.codebook_sizes is not None:
            sizes = tuple(int(n) for n in self.codebook_sizes)
            object.__setattr__(self, "codebook_sizes", sizes)
            if not sizes or any(n < 1 for n in sizes):
                raise ValueError(f"codebook_sizes={list(sizes)}: give one size >= 1 per codebook "
                                 "(None for a single id stream)")
            if self.vocab_size != sum(sizes):
                raise ValueError(f"vocab_size={self.vocab_size} must equal the sum of "
                                 f"codebook_sizes {list(sizes)} ({sum(sizes)})")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        for name in ("vocab_size", "max_seq_len", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")

    @property
    def cond_offsets(self) -> tuple[int, ...]:
        """First id of each condition slot, which is also its "none" id."""
        return tuple(sum(self.cond_slot_sizes[:k]) for k in range(len(self.cond_slot_sizes)))

    def to_dict(self) -> dict[str, Any]:
        """The architecture as plain data; ``cond_slot_sizes`` only when the model has conditions
        and ``codebook_sizes`` only for compound tokens (a single-stream, unconditioned model's
        ``model.json`` is what it was before either existed)."""
        d = asdict(self)
        for key in ("cond_slot_sizes", "codebook_sizes"):
            if d[key]:
                d[key] = list(d[key])
            else:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig keys {unknown}; known: {sorted(known)}")
        return cls(**d)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.attn_dropout = cfg.attn_dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``attn_mask`` (B, 1, T, T) bool, True where a query may attend to a key; None is the
        plain causal mask."""
        B, T, C = x.shape  # (B, T, C)
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
            dropout_p=self.attn_dropout if self.training else 0.0,
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only language model over token ids ``0..vocab_size-1``."""

    def __init__(self, cfg: TransformerConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.wte = self.token_embedding(cfg)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        # Registered last, so an unconditioned model draws exactly the initial weights it did
        # before conditions existed.
        self.wce: nn.Embedding | None = None
        if cfg.cond_slot_sizes:
            self.wce = nn.Embedding(sum(cfg.cond_slot_sizes), cfg.n_embd)
            self.register_buffer("cond_none", torch.tensor(cfg.cond_offsets, dtype=torch.long),
                                 persistent=False)
        self.reset_parameters(generator)
        # Training switch (module docstring): recompute each block in backward instead of
        # keeping its activations. Less memory, about one more forward pass of compute.
        self.activation_checkpointing = False

    def token_embedding(self, cfg: TransformerConfig) -> nn.Module:
        """One table of ``vocab_size`` rows (its weight is also the output head). A compound
        configuration is refused: its model is :class:`models.compound.CompoundGPT`."""
        if cfg.codebook_sizes is not None:
            raise ValueError(f"codebook_sizes={list(cfg.codebook_sizes)}: compound tokens are "
                             "modelled by models.compound.CompoundGPT, not GPT")
        return nn.Embedding(cfg.vocab_size, cfg.n_embd)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 init from an explicit generator (never the global RNG): N(0, 0.02), residual
        projections scaled by 1/sqrt(2·n_layer), biases zero, LayerNorm weight one."""
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.config.n_layer),
                                generator=generator)
            else:
                nn.init.normal_(p, 0.0, std, generator=generator)
        if self.wce is not None:
            # Zero: a conditioned model starts as the unconditioned one (every condition adds
            # nothing) and training moves each label's row from there. Drawn like the token
            # embedding, the summed rows are as large as a token's and slowed training by
            # about 250 steps on the chorales (val loss 4.65 against 4.22 at step 700).
            self.wce.weight.zero_()

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        reduction: str = "mean",
        segments: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx`` (B, T) ids -> logits (B, T, V) and, given ``targets`` (B, T), the loss.

        ``reduction="mean"`` averages over valid positions; ``"sum"`` returns their sum (used
        to weight micro-batches by token count); ``"none"`` returns (B, T) with zeros at invalid
        positions.

        ``segments`` (B, T) ints packs several pieces into a row: each maximal run of equal
        values is one piece, which attends only to earlier positions of itself (block-diagonal
        causal mask) and whose positions count from 0, so its logits are those of the piece alone.

        ``cond`` (B, K) condition ids of each row (conditioned models only; None = "none" in
        every slot). A condition is added to the inputs, never predicted.
        """
        x = self.hidden_states(self.wte(idx), segments, cond)  # (B, T, C)
        logits = F.linear(x, self.wte.weight)  # tied output projection: (B, T, V)
        if targets is None:
            return logits, None
        return logits, masked_cross_entropy(logits, targets, loss_mask, reduction)

    def hidden_states(
        self,
        tok_emb: torch.Tensor,
        segments: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token embeddings (B, T, C) -> the final hidden states (B, T, C), before the output
        heads: positions and conditions added, dropout, the blocks, the final LayerNorm.
        ``segments`` and ``cond`` as in :meth:`forward`."""
        B, T = tok_emb.shape[:2]
        if self.config.max_seq_len < T:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        pos = torch.arange(T, device=tok_emb.device)  # (T,)
        mask = None
        if segments is not None:
            pos, mask = segment_positions_and_mask(segments)  # (B, T), (B, 1, T, T)
        x = tok_emb + self.wpe(pos)  # (B, T, C)
        if self.wce is not None:  # on the window's first position: later ones attend to it
            c = self.condition_embedding(cond, B)  # (B, C)
            x = torch.cat([x[:, :1] + c[:, None, :], x[:, 1:]], dim=1)
        elif cond is not None and cond.numel():
            raise ValueError("this model was trained without conditions; pass cond=None")
        x = self.drop(x)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            # checkpoint keeps x only; the block runs again in backward, same dropout masks
            x = (checkpoint(block, x, mask, use_reentrant=False) if recompute
                 else block(x, mask))  # (B, T, C)
        return self.ln_f(x)

    def condition_embedding(self, cond: torch.Tensor | None, batch: int) -> torch.Tensor:
        """(B, K) condition ids (None: every slot's "none") -> (B, C), the sum over slots."""
        assert self.wce is not None
        if cond is None:
            cond = self.cond_none.expand(batch, -1)
        K = len(self.config.cond_slot_sizes)
        if cond.shape != (batch, K):
            raise ValueError(f"cond has shape {tuple(cond.shape)}, expected ({batch}, {K})")
        lo = self.cond_none  # (K,)
        hi = lo + torch.tensor(self.config.cond_slot_sizes, device=lo.device)
        if ((cond < lo) | (cond >= hi)).any():
            raise ValueError("condition ids outside their slots "
                             f"(slot sizes {list(self.config.cond_slot_sizes)})")
        return self.wce(cond).sum(dim=1)  # (B, K, C) -> (B, C)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def segment_positions_and_mask(segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) segment ids -> position of each token in its run of equal ids (B, T), and the
    attention mask (B, 1, T, T), True where query t may see key s: s <= t in the same run."""
    t = torch.arange(segments.shape[1], device=segments.device)
    new = torch.ones_like(segments, dtype=torch.bool)
    new[:, 1:] = segments[:, 1:] != segments[:, :-1]  # a run starts here
    run_start = torch.where(new, t, 0).cummax(dim=1).values  # (B, T)
    causal = t[None, :] <= t[:, None]  # (T, T): key s <= query t
    same = run_start[:, :, None] == run_start[:, None, :]  # (B, T, T): same run
    return t - run_start, (same & causal)[:, None]


def masked_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy in fp32 over positions with ``targets != IGNORE_INDEX`` (and ``loss_mask``)."""
    valid = targets != IGNORE_INDEX  # (B, T)
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    safe_targets = torch.where(valid, targets, torch.zeros_like(targets))
    nll = F.cross_entropy(logits.float().flatten(0, 1), safe_targets.flatten(), reduction="none")
    nll = nll.view_as(targets) * valid  # (B, T), zero where invalid
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    return nll.sum() / valid.sum().clamp(min=1)


# --------------------------------------------------------------------------------------- weights
def export_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU fp32 copies of every tensor in ``model.state_dict()`` (sorted keys)."""
    sd = model.state_dict()
    return {k: sd[k].detach().to("cpu").contiguous().clone() for k in sorted(sd)}


def save_model(model_dir: Path, model: GPT, meta: dict[str, Any]) -> None:
    """Write ``model.safetensors`` + ``model.json`` (architecture, vocab ids, hashes, ``meta``)."""
    from safetensors.torch import save

    model_dir = Path(model_dir)
    write_bytes(model_dir / "model.safetensors", save(export_state(model)))
    write_json(model_dir / "model.json",
               {"format": MODEL_FORMAT, "config": model.config.to_dict(), **meta})


def load_model(model_dir: Path, device: str = "cpu",
               build: Callable[[TransformerConfig], type[GPT]] | None = None
               ) -> tuple[GPT, dict[str, Any]]:
    """Read a model written by :func:`save_model`; returns ``(model in eval mode, model.json)``.
    ``build`` picks the class from the config (default ``GPT``, which refuses a compound one);
    :func:`models.loading.load_trained` passes the one that knows compound models."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    meta_path, weights_path = model_dir / "model.json", model_dir / "model.safetensors"
    for p in (meta_path, weights_path):
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing (run `symkit train-transformer` first)")
    meta = read_json(meta_path)
    if meta.get("format") != MODEL_FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {MODEL_FORMAT!r}")
    # A private generator for the throw-away init: loading never touches the caller's global RNG.
    cfg = TransformerConfig.from_dict(meta["config"])
    model = (build or (lambda _: GPT))(cfg)(cfg, torch.Generator().manual_seed(0))
    model.load_state_dict(load_file(str(weights_path)), strict=True)
    return model.to(device).eval(), meta

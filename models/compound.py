"""The transformer over compound tokens (CPWord, Octuple): one step is one id per codebook.

A compound tokenizer writes each step as ``K`` ids, one from each of its vocabularies (a
*codebook*: CPWord's Family, Position/Bar, Pitch, Velocity, Duration, TimeSig; Octuple's Pitch,
Position, Bar, ...; docs/tokenization.md). :class:`CompoundGPT` is :class:`models.transformer.GPT`
with two changes, as MusicGen models its parallel audio codebooks:

- **Input: one embedding table per codebook, summed.** Step ``t`` enters the residual stream as
  ``sum_k E_k[x_t,k] + P[t]``. Summing costs exactly the parameters of one table over the whole
  vocabulary (``sum_k size_k`` rows, the single-stream model's ``vocab_size``), needs no extra
  projection, and keeps each codebook's contribution additive, so one codebook's rows can be read
  and tied to its output head alone. The alternative, CP Transformer's (Hsiao et al., 2021),
  concatenates per-codebook embeddings (of their own widths) and projects them to the model's
  width: more parameters, one more matrix, and each head no longer mirrors its input table.
- **Output: one head per codebook**, each tied to its codebook's embedding as the single-stream
  head is: (B, T, size_k) logits per codebook, all read from the same hidden state. Given the
  hidden state at ``t`` the heads are independent, so a step's joint log-probability is the sum
  of its codebooks' log-probabilities.

Positions, blocks, conditions, packing, activation checkpointing and initialisation are GPT's
own (:meth:`GPT.hidden_states`); nothing of the block code is copied.

The loss (:func:`codebook_cross_entropy`) is MusicGen's: the cross-entropy of each codebook over
its scored targets, then the plain mean over codebooks. A target is *not scored* when it is
``IGNORE_INDEX`` (padding, as for the single-stream loss), when ``loss_mask`` hides its step, or
when it is one of its codebook's ``mask_ids``. The last is for CPWord, whose steps leave some
codebooks empty: a Position step has no Pitch, a Note step no Position, and miditok writes the
codebook's ``Ignore_None`` token there (id 4 in every vocabulary but the first, where 4 is
``Family_Metric``: mask ids are per codebook). Those tokens carry no information of their own,
since which codebooks are empty follows from the values of the others (the family, and for
TimeSig whether the step is a Bar or a Position), so they are masked, never predicted: each head
learns its codebook's value given that the step has one. For the same reason a masked target
adds 0 to a sequence's NLL (:func:`sequence_nll`): the joint NLL of a step sums the codebooks
that carry a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.base import IGNORE_INDEX
from models.transformer import GPT, TransformerConfig


class CompoundGPT(GPT):
    """Decoder over compound steps: ``idx`` (B, T, K) ids, one per codebook, each in
    ``0..codebook_sizes[k]-1``; logits are a list of K tensors (B, T, size_k)."""

    wte: nn.ModuleList  # one nn.Embedding per codebook

    def token_embedding(self, cfg: TransformerConfig) -> nn.Module:
        """One table per codebook (their rows add up to ``vocab_size``), each also its head."""
        if cfg.codebook_sizes is None:
            raise ValueError("codebook_sizes is None: a single id stream is modelled by "
                             "models.transformer.GPT, not CompoundGPT")
        return nn.ModuleList(nn.Embedding(n, cfg.n_embd) for n in cfg.codebook_sizes)

    @property
    def n_codebooks(self) -> int:
        return len(self.wte)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        mask_ids: Sequence[Sequence[int]] = (),
    ) -> tuple[list[torch.Tensor], CodebookLoss | None]:
        """``idx`` (B, T, K) -> K logits (B, T, size_k) and, given ``targets`` (B, T, K), the
        loss of :func:`codebook_cross_entropy` (``loss_mask`` (B, T) and ``mask_ids`` as there).
        ``segments`` and ``cond`` as in :meth:`GPT.forward`."""
        K = self.n_codebooks
        if idx.dim() != 3 or idx.shape[2] != K:
            raise ValueError(f"idx has shape {tuple(idx.shape)}, expected (batch, time, {K})")
        tok = self.wte[0](idx[..., 0])  # (B, T, C)
        for k in range(1, K):  # summed in codebook order, so the sum is the same every run
            tok = tok + self.wte[k](idx[..., k])
        x = self.hidden_states(tok, segments, cond)  # (B, T, C)
        logits = [F.linear(x, emb.weight) for emb in self.wte]  # tied heads: K × (B, T, size_k)
        if targets is None:
            return logits, None
        return logits, codebook_cross_entropy(logits, targets, mask_ids, loss_mask)


@dataclass(frozen=True)
class CodebookLoss:
    """Per-codebook summed NLL and target counts of a batch, and the mean MusicGen trains on.

    ``sums`` (K,) fp32 nats, differentiable; ``counts`` (K,) scored targets. Keeping sums and
    counts (not only the means) lets a training step add micro-batches up and divide by the whole
    step's count per codebook, as the single-stream loop divides by its count of targets.
    """

    sums: torch.Tensor
    counts: torch.Tensor

    @property
    def scored(self) -> torch.Tensor:
        """(K,) bool: the codebook has at least one scored target in the batch."""
        return self.counts > 0

    @property
    def per_codebook(self) -> torch.Tensor:
        """(K,) mean cross-entropy of each codebook over its scored targets; 0 where it has none
        (check :attr:`scored` before logging it)."""
        return self.sums / self.counts.clamp(min=1)

    @property
    def mean(self) -> torch.Tensor:
        """The training loss: the plain mean of :attr:`per_codebook` over the codebooks that have
        a scored target (a codebook with none is left out of the average, not counted as 0);
        0 when no codebook has any."""
        return self.per_codebook.sum() / self.scored.sum().clamp(min=1)


def codebook_nll(
    logits: Sequence[torch.Tensor],
    targets: torch.Tensor,
    mask_ids: Sequence[Sequence[int]] = (),
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL in nats (fp32) of every target, and which targets are scored: both (B, T, K).

    ``logits``: K tensors (B, T, size_k). ``targets`` (B, T, K). A target is scored unless it is
    ``IGNORE_INDEX``, its step is False in ``loss_mask`` (B, T), or it is in ``mask_ids[k]`` (the
    ids of codebook ``k`` never predicted, e.g. CPWord's ``Ignore_None`` and PAD; ``()`` masks
    none in any codebook). Unscored targets have NLL 0.
    """
    K = len(logits)
    if targets.dim() != 3 or targets.shape[2] != K:
        raise ValueError(f"targets have shape {tuple(targets.shape)}, expected (batch, time, {K})")
    if mask_ids and len(mask_ids) != K:
        raise ValueError(f"mask_ids has {len(mask_ids)} entries, expected one per codebook ({K})")
    nll, valid = [], []
    for k, lg in enumerate(logits):
        t = targets[..., k]  # (B, T)
        if lg.shape[:2] != t.shape:
            raise ValueError(f"logits of codebook {k} have shape {tuple(lg.shape)}, "
                             f"targets {tuple(t.shape)}")
        ok = t != IGNORE_INDEX
        if mask_ids and len(mask_ids[k]):
            ok = ok & ~torch.isin(t, torch.as_tensor(list(mask_ids[k]), device=t.device))
        if loss_mask is not None:
            ok = ok & loss_mask.bool()
        safe = torch.where(ok, t, torch.zeros_like(t))
        ce = F.cross_entropy(lg.float().flatten(0, 1), safe.flatten(), reduction="none")
        nll.append(ce.view_as(t) * ok)
        valid.append(ok)
    return torch.stack(nll, dim=-1), torch.stack(valid, dim=-1)


def codebook_cross_entropy(
    logits: Sequence[torch.Tensor],
    targets: torch.Tensor,
    mask_ids: Sequence[Sequence[int]] = (),
    loss_mask: torch.Tensor | None = None,
) -> CodebookLoss:
    """MusicGen's loss: each codebook's cross-entropy over its scored targets, averaged over the
    codebooks that have any (:class:`CodebookLoss`). Arguments as :func:`codebook_nll`."""
    nll, valid = codebook_nll(logits, targets, mask_ids, loss_mask)
    return CodebookLoss(sums=nll.sum(dim=(0, 1)), counts=valid.sum(dim=(0, 1)))


def sequence_nll(
    logits: Sequence[torch.Tensor],
    targets: torch.Tensor,
    mask_ids: Sequence[Sequence[int]] = (),
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, the joint NLL in nats summed over its steps and codebooks (B,), and its
    count of scored steps (B,): steps with at least one scored target.

    Unscored targets add 0 (module docstring). Divided by a piece's notes, the summed NLL is
    comparable across tokenizations (NLL per note), so an Octuple model can be paired with a
    REMI one; divided by the step count it is the NLL per step. Arguments as
    :func:`codebook_nll`.
    """
    nll, valid = codebook_nll(logits, targets, mask_ids, loss_mask)
    return nll.sum(dim=(1, 2)), valid.any(dim=2).sum(dim=1)

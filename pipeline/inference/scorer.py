"""A trained :class:`models.transformer.GPT` as a ``models.base.SequenceModel``: the scorer that
evaluation, generation and the audit use.

``load_scorer(model_dir)`` returns a :class:`TransformerScorer` over ``model.safetensors`` and
``model.json`` (both written by the ``train_transformer`` stage, read by
:func:`models.transformer.load_model`); nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.transformer import GPT, load_model


class TransformerScorer:
    """``SequenceModel`` over a trained :class:`GPT`.

    Invariants (docs/artifacts.md, scoring protocol): a piece ``x_1..x_n`` gives ``n + 1`` NLLs
    (targets ``x_1..x_n, EOS``), each scored exactly once, with BOS prepended. PAD and BOS are
    never targets, so they are removed from the support (their probability is renormalised away).
    Pieces longer than the context are scored in sliding windows: the first window scores all of
    its targets; each later window moves by ``stride`` and scores only its last ``stride``
    targets, so every target after the first window sees at least ``max_seq_len - stride``
    tokens of left context. ``stride=1`` gives every target the full context (slowest).
    Computation is fp32 on every device.
    """

    def __init__(self, model: GPT, *, bos_id: int, eos_id: int, pad_id: int | None,
                 device: str = "cpu", stride: int | None = None, batch_size: int = 32,
                 condition: dict[str, Any] | None = None) -> None:
        self.model = model.eval().float().to(device)
        self.condition = condition
        """``model.json``'s ``condition`` entry (names, vocabulary, its hash) of a conditioned
        model; None for an unconditioned one."""
        self.device = device
        self.vocab_size = int(model.config.vocab_size)
        self.eos_id = int(eos_id)
        self.bos_id = int(bos_id)
        self.pad_id = None if pad_id is None else int(pad_id)
        T = model.config.max_seq_len
        self.stride = int(stride) if stride else max(1, T // 4)
        if not 1 <= self.stride <= T:
            raise ValueError(f"stride={self.stride} must be in 1..max_seq_len={T}")
        self.batch_size = batch_size

    def _windows(self, full: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """Windows over ``full = [BOS, x_1..x_n, EOS]``: (inputs, targets, n_context_skipped)."""
        T = self.model.config.max_seq_len
        inputs, targets = full[:-1], full[1:]
        n = len(targets)
        if n <= T:
            return [(inputs, targets, 0)]
        out = [(inputs[:T], targets[:T], 0)]
        done = T
        while done < n:
            end = min(done + self.stride, n)
            start = end - T
            out.append((inputs[start:end], targets[start:end], done - start))
            done = end
        return out

    def _cond_rows(self, conds: np.ndarray | None, n: int) -> np.ndarray | None:
        """``conds`` checked against the model: (n, K) int64, or None for an unconditioned call."""
        if conds is None:
            return None
        conds = np.asarray(conds, dtype=np.int64)
        K = len(self.model.config.cond_slot_sizes)
        if K == 0:
            raise ValueError("this model was trained without conditions; pass conds=None")
        if conds.shape != (n, K):
            raise ValueError(f"conds has shape {conds.shape}, expected ({n}, {K})")
        return conds

    @torch.no_grad()
    def _logprobs(self, batch: list[np.ndarray], cond: np.ndarray | None = None) -> torch.Tensor:
        """Right-padded batch of inputs (and their (B, K) conditions) -> (B, T, V)
        log-probabilities with PAD/BOS masked."""
        T = max(len(b) for b in batch)
        idx = torch.full((len(batch), T), self.eos_id, dtype=torch.long)
        for i, b in enumerate(batch):
            idx[i, : len(b)] = torch.as_tensor(b, dtype=torch.long)
        c = None if cond is None else torch.as_tensor(cond, dtype=torch.long).to(self.device)
        logits, _ = self.model(idx.to(self.device), cond=c)
        logits = logits.float()
        for special in {self.bos_id, self.pad_id} - {None, self.eos_id}:
            logits[..., special] = float("-inf")
        return torch.log_softmax(logits, dim=-1)  # (B, T, V)

    def token_nll(self, seqs: Sequence[np.ndarray],
                  conds: np.ndarray | None = None) -> list[np.ndarray]:
        """NLL of every target (protocol above); ``conds`` (N, K): each sequence's condition ids
        for a conditioned model (None: "no condition" in every slot). Conditions change the
        inputs only: the targets, and so the number of NLLs, are those of the sequence."""
        conds = self._cond_rows(conds, len(seqs))
        jobs = []  # (seq index, inputs, targets, skip)
        out = []
        for s, seq in enumerate(seqs):
            seq = np.asarray(seq, dtype=np.int64)
            if seq.size and (seq.min() < 0 or seq.max() >= self.vocab_size):
                raise ValueError(f"sequence {s}: ids outside 0..{self.vocab_size - 1}")
            full = np.concatenate([[self.bos_id], seq, [self.eos_id]])
            out.append(np.empty(len(seq) + 1, dtype=np.float64))
            jobs.extend((s, *w) for w in self._windows(full))
        # Sort by length so batches pad little; results go back by (seq, offset), order-free.
        cursor = [0] * len(seqs)
        order = sorted(range(len(jobs)), key=lambda j: (len(jobs[j][1]), j))
        results: dict[int, np.ndarray] = {}
        for b0 in range(0, len(order), self.batch_size):
            chunk = order[b0 : b0 + self.batch_size]
            cond = None if conds is None else conds[[jobs[j][0] for j in chunk]]
            lp = self._logprobs([jobs[j][1] for j in chunk], cond)
            for row, j in enumerate(chunk):
                _, _, tgt, skip = jobs[j]
                t = torch.as_tensor(tgt, dtype=torch.long, device=lp.device)
                nll = -lp[row, : len(tgt)].gather(1, t[:, None])[:, 0]
                results[j] = nll[skip:].double().cpu().numpy()
        for j, (s, _, _, _) in enumerate(jobs):  # jobs of one sequence are in target order
            r = results[j]
            out[s][cursor[s] : cursor[s] + len(r)] = r
            cursor[s] += len(r)
        return out

    @torch.no_grad()
    def next_logprobs(self, contexts: Sequence[np.ndarray],
                      conds: np.ndarray | None = None) -> np.ndarray:
        """(B, V) next-id log-probabilities; ``conds`` (B, K) as in :meth:`token_nll`."""
        conds = self._cond_rows(conds, len(contexts))
        T = self.model.config.max_seq_len
        rows = []
        for b0 in range(0, len(contexts), self.batch_size):
            batch = [np.concatenate([[self.bos_id], np.asarray(c, dtype=np.int64)])[-T:]
                     for c in contexts[b0 : b0 + self.batch_size]]
            lp = self._logprobs(batch, None if conds is None else conds[b0 : b0 + len(batch)])
            last = torch.as_tensor([len(b) - 1 for b in batch], device=lp.device)
            rows.append(lp[torch.arange(len(batch), device=lp.device), last].double().cpu())
        if not rows:
            return np.zeros((0, self.vocab_size))
        return torch.cat(rows).numpy()


def load_scorer(model_dir: Path, device: str = "cpu", stride: int | None = None):
    """Load ``model_dir/model.{safetensors,json}`` as a ``SequenceModel`` (fp32, eval mode)."""
    model, meta = load_model(Path(model_dir), device)
    return TransformerScorer(model, bos_id=meta["bos_id"], eos_id=meta["eos_id"],
                             pad_id=meta.get("pad_id"), device=device, stride=stride,
                             condition=meta.get("condition"))

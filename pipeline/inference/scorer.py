"""A trained :class:`models.transformer.GPT` as a ``models.base.SequenceModel``: the scorer that
evaluation, generation and the audit use.

``load_scorer(model_dir)`` returns a :class:`TransformerScorer` over ``model.safetensors`` and
``model.json`` (both written by the ``train_transformer`` stage, read by
:func:`models.loading.load_trained`); nothing is unpickled. A model of compound tokens (CPWord,
Octuple) gives a :class:`CompoundScorer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.compound import CompoundGPT
from models.loading import load_trained
from models.transformer import GPT


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


class CompoundScorer(TransformerScorer):
    """A trained :class:`CompoundGPT` scored as :class:`TransformerScorer` scores one stream.

    A sequence is an (n, K) array of steps, one id per codebook (the token tables' ``codes``,
    transposed). Framed as a step of every codebook's BOS, the steps, and a step of every
    codebook's EOS, it gives ``n + 1`` target steps, windowed with the same stride rule. Each
    codebook's distribution is renormalised over the ids that can be targets: its PAD and BOS
    and its masked ids (CPWord's ``Ignore_None``) are removed from the support, as PAD and BOS
    are for one stream. A target in a codebook's masked ids is not scored (NLL 0), as in training.
    A step's NLL is the sum of its codebooks' (the heads are independent given the hidden state,
    so this is the joint NLL of the step): :meth:`token_nll` gives it, :meth:`codebook_nll` each
    codebook's share.
    """

    def __init__(self, model: CompoundGPT, *, codebooks: Sequence[dict[str, Any]],
                 device: str = "cpu", stride: int | None = None, batch_size: int = 32) -> None:
        super().__init__(model, bos_id=int(codebooks[0]["bos_id"]),
                         eos_id=int(codebooks[0]["eos_id"]), pad_id=int(codebooks[0]["pad_id"]),
                         device=device, stride=stride, batch_size=batch_size)
        self.codebooks = [dict(c) for c in codebooks]
        self.sizes = np.asarray([int(c["size"]) for c in codebooks], dtype=np.int64)
        self.bos = np.asarray([int(c["bos_id"]) for c in codebooks], dtype=np.int64)
        self.eos = np.asarray([int(c["eos_id"]) for c in codebooks], dtype=np.int64)
        self.unscored = [((int(c["ignore_id"]),) if "ignore_id" in c else ()) for c in codebooks]
        self.removed = [sorted({int(c["pad_id"]), int(c["bos_id"]), *u} - {int(c["eos_id"])})
                        for c, u in zip(codebooks, self.unscored, strict=True)]

    def codebook_nll(self, seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """(n + 1, K) NLL of every target step of each (n, K) sequence, per codebook (0 where
        the target is not scored)."""
        K = len(self.sizes)
        jobs, out = [], []
        for s, seq in enumerate(seqs):
            seq = np.asarray(seq, dtype=np.int64).reshape(-1, K)
            if seq.size and ((seq < 0).any() or (seq >= self.sizes).any()):
                raise ValueError(f"sequence {s}: ids outside each codebook's 0..size-1")
            full = np.concatenate([self.bos[None], seq, self.eos[None]])
            out.append(np.empty((len(seq) + 1, K), dtype=np.float64))
            jobs.extend((s, *w) for w in self._windows(full))
        cursor = [0] * len(seqs)
        order = sorted(range(len(jobs)), key=lambda j: (len(jobs[j][1]), j))
        results: dict[int, np.ndarray] = {}
        for b0 in range(0, len(order), self.batch_size):
            chunk = order[b0 : b0 + self.batch_size]
            nll = self._nll([jobs[j][1] for j in chunk], [jobs[j][2] for j in chunk])
            for row, j in enumerate(chunk):
                n, skip = len(jobs[j][2]), jobs[j][3]
                results[j] = nll[row, skip:n].double().cpu().numpy()
        for j, (s, _, _, _) in enumerate(jobs):  # jobs of one sequence are in target order
            r = results[j]
            out[s][cursor[s] : cursor[s] + len(r)] = r
            cursor[s] += len(r)
        return out

    def token_nll(self, seqs: Sequence[np.ndarray],
                  conds: np.ndarray | None = None) -> list[np.ndarray]:
        """Joint NLL of every target step: the sum over codebooks of :meth:`codebook_nll`."""
        if conds is not None:
            raise ValueError("a model of compound tokens is not conditioned; pass conds=None")
        return [per.sum(axis=1) for per in self.codebook_nll(seqs)]

    @torch.no_grad()
    def _nll(self, inputs: list[np.ndarray], targets: list[np.ndarray]) -> torch.Tensor:
        """Right-padded (B, T, K) inputs and targets -> (B, T, K) NLL, each codebook's
        distribution renormalised over its possible targets (class docstring)."""
        B, T, K = len(inputs), max(len(b) for b in inputs), len(self.sizes)
        idx = torch.as_tensor(self.eos).expand(B, T, K).clone()
        tgt = torch.as_tensor(self.eos).expand(B, T, K).clone()
        for i, (x, y) in enumerate(zip(inputs, targets, strict=True)):
            idx[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
            tgt[i, : len(y)] = torch.as_tensor(y, dtype=torch.long)
        logits, _ = self.model(idx.to(self.device))
        tgt = tgt.to(self.device)
        out = []
        for k, lg in enumerate(logits):
            lg = lg.float()
            lg[..., self.removed[k]] = float("-inf")
            lp = torch.log_softmax(lg, dim=-1)  # (B, T, size_k)
            t = tgt[..., k]
            nll = -lp.gather(-1, t[..., None])[..., 0]
            if self.unscored[k]:
                nll = torch.where(torch.isin(t, torch.as_tensor(self.unscored[k],
                                                                device=t.device)),
                                  torch.zeros_like(nll), nll)
            out.append(nll)
        return torch.stack(out, dim=-1)  # (B, T, K)

    def next_logprobs(self, contexts: Sequence[np.ndarray],
                      conds: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError("a compound step is K ids, one per codebook: sample it with "
                                  "next_step_logprobs (pipeline.inference.sampling.sample_steps)")

    @torch.no_grad()
    def next_step_logprobs(self, contexts: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per codebook, (B, size_k) log-probabilities of the next step's id, all read from the
        same hidden state: each (n, K) context framed by a step of every codebook's BOS, its
        last ``max_seq_len`` steps kept. Raw softmaxes over each whole codebook: the sampler
        removes what must never be drawn (:func:`pipeline.inference.sampling.sample_steps`)."""
        K, T = len(self.sizes), self.model.config.max_seq_len
        out: list[list[torch.Tensor]] = [[] for _ in range(K)]
        for b0 in range(0, len(contexts), self.batch_size):
            batch = [np.concatenate([self.bos[None],
                                     np.asarray(c, dtype=np.int64).reshape(-1, K)])[-T:]
                     for c in contexts[b0 : b0 + self.batch_size]]
            width = max(len(b) for b in batch)
            idx = torch.as_tensor(self.eos).expand(len(batch), width, K).clone()
            for i, b in enumerate(batch):
                idx[i, : len(b)] = torch.as_tensor(b, dtype=torch.long)
            logits, _ = self.model(idx.to(self.device))
            rows = torch.arange(len(batch), device=self.device)
            last = torch.as_tensor([len(b) - 1 for b in batch], device=self.device)
            for k, lg in enumerate(logits):
                out[k].append(torch.log_softmax(lg[rows, last].float(), -1).double().cpu())
        if not contexts:
            return [np.zeros((0, int(n))) for n in self.sizes]
        return [torch.cat(rows_k).numpy() for rows_k in out]


def load_scorer(model_dir: Path, device: str = "cpu", stride: int | None = None):
    """Load ``model_dir/model.{safetensors,json}`` as a ``SequenceModel`` (fp32, eval mode):
    a :class:`CompoundScorer` for a model of compound tokens, else a
    :class:`TransformerScorer`."""
    model, meta = load_trained(Path(model_dir), device)
    if isinstance(model, CompoundGPT):
        return CompoundScorer(model, codebooks=meta["codebooks"], device=device, stride=stride)
    return TransformerScorer(model, bos_id=meta["bos_id"], eos_id=meta["eos_id"],
                             pad_id=meta.get("pad_id"), device=device, stride=stride,
                             condition=meta.get("condition"))

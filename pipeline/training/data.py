"""Training data: token tables -> examples -> random windows -> padded batches.

Inputs (``docs/artifacts.md``): ``data/tokens/tokens.parquet`` (``sha256``, ``split``, ``track``,
``ids``), optional ``data/tokens/augmented.parquet`` (train only) and ``data/tokens/info.json``.

Invariants:
- An example is one row's ids wrapped as ``[BOS] + ids + [EOS]``; rows are sorted by their key
  columns before use, so row order in the file never matters.
- The order of examples is a pure function of ``(seed, epoch)``: the examples form one endless
  stream, epoch ``e`` being ``randperm(n)`` from ``torch.Generator().manual_seed(seed·1000003+e)``.
  Optimiser step ``s`` consumes stream positions ``[s·E, (s+1)·E)`` (``E`` = effective batch), so
  resuming needs only ``s``, and ranks take disjoint, fixed slices of each step's examples.
- Each example contributes one window of ``max_seq_len + 1`` tokens per visit, at an offset drawn
  from the same epoch generator. Token order inside a piece is never changed.
- Padding: inputs are padded with ``pad_id``; padded targets are ``IGNORE_INDEX`` and the mask is
  false there, so padding never reaches the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.core.artifacts import read_parquet
from pipeline.tokens.contract import IGNORE_INDEX, TokenInfo, read_tokens


@dataclass
class Corpus:
    """Examples as int64 arrays ``[BOS, x_1..x_n, EOS]``; ``skipped`` counts rejected rows."""

    train: list[np.ndarray]
    val: list[np.ndarray]
    n_augmented: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


def _check_ids(ids: np.ndarray, info: TokenInfo) -> str | None:
    """Why a row cannot be trained on, or None. Specials inside a piece would teach the model to
    stop or restart mid-piece, so they are rejected rather than silently kept."""
    if ids.size == 0:
        return None
    if ids.min() < 0 or ids.max() >= info.vocab_size:
        return "id_out_of_range"
    if np.isin(ids, info.special_ids()).any():
        return "special_id_inside_piece"
    return None


def _wrap(ids: np.ndarray, info: TokenInfo) -> np.ndarray:
    return np.concatenate([[info.bos_id], ids.astype(np.int64), [info.eos_id]]).astype(np.int64)


def load_corpus(tokens: Path, info: TokenInfo, augmented: Path | None = None) -> Corpus:
    """Read train/val examples (plus train augmentations when ``augmented`` exists)."""
    table = read_tokens(tokens, ["sha256", "split", "track", "ids"])
    table = table.sort_values(["split", "sha256", "track"], kind="stable")
    corpus = Corpus(train=[], val=[])
    for split, ids in zip(table["split"], table["ids"], strict=True):
        if split not in ("train", "val"):
            continue
        arr = np.asarray(ids, dtype=np.int64)
        why = _check_ids(arr, info)
        if why:
            corpus.skipped[f"{split}:{why}"] = corpus.skipped.get(f"{split}:{why}", 0) + 1
            continue
        (corpus.train if split == "train" else corpus.val).append(_wrap(arr, info))
    if augmented is not None and Path(augmented).exists():
        aug = read_parquet(augmented, columns=["sha256", "transpose", "ids"])
        for ids in aug.sort_values(["sha256", "transpose"], kind="stable")["ids"]:
            arr = np.asarray(ids, dtype=np.int64)
            why = _check_ids(arr, info)
            if why:
                corpus.skipped[f"augmented:{why}"] = corpus.skipped.get(f"augmented:{why}", 0) + 1
                continue
            corpus.train.append(_wrap(arr, info))
            corpus.n_augmented += 1
    return corpus


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor  # (B, T) input ids, pad_id after the end of each window
    y: torch.Tensor  # (B, T) target ids, IGNORE_INDEX where padded
    mask: torch.Tensor  # (B, T) bool, True where the target counts

    @property
    def n_valid(self) -> int:
        return int(self.mask.sum())


def make_batch(windows: list[np.ndarray], seq_len: int, pad_id: int) -> Batch:
    """Windows of up to ``seq_len + 1`` tokens -> (B, seq_len) inputs/targets/mask."""
    B = len(windows)
    x = torch.full((B, seq_len), pad_id, dtype=torch.long)
    y = torch.full((B, seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, w in enumerate(windows):
        n = len(w) - 1
        if n < 1 or n > seq_len:
            raise ValueError(f"window {i} has {len(w)} tokens; need 2..{seq_len + 1}")
        t = torch.as_tensor(w, dtype=torch.long)
        x[i, :n] = t[:-1]
        y[i, :n] = t[1:]
    return Batch(x, y, y != IGNORE_INDEX)


class WindowStream:
    """The endless, seeded stream of training windows (see the module docstring)."""

    def __init__(self, examples: list[np.ndarray], seq_len: int, seed: int) -> None:
        if not examples:
            raise ValueError("no training examples (is the train split empty?)")
        self.examples = examples
        self.seq_len = seq_len
        self.seed = seed
        self._plans: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.examples)

    def _plan(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if epoch not in self._plans:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(len(self.examples), generator=g)
            u = torch.rand(len(self.examples), generator=g, dtype=torch.float64)
            self._plans = {epoch: (perm, u)}  # keep one epoch: memory stays O(n)
        return self._plans[epoch]

    def position(self, k: int) -> tuple[int, int]:
        """Stream position ``k`` -> (example index, window offset)."""
        epoch, j = divmod(k, len(self.examples))
        perm, u = self._plan(epoch)
        ex = int(perm[j])
        span = len(self.examples[ex]) - (self.seq_len + 1)  # offsets 0..span are valid
        return ex, int(float(u[j]) * (span + 1)) if span > 0 else 0

    def window(self, k: int) -> np.ndarray:
        ex, off = self.position(k)
        return self.examples[ex][off : off + self.seq_len + 1]

    def n_valid(self, k: int) -> int:
        """Targets counted by the window at ``k`` (computed from lengths, no tensors)."""
        ex, _ = self.position(k)
        return min(len(self.examples[ex]) - 1, self.seq_len)


@dataclass(frozen=True)
class Shard:
    """Which part of an optimiser step's examples this process handles."""

    rank: int = 0
    world_size: int = 1
    micro_batch: int = 16
    grad_accum: int = 1

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def micro_positions(self, step: int, micro: int) -> range:
        """Stream positions of micro-batch ``micro`` of this rank at optimiser step ``step``."""
        slot = self.rank * self.grad_accum + micro  # rank-major slots within the step
        start = step * self.effective_batch + slot * self.micro_batch
        return range(start, start + self.micro_batch)

    def step_positions(self, step: int) -> range:
        return range(step * self.effective_batch, (step + 1) * self.effective_batch)


def val_windows(examples: list[np.ndarray], seq_len: int, max_windows: int = 0) -> list[np.ndarray]:
    """Consecutive, non-overlapping windows covering every target of every val example once.

    ``max_windows > 0`` keeps that many, evenly spaced over the full list (deterministic).
    """
    out = []
    for ex in examples:
        n = len(ex) - 1  # targets
        out.extend(ex[s : min(s + seq_len, n) + 1] for s in range(0, n, seq_len))
    if 0 < max_windows < len(out):
        keep = np.linspace(0, len(out) - 1, max_windows).round().astype(int)
        out = [out[i] for i in sorted(set(keep.tolist()))]
    return out

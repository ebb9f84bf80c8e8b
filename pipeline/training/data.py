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
- Packing (``transformer.data.pack``, :class:`PackedRows`): a training row holds consecutive
  windows of the same stream while their targets fit; optimiser step ``s`` then consumes rows
  ``[s·E, (s+1)·E)`` instead of windows, and the batch's ``segments`` keep each window to itself.
- Conditions (``condition.use``, docs/conditioning.md): each example carries its piece's (K,)
  condition ids (``Corpus.train_cond`` / ``val_cond``), and every window of it the same ids
  (``Batch.cond``). They are inputs only and never change the targets. Condition dropout replaces
  a training window's ids by every slot's "none" with a probability, drawn from a generator seeded
  by ``(seed, stream position)``, so it too is a pure function of the step. Packing refuses
  conditions: a packed row holds several pieces.
- Compound tokens (``info.compound``: CPWord, Octuple): an example is a (steps, K) array, one id
  per codebook per step, framed by a step of every codebook's own BOS and one of its own EOS;
  inputs are padded with each codebook's PAD, padded targets are ``IGNORE_INDEX`` in every
  codebook, and ``Batch.mask`` stays (B, T). Windows, offsets and the stream are those of one
  stream, counted in steps. Packing refuses compound examples.
- Batches are gathered from one flat array of the training tokens by index arithmetic
  (:meth:`WindowStream.batch`, :meth:`PackedRows.batch`); validation batches, built once per
  evaluation, use :func:`make_batch` over a list of windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.base import IGNORE_INDEX
from pipeline.conditions.assign import PieceConditions, transposed_ids
from pipeline.conditions.vocab import ConditionVocab
from pipeline.core.artifacts import read_parquet
from pipeline.tokens.contract import TokenInfo, read_tokens


@dataclass
class Corpus:
    """Examples as int64 arrays ``[BOS, x_1..x_n, EOS]`` (compound tokens: (n + 2, K) arrays,
    each codebook framed by its own BOS and EOS); ``skipped`` counts rejected rows."""

    train: list[np.ndarray]
    val: list[np.ndarray]
    n_augmented: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    conditions: PieceConditions | None = None  # the pieces' condition ids (None: unconditioned)
    train_cond: list[np.ndarray] = field(default_factory=list)  # (K,) ids per train example
    val_cond: list[np.ndarray] = field(default_factory=list)  # (K,) ids per val example

    @property
    def cond_vocab(self) -> ConditionVocab | None:
        return None if self.conditions is None else self.conditions.vocab


def _check_ids(ids: np.ndarray, info: TokenInfo) -> str | None:
    """Why a row cannot be trained on, or None. Specials inside a piece would teach the model to
    stop or restart mid-piece, so they are rejected rather than silently kept. Compound steps
    (n, K) are checked per codebook, against its own size and specials."""
    if ids.size == 0:
        return None
    if info.compound:
        sizes = np.asarray(info.codebook_sizes())
        specials = np.stack([info.codebook_ids(k) for k in ("pad_id", "bos_id", "eos_id")])
        if (ids < 0).any() or (ids >= sizes).any():
            return "id_out_of_range"
        if (ids[:, None, :] == specials[None]).any():
            return "special_id_inside_piece"
        return None
    if ids.min() < 0 or ids.max() >= info.vocab_size:
        return "id_out_of_range"
    if np.isin(ids, info.special_ids()).any():
        return "special_id_inside_piece"
    return None


def _wrap(ids: np.ndarray, info: TokenInfo) -> np.ndarray:
    if info.compound:  # a step of every codebook's BOS, the steps, a step of every EOS
        return np.concatenate([np.asarray([info.codebook_ids("bos_id")], dtype=np.int64),
                               ids.astype(np.int64).reshape(-1, len(info.codebooks or [])),
                               np.asarray([info.codebook_ids("eos_id")], dtype=np.int64)])
    return np.concatenate([[info.bos_id], ids.astype(np.int64), [info.eos_id]]).astype(np.int64)


def steps_of(codes: object, n_codebooks: int) -> np.ndarray:
    """A row's ``codes`` (one list per codebook) -> (steps, K) int64 steps."""
    books = [np.asarray(c, dtype=np.int64) for c in (codes if codes is not None else [])]
    if not books:
        return np.zeros((0, n_codebooks), dtype=np.int64)
    return np.stack(books, axis=1)


def row_ids(info: TokenInfo) -> tuple[str, object]:
    """The token table column a row's sequence is read from (``ids``, or ``codes`` for compound
    tokens) and the function that turns one cell into the sequence."""
    if info.compound:
        k = len(info.codebooks or [])
        return "codes", lambda cell: steps_of(cell, k)
    return "ids", lambda cell: np.asarray(cell, dtype=np.int64)


def load_corpus(tokens: Path, info: TokenInfo, augmented: Path | None = None,
                conditions: PieceConditions | None = None) -> Corpus:
    """Read train/val examples (plus train augmentations when ``augmented`` exists), with each
    example's condition ids when ``conditions`` is given."""
    column, as_array = row_ids(info)
    table = read_tokens(tokens, ["sha256", "split", "track", "ids"]
                        + ([column] if column != "ids" else []))
    table = table.sort_values(["split", "sha256", "track"], kind="stable")
    corpus = Corpus(train=[], val=[], conditions=conditions)
    for sha, split, ids in zip(table["sha256"], table["split"], table[column], strict=True):
        if split not in ("train", "val"):
            continue
        arr = as_array(ids)
        why = _check_ids(arr, info)
        if why:
            corpus.skipped[f"{split}:{why}"] = corpus.skipped.get(f"{split}:{why}", 0) + 1
            continue
        (corpus.train if split == "train" else corpus.val).append(_wrap(arr, info))
        if conditions is not None:
            (corpus.train_cond if split == "train" else corpus.val_cond).append(conditions.of(sha))
    if augmented is not None and Path(augmented).exists():
        aug = read_parquet(augmented, columns=["sha256", "transpose", column])
        aug = aug.sort_values(["sha256", "transpose"], kind="stable")
        for sha, semitones, ids in zip(aug["sha256"], aug["transpose"], aug[column], strict=True):
            arr = as_array(ids)
            why = _check_ids(arr, info)
            if why:
                corpus.skipped[f"augmented:{why}"] = corpus.skipped.get(f"augmented:{why}", 0) + 1
                continue
            corpus.train.append(_wrap(arr, info))
            corpus.n_augmented += 1
            if conditions is not None:
                corpus.train_cond.append(transposed_ids(conditions, sha, int(semitones)))
    return corpus


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor  # (B, T) input ids, pad_id after the end of each window; compound (B, T, K)
    y: torch.Tensor  # (B, T) target ids, IGNORE_INDEX where padded; compound (B, T, K)
    mask: torch.Tensor  # (B, T) bool, True where the target counts
    segments: torch.Tensor | None = None  # (B, T) packed rows: piece index in the row, -1 = pad
    cond: torch.Tensor | None = None  # (B, K) condition ids of each row's piece

    @property
    def n_valid(self) -> int:
        return int(self.mask.sum())


Pad = int | np.ndarray
"""The input padding: one id, or per codebook a (K,) array of PAD ids (compound tokens)."""


def make_batch(windows: list[np.ndarray], seq_len: int, pad_id: Pad,
               cond: np.ndarray | None = None) -> Batch:
    """Windows of up to ``seq_len + 1`` tokens (and their (B, K) condition ids) -> (B, seq_len)
    inputs/targets/mask; compound windows (steps, K) with per-codebook ``pad_id`` (K,) give
    (B, seq_len, K) inputs and targets and a (B, seq_len) mask."""
    B = len(windows)
    if np.ndim(pad_id):
        pad = torch.as_tensor(np.asarray(pad_id, dtype=np.int64))
        x = pad.expand(B, seq_len, len(pad)).clone()
        y = torch.full((B, seq_len, len(pad)), IGNORE_INDEX, dtype=torch.long)
    else:
        x = torch.full((B, seq_len), pad_id, dtype=torch.long)
        y = torch.full((B, seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, w in enumerate(windows):
        n = len(w) - 1
        if n < 1 or n > seq_len:
            raise ValueError(f"window {i} has {len(w)} tokens; need 2..{seq_len + 1}")
        t = torch.as_tensor(w, dtype=torch.long)
        x[i, :n] = t[:-1]
        y[i, :n] = t[1:]
    c = None if cond is None else torch.as_tensor(np.asarray(cond, dtype=np.int64))
    return Batch(x, y, (y if y.dim() == 2 else y[..., 0]) != IGNORE_INDEX, cond=c)


class WindowStream:
    """The endless, seeded stream of training windows (see the module docstring).

    The examples are also held as one flat int64 array (``flat``, with ``starts`` and
    ``lengths``), so a batch is gathered by index arithmetic (:meth:`batch`) instead of a Python
    loop over windows; :meth:`window` and :meth:`position` give the same windows one at a time.
    """

    def __init__(self, examples: list[np.ndarray], seq_len: int, seed: int,
                 cond: list[np.ndarray] | None = None) -> None:
        if not examples:
            raise ValueError("no training examples (is the train split empty?)")
        if cond is not None and len(cond) != len(examples):
            raise ValueError(f"{len(cond)} condition rows for {len(examples)} examples")
        self.examples = examples
        self.cond = None if cond is None else np.stack(cond).astype(np.int64)  # (n, K)
        self.seq_len = seq_len
        self.seed = seed
        self.lengths = np.array([len(e) for e in examples], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.flat = np.concatenate(examples).astype(np.int64, copy=False)
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

    def positions(self, ks: range) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions ``ks`` (a contiguous range) -> (example indices, window offsets)."""
        k = np.arange(ks.start, ks.stop, dtype=np.int64)
        epoch, j = np.divmod(k, len(self.examples))
        ex = np.empty(len(k), dtype=np.int64)
        u = np.empty(len(k), dtype=np.float64)
        for e in np.unique(epoch).tolist():  # one epoch, or two across a boundary
            sel = epoch == e
            perm, uu = self._plan(e)
            ex[sel] = perm.numpy()[j[sel]]
            u[sel] = uu.numpy()[j[sel]]
        span = self.lengths[ex] - (self.seq_len + 1)  # offsets 0..span are valid
        # float64 product truncated toward zero: the same value as int(float(u) * (span + 1))
        off = np.where(span > 0, (u * (span + 1)).astype(np.int64), 0)
        return ex, off

    def position(self, k: int) -> tuple[int, int]:
        """Stream position ``k`` -> (example index, window offset)."""
        ex, off = self.positions(range(k, k + 1))
        return int(ex[0]), int(off[0])

    def window(self, k: int) -> np.ndarray:
        ex, off = self.position(k)
        return self.examples[ex][off : off + self.seq_len + 1]

    def targets(self, ks: range) -> np.ndarray:
        """Targets of each window at positions ``ks``: ``min(len - off, T + 1) - 1``, at least 1."""
        ex, off = self.positions(ks)
        return np.minimum(self.lengths[ex] - off, self.seq_len + 1) - 1

    def n_valid(self, k: int) -> int:
        """Targets counted by the window at ``k`` (computed from lengths, no tensors)."""
        return int(self.targets(range(k, k + 1))[0])

    def n_targets(self, ks: range) -> int:
        """Targets counted by the windows at positions ``ks`` together."""
        return int(self.targets(ks).sum())

    def batch(self, ks: range, pad_id: Pad) -> Batch:
        """The windows at positions ``ks`` as one padded batch, equal to
        ``make_batch([self.window(k) for k in ks], seq_len, pad_id)``."""
        ex, off = self.positions(ks)
        n = np.minimum(self.lengths[ex] - off, self.seq_len + 1) - 1  # (B,) targets per row
        col = np.arange(self.seq_len)
        src = (self.starts[ex] + off)[:, None] + col[None, :]  # (B, T) index of each input
        valid = col[None, :] < n[:, None]  # (B, T)
        last = len(self.flat) - 1
        keep = valid if self.flat.ndim == 1 else valid[..., None]  # compound: (B, T, 1)
        x = np.where(keep, self.flat[np.minimum(src, last)], pad_id)
        y = np.where(keep, self.flat[np.minimum(src + 1, last)], IGNORE_INDEX)
        cond = None if self.cond is None else torch.from_numpy(self.cond[ex])
        return Batch(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(valid), cond=cond)


class PackedRows:
    """Training rows packed with several windows (``transformer.data.pack``).

    Row ``r`` holds the consecutive stream windows at positions ``[start(r), start(r + 1))``:
    windows are taken in stream order while their targets fit in the row's ``seq_len`` positions
    (a window that does not fit opens the next row; every row holds at least one). So the order
    of examples and each window are those of :class:`WindowStream`; only how many share a row
    changes. Row boundaries are a pure function of the stream, found by scanning from row 0
    (resuming at step ``s`` re-scans the lengths of the rows before it; no tensors involved).

    In a row, each window keeps its own inputs and targets; ``segments`` numbers the windows
    (``-1`` on padding), which the model turns into a block-diagonal causal mask and positions
    restarting at each window, so a piece sees only itself.
    """

    CHUNK = 4096  # window lengths computed per scan

    def __init__(self, stream: WindowStream) -> None:
        if stream.cond is not None:
            raise ValueError("packed rows hold several pieces, each with its own conditions; "
                             "set transformer.data.pack: false to train with conditions")
        if stream.flat.ndim != 1:
            raise ValueError("packed rows hold one id stream; compound tokens are not packed "
                             "(set transformer.data.pack: false)")
        self.stream = stream
        self._starts = [0]  # _starts[r]: first stream position of row r
        self._used: list[int] = []  # targets in row r
        self._buf_start, self._buf = 0, np.zeros(0, dtype=np.int64)

    def _n(self, k: int) -> int:
        if not self._buf_start <= k < self._buf_start + len(self._buf):
            self._buf_start = k
            self._buf = self.stream.targets(range(k, k + self.CHUNK))
        return int(self._buf[k - self._buf_start])

    def _scan(self, rows: int) -> None:
        """Find the boundaries of rows ``0..rows-1``."""
        T = self.stream.seq_len
        while len(self._used) < rows:
            k, used = self._starts[-1], 0
            while used < T:
                nk = self._n(k)
                if used and used + nk > T:
                    break
                used, k = used + nk, k + 1
            self._starts.append(k)
            self._used.append(used)

    def start(self, row: int) -> int:
        """First stream position of row ``row`` (= examples consumed by the rows before it)."""
        self._scan(row)
        return self._starts[row]

    def n_targets(self, rows: range) -> int:
        self._scan(rows.stop)
        return sum(self._used[rows.start : rows.stop])

    def batch(self, rows: range, pad_id: int) -> Batch:
        """Rows ``rows`` (a contiguous range) -> x, y, mask, segments (B, T)."""
        self._scan(rows.stop)
        T, s = self.stream.seq_len, self.stream
        first, stop = self._starts[rows.start], self._starts[rows.stop]
        ex, off = s.positions(range(first, stop))
        n = np.minimum(s.lengths[ex] - off, T + 1) - 1  # (W,) targets of each window
        bounds = np.asarray(self._starts[rows.start : rows.stop + 1]) - first
        row = np.repeat(np.arange(len(rows)), np.diff(bounds))  # (W,) row of each window
        seg = np.arange(len(n)) - bounds[row]  # (W,) index of the window in its row
        ends = np.cumsum(n)
        col0 = ends - n - (ends - n)[bounds[row]]  # (W,) first column of each window
        win = np.repeat(np.arange(len(n)), n)  # (N,) window of each placed target
        i = np.arange(int(ends[-1])) - np.repeat(ends - n, n)  # (N,) index inside the window
        r, c = row[win], col0[win] + i
        src = s.starts[ex][win] + off[win] + i
        x = np.full((len(rows), T), pad_id, dtype=np.int64)
        y = np.full((len(rows), T), IGNORE_INDEX, dtype=np.int64)
        segments = np.full((len(rows), T), -1, dtype=np.int64)
        x[r, c], y[r, c], segments[r, c] = s.flat[src], s.flat[src + 1], seg[win]
        return Batch(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(y != IGNORE_INDEX),
                     torch.from_numpy(segments))


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
    return [examples[e][s : s + seq_len + 1]
            for e, s in val_window_plan(examples, seq_len, max_windows)]


def val_window_plan(examples: list[np.ndarray], seq_len: int,
                    max_windows: int = 0) -> list[tuple[int, int]]:
    """(example index, first position) of each window :func:`val_windows` returns, in order."""
    out = []
    for e, ex in enumerate(examples):
        n = len(ex) - 1  # targets
        out.extend((e, s) for s in range(0, n, seq_len))
    if 0 < max_windows < len(out):
        keep = np.linspace(0, len(out) - 1, max_windows).round().astype(int)
        out = [out[i] for i in sorted(set(keep.tolist()))]
    return out


def codebook_counts(y: torch.Tensor, mask_ids: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """(K,) scored targets of each codebook in compound targets ``y`` (B, T, K): neither
    ``IGNORE_INDEX`` nor one of the codebook's ``mask_ids`` (as
    :func:`models.compound.codebook_nll` scores them), counted on the host."""
    t = y.numpy()
    ok = t != IGNORE_INDEX
    for k, ids in enumerate(mask_ids):
        if ids:
            ok[..., k] &= ~np.isin(t[..., k], ids)
    return ok.sum(axis=(0, 1)).astype(np.int64)


def drop_conditions(cond: torch.Tensor, none_ids: np.ndarray, p: float, seed: int,
                    position: int) -> torch.Tensor:
    """Condition dropout: each row of ``cond`` (B, K) becomes every slot's "none" with
    probability ``p``. The draw comes from a generator seeded by ``(seed, position)`` (the
    batch's first stream position), so a resumed run drops the same rows."""
    if p <= 0 or cond.shape[1] == 0:
        return cond
    drop = np.random.default_rng([seed, position]).random(cond.shape[0]) < p
    out = cond.clone()
    out[torch.from_numpy(drop)] = torch.as_tensor(none_ids, dtype=out.dtype)
    return out

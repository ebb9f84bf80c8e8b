"""The training loop, nanoGPT-shaped: :func:`train` sets up, then steps until a stop rule fires.

One optimiser step (:func:`_train_step`), in order:

1. the step's learning rate, which the schedule set when the previous step ended;
2. forward each micro-batch under autocast; its masked cross-entropy is *summed* over valid
   targets and divided by the step's *global* count of valid targets, so micro-batches and ranks
   are weighted by tokens (the factor ``world_size`` undoes DDP's gradient averaging); backward,
   with DDP's all-reduce only on the last micro-batch (``no_sync`` before);
3. unscale (fp16), clip the gradient norm (always measured: it is logged every step);
4. note the step's loss and gradient norm, still on the device (:class:`Pending`);
5. optimiser step, ``zero_grad(set_to_none=True)``, schedule step.

Compound tokens (CPWord, Octuple; :class:`models.compound.CompoundGPT`): step 2's loss is
:class:`models.compound.CodebookLoss`'s mean over codebooks, formed over the whole optimiser step
as the single-stream loss is: each micro-batch adds ``sum_k sums_k / (N_k · K')``, where ``N_k``
is codebook ``k``'s scored targets in the whole step (all ranks, counted on the host from the
step's targets) and ``K'`` the codebooks with any, times ``world_size``. So accumulation and ranks
give the loss of one big batch, and the log has each codebook's train and validation loss
(``train_loss_<codebook>``, ``val_loss_<codebook>``); ``train_loss`` and ``val_loss`` are the
mean over codebooks of each codebook's mean NLL, and that val loss is what the stop rules read.

Around it (:func:`_train`): counters and stop rules, validation every ``train.eval_every`` steps
(best weights kept, early stopping), a log line, a checkpoint every ``checkpoint.every`` steps.

Reading steps. A step reads device values (which waits for the device) only when it has to: at
step 1, at multiples of ``train.log_every``, ``train.eval_every`` and ``checkpoint.every``, and at
the last step. There the losses and gradient norms of every step since the previous reading step
are read at once, filling their log rows, and the non-finite guard runs: if any of those steps had
a NaN/inf loss (or gradient norm, without a grad scaler) training stops with
:class:`NonFiniteError` naming the first such step, *before* anything is evaluated or saved. So
no checkpoint and no best weights ever come from a state that went through a non-finite step;
the steps between it and the reading step ran, but their state is discarded. Everything the loop
decides in between (token counts, stop rules, the learning rate) comes from lengths and counters
on the host.

Set-up lives beside this module: where the process runs (``device``), the model, optimiser and
schedule (``setup``), which checkpoint to continue from (``resume``). A checkpoint holds everything
the next step depends on (weights, optimiser, schedule, grad scaler, RNG states of every rank,
counters, the log) and the data order is a pure function of the step (``data``), so on CPU an
interrupted run resumed from any of its checkpoints ends with exactly the same weights as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from models.lora import param_counts
from models.transformer import export_state
from pipeline.conditions.vocab import ConditionVocab
from pipeline.tokens.contract import TokenInfo
from pipeline.training import checkpoint as ckpt
from pipeline.training.config import CheckpointSection, TrainSection, TransformerStageConfig
from pipeline.training.data import (
    Batch,
    Corpus,
    PackedRows,
    Shard,
    WindowStream,
    codebook_counts,
    drop_conditions,
    make_batch,
    val_window_plan,
)
from pipeline.training.device import DistInfo, TrainDevice, make_device
from pipeline.training.resume import fingerprint, gather_rng, open_resume, restore_rng
from pipeline.training.setup import build_model, make_optimizer, make_scheduler

Weights = dict[str, torch.Tensor]
Echo = Callable[[str], None]


class NonFiniteError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the last good checkpoint is kept."""


@dataclass
class TrainState:
    """Counters and history; everything here goes into every checkpoint."""

    step: int = 0
    tokens: int = 0
    best_val: float | None = None
    best_step: int = 0
    evals_since_best: int = 0
    stop_reason: str | None = None
    skipped_steps: int = 0  # fp16 steps skipped by the grad scaler (inf/NaN gradients)
    log: list[dict[str, Any]] = field(default_factory=list)  # rows are filled at reading steps


@dataclass
class TrainResult:
    """What :func:`train` hands to the stage's outputs (``pipeline.training.outputs``)."""

    state: TrainState
    model: nn.Module
    best: Weights
    params: dict[str, int]
    finetune: dict[str, Any]
    fingerprint: dict[str, Any]
    device: str
    precision: str
    reproducible: bool
    resumed_from: str | None
    seconds: float
    steps_this_run: int
    tokens_this_run: int
    n_train_examples: int
    n_val_windows: int
    examples: int  # training examples (windows) consumed, all ranks
    padded_share: float | None  # padded positions among the training positions seen
    conditions: ConditionVocab | None = None  # the vocabulary of a conditioned run


@dataclass
class Pending:
    """Steps since the last reading step: their log rows and device values, read together."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)  # per step: (nll_sum, grad_norm);
    # compound: (nll_sum of each codebook..., grad_norm)
    n_targets: list[Any] = field(default_factory=list)  # int; compound: (K,) counts


@dataclass(frozen=True)
class Batches:
    """Where each step's examples come from."""

    stream: WindowStream  # the seeded, endless stream of training windows
    shard: Shard  # this rank's slice of each optimiser step (its rows)
    val: list[np.ndarray]  # validation windows, fixed
    seq_len: int  # T
    pad_id: int | np.ndarray  # compound: (K,) each codebook's PAD
    packed: PackedRows | None = None  # transformer.data.pack: rows of several windows
    val_cond: np.ndarray | None = None  # (len(val), K) condition ids of the validation windows
    cond_none: np.ndarray | None = None  # (K,) every slot's "none" id
    cond_dropout: float = 0.0  # probability a training window's conditions become "none"
    mask_ids: tuple[tuple[int, ...], ...] | None = None  # compound: ids never predicted, per
    # codebook (CPWord's Ignore_None); None for one id stream
    codebooks: tuple[str, ...] = ()  # compound: each codebook's key (log columns)

    def micro_batch(self, step: int, micro: int) -> Batch:
        """This rank's micro-batch ``micro`` of optimiser step ``step``: x, y, mask (B, T)
        (and segments when packed, conditions when conditioned)."""
        rows = self.shard.micro_positions(step, micro)
        if self.packed is not None:
            return self.packed.batch(rows, self.pad_id)
        b = self.stream.batch(rows, self.pad_id)
        if b.cond is None or self.cond_none is None:
            return b
        cond = drop_conditions(b.cond, self.cond_none, self.cond_dropout, self.stream.seed,
                               rows.start)
        return Batch(b.x, b.y, b.mask, b.segments, cond)

    def n_targets(self, step: int) -> int:
        """Valid targets of optimiser step ``step``, all ranks (from lengths, no tensors)."""
        rows = self.shard.step_positions(step)
        if self.packed is not None:
            return self.packed.n_targets(rows)
        return self.stream.n_targets(rows)

    def codebook_targets(self, step: int) -> np.ndarray:
        """Compound tokens: (K,) scored targets of each codebook in optimiser step ``step``, all
        ranks (the step's windows gathered on the host; no device values)."""
        b = self.stream.batch(self.shard.step_positions(step), self.pad_id)
        return codebook_counts(b.y, self.mask_ids or ())

    def examples(self, steps: int) -> int:
        """Training windows consumed by the first ``steps`` optimiser steps, all ranks."""
        rows = steps * self.shard.effective_batch
        return rows if self.packed is None else self.packed.start(rows)


@dataclass(frozen=True)
class Parts:
    """The model and what steps with it."""

    model: nn.Module  # unwrapped (LoRA layers included): evaluated and saved
    fwd: nn.Module  # what a training step calls: the model, DDP-wrapped and/or compiled
    ddp: DistributedDataParallel | None
    opt: torch.optim.AdamW
    sched: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler

    @property
    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


@dataclass(frozen=True)
class StepStats:
    nll_sum: torch.Tensor  # summed NLL over valid targets of the step (all ranks), on the device;
    # compound: (K,), one sum per codebook
    grad_norm: torch.Tensor  # before clipping, on the device
    lr: float
    n_tokens: int  # valid targets in the step, all ranks (compound: steps)
    skipped: bool  # fp16: the grad scaler skipped the update (inf/NaN gradients)
    counts: np.ndarray | None = None  # compound: (K,) scored targets of each codebook


def train(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus, ckpt_dir: Path, *,
          threads: int, dist: DistInfo | None = None,
          on_step: Callable[[TrainState], None] | None = None,
          echo: Echo = print, cond_dropout: float = 0.0) -> TrainResult:
    """Train (or resume) according to ``cfg``; checkpoints in ``ckpt_dir`` (rank 0 writes).

    A corpus with conditions (``corpus.conditions``) trains a conditioned model, each training
    window's conditions dropped to "none" with probability ``cond_dropout`` (``condition.dropout``).
    ``on_step`` is called after every completed step (after its checkpoint, if any); an
    exception raised there behaves like a kill. Global torch RNG state is forked, so the caller's
    RNG is left untouched.
    """
    dist = dist or DistInfo()
    torch.set_num_threads(threads)
    dev = make_device(cfg.device, cfg.precision, dist)
    fp = fingerprint(cfg, info, threads, dist.world_size,
                     conditions=condition_identity(corpus, cond_dropout))
    with torch.random.fork_rng(devices=dev.rng_devices):
        return _train(cfg, info, corpus, Path(ckpt_dir), dev, fp, on_step or _ignore,
                      echo if dist.is_main else _ignore, cond_dropout)


def _ignore(_: object) -> None:
    pass


def condition_identity(corpus: Corpus, cond_dropout: float) -> dict[str, Any] | None:
    """What the run identity records of the conditions (None for an unconditioned run, whose
    identity is then what it was before conditions existed)."""
    if corpus.conditions is None:
        return None
    v = corpus.conditions.vocab
    return {"names": list(v.names), "vocab_hash": v.hash, "ids_sha256": corpus.conditions.digest(),
            "dropout": cond_dropout}


def _train(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus, ckpt_dir: Path,
           dev: TrainDevice, fp: dict[str, Any], on_step: Callable[[TrainState], None],
           echo: Echo, cond_dropout: float) -> TrainResult:
    """:func:`train` inside the forked RNG: set up, resume, loop until a stop rule fires."""
    t0 = time.perf_counter()
    tr = cfg.train
    data = _batches(cfg, info, corpus, dev.dist, cond_dropout)

    # Set-up. Dropout draws from the default generators: seed them per rank (checkpoints keep their
    # states). The initial weights come from their own generator, the same on every rank.
    torch.manual_seed(cfg.seed + dev.dist.rank)
    vocab = corpus.cond_vocab
    model, ft_report = build_model(cfg.model, cfg.finetune, info.vocab_size,
                                   torch.Generator().manual_seed(cfg.seed),
                                   tokenizer_hash=info.tokenizer_hash,
                                   cond_slot_sizes=() if vocab is None else vocab.slot_sizes,
                                   codebook_sizes=info.codebook_sizes() or None)
    model.to(dev.device)
    opt = make_optimizer(model, cfg.optim, dev.device_type)
    sched = make_scheduler(opt, cfg.optim, tr.max_steps)
    scaler = torch.amp.GradScaler(dev.device_type, enabled=dev.use_scaler)

    # Resume: the newest readable checkpoint of this run, if any, replaces the fresh state.
    resume = open_resume(ckpt_dir, fp, cfg.checkpoint, dev.dist, echo)
    state, best = TrainState(), export_state(model)
    if resume.checkpoint is not None:
        state, best = _restore(resume.checkpoint, model, opt, sched, scaler, dev)
        echo(f"resumed from {resume.checkpoint.path} (step {state.step})")
    if state.stop_reason == "wall_clock":
        state.stop_reason = None  # a guard stop is a pause: continue the same run
    m = _wrap(model, opt, sched, scaler, dev, cfg.compile, cfg.activation_checkpointing)

    # The loop: one optimiser step, then the bookkeeping around it.
    last_ckpt = None if resume.checkpoint is None else resume.checkpoint.path
    start_step, start_tokens, guard_fired = state.step, state.tokens, False
    pending = Pending()
    t_train = time.perf_counter()
    while state.stop_reason is None:
        if state.step >= tr.max_steps:  # a finished run, resumed: nothing left to do
            state.stop_reason = "max_steps"
            break
        s = _train_step(m, data, state.step, dev, cfg.optim.grad_clip)
        state.step += 1
        state.tokens += s.n_tokens
        state.skipped_steps += int(s.skipped)
        row = {"step": state.step, "train_loss": None, "val_loss": None, "lr": s.lr,
               "grad_norm": None}
        for key in data.codebooks:
            row[f"train_loss_{key}"] = row[f"val_loss_{key}"] = None
        state.log.append(row)
        pending.rows.append(row)
        pending.values.append(torch.cat([s.nll_sum.reshape(-1), s.grad_norm.float()[None]]))
        pending.n_targets.append(s.n_tokens if s.counts is None else s.counts)
        state.stop_reason = _length_rule(state, tr)
        if state.stop_reason is None and _out_of_time(t0, tr.max_minutes, dev):
            state.stop_reason, guard_fired = "wall_clock", True
        if not (state.stop_reason or state.step == 1 or state.step % tr.log_every == 0
                or state.step % tr.eval_every == 0 or state.step % cfg.checkpoint.every == 0):
            on_step(state)
            continue
        # A reading step: fill the pending rows, stop on a non-finite step before any use.
        _read_pending(pending, dev, last_ckpt, data.codebooks)
        # No extra evaluation at a wall-clock pause: the resumed run must match an unpaused one.
        if state.step % tr.eval_every == 0 or state.stop_reason in ("max_steps", "max_tokens"):
            if data.mask_ids is None:
                row["val_loss"] = evaluate(m.model, data.val, data.seq_len, data.pad_id, dev,
                                           2 * tr.micro_batch, data.val_cond)
            else:
                row["val_loss"], per_book = evaluate_codebooks(
                    m.model, data.val, data.seq_len, data.pad_id, dev, 2 * tr.micro_batch,
                    data.mask_ids)
                for key, value in zip(data.codebooks, per_book, strict=True):
                    row[f"val_loss_{key}"] = value
            if _track_best(state, row["val_loss"], tr.patience):
                best = export_state(m.model)
        if state.step % tr.log_every == 0 or state.stop_reason or state.step == 1:
            tok_s = (state.tokens - start_tokens) / max(time.perf_counter() - t_train, 1e-9)
            echo(_log_line(state, row, tr.max_steps, data, tok_s))
        if state.step % cfg.checkpoint.every == 0 or state.stop_reason:
            last_ckpt = _save(ckpt_dir, state, m, best, fp, dev, data,
                              cfg.checkpoint) or last_ckpt
        on_step(state)

    if state.best_val is None:
        best, state.best_step = export_state(m.model), state.step  # no validation: last weights
    return TrainResult(
        state=state, model=m.model, best=best, params=param_counts(m.model), finetune=ft_report,
        fingerprint=fp, device=dev.device, precision=dev.precision,
        reproducible=not guard_fired, resumed_from=resume.resumed_from,
        seconds=time.perf_counter() - t0, steps_this_run=state.step - start_step,
        tokens_this_run=state.tokens - start_tokens, n_train_examples=len(data.stream),
        n_val_windows=len(data.val), examples=data.examples(state.step),
        padded_share=_padded_share(state, data), conditions=corpus.cond_vocab)


def _train_step(m: Parts, data: Batches, step: int, dev: TrainDevice, clip: float) -> StepStats:
    """Optimiser step ``step`` (0-based), in the order of the module docstring. Reads nothing
    from the device (but the fp16 grad scaler does, to decide whether to skip the update)."""
    # 1. The learning rate: the schedule set it when the previous step ended.
    lr = m.sched.get_last_lr()[0]
    # 2. Forward and backward, micro-batch by micro-batch; the loss is divided by the step's
    # global count of valid targets (not by grad_accum: micro-batches hold different counts).
    n_global = data.n_targets(step)
    if data.mask_ids is not None:
        return _compound_step(m, data, step, dev, clip, lr, n_global)
    nll_sum = torch.zeros((), device=dev.device)  # this rank's summed NLL, for the log
    for micro in range(data.shard.grad_accum):
        b = data.micro_batch(step, micro)  # x, y, mask: (B, T)
        last = micro == data.shard.grad_accum - 1
        packed = {} if b.segments is None else {"segments": b.segments.to(dev.device)}
        if b.cond is not None:
            packed["cond"] = b.cond.to(dev.device)
        with _no_sync(m.ddp, not last):
            with dev.autocast():
                _, nll = m.fwd(b.x.to(dev.device), b.y.to(dev.device), b.mask.to(dev.device),
                               reduction="sum", **packed)
            m.scaler.scale(nll * (data.shard.world_size / n_global)).backward()
        nll_sum += nll.detach().float()
    if m.ddp is not None:
        tdist.all_reduce(nll_sum)
    gnorm, skipped = _clip_and_update(m, clip)  # 3-5.
    return StepStats(nll_sum, gnorm, lr, n_global, skipped)


def _clip_and_update(m: Parts, clip: float) -> tuple[torch.Tensor, bool]:
    """Steps 3 to 5 of the module docstring; returns the gradient norm (on the device) and
    whether the fp16 grad scaler skipped the update."""
    # 3. Unscale and clip.
    if m.scaler.is_enabled():
        m.scaler.unscale_(m.opt)  # clip the true gradients, not the scaled ones
    gnorm = torch.nn.utils.clip_grad_norm_(m.trainable, clip if clip > 0 else math.inf)
    # 4. The loss and norm stay on the device until the next reading step (:func:`_read_pending`).
    # 5. Update, clear the gradients, move the schedule on.
    scale_before = m.scaler.get_scale() if m.scaler.is_enabled() else None
    m.scaler.step(m.opt)
    m.scaler.update()
    skipped = m.scaler.is_enabled() and m.scaler.get_scale() < scale_before
    m.opt.zero_grad(set_to_none=True)
    m.sched.step()  # sets the next step's lr
    return gnorm, skipped


def _compound_step(m: Parts, data: Batches, step: int, dev: TrainDevice, clip: float, lr: float,
                   n_global: int) -> StepStats:
    """:func:`_train_step` for compound tokens: the loss is the mean over codebooks of each
    codebook's NLL over the whole step's scored targets (module docstring), so each micro-batch's
    per-codebook sums are weighted by ``world_size / (N_k · K')``."""
    counts = data.codebook_targets(step)  # (K,) all ranks, from the host
    scored = counts > 0
    weight = np.where(scored, data.shard.world_size / (np.maximum(counts, 1)
                                                       * max(int(scored.sum()), 1)), 0.0)
    w = torch.as_tensor(weight, dtype=torch.float32, device=dev.device)  # (K,)
    nll_sum = torch.zeros(len(counts), device=dev.device)  # this rank's per-codebook sums
    for micro in range(data.shard.grad_accum):
        b = data.micro_batch(step, micro)  # x, y: (B, T, K); mask: (B, T)
        last = micro == data.shard.grad_accum - 1
        with _no_sync(m.ddp, not last):
            with dev.autocast():
                _, loss = m.fwd(b.x.to(dev.device), b.y.to(dev.device), b.mask.to(dev.device),
                                mask_ids=data.mask_ids)
            m.scaler.scale((loss.sums * w).sum()).backward()
        nll_sum += loss.sums.detach().float()
    if m.ddp is not None:
        tdist.all_reduce(nll_sum)
    gnorm, skipped = _clip_and_update(m, clip)
    return StepStats(nll_sum, gnorm, lr, n_global, skipped, counts)


def _read_pending(p: Pending, dev: TrainDevice, last_ckpt: Path | None,
                  codebooks: tuple[str, ...] = ()) -> None:
    """Read the pending steps' losses and norms in one transfer, fill their log rows, and stop on
    the first non-finite step. fp16 overflow is the grad scaler's to handle (it skips the update
    and lowers the scale), so only the loss counts there."""
    values = torch.stack(p.values).tolist() if p.values else []
    rows, n_targets = p.rows, p.n_targets
    p.rows, p.values, p.n_targets = [], [], []
    for row, (*sums, gnorm), n in zip(rows, values, n_targets, strict=True):
        row["grad_norm"] = gnorm
        if isinstance(n, int):
            row["train_loss"] = sums[0] / n
            continue
        per_book = [s / c if c else None for s, c in zip(sums, n.tolist(), strict=True)]
        for key, value in zip(codebooks, per_book, strict=True):
            row[f"train_loss_{key}"] = value
        scored = [v for v in per_book if v is not None]
        row["train_loss"] = math.fsum(scored) / len(scored) if scored else math.nan
    for row in rows:
        loss, gnorm = row["train_loss"], row["grad_norm"]
        if not math.isfinite(loss) or (not math.isfinite(gnorm) and not dev.use_scaler):
            where = (f"last good checkpoint: {last_ckpt}" if last_ckpt
                     else "no checkpoint written yet")
            raise NonFiniteError(
                f"non-finite value at step {row['step']}: train loss {loss}, grad norm {gnorm}; "
                f"stopped without saving ({where}; steps up to {rows[-1]['step']} ran and were "
                "discarded). Usual causes: learning rate too high, fp16 overflow (try precision: "
                "bf16 or fp32), or bad token ids (run `symkit doctor`).")


def _padded_share(state: TrainState, data: Batches) -> float | None:
    """Padded positions among the training positions seen (rows × T), all ranks."""
    positions = state.step * data.shard.effective_batch * data.seq_len
    return 1.0 - state.tokens / positions if positions else None


@torch.no_grad()
def evaluate(model: nn.Module, windows: list[np.ndarray], seq_len: int, pad_id: int,
             dev: TrainDevice, batch_size: int, cond: np.ndarray | None = None) -> float | None:
    """Token-weighted mean NLL (nats) over ``windows`` (with their (N, K) condition ids ``cond``
    for a conditioned model); None when there are none."""
    if not windows:
        return None
    was_training = model.training
    model.eval()
    sums = []
    for b0 in range(0, len(windows), batch_size):
        batch = make_batch(windows[b0 : b0 + batch_size], seq_len, pad_id,
                           None if cond is None else cond[b0 : b0 + batch_size])
        extra = {} if batch.cond is None else {"cond": batch.cond.to(dev.device)}
        with dev.autocast():
            _, nll = model(batch.x.to(dev.device), batch.y.to(dev.device),
                           batch.mask.to(dev.device), reduction="sum", **extra)
        sums.append(nll.float())
    model.train(was_training)
    total = 0.0
    for value in torch.stack(sums).tolist():  # one read; summed in float64 in batch order
        total += value
    count = sum(len(w) - 1 for w in windows)
    return total / max(count, 1)


@torch.no_grad()
def evaluate_codebooks(model: nn.Module, windows: list[np.ndarray], seq_len: int,
                       pad_id: np.ndarray, dev: TrainDevice, batch_size: int,
                       mask_ids: tuple[tuple[int, ...], ...]
                       ) -> tuple[float | None, list[float | None]]:
    """Compound tokens: the validation loss, the plain mean over codebooks of each codebook's
    mean NLL over its scored targets in ``windows`` (the training loss's definition, over all
    windows at once), and each codebook's mean (None for one without a scored target);
    ``(None, [])`` when there are no windows."""
    if not windows:
        return None, []
    was_training = model.training
    model.eval()
    sums, counts = [], []
    for b0 in range(0, len(windows), batch_size):
        batch = make_batch(windows[b0 : b0 + batch_size], seq_len, pad_id)
        with dev.autocast():
            _, loss = model(batch.x.to(dev.device), batch.y.to(dev.device),
                            batch.mask.to(dev.device), mask_ids=mask_ids)
        sums.append(loss.sums.float())
        counts.append(loss.counts)
    model.train(was_training)
    per_batch = torch.stack(sums).tolist()  # one read; summed in float64 in batch order
    n = torch.stack(counts).sum(dim=0).tolist()
    per_book = [math.fsum(row[k] for row in per_batch) / n[k] if n[k] else None
                for k in range(len(n))]
    scored = [v for v in per_book if v is not None]
    return (math.fsum(scored) / len(scored) if scored else None), per_book


# ------------------------------------------------------------------------------ set-up helpers
def _batches(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus,
             dist: DistInfo, cond_dropout: float = 0.0) -> Batches:
    T = cfg.model.max_seq_len
    conditioned = corpus.conditions is not None
    stream = WindowStream(corpus.train, T, cfg.seed, corpus.train_cond if conditioned else None)
    plan = val_window_plan(corpus.val, T, cfg.data.val_max_windows)
    val_cond = None
    if conditioned:
        k = corpus.conditions.vocab.n_slots
        val_cond = np.asarray([corpus.val_cond[e] for e, _ in plan], dtype=np.int64).reshape(-1, k)
    compound = bool(info.compound)
    return Batches(stream=stream,
                   shard=Shard(dist.rank, dist.world_size, cfg.train.micro_batch,
                               cfg.train.grad_accum),
                   val=[corpus.val[e][s : s + T + 1] for e, s in plan],
                   seq_len=T,
                   pad_id=np.asarray(info.codebook_ids("pad_id")) if compound else info.pad_id,
                   packed=PackedRows(stream) if cfg.data.pack else None,
                   val_cond=val_cond,
                   cond_none=corpus.conditions.vocab.none_ids() if conditioned else None,
                   cond_dropout=cond_dropout,
                   mask_ids=info.codebook_mask_ids() if compound else None,
                   codebooks=info.codebook_keys())


def _restore(c: ckpt.Checkpoint, model: nn.Module, opt: torch.optim.Optimizer,
             sched: torch.optim.lr_scheduler.LambdaLR, scaler: torch.amp.GradScaler,
             dev: TrainDevice) -> tuple[TrainState, Weights]:
    """Load checkpoint ``c`` into the fresh pieces -> (counters and log, best weights so far)."""
    model.load_state_dict(c.model)
    opt.load_state_dict(c.optimizer)
    sched.load_state_dict(c.state["scheduler"])
    if dev.use_scaler and c.state.get("scaler"):
        scaler.load_state_dict(c.state["scaler"])
    restore_rng(c.rng, dev)
    return TrainState(**c.state["train_state"]), c.best


def _wrap(model: nn.Module, opt: torch.optim.AdamW, sched: torch.optim.lr_scheduler.LambdaLR,
          scaler: torch.amp.GradScaler, dev: TrainDevice, compile_: bool,
          recompute: bool = False) -> Parts:
    """DDP-wrap (several processes) and compile (``transformer.compile``) the restored model;
    ``recompute`` turns on its activation checkpointing (``transformer.activation_checkpointing``;
    ``GPT`` and LoRA-wrapped ``GPT`` alike, since the adapters sit inside the blocks)."""
    model.activation_checkpointing = recompute
    ddp = None
    if dev.dist.world_size > 1:
        ids = [dev.dist.local_rank] if dev.device_type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
    wrapped = ddp or model
    wrapped.train()
    return Parts(model, torch.compile(wrapped) if compile_ else wrapped, ddp, opt, sched, scaler)


# ---------------------------------------------------------------------------- loop helpers
def _no_sync(ddp: DistributedDataParallel | None,
             skip: bool) -> contextlib.AbstractContextManager[object]:
    """DDP all-reduces gradients in every backward; ``skip`` defers that to a later micro-batch."""
    return ddp.no_sync() if skip and ddp is not None else contextlib.nullcontext()


def _length_rule(state: TrainState, tr: TrainSection) -> str | None:
    if tr.max_tokens and state.tokens >= tr.max_tokens:
        return "max_tokens"
    return "max_steps" if state.step >= tr.max_steps else None


def _out_of_time(t0: float, max_minutes: float | None, dev: TrainDevice) -> bool:
    """The wall-clock guard; ranks agree, so they all stop at the same step."""
    if max_minutes is None:
        return False
    if dev.dist.world_size == 1:  # nothing to agree on: no tensor, no device read
        return time.perf_counter() - t0 > 60 * max_minutes
    over = torch.tensor(float(time.perf_counter() - t0 > 60 * max_minutes),
                        device=dev.comm_device)
    if dev.dist.world_size > 1:
        tdist.all_reduce(over, op=tdist.ReduceOp.MAX)
    return bool(over.item())


def _track_best(state: TrainState, val: float | None, patience: int) -> bool:
    """Record a validation loss; True when it is the best so far (the caller keeps the weights).
    Sets ``early_stopping`` after ``patience`` evaluations without improvement."""
    if val is None:
        return False
    if state.best_val is None or val < state.best_val:
        state.best_val, state.best_step, state.evals_since_best = val, state.step, 0
        return True
    state.evals_since_best += 1
    if patience and state.evals_since_best >= patience and not state.stop_reason:
        state.stop_reason = "early_stopping"
    return False


def _log_line(state: TrainState, row: dict[str, Any], max_steps: int, data: Batches,
              tok_s: float) -> str:
    loss, val = row["train_loss"], row["val_loss"]
    val_txt = "" if val is None else f" | val {val:.4f} (ppl {math.exp(min(val, 50)):.2f})"
    examples = data.examples(state.step)
    return (f"step {state.step}/{max_steps} | examples {examples} | epoch "
            f"{examples / len(data.stream):.2f} | tokens {state.tokens}"
            f" | loss {loss:.4f} (ppl {math.exp(min(loss, 50)):.2f}){val_txt} | lr {row['lr']:.2e}"
            f" | grad_norm {row['grad_norm']:.3f} | {tok_s:.0f} tok/s")


def _save(ckpt_dir: Path, state: TrainState, m: Parts, best: Weights, fp: dict[str, Any],
          dev: TrainDevice, data: Batches, policy: CheckpointSection) -> Path | None:
    """Checkpoint after step ``state.step``: every rank gives its RNG state, rank 0 writes.
    Returns the folder on rank 0, None on the others."""
    rng = gather_rng(dev)
    if not dev.dist.is_main:
        return None
    return ckpt.save_checkpoint(
        ckpt_dir, state.step, model=export_state(m.model), best=best,
        optimizer=m.opt.state_dict(), rng=rng, keep_last=policy.keep_last,
        state={**fp, "train_state": asdict(state), "scheduler": m.sched.state_dict(),
               "data_position": data.examples(state.step),  # next stream position
               "scaler": m.scaler.state_dict() if dev.use_scaler else {},
               "model_config": m.model.config.to_dict()})

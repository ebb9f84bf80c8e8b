"""Replay one optimiser step of a training run: which pieces it saw, its loss and its gradient
norm, recomputed.

Training is deterministic (a seeded window stream, seeded initial weights and dropout, a fixed
thread count), and a resumed run equals an uninterrupted one. So step ``N`` can be recomputed
from the newest kept checkpoint at or before step ``N − 1`` (or from the initialisation when
none is kept) by running the same optimiser steps, with the loop's own pieces
(:func:`pipeline.training.loop._train_step` and the set-up around it), and no validation in
between (validation changes no state a step reads). On the machine and thread count of the run
the loss and norm equal the logged ones bit for bit, so the log's printed precision is met.

The pieces of a step come from the window stream: each row's example and window offset, and the
example's piece (``sha256``, and the transposition of an augmented copy) by the order
:func:`pipeline.training.data.load_corpus` reads them in (:func:`example_labels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.core.artifacts import read_parquet
from pipeline.tokens.contract import TokenInfo, read_tokens
from pipeline.training import checkpoint as ckpt
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import Corpus, _check_ids
from pipeline.training.device import DistInfo, make_device
from pipeline.training.loop import _batches, _restore, _train_step, _wrap, condition_identity
from pipeline.training.resume import FRESH_HINT, fingerprint
from pipeline.training.setup import build_model, make_optimizer, make_scheduler


@dataclass(frozen=True)
class Replayed:
    step: int
    """The replayed step, 1-based as in the log."""
    started_from: int
    """The step of the checkpoint it started from (0: the initialisation)."""
    loss: float
    """Nats per valid target of the step, as the log's ``train_loss``."""
    grad_norm: float
    """Before clipping, as the log's ``grad_norm``."""
    lr: float
    rows: pd.DataFrame
    """One row per window of the step: ``example``, ``offset`` (where the window starts in the
    example) and, with labels, ``sha256`` and ``transpose``."""


def example_labels(tokens: Path, info: TokenInfo, augmented: Path | None) -> pd.DataFrame:
    """``sha256`` and ``transpose`` (0 for the piece itself) of each training example, in the
    order :func:`pipeline.training.data.load_corpus` builds ``Corpus.train``."""
    table = read_tokens(tokens, ["sha256", "split", "track", "ids"])
    table = table.sort_values(["split", "sha256", "track"], kind="stable")
    rows = [(sha, 0) for sha, split, ids in zip(table["sha256"], table["split"], table["ids"],
                                                strict=True)
            if split == "train" and not _check_ids(np.asarray(ids, dtype=np.int64), info)]
    if augmented is not None and Path(augmented).exists():
        aug = read_parquet(augmented, columns=["sha256", "transpose", "ids"])
        aug = aug.sort_values(["sha256", "transpose"], kind="stable")
        rows += [(sha, int(t)) for sha, t, ids in zip(aug["sha256"], aug["transpose"],
                                                      aug["ids"], strict=True)
                 if not _check_ids(np.asarray(ids, dtype=np.int64), info)]
    return pd.DataFrame(rows, columns=["sha256", "transpose"])


def starting_checkpoint(ckpt_dir: Path, fp: dict, step: int) -> ckpt.Checkpoint | None:
    """The newest readable checkpoint of run ``fp`` in ``ckpt_dir`` taken at or before
    ``step − 1`` (after at most ``step − 1`` steps); None when none is kept."""
    for path in reversed(ckpt.list_checkpoints(ckpt_dir)):
        try:
            loaded = ckpt.load_checkpoint(path)
        except ckpt.CheckpointUnreadable:
            continue
        if int(loaded.state.get("step", 0)) <= step - 1:
            ckpt.check_compatible(path, loaded.state, fp, FRESH_HINT)
            return loaded
    return None


def replay(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus, ckpt_dir: Path,
           step: int, *, threads: int, cond_dropout: float = 0.0,
           labels: pd.DataFrame | None = None) -> Replayed:
    """Recompute step ``step`` (1-based) of the one-process run ``cfg`` (one seed, as
    :meth:`TransformerStageConfig.replicate` makes it) whose checkpoints are in ``ckpt_dir``."""
    if step < 1:
        raise ValueError(f"--step {step}: steps count from 1")
    dist = DistInfo()
    torch.set_num_threads(threads)
    dev = make_device(cfg.device, cfg.precision, dist)
    fp = fingerprint(cfg, info, threads, dist.world_size,
                     conditions=condition_identity(corpus, cond_dropout))
    with torch.random.fork_rng(devices=dev.rng_devices):
        data = _batches(cfg, info, corpus, dist, cond_dropout)
        torch.manual_seed(cfg.seed + dist.rank)  # as the loop seeds dropout
        vocab = corpus.cond_vocab
        model, _ = build_model(cfg.model, cfg.finetune, info.vocab_size,
                               torch.Generator().manual_seed(cfg.seed),
                               tokenizer_hash=info.tokenizer_hash,
                               cond_slot_sizes=() if vocab is None else vocab.slot_sizes)
        model.to(dev.device)
        opt = make_optimizer(model, cfg.optim, dev.device_type)
        sched = make_scheduler(opt, cfg.optim, cfg.train.max_steps)
        scaler = torch.amp.GradScaler(dev.device_type, enabled=dev.use_scaler)
        start = starting_checkpoint(ckpt_dir, fp, step)
        first = 0
        if start is not None:
            state, _ = _restore(start, model, opt, sched, scaler, dev)
            first = state.step
        m = _wrap(model, opt, sched, scaler, dev, cfg.compile,
                  cfg.activation_checkpointing)
        for k in range(first, step):
            s = _train_step(m, data, k, dev, cfg.optim.grad_clip)
    positions = data.shard.step_positions(step - 1)
    if data.packed is not None:
        positions = range(data.packed.start(positions.start), data.packed.start(positions.stop))
    ex, off = data.stream.positions(positions)
    rows = pd.DataFrame({"example": ex, "offset": off})
    if labels is not None:
        rows = rows.join(labels, on="example")
    return Replayed(step, first, float(s.nll_sum) / s.n_tokens, float(s.grad_norm), s.lr, rows)

"""The learning-rate range test (Smith, "Cyclical Learning Rates for Training Neural Networks",
2017; the form fastai popularised): train the configured model from its initialisation for a
few hundred steps while the learning rate grows exponentially from very small to very large,
and read where the loss falls fastest and where it blows up.

The rule that turns the curve into a suggestion: the loss of each step is smoothed by a
centred running median over :data:`HALF` steps each side (no lag: a moving average trails the
rising learning rate, and over 7 decades in 200 steps 50 steps of trail are 2 decades); the test
stops once the loss, having fallen beyond the noise of its first steps, climbs back above their
level (the loss of an untrained model, about ln of the vocabulary: the steps are now too large
to learn anything); the
suggested peak learning rate is the one at the smoothed minimum divided by :data:`DIVIDE` (the
loss is lowest just before the steps get too large; a tenth of it is still on the falling part
of the curve). The steepest descent is reported beside it. (The rule was changed twice after
runs on the chorales: a bias-corrected moving average, beta 0.98, with a stop at 4 times the
minimum, as fastai's ``lr_find`` has, trailed the learning rate by two decades and never
stopped; a stop at the first rise above the first steps' loss ended a flat start on noise:
docs/transformer.md.)

The steps use the training stage's own pieces: the model as ``build_model`` makes it, AdamW as
``make_optimizer`` makes it (weight decay, betas), the seeded window stream of the train split
and the configured micro-batch × accumulation as one batch, gradient clipping. No warm-up and
no schedule: the learning rate is the test's. Global RNG state is forked, as in training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.tokens.contract import TokenInfo
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import Corpus, WindowStream
from pipeline.training.setup import build_model, make_optimizer

START = 1e-7
END = 1.0
STEPS = 200
HALF = 7
DIVIDE = 10.0


@dataclass(frozen=True)
class RangeTest:
    lrs: list[float]
    """The learning rate of each step run (the test may stop before the last planned)."""
    losses: list[float]
    smoothed: list[float]
    suggestion: float | None
    """The learning rate at the smoothed minimum divided by :data:`DIVIDE`."""
    steepest: float | None
    """The learning rate where the smoothed loss falls fastest per log-step of learning rate."""
    stopped: str
    """``end`` (every planned step ran), ``diverged`` or ``non_finite``."""


def schedule(start: float = START, end: float = END, steps: int = STEPS) -> np.ndarray:
    """``steps`` learning rates growing geometrically from ``start`` to ``end``."""
    if not 0 < start < end or steps < 2:
        raise ValueError(f"lr-find: need 0 < start < end and at least 2 steps, got start={start}, "
                         f"end={end}, steps={steps}")
    return np.geomspace(start, end, steps)


def smooth(losses: list[float], half: int = HALF) -> list[float]:
    """The centred running median over ``half`` steps each side (fewer at the ends)."""
    x = np.asarray(losses, dtype=float)
    return [float(np.median(x[max(0, i - half): i + half + 1])) for i in range(x.size)]


def suggest(lrs: list[float], smoothed: list[float]) -> tuple[float | None, float | None]:
    """(suggestion, steepest): the learning rate at the smoothed minimum over :data:`DIVIDE`,
    and where the smoothed loss falls fastest against log learning rate."""
    s = np.asarray(smoothed, dtype=float)
    ok = np.isfinite(s)
    if ok.sum() < 3:
        return None, None
    idx = np.flatnonzero(ok)
    best = idx[int(np.argmin(s[ok]))]
    slope = np.gradient(s[ok], np.log(np.asarray(lrs, dtype=float)[ok]))
    return float(lrs[best]) / DIVIDE, float(np.asarray(lrs)[ok][int(np.argmin(slope))])


def _blown(losses: list[float]) -> bool:
    """Has the loss learned something and given it all back? Its first ``4 * HALF`` steps (at
    learning rates too small to move it) give the untrained level and its noise (robust sd);
    once the running median has fallen more than 3 such sds below that level, a median of the
    last ``HALF`` steps above it ends the test."""
    if len(losses) <= 4 * HALF:
        return False
    first = np.asarray(losses[: 4 * HALF])
    start = float(np.median(first))
    noise = 1.4826 * float(np.median(np.abs(first - start)))
    low = min(smooth(losses))
    return start - low > 3 * noise and float(np.median(losses[-HALF:])) > start


def range_test(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus, *,
               start: float = START, end: float = END, steps: int = STEPS,
               threads: int = 1) -> RangeTest:
    """Run the test (module docstring) on CPU in fp32 with ``threads`` torch threads."""
    lrs = schedule(start, end, steps)
    torch.set_num_threads(threads)
    tr = cfg.train
    rows = tr.micro_batch * tr.grad_accum
    stream = WindowStream(corpus.train, cfg.model.max_seq_len, cfg.seed)
    losses: list[float] = []
    stopped = "end"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # dropout draws from the default generator
        model, _ = build_model(cfg.model, cfg.finetune, info.vocab_size,
                               torch.Generator().manual_seed(cfg.seed),
                               tokenizer_hash=info.tokenizer_hash)
        model.activation_checkpointing = cfg.activation_checkpointing  # the memory of training
        model.train()
        opt = make_optimizer(model, cfg.optim, "cpu")
        trainable = [p for p in model.parameters() if p.requires_grad]
        for k, lr in enumerate(lrs):
            for group in opt.param_groups:
                group["lr"] = float(lr)
            b = stream.batch(range(k * rows, (k + 1) * rows), info.pad_id)
            _, loss = model(b.x, b.y, b.mask)
            value = float(loss.detach())
            if not math.isfinite(value):
                stopped = "non_finite"
                break
            loss.backward()
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(value)
            if _blown(losses):
                stopped = "diverged"
                break
    ran = [float(x) for x in lrs[: len(losses)]]
    smoothed = smooth(losses)
    suggestion, steepest = suggest(ran, smoothed)
    return RangeTest(ran, losses, smoothed, suggestion, steepest, stopped)

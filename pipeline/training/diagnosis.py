"""Diagnosis of a training run from its log: which symptoms it shows, at which step, and what
they most likely mean.

A seed's log (``reports/plots/train_log/seed-<s>.tsv``, or the log rows a checkpoint keeps) has
one row per optimiser step: ``step``, ``train_loss`` (nats per token of that step's batch),
``val_loss`` (at evaluation steps only), ``lr`` and ``grad_norm`` (before clipping).
:func:`diagnose` reads one log and the run's facts (:class:`RunFacts`: why it stopped, its step
budget and patience) and returns :class:`Flag` s. The constants were fixed from their
rationales before any run was read. Three rules were then extended once, after their first
measurement on planted faults, because a fault showed a symptom they had no words for: a loss
stuck near its first value (``plateau``'s first case, and ``lr_too_high``'s last), and slow
learning that memorises (``lr_too_low`` yields to ``overfitting``). The committed c91013e logs
had been read with the first rules; the extension changed no flag on them, and no rule was
changed for them. Each rule is named after the symptom it looks for:

- ``non_finite``: a NaN or infinite loss or gradient norm. The loop stops there (the last good
  checkpoint keeps the log).
- ``divergence``: the smoothed training loss (a running median over :data:`WINDOW` steps) climbs
  more than :data:`DIVERGE_NATS` above its best so far: a batch e times less likely on average
  than the model already managed is no fluctuation.
- ``loss_spike``: one step's loss more than :data:`SPIKE_SDS` robust standard deviations
  (1.4826 × the median absolute deviation, over the :data:`WINDOW` steps around it) and more
  than :data:`SPIKE_NATS` above the median of those steps: a batch the model found e times less
  likely than its neighbours, beyond what their spread explains.
- ``grad_norm_spike``: a gradient norm more than :data:`GRAD_FACTOR` times the median of the
  steps around it: an order of magnitude.
- ``plateau``: the training loss stops falling while it should still fall: after a quarter of
  the step budget it has fallen less than :data:`SLOW_DROP` of its first value and no longer
  falls (its least-squares drop over the second eighth is less than :data:`NOISE_SDS` standard
  errors), or over the second quarter, while the learning rate is at least :data:`HIGH_LR` of
  its peak, it does not fall. A run there normally still learns; a flat loss means it learns
  nothing more from its data.
- ``overfitting``: validation loss turns up while training loss goes on falling: the last
  evaluation lies more than :data:`NOISE_SDS` noise standard deviations above the lowest.
- ``early_stop_in_noise``: the run stopped early, and the evaluations after its best lie within
  :data:`NOISE_SDS` noise standard deviations of it: the stop was triggered by the validation
  estimate's noise, not shown to be overfitting.
- ``lr_too_high``: non-finite values, divergence, at least :data:`MANY_SPIKES` loss or
  gradient spikes while the learning rate is at least :data:`HIGH_LR` of its peak, or a loss
  spike at high learning rate followed by a loss stuck near its first value (a step too large
  threw the model where it cannot learn from).
- ``lr_too_low``: after a quarter of the budget the smoothed loss has fallen less than
  :data:`SLOW_DROP` of its first value, and it was still falling: learning is slow, not done.
  Not when validation turns up meanwhile (``overfitting``): slow learning that memorises is not
  a learning rate's doing (noisy labels are memorised slowly).

The noise of the validation estimate is measured from the validation curve itself: for a curve
that bends smoothly, the second differences of successive evaluations are mostly noise, with
variance 6σ²; σ is their robust spread over √6. It needs at least :data:`MIN_EVALS`
evaluations.

Pure functions: the same log gives the same flags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

WINDOW = 51
"""Steps around a step (25 each side) whose median and spread it is compared with."""
SPIKE_SDS = 6.0
SPIKE_NATS = 1.0
GRAD_FACTOR = 10.0
DIVERGE_NATS = 1.0
NOISE_SDS = 2.0
HIGH_LR = 0.5
MANY_SPIKES = 3
SLOW_DROP = 0.25
MIN_EVALS = 5
COLUMNS = ("step", "train_loss", "val_loss", "lr", "grad_norm")

CAUSES = {
    "non_finite": "a learning rate too high for this model and batch, an fp16 overflow, or a "
                  "batch with ids outside the vocabulary; lower transformer.optim.lr (symkit "
                  "lr-find) or use bf16/fp32",
    "divergence": "a learning rate too high (the loss climbed back up and stayed): lower "
                  "transformer.optim.lr or lengthen warmup_steps",
    "loss_spike": "an unusual batch (replay it: symkit replay --step N) or a learning rate at "
                  "the edge of stability",
    "grad_norm_spike": "an unusual batch or an unstable step; grad_clip bounds the update, so "
                       "a single spike is harmless, many are not",
    "plateau": "the model learns nothing more from these data while the learning rate is "
               "high: targets it cannot predict (noisy or shuffled labels), a model too small, "
               "or a learning rate too low or too high to make progress",
    "overfitting": "the model memorises its training pieces: fewer steps, more data, dropout "
                   "or weight decay",
    "early_stop_in_noise": "the validation estimate is too noisy for the patience: validate on "
                           "the full val set (transformer.data.val_max_windows: 0), raise "
                           "patience, or train a fixed step budget (patience: 0)",
    "lr_too_high": "lower transformer.optim.lr (symkit lr-find suggests one)",
    "lr_too_low": "raise transformer.optim.lr (symkit lr-find suggests one) or train longer",
}


@dataclass(frozen=True)
class RunFacts:
    """What the log alone does not say."""

    stop_reason: str | None = None
    """``max_steps``, ``early_stopping``, ... (``reports/train.json``); None: unknown."""
    max_steps: int | None = None
    patience: int | None = None
    val_max_windows: int | None = None

    @classmethod
    def of(cls, transformer: Mapping[str, Any], stop_reason: str | None = None) -> RunFacts:
        """The facts a ``transformer`` params section (or a checkpoint's config) gives: the step
        budget, patience and validation windows, with the run's ``stop_reason``."""
        train, data = transformer.get("train") or {}, transformer.get("data") or {}
        return cls(stop_reason=stop_reason, max_steps=train.get("max_steps"),
                   patience=train.get("patience"), val_max_windows=data.get("val_max_windows"))


@dataclass(frozen=True)
class Flag:
    kind: str
    step: int
    evidence: str
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_log(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A log as floats, sorted by step, one row per step (the last of duplicates): a TSV read
    into a frame, or a checkpoint's log rows."""
    frame = pd.DataFrame(list(rows) if not isinstance(rows, pd.DataFrame) else rows)
    for c in COLUMNS:
        frame[c] = pd.to_numeric(frame[c], errors="coerce") if c in frame else np.nan
    frame = frame[list(COLUMNS)].dropna(subset=["step"])
    return frame.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def robust_sd(x: np.ndarray) -> float:
    """1.4826 × the median absolute deviation: a normal's sd, unmoved by a few outliers."""
    x = x[np.isfinite(x)]
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if x.size else math.nan


def _around(x: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The running median and robust sd of the :data:`WINDOW` steps centred on each step."""
    roll = x.rolling(WINDOW, center=True, min_periods=5)
    return roll.median().to_numpy(), roll.apply(robust_sd, raw=True).to_numpy()


def val_noise(val: np.ndarray) -> float | None:
    """The noise sd of a validation curve, from its second differences (module docstring);
    None with fewer than :data:`MIN_EVALS` evaluations."""
    v = val[np.isfinite(val)]
    if v.size < MIN_EVALS:
        return None
    return robust_sd(v[:-2] - 2 * v[1:-1] + v[2:]) / math.sqrt(6)


def _drop(step: np.ndarray, loss: np.ndarray) -> tuple[float, float]:
    """(fitted drop over the span, its standard error): minus the least-squares slope times the
    span's length, the error from the residuals' robust spread."""
    t = step - step.mean()
    slope = float((t * (loss - loss.mean())).sum() / (t * t).sum())
    resid = loss - loss.mean() - slope * t
    span = float(step.max() - step.min())
    se = robust_sd(resid) / math.sqrt(float((t * t).sum())) * span
    return -slope * span, se


def diagnose(log: pd.DataFrame, facts: RunFacts = RunFacts()) -> list[Flag]:
    """The symptoms of one run (module docstring), in step order."""
    log = read_log(log)
    flags: list[Flag] = []
    if log.empty:
        return flags

    def flag(kind: str, step: float, evidence: str) -> None:
        flags.append(Flag(kind, int(step), evidence, CAUSES[kind]))

    step = log["step"].to_numpy()
    loss, grad, lr = (log[c].to_numpy() for c in ("train_loss", "grad_norm", "lr"))
    bad = ~np.isfinite(loss) | ~np.isfinite(grad)  # every step logs both
    if bad.any():
        i = int(np.argmax(bad))
        flag("non_finite", step[i], f"train loss {loss[i]:.4g}, gradient norm {grad[i]:.4g} at "
                                    f"step {int(step[i])}")
    finite = np.isfinite(loss)
    peak = float(np.nanmax(lr)) if np.isfinite(lr).any() else math.nan
    high = lr >= HIGH_LR * peak if math.isfinite(peak) else np.zeros_like(finite)

    med, sd = _around(log["train_loss"].where(finite))
    spikes = [i for i in range(len(step)) if finite[i] and np.isfinite(med[i])
              and loss[i] - med[i] > max(SPIKE_SDS * sd[i], SPIKE_NATS)]
    for i in spikes:
        flag("loss_spike", step[i], f"train loss {loss[i]:.3f} against a median of "
                                    f"{med[i]:.3f} (robust sd {sd[i]:.3f}) over the "
                                    f"{WINDOW} steps around it")
    gmed, _ = _around(log["grad_norm"].where(np.isfinite(grad)))
    gspikes = [i for i in range(len(step)) if np.isfinite(grad[i]) and np.isfinite(gmed[i])
               and grad[i] > GRAD_FACTOR * gmed[i]]
    for i in gspikes:
        flag("grad_norm_spike", step[i], f"gradient norm {grad[i]:.3g}, {grad[i] / gmed[i]:.0f} "
                                         f"times the median {gmed[i]:.3g} around it")

    smooth = med  # the running median the spikes were measured against
    best = np.fmin.accumulate(np.where(np.isfinite(smooth), smooth, np.inf))
    up = np.isfinite(smooth) & (smooth - best > DIVERGE_NATS)
    if up.any():
        i = int(np.argmax(up))
        flag("divergence", step[i], f"smoothed train loss {smooth[i]:.3f} at step {int(step[i])},"
                                    f" {smooth[i] - best[i]:.2f} nats above its best so far "
                                    f"({best[i]:.3f})")

    budget = facts.max_steps or int(step.max())
    span = finite & (step > budget / 4) & (step <= budget / 2) & high
    quarter = finite & (step <= budget / 4)
    stuck = False
    if quarter.sum() >= 20 and np.isfinite(smooth[quarter]).any():
        first = float(loss[finite][0])
        at = float(smooth[quarter][np.isfinite(smooth[quarter])][-1])
        tail = quarter & (step > budget / 8)
        drop, se = _drop(step[tail], loss[tail]) if tail.sum() >= 10 else (0.0, math.inf)
        said = (f"smoothed train loss {at:.3f} after a quarter of the budget, "
                f"{1 - at / first:.0%} below its first {first:.3f}")
        if first - at < SLOW_DROP * first:
            if drop > NOISE_SDS * se:
                flag("lr_too_low", step[quarter][-1], f"{said}, and still falling")
            else:
                stuck = True
                flag("plateau", step[quarter][-1], f"{said}, and no longer falling (fitted drop "
                                                   f"{drop:.3f}, standard error {se:.3f}, over "
                                                   f"steps {int(step[tail][0])}-"
                                                   f"{int(step[tail][-1])})")

    if not stuck and span.sum() >= 20 and step.max() >= budget / 2:
        drop, se = _drop(step[span], loss[span])
        if drop < NOISE_SDS * se:
            flag("plateau", step[span][0], f"train loss fell {drop:.3f} nats (standard error "
                                           f"{se:.3f}) over steps {int(step[span][0])}-"
                                           f"{int(step[span][-1])}, at {loss[span].mean():.3f} "
                                           f"nats, learning rate at least {HIGH_LR:.0%} of its "
                                           "peak")

    evals = log[np.isfinite(log["val_loss"])]
    noise = val_noise(evals["val_loss"].to_numpy())
    if noise is not None and len(evals):
        v, s = evals["val_loss"].to_numpy(), evals["step"].to_numpy()
        i_best = int(np.argmin(v))
        after = v[i_best + 1:]
        if after.size and v[-1] - v[i_best] > NOISE_SDS * noise:
            at_best = np.interp(s[i_best], step[np.isfinite(smooth)], smooth[np.isfinite(smooth)])
            if smooth[np.isfinite(smooth)][-1] < at_best:
                j = i_best + 1 + int(np.argmax(after - v[i_best] > NOISE_SDS * noise))
                flag("overfitting", s[j], f"val loss {v[-1]:.4f} at the last evaluation, "
                                          f"{v[-1] - v[i_best]:.4f} above its lowest "
                                          f"{v[i_best]:.4f} (step {int(s[i_best])}); the "
                                          f"estimate's noise sd is {noise:.4f}; train loss fell "
                                          "meanwhile")
        stopped_early = (facts.stop_reason == "early_stopping" if facts.stop_reason
                         else facts.max_steps is not None and step.max() < facts.max_steps)
        if stopped_early and after.size:
            rise = float(after.max() - v[i_best])
            if rise < NOISE_SDS * noise:
                windows = (f" on {facts.val_max_windows} validation windows"
                           if facts.val_max_windows else "")
                flag("early_stop_in_noise", step.max(),
                     f"stopped at step {int(step.max())}"
                     + (f" of {facts.max_steps}" if facts.max_steps else "")
                     + f": the {after.size} evaluations after the best ({v[i_best]:.4f} at step "
                     f"{int(s[i_best])}) rose at most {rise:.4f}, within {NOISE_SDS:g} times "
                     f"the validation estimate's noise sd ({noise:.4f}){windows}"
                     + (f", patience {facts.patience}" if facts.patience else ""))

    if any(f.kind == "overfitting" for f in flags):  # slow learning that memorises
        flags = [f for f in flags if f.kind != "lr_too_low"]
    unstable = [f for f in flags if f.kind in ("non_finite", "divergence")]
    spiky = sorted({int(step[i]) for i in set(spikes) | set(gspikes) if high[i]})
    thrown = stuck and any(high[i] for i in spikes)
    if unstable or len(spiky) >= MANY_SPIKES or thrown:
        what = sorted({f.kind for f in unstable}) + (
            [f"{len(spiky)} spikes at high learning rate"] if spiky else [])
        if thrown:
            what.append("the loss spiked, then stayed near its first value")
        flag("lr_too_high", min([f.step for f in unstable] + spiky),
             f"{', '.join(what)}; peak learning rate {peak:.3g}")
    return sorted(flags, key=lambda f: (f.step, f.kind))

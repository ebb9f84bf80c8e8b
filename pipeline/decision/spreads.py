"""The spreads the decision's controls simulate at, measured, never written in code.

How often a rule passes a good model depends on how noisy its evidence is: the gain's standard
error over test groups and over training seeds, the gap's standard error, how much pieces differ
in NLL per note (which turns a gap into the AUC a membership attack reaches), and how often
held-out human windows are flagged. :class:`Spreads` holds those numbers with where each came
from:

- :func:`from_pilot`, for ``symkit preregister``: a *val pilot*, the models trained and scored on
  val only (``evaluate.splits: [val]``), before any test piece is scored. The gain's spreads come
  from evaluate's power block (val's per-group spread scaled to the registered test groups, and
  the spread of the per-seed gains); the gap's from val's gap against the train subset, rescaled
  to the registered held-out count; the pieces' spread from val's per-piece table; the human flag
  rate from the audit's calibration (each flag metric flags ``1 − flag_quantile`` of val windows,
  and windows that one metric flags the others mostly flag too).
- :func:`from_run`, for ``symkit report``: the same quantities as the run measured them on
  test (the groups-only interval of the test gain, the per-seed test gains, each seed's gap
  interval, the held-out pieces, the audit's human test windows).

The gap has two spreads: each seed's standard error (its group bootstrap: the pieces' noise,
which every seed shares, since all score the same pieces) and the spread of the seeds' gaps
around each other (what training adds). A rule judged on every seed meets the first once and
the second once per seed.

Every figure is a standard error or a rate, in the units the rule judges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from pipeline.decision.metrics import number

PAIR = "ngram_minus_transformer"
MODEL = "transformer"


class SpreadsUnavailable(ValueError):
    """A spread cannot be measured from what exists; the message says what is missing."""


@dataclass(frozen=True)
class Spreads:
    gain_se_groups: float
    """Standard error of the relative gain from the test groups alone."""
    gain_seed_sd: float
    """Standard deviation of the per-seed relative gains."""
    gap_se_note: float
    """Standard error of one seed's held-out − train gap, nats per note."""
    gap_se_token: float
    """The same per token."""
    piece_sd_note: float
    """Spread over held-out pieces of the model's NLL per note (one seed's; :func:`robust_sd`)."""
    human_flag_rate: float
    """Share of held-out human windows the audit flags."""
    gap_seed_sd_note: float | None = None
    """Standard deviation of the per-seed gaps on the same pieces, nats per note: how much
    training seeds disagree once the pieces are fixed. None (a registration stated before it
    was measured): the controls draw the seeds' gaps independently, the hardest case for a good
    model."""
    gap_seed_sd_token: float | None = None
    """The same per token."""
    source: dict[str, str] = field(default_factory=dict)
    """Field -> where it was measured, in words."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Spreads:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def _se(block: Any, level: float, lo: str = "ci_low", hi: str = "ci_high") -> float | None:
    if not isinstance(block, Mapping):
        return None
    a, b = number(block.get(lo)), number(block.get(hi))
    return (b - a) / (2 * _z(level)) if a is not None and b is not None else None


def _per_seed_gap_se(gap: Mapping[str, Any], unit: str, level: float) -> float | None:
    """The mean, over seeds, of each seed's gap standard error (its own group bootstrap); the
    groups-only interval of the pooled gap when the seeds' blocks are missing."""
    seeds = gap.get("per_seed") if isinstance(gap.get("per_seed"), Mapping) else {}
    ses = [_se(b.get(unit), level) for b in seeds.values() if isinstance(b, Mapping)]
    ses = [s for s in ses if s is not None]
    if ses:
        return float(np.mean(ses))
    return _se(gap.get(unit), level, "groups_ci_low", "groups_ci_high")


def _per_seed_gap_sd(gap: Mapping[str, Any], unit: str) -> float | None:
    """The standard deviation of the seeds' own gaps (``gap.per_seed.<seed>.<unit>.value``):
    the seeds scored the same pieces, so this is what training adds to the pieces' noise. None
    with fewer than two seeds."""
    seeds = gap.get("per_seed") if isinstance(gap.get("per_seed"), Mapping) else {}
    values = [number((b.get(unit) or {}).get("value")) for b in seeds.values()
              if isinstance(b, Mapping) and isinstance(b.get(unit), Mapping)]
    values = [v for v in values if v is not None]
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def robust_sd(values: np.ndarray) -> float:
    """The spread of the middle half as a normal's standard deviation (interquartile range /
    1.349): a few pieces whose NLL per note is far out (a piece of few notes and many tokens)
    would inflate the plain one, and the AUC this spread converts to is a rank statistic they
    barely move."""
    q1, q3 = np.percentile(values, [25, 75])
    return float((q3 - q1) / 1.349)


def piece_sd(per_piece: pd.DataFrame, splits: tuple[str, ...], unit: str = "n_notes") -> float:
    """Spread over pieces of the model's NLL per note (per ``unit``) in ``splits``
    (:func:`robust_sd`), the mean over its seeds."""
    rows = per_piece[(per_piece["model"] == MODEL) & per_piece["split"].isin(splits)]
    if rows.empty:
        raise SpreadsUnavailable(f"the per-piece table has no {MODEL} rows of {list(splits)}")
    per = rows["nll_nats"] / rows[unit].where(rows[unit] > 0)
    sds = [robust_sd(v.dropna().to_numpy()) for _, v in per.groupby(
        rows["seed"].fillna(-1), sort=True) if v.notna().sum() > 3]
    if not sds:
        raise SpreadsUnavailable("too few pieces to measure the pieces' spread")
    return float(np.mean(sds))


def _piece_var_ratio(per_piece: pd.DataFrame, held: int, train: int, held_now: int,
                     train_now: int) -> float:
    """How the gap's variance scales from (``held_now``, ``train_now``) pieces to (``held``,
    ``train``): ``(sd_h²/held + sd_t²/train) / (sd_h²/held_now + sd_t²/train_now)``."""
    sh = piece_sd(per_piece, ("val", "test"))
    st = piece_sd(per_piece, ("train",))
    return (sh * sh / max(held, 1) + st * st / max(train, 1)) / \
        (sh * sh / max(held_now, 1) + st * st / max(train_now, 1))


def from_pilot(eval_report: Mapping[str, Any], per_piece: pd.DataFrame, *, held_out: int,
               train_pieces: int, flag_quantile: float, level: float) -> Spreads:
    """Spreads for a registration, from a val pilot (``eval_report`` and ``per_piece`` of an
    evaluate run that scored val only). ``held_out``: the val and test pieces the registered
    gap will pool; ``train_pieces``: its train subset."""
    power = (eval_report.get("power") or {}).get(PAIR)
    if not isinstance(power, Mapping) or number(power.get("se_groups")) is None:
        raise SpreadsUnavailable(f"reports/eval.json has no power.{PAIR} block: run the val "
                                 "pilot first (evaluate.splits: [val])")
    gap = (eval_report.get("gap") or {}).get(MODEL)
    if not isinstance(gap, Mapping):
        raise SpreadsUnavailable("reports/eval.json has no gap block: the pilot must score a "
                                 "train subset beside val (evaluate.train_pieces)")
    n_held = int(gap.get("n_pieces_heldout") or 0)
    n_train = int(gap.get("n_pieces_train") or 0)
    scale = math.sqrt(_piece_var_ratio(per_piece, held_out, train_pieces, n_held, n_train))
    se_note = _per_seed_gap_se(gap, "nats_per_note", level)
    se_token = _per_seed_gap_se(gap, "nats_per_token", level)
    if se_note is None or se_token is None:
        raise SpreadsUnavailable("the pilot's gap has no interval")
    where = (f"val pilot: {n_held} val and {n_train} train pieces, rescaled to {held_out} "
             f"held-out and {train_pieces} train pieces by the pieces' spreads")
    seeds_where = (f"val pilot: the seeds' gaps on {n_held} val and {n_train} train pieces, "
                   "not rescaled (what seeds disagree on need not average out over pieces)")
    return Spreads(
        gain_se_groups=float(power["se_groups"]),
        gain_seed_sd=float(number(power.get("seed_sd")) or 0.0),
        gap_se_note=se_note * scale, gap_se_token=se_token * scale,
        piece_sd_note=piece_sd(per_piece, ("val",)),
        human_flag_rate=1.0 - flag_quantile,
        gap_seed_sd_note=_per_seed_gap_sd(gap, "nats_per_note"),
        gap_seed_sd_token=_per_seed_gap_sd(gap, "nats_per_token"),
        source={"gain_se_groups": f"val pilot: val's {power.get('n_groups_observed')} groups' "
                                  f"spread scaled to {power.get('n_groups')} test groups",
                "gain_seed_sd": f"val pilot: {power.get('n_seeds')} seeds' val gains",
                "gap_se_note": where, "gap_se_token": where,
                "piece_sd_note": "val pilot: val pieces' NLL per note",
                "gap_seed_sd_note": seeds_where, "gap_seed_sd_token": seeds_where,
                "human_flag_rate": "the audit's calibration: 1 − audit.flag_quantile of "
                                   "held-out windows"})


def from_run(eval_report: Mapping[str, Any], per_piece: pd.DataFrame,
             audit_report: Mapping[str, Any] | None, *, level: float) -> Spreads:
    """Spreads as the run measured them on test (for ``symkit report``)."""
    gain = (((eval_report.get("paired") or {}).get(PAIR) or {}).get("test") or {}) \
        .get("rel_improvement")
    se_groups = _se(gain, level, "groups_ci_low", "groups_ci_high")
    if se_groups is None:
        raise SpreadsUnavailable("reports/eval.json has no test gain with a groups-only "
                                 "interval")
    seeds = [number(v) for v in ((gain or {}).get("per_seed") or {}).values()]
    seeds = [v for v in seeds if v is not None]
    gap = (eval_report.get("gap") or {}).get(MODEL) or {}
    se_note = _per_seed_gap_se(gap, "nats_per_note", level)
    se_token = _per_seed_gap_se(gap, "nats_per_token", level)
    flags = ((audit_report or {}).get("flag_rate") or {}).get("human_test")
    if se_note is None or se_token is None or number(flags) is None:
        raise SpreadsUnavailable("the run lacks a gap interval or the audit's human test rate")
    return Spreads(
        gain_se_groups=se_groups,
        gain_seed_sd=float(np.std(seeds, ddof=1)) if len(seeds) > 1 else 0.0,
        gap_se_note=se_note, gap_se_token=se_token,
        piece_sd_note=piece_sd(per_piece, ("val", "test")),
        human_flag_rate=float(flags),
        gap_seed_sd_note=_per_seed_gap_sd(gap, "nats_per_note"),
        gap_seed_sd_token=_per_seed_gap_sd(gap, "nats_per_token"),
        source={"gain_se_groups": "test gain's groups-only interval",
                "gain_seed_sd": f"{len(seeds)} seeds' test gains",
                "gap_se_note": "each seed's gap interval", "gap_se_token": "each seed's gap "
                "interval", "piece_sd_note": "held-out pieces' NLL per note",
                "gap_seed_sd_note": "the seeds' gaps", "gap_seed_sd_token": "the seeds' gaps",
                "human_flag_rate": "the audit's human test windows"})


def auc_for_gap(gap: float, sd: float) -> float:
    """The AUC a loss attack reaches when training pieces' NLL per note sits ``gap`` below
    held-out pieces', both normal with standard deviation ``sd`` (binormal):
    ``Φ(gap / (sd · √2))``."""
    return NormalDist().cdf(gap / (sd * math.sqrt(2))) if sd > 0 else (1.0 if gap > 0 else 0.5)

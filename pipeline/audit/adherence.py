"""Does a conditioned model follow its condition? Adherence of samples to the requested labels.

A sample drawn under a requested condition (``key: G major``) is decoded, its condition measured
from its own notes by the conditions stage's code (:func:`pipeline.conditions.table.measure`),
and counted as adhering when the measured label equals the requested one. The rate means little
alone, so it is read against three references, each with a bootstrap interval:

- **ceiling**: held-out human windows of the same length, measured the same way, against their
  own piece's label (a window of a G major chorale need not measure as G major);
- **floor**: the same model's unconditioned samples against the same requests (what the model
  does when it is not told);
- **shuffled**: the conditioned samples against the requests permuted among them (the rate an
  unrelated request reaches: with few labels, or one dominant label, it is far from 0).

A model that follows its condition lies above the floor and the shuffled rate, and at best
near the ceiling. Only conditions measured from notes are judged (key, mode, density,
polyphony); meter and tempo are measured from the decoded MIDI only when the tokenizer writes
time signatures or tempos, and are listed as not measurable otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.conditions.config import ConditionConfig
from pipeline.conditions.table import FROM_NOTES, measured_labels
from pipeline.stats.bootstrap import bootstrap_weights, percentile_interval


def matches(requested: Sequence[Mapping[str, Any]], measured: Sequence[Mapping[str, Any]],
            name: str) -> np.ndarray:
    """Per pair, 1.0 when the measured label equals the requested one, 0.0 when it differs, NaN
    when nothing was requested for ``name`` (that pair does not count)."""
    out = np.full(len(requested), np.nan)
    for i, (r, m) in enumerate(zip(requested, measured, strict=True)):
        want = r.get(name)
        if want is None or (isinstance(want, float) and np.isnan(want)):
            continue
        out[i] = float(m.get(name) == want)
    return out


def rate(hits: np.ndarray, units: Sequence[str], *, seed: int, n_boot: int,
         level: float, replicates: bool = False) -> dict[str, Any]:
    """Share of counted pairs that match, with a percentile interval from a bootstrap over
    ``units`` (a sample, or a human piece whose windows are correlated). ``replicates`` keeps
    the bootstrap replicates under ``"reps"`` (for :func:`difference`)."""
    hits = np.asarray(hits, dtype=np.float64)
    keep = ~np.isnan(hits)
    if not keep.any():
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0, "units": 0,
                **({"reps": None} if replicates else {})}
    labels, codes = np.unique(np.asarray(units, dtype=object)[keep].astype(str),
                              return_inverse=True)
    num = np.bincount(codes, weights=hits[keep], minlength=len(labels))
    den = np.bincount(codes, minlength=len(labels)).astype(np.float64)
    w = bootstrap_weights(len(labels), n_boot, np.random.default_rng(seed))
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (w @ num) / (w @ den)
    lo, hi = percentile_interval(reps, level)
    return {"value": float(num.sum() / den.sum()), "ci_low": lo, "ci_high": hi,
            "n": int(keep.sum()), "units": len(labels), **({"reps": reps} if replicates else {})}


def difference(a: Mapping[str, Any], b: Mapping[str, Any], level: float) -> dict[str, Any]:
    """``a − b`` of two rates drawn on different units, each bootstrapped on its own (replicate
    ``i`` of the difference is ``a``'s ``i``-th minus ``b``'s), with its percentile interval."""
    if a.get("reps") is None or b.get("reps") is None:
        return {"value": None, "ci_low": None, "ci_high": None}
    lo, hi = percentile_interval(a["reps"] - b["reps"], level)
    return {"value": a["value"] - b["value"], "ci_low": lo, "ci_high": hi}


def shuffled_requests(requested: Sequence[Mapping[str, Any]], seed: int
                      ) -> list[Mapping[str, Any]]:
    """The requests permuted among the samples by a generator seeded with ``seed``."""
    order = np.random.default_rng(seed).permutation(len(requested))
    return [requested[int(i)] for i in order]


def adherence(names: Sequence[str], *, requested: Sequence[Mapping[str, Any]],
              conditioned: Sequence[Mapping[str, Any]],
              unconditioned: Sequence[Mapping[str, Any]],
              human_own: Sequence[Mapping[str, Any]], human: Sequence[Mapping[str, Any]],
              human_units: Sequence[str], measurable: Mapping[str, bool], seed: int = 0,
              n_boot: int = 2000, level: float = 0.95) -> dict[str, Any]:
    """Per condition in ``names``: the conditioned samples' rate (``requested[i]`` against
    ``conditioned[i]``, measured labels) and the references: ``floor`` (``unconditioned[i]``,
    paired with the requests in turn), ``shuffled`` (the conditioned samples against permuted
    requests) and ``ceiling`` (``human[j]`` against its piece's ``human_own[j]``, resampled by
    ``human_units``). ``measurable``: whether the condition can be measured from a sample."""
    n = len(requested)
    units = [str(i) for i in range(n)]
    floor_req = [requested[i % n] for i in range(len(unconditioned))] if n else []
    shuffled = shuffled_requests(requested, seed)
    kw = {"seed": seed, "n_boot": n_boot, "level": level, "replicates": True}
    out: dict[str, Any] = {}
    for name in names:
        if not measurable.get(name, False):
            out[name] = {"measurable": False}
            continue
        rates = {
            "rate": rate(matches(requested, conditioned, name), units, **kw),
            "floor": rate(matches(floor_req, unconditioned, name),
                          [str(i) for i in range(len(unconditioned))],
                          **{**kw, "seed": seed + 1}),
            "shuffled": rate(matches(shuffled, conditioned, name), units,
                             **{**kw, "seed": seed + 2}),
            "ceiling": rate(matches(human_own, human, name), human_units,
                            **{**kw, "seed": seed + 3}),
        }
        out[name] = {
            "measurable": True,
            **{k: {x: v for x, v in r.items() if x != "reps"} for k, r in rates.items()},
            # registrable: does the model follow its request more often than when not told,
            # and more often than an unrelated request matches?
            "minus_floor": difference(rates["rate"], rates["floor"], level),
            "minus_shuffled": difference(rates["rate"], rates["shuffled"], level),
        }
    return out


def measurable_conditions(names: Sequence[str], tokenizer: Any) -> dict[str, bool]:
    """Which conditions a decoded sample can show: the note conditions always; meter and tempo
    when the tokenizer writes time signatures or tempos; metadata columns never."""
    config = getattr(tokenizer, "config", None)
    writes = {"meter": bool(getattr(config, "use_time_signatures", False)),
              "tempo": bool(getattr(config, "use_tempos", False))}
    return {n: n in FROM_NOTES or writes.get(n, False) for n in names}


def window_labels(tokenizer: Any, ids: np.ndarray, cfg: ConditionConfig) -> dict[str, Any]:
    """The labels a window of token ids measures as (all None when it does not decode)."""
    from pipeline.conditions.extract import first_meter, first_tempo_qpm
    from pipeline.music.midi import score_notes
    from pipeline.tokens.tokenizer import decode_ids

    score, err = decode_ids(tokenizer, [int(i) for i in ids])
    if err is not None or score is None:
        return measured_labels(None, cfg)
    return measured_labels(score_notes(score), cfg, first_meter(score), first_tempo_qpm(score))


def audit_adherence(samples: Any, tokenizer: Any, heldout: Any, conditions: Any, *,
                    width: int, stride: int, max_windows: int, cfg: ConditionConfig,
                    seed: int, n_boot: int, level: float) -> dict[str, Any]:
    """audit.json's ``adherence``: per model with ``conditioned`` samples, :func:`adherence` of
    each requested condition, every window being a sample's first ``width`` generated ids or a
    held-out piece's window (``heldout``: val and test token rows; ``conditions``: the condition
    table, the human windows' own labels). Empty without conditioned samples."""
    from pipeline.audit.memorisation import window_offsets

    if "kind" not in samples or not (samples["kind"] == "conditioned").any():
        return {}
    import json

    own = conditions.set_index("sha256")
    human, human_units, human_rows = [], [], []
    for _, r in heldout.sort_values(["sha256", "track"], kind="stable").iterrows():
        ids = np.asarray(r["ids"], dtype=np.int64)
        label_row = own.loc[r["sha256"]].to_dict() if r["sha256"] in own.index else {}
        for off in window_offsets(ids.size, width, stride, max_windows):
            human.append(window_labels(tokenizer, ids[off: off + width], cfg))
            human_units.append(str(r["sha256"]))
            human_rows.append(label_row)

    def generated(rows: Any) -> list[dict[str, Any]]:
        return [window_labels(tokenizer, np.asarray(r["ids"])[int(r["prompt_len"]):]
                              [:width], cfg) for _, r in rows.iterrows()]

    out = {}
    for model in sorted(samples.loc[samples["kind"] == "conditioned", "model"].unique()):
        mine = samples[samples["model"] == model].sort_values("index", kind="stable")
        cond = mine[mine["kind"] == "conditioned"]
        requested = [json.loads(c) for c in cond["condition"]]
        names = list(requested[0]) if requested else []
        human_own = [{n: row.get(n) for n in names} for row in human_rows]
        out[model] = {
            "conditions": names, "n_conditioned": len(cond),
            "n_unconditional": int((mine["kind"] == "unconditional").sum()),
            "n_human_windows": len(human), "window": width,
            **adherence(names, requested=requested, conditioned=generated(cond),
                        unconditioned=generated(mine[mine["kind"] == "unconditional"]),
                        human_own=human_own, human=human, human_units=human_units,
                        measurable=measurable_conditions(names, tokenizer), seed=seed,
                        n_boot=n_boot, level=level)}
    return out

"""The report's first screen: what the experiment is, what was decided, and why, in words.

- :func:`experiment_rows`: the experiment's identity in five short rows (corpus, split,
  tokenizer, models, registration).
- :func:`decision_sentence`: the overall decision and the count of verdicts behind it.
- :func:`plain_evidence`: one sentence per criterion, with its numbers and interval, for the
  criteria the project ships (the metrics of :data:`pipeline.decision.metrics.METRICS`), and
  for a guard judged on every training seed, each seed's number, interval and verdict;
  any other rule keeps :func:`pipeline.decision.criteria.evaluate`'s generic sentence.
- :func:`gain_rows`: the transformer's per-note gain over the n-gram on each scored split, pooled
  and per training seed, for the headline forest plot.

Every number comes from the flat metrics (``reports/metrics.json``, built from the stage
reports) or from params.yaml: nothing is written by hand. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.decision.criteria import Verdict
from pipeline.decision.metrics import number
from pipeline.render.compare_figures import ForestRow
from pipeline.render.document import NA

Metrics = Mapping[str, Any]


def _num(metrics: Metrics, key: str) -> float | None:
    return number(metrics.get(key))


def _int(metrics: Metrics, key: str) -> int | None:
    v = _num(metrics, key)
    return None if v is None else int(v)


def _pct(x: float | None, digits: int = 1) -> str:
    return NA if x is None else f"{abs(x) * 100:.{digits}f}%"


def _points(x: float | None) -> str:
    """A difference of two rates in percentage points, unsigned."""
    return NA if x is None else f"{abs(x) * 100:.1f} points"


def _g(x: float | None, digits: int = 2) -> str:
    return NA if x is None else f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{digits + 1}g}"


def _seeds(metrics: Metrics) -> list[int]:
    seeds, k = [], 0
    while (s := _int(metrics, f"eval.seeds.transformer.{k}")) is not None:
        seeds.append(s)
        k += 1
    return seeds


# ---- identity -------------------------------------------------------------------------------
def experiment_rows(params: Mapping[str, Any], metrics: Metrics,
                    split_counts: Mapping[str, tuple[int, int]],
                    registration: str) -> list[list[str]]:
    """Rows of the "Experiment" table: label, one line of facts. ``split_counts``: split ->
    (pieces, groups); ``registration``: the registration status and where it was committed."""
    corpus = (params.get("corpus") or {}).get("source", NA)
    ok, quarantined = _int(metrics, "data.pieces_ok"), _int(metrics, "data.pieces_quarantined")
    dup = _int(metrics, "data.pieces_duplicate")
    corpus_text = f"{corpus}: {ok if ok is not None else NA} pieces" + (
        f" ({quarantined} quarantined, {dup} byte duplicates set aside)"
        if quarantined is not None and dup is not None else "")
    order = [s for s in ("train", "val", "test") if s in split_counts]
    split_hash = str(metrics.get("split.hash") or NA)[:12]
    split_text = (" / ".join(f"{s} {split_counts[s][0]}" for s in order) + " pieces in "
                  + " / ".join(str(split_counts[s][1]) for s in order) + " groups"
                  if order else NA) + f"; split hash {split_hash}"
    tok = metrics.get("tokenize.tokenizer", NA)
    model = metrics.get("tokenize.model")
    vocab, base = _int(metrics, "tokenize.vocab_size"), _int(metrics, "tokenize.base_vocab_size")
    tok_text = str(tok) + (f" + {model}" if model and model != "none" else "") + (
        f", {vocab} tokens" if vocab is not None else "") + (
        f" (base {base})" if base is not None and base != vocab else "")
    order_n = _int(metrics, "ngram.best_order")
    smoothing = (params.get("ngram") or {}).get("smoothing", "")
    n_params = _num(metrics, "train.params.total")
    seeds = _seeds(metrics)
    models = (f"{order_n}-gram ({smoothing})" if order_n is not None else "n-gram: " + NA)
    models += (f"; transformer of {n_params / 1e6:.2f} M parameters" if n_params is not None
               else "; transformer: " + NA)
    if seeds:
        models += (f", {len(seeds)} training seeds ({', '.join(map(str, seeds))})"
                   if len(seeds) > 1 else f", training seed {seeds[0]}")
    return [["corpus", corpus_text], ["split", split_text], ["tokenizer", tok_text],
            ["models", models], ["registration", registration]]


def decision_sentence(decision: str, verdicts: list[Verdict], rules: str | None = None) -> str:
    """``Decision: FAIL. At least one registered criterion fails. Of 8 criteria, 4 pass, 3 fail
    and 1 is inconclusive.`` ``rules``: what the registered rules give, said when the decision
    is the registration's status instead."""
    n = len(verdicts)
    counts = [(sum(v.status == s for v in verdicts), word) for s, word in
              (("PASS", "pass"), ("FAIL", "fail"), ("INCONCLUSIVE", "inconclusive"))]
    parts = [f"{c} {'is inconclusive' if c == 1 else 'are inconclusive'}"
             if w == "inconclusive" else f"{c} {w}" for c, w in counts if c]
    if not parts:
        listed = "none is judged"
    elif len(parts) == 1:
        listed = parts[0]
    else:
        listed = ", ".join(parts[:-1]) + " and " + parts[-1]
    head = f"Decision: {decision}."
    why = {"PASS": "Every registered criterion passes.",
           "FAIL": "At least one registered criterion fails.",
           "INCONCLUSIVE": "No criterion fails, but not all pass: the data cannot tell yet.",
           "DEVIATED": "The experiment differs from its registration (see the deviations).",
           "NOT REGISTERED": "No registration: the criteria were not frozen before scoring.",
           "FOLLOWED, ORDER NOT SHOWN": "The registration is followed, but git does not show it "
                                        "committed before the results."}
    text = why.get(decision)
    if text is None and decision.startswith("FOLLOWED AFTER"):
        text = ("The registration is followed, but the test pieces were scored before it was "
                "made (see the earlier looks): the result is exploratory.")
    said = f" The registered rules give {rules}." if rules and rules != decision else ""
    return f"{head} {text or ''}{said} Of {n} criteria, {listed}."


# ---- evidence in words ----------------------------------------------------------------------
OP_WORDS = {">=": "at least", ">": "more than", "<=": "at most", "<": "less than",
            "==": "exactly"}


def _points_ci(v: Verdict, level: float) -> str:
    """`` (95% CI -19.3 to -5.6 points)`` for a difference of rates; "" without an interval."""
    if v.ci_low is None or v.ci_high is None:
        return ""
    return f" ({level:.0%} CI {v.ci_low * 100:+.1f} to {v.ci_high * 100:+.1f} points)"


def _interval_reason(v: Verdict, judge_interval: bool) -> str:
    if judge_interval and v.judge == "refute":
        return {"PASS": "values in the interval meet the rule, so the data do not refute it",
                "FAIL": "no value in the interval meets the rule, so the data refute it",
                "INCONCLUSIVE": "its interval is not available"}[v.status]
    if not judge_interval:
        return {"PASS": "it meets the rule", "FAIL": "it fails the rule",
                "INCONCLUSIVE": "its interval leaves the rule undecided"}[v.status]
    return {"PASS": "the whole interval meets the rule",
            "FAIL": "no value in the interval meets the rule",
            "INCONCLUSIVE": "the interval straddles the threshold, so the data cannot tell"}[
        v.status]


def _ci_pct(v: Verdict, level: float) -> str:
    if v.ci_low is None or v.ci_high is None:
        return ""
    return f" ({level:.0%} CI {v.ci_low * 100:.1f}% to {v.ci_high * 100:.1f}%)"


def _gain(v: Verdict, m: Metrics, level: float) -> str | None:
    split = v.metric.split(".", 1)[0]
    order = _int(m, "ngram.best_order")
    base = f"{order}-gram" if order is not None else "n-gram"
    pieces = _int(m, f"eval.paired.ngram_minus_transformer.{split}.n_pieces")
    groups = _int(m, f"eval.models.transformer.{split}.n_groups")
    seeds = _seeds(m)
    per_seed = [_num(m, f"eval.paired.ngram_minus_transformer.{split}.rel_improvement.per_seed."
                        f"{s}") for s in seeds]
    if v.value is None:
        return None
    direction = "lower" if v.value >= 0 else "higher"
    where = f"on {pieces if pieces is not None else NA} {split} pieces in " \
            f"{groups if groups is not None else NA} groups"
    if len(seeds) > 1:
        where += f", {len(seeds)} training seeds"
        if all(p is not None for p in per_seed):
            where += f" (each seed: {', '.join(f'{p * 100:.1f}%' for p in per_seed)})"
    return (f"The transformer's NLL per note is {_pct(v.value)} {direction} than the {base}'s"
            f"{_ci_pct(v, level)} {where}; the rule asks for a gain of {OP_WORDS[v.op]} "
            f"{v.threshold * 100:g}%: {_interval_reason(v, v.ci_low is not None)}.")


def _near_copies(v: Verdict, m: Metrics, level: float) -> str | None:
    n = _int(m, "leakage.independent.test_pieces")
    rnd, rnd_n = (_int(m, "leakage.independent.random_split.test_near_train"),
                  _int(m, "leakage.independent.random_split.test_pieces"))
    if v.value is None:
        return None
    text = (f"{int(v.value)} of {n if n is not None else NA} test pieces have a near copy in "
            "train (every test piece compared with every train piece)")
    if rnd is not None and rnd_n is not None:
        text += f"; a random split of the same pieces would have {rnd} of {rnd_n}"
    allowed = ("none" if v.op == "==" and v.threshold == 0
               else f"{OP_WORDS[v.op]} {v.threshold:g}")
    return f"{text}. The rule allows {allowed}: {_interval_reason(v, False)}."


def _membership(v: Verdict, m: Metrics, level: float) -> str | None:
    model = v.metric.split(".")[1]
    key = f"audit.judged.{model}.membership_auc"
    n_train = _int(m, f"{key}.n_train")
    n_held = _int(m, f"{key}.n_heldout")
    held = (f"{n_held} unseen val and test pieces" if n_held is not None
            else f"{_int(m, f'{key}.n_test')} unseen test pieces")
    if v.value is None:
        return None
    ci = (f" ({level:.0%} CI {_g(v.ci_low)} to {_g(v.ci_high)})"
          if v.ci_low is not None and v.ci_high is not None else "")
    tpr, fpr = _num(m, f"{key}.tpr.value"), _num(m, f"{key}.tpr.fpr")
    if v.metric.endswith("membership_tpr") and fpr is not None:
        return (f"Calling at most {fpr:.0%} of {held} members, the {model}'s loss picks out "
                f"{v.value:.0%} of {n_train} training pieces{ci}, where {fpr:.0%} is chance; "
                f"the rule allows {OP_WORDS[v.op]} {v.threshold:g}: "
                f"{_interval_reason(v, bool(ci))}.")
    extra = (f"; calling at most {fpr:.0%} of the unseen pieces members, it picks out "
             f"{tpr:.0%} of the training ones" if tpr is not None and fpr is not None else "")
    return (f"The {model}'s loss per note tells {n_train} training pieces from {held} with AUC "
            f"{_g(v.value)}{ci}, where 0.5 is chance{extra}; the rule allows "
            f"{OP_WORDS[v.op]} {v.threshold:g}: {_interval_reason(v, bool(ci))}.")


def _flags(v: Verdict, m: Metrics, level: float) -> str | None:
    model = v.metric.split(".")[1]
    rate = _num(m, f"audit.judged.{model}.flag_rate.value")
    human = _num(m, f"audit.judged.{model}.flag_rate.human.value")
    n = _int(m, f"audit.judged.{model}.flag_rate.n")
    if v.value is None:
        return None
    side = "less" if v.value < 0 else "more"
    ci = _points_ci(v, level)
    return (f"{_pct(rate)} of {n} {model} samples are flagged as copying training music, "
            f"against {_pct(human)} of held-out human windows: {_points(v.value)} {side}{ci}; "
            f"the rule allows at most {v.threshold * 100:g} points more: "
            f"{_interval_reason(v, bool(ci))}.")


def _extraction(v: Verdict, m: Metrics, level: float, params: Mapping[str, Any]) -> str | None:
    model = v.metric.split(".")[1]
    audit = params.get("audit") or {}
    train = _num(m, f"audit.judged.{model}.extraction_rate.train.value")
    test = _num(m, f"audit.judged.{model}.extraction_rate.test.value")
    if v.value is None:
        return None
    ci = _points_ci(v, level)
    return (f"Given the first {audit.get('extraction_prefix', NA)} tokens of a piece, the "
            f"{model} continued the next {audit.get('extraction_tokens', NA)} exactly for "
            f"{_pct(train)} of training pieces and {_pct(test)} of unseen test pieces, an excess "
            f"of {v.value * 100:+.1f} points{ci}; the rule allows at most {v.threshold * 100:g} "
            f"points: {_interval_reason(v, bool(ci))}.")


def _outside(m: Metrics, model: str) -> list[str]:
    """The music statistics of ``model``'s samples outside the human band."""
    prefix = f"audit.judged.{model}.quality.stats."
    return sorted({k[len(prefix):].rsplit(".", 1)[0] for k, x in m.items()
                   if k.startswith(prefix) and k.endswith(".inside") and x is False})


def _quality(v: Verdict, m: Metrics, level: float) -> str | None:
    model = v.metric.split(".")[1]
    n_stats = _int(m, f"audit.judged.{model}.quality.n_stats")
    outside = _outside(m, model)
    if v.value is None or n_stats is None:
        return None
    inside = round(v.value * n_stats)
    need = next((k for k in range(n_stats + 1) if k / n_stats >= v.threshold), n_stats)
    text = (f"{inside} of {n_stats} music statistics of the {model}'s samples lie inside the "
            "band of held-out human music")
    if outside:
        text += f" (outside: {', '.join(o.replace('_', ' ') for o in outside)})"
    return f"{text}; the rule needs at least {need}: {_interval_reason(v, False)}."


def _quality_band(v: Verdict, m: Metrics) -> str | None:
    model = v.metric.split(".")[1]
    n_stats = _int(m, f"audit.judged.{model}.quality.n_stats")
    score, band = _num(m, f"quality.{model}.score"), _num(m, f"quality.{model}.score_band_low")
    outside = _outside(m, model)
    if v.value is None or n_stats is None or score is None or band is None:
        return None
    text = (f"{round(score * n_stats)} of {n_stats} music statistics of the {model}'s samples "
            "lie inside the band of held-out human music")
    if outside:
        text += f" (outside: {', '.join(o.replace('_', ' ') for o in outside)})"
    return (f"{text}; held-out human sets of the same size have at least "
            f"{round(band * n_stats)} inside in all but the calibrated share of draws, and the "
            f"rule needs as many: {_interval_reason(v, False)}.")


def _gap(v: Verdict, m: Metrics, level: float) -> str | None:
    if v.value is None:
        return None
    has_ci = v.ci_low is not None and v.ci_high is not None
    more = "more" if v.value >= 0 else "less"
    rule = (f"at most {v.threshold:g}" if v.op in ("<", "<=") else f"at least {v.threshold:g}")
    unit = "note" if "gap_per_note" in v.metric else "token"
    n_held = _int(m, "eval.gap.transformer.n_pieces_heldout")
    n_train = _int(m, "eval.gap.transformer.n_pieces_train")
    parts = ([f"{n_held} held-out (val and test) against {n_train} training pieces"]
             if n_held is not None and n_train is not None else [])
    parts += [f"{level:.0%} CI {v.ci_low:.2f} to {v.ci_high:.2f}"] if has_ci else []
    detail = f" ({'; '.join(parts)})" if parts else ""
    return (f"Held-out music costs {abs(v.value):.2f} nats per {unit} {more} than training "
            f"music{detail}; the rule asks for {rule}: {_interval_reason(v, has_ci)}.")


def _per_seed(v: Verdict, level: float) -> str:
    """A guard judged on every training seed: what it measures, then each seed's value,
    interval and verdict, and which seed decides."""
    parts = v.metric.split(".")
    kind, model = (parts[2], parts[1]) if parts[0] == "memorisation" else ("gap", "transformer")
    points = kind in ("flag_excess", "extraction_excess")

    def num(x: float | None) -> str:
        return NA if x is None else f"{x * 100:+.1f}" if points else _g(x)

    what = {"membership_auc": f"The {model}'s membership AUC (0.5 is chance)",
            "flag_excess": f"The share of the {model}'s samples flagged as copying training "
                           "music, less that of held-out human windows, in points",
            "extraction_excess": f"The share of training pieces the {model} continues exactly, "
                                 "less that of unseen test pieces, in points"}.get(
        kind, "Held-out less training NLL of the transformer, nats per "
              + ("note" if "gap_per_note" in v.metric else "token"))
    limit = (f"{OP_WORDS[v.op]} {v.threshold * 100:g} points" if points
             else f"{OP_WORDS[v.op]} {v.threshold:g}")
    seeds = "; ".join(f"seed {s.seed} {num(s.value)} ({level:.0%} CI {num(s.ci_low)} to "
                      f"{num(s.ci_high)}), {s.status}" for s in v.seeds)
    why = {"FAIL": f"seed {v.seed} fails, so the rule fails",
           "PASS": "every seed passes, so the rule passes",
           "INCONCLUSIVE": f"no seed fails, but seed {v.seed} does not pass, so the data cannot "
                           "tell"}[v.status]
    return (f"{what}, judged on each of its {len(v.seeds)} training seeds alone, since the rule "
            f"({limit}) must hold for every one: {seeds}; {why}.")


def plain_evidence(v: Verdict, metrics: Metrics, params: Mapping[str, Any],
                   level: float) -> str:
    """One sentence of evidence for a verdict, in words, for the metrics the project's criteria
    use (a guard judged on every training seed: :func:`_per_seed`); the generic sentence
    (``v.evidence``) for any other metric or a missing value."""
    if v.seeds:
        return _per_seed(v, level)
    makers: dict[str, Callable[[], str | None]] = {
        "test.nll_per_note.rel_improvement": lambda: _gain(v, metrics, level),
        "val.nll_per_note.rel_improvement": lambda: _gain(v, metrics, level),
        "leakage.test_near_train": lambda: _near_copies(v, metrics, level),
        "generalisation.gap.transformer": lambda: _gap(v, metrics, level),
        "generalisation.gap_per_note.transformer": lambda: _gap(v, metrics, level),
    }
    parts = v.metric.split(".")
    if len(parts) == 3 and parts[0] == "memorisation":
        makers[v.metric] = {"membership_auc": lambda: _membership(v, metrics, level),
                            "membership_tpr": lambda: _membership(v, metrics, level),
                            "flag_excess": lambda: _flags(v, metrics, level),
                            "extraction_excess": lambda: _extraction(v, metrics, level,
                                                                     params)}.get(
            parts[2], lambda: None)
    if len(parts) == 3 and parts[0] == "quality" and parts[2] == "score":
        makers[v.metric] = lambda: _quality(v, metrics, level)
    if len(parts) == 3 and parts[0] == "quality" and parts[2] == "margin":
        makers[v.metric] = lambda: _quality_band(v, metrics)
    text = makers.get(v.metric, lambda: None)()
    return text or v.evidence


# ---- the headline figure's rows -------------------------------------------------------------
def gain_rows(metrics: Metrics, splits: tuple[str, ...] = ("val", "test")) -> list[ForestRow]:
    """The transformer's relative gain in NLL per note over the n-gram, per scored split."""
    rows = []
    seeds = _seeds(metrics)
    for split in splits:
        key = f"eval.paired.ngram_minus_transformer.{split}.rel_improvement"
        v, lo, hi = (_num(metrics, f"{key}.{k}") for k in ("value", "ci_low", "ci_high"))
        if v is None or lo is None or hi is None:
            continue
        per_seed = [_num(metrics, f"{key}.per_seed.{s}") for s in seeds]
        pieces = _int(metrics, f"eval.paired.ngram_minus_transformer.{split}.n_pieces")
        groups = _int(metrics, f"eval.models.transformer.{split}.n_groups")
        rows.append(ForestRow(split, f"{pieces} pieces, {groups} groups", v, lo, hi,
                            tuple(p for p in per_seed if p is not None)))
    return rows

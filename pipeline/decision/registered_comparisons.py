"""Registered comparisons: the ``compare`` section of params.yaml, its registration, and how
``symkit compare`` judges arms against it.

A comparison rule names two runs by the params that tell them apart, and a decision rule on the
paired difference of their scores::

    - name: tsd_beats_remi
      baseline: {tokenize.tokenizer: REMI, tokenize.vocab_size: 1000}
      arm: {tokenize.tokenizer: TSD, tokenize.vocab_size: 1000}
      metric: nats_per_note.rel_improvement  # (baseline − arm) / baseline: > 0, arm better
      op: ">="
      threshold: 0.02
      judge: interval
      rationale: ...

``symkit preregister`` freezes the section into :data:`REGISTRATION` (a file of its own, so that
registering comparisons never touches the experiment's own registration, which the stages read).
Every arm of a DVC experiment carries the file that was committed when it ran, so the arms show
whether a rule existed before their results did.

Judging (:func:`judge`): a rule *matches* a pair of arms (baseline ``i``, arm ``j``) when arm
``i``'s params hold the rule's ``baseline`` values, arm ``j``'s hold its ``arm`` values, and no
other param differs between them (:data:`pipeline.stats.paired.IGNORED_SECTIONS` aside): the
controlled comparison the rule declared. The pair need not involve the command's first arm.
Arms with the same params count once. A rule matching several pairs is judged on each. When no
pair matches but some pair matches the rule's values while other params differ too, the rule is
judged on that confounded pair and DEVIATED; when nothing matches it is NOT RUN, with the reason.

Each judged pair is scored with the *registered* settings (``n_boot``, ``ci_level``, ``seed``),
whatever the command's options, at the level ``1 − (1 − ci_level) / m`` with ``multiplicity:
bonferroni``, where ``m`` counts the registered rules, a rule matching several pairs once per
pair (``none``: at ``ci_level``). Verdicts are the single-run report's
(:func:`pipeline.decision.criteria.evaluate`): PASS, FAIL, INCONCLUSIVE; DEVIATED when the
registration was not followed (its hash does not match, an arm of the pair holds another
registration or none, an arm's params.yaml ``compare`` section differs from the registered one,
or the pair is confounded), with the deviations named; comparisons no registered rule covers are
NOT REGISTERED.

Pure: the command (:mod:`pipeline.tools.compare`) reads the arms and scores the pairs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, StageConfig, parse_section, section_class, sections
from pipeline.decision.criteria import Criterion, evaluate, unique_rule_names
from pipeline.stats.paired import IGNORED_SECTIONS, canonical, params_diff

REGISTRATION = "reports/preregistration_compare.json"
"""Where ``symkit preregister`` writes the registered comparisons (relative to the project)."""
SCHEMA_VERSION = 1
METRICS = ("nats_per_note", "nats_per_second", "nats_per_token")
STATISTICS = ("rel_improvement", "diff")
METRIC_KEYS = tuple(f"{m}.{s}" for m in METRICS for s in STATISTICS)
"""What a rule's ``metric`` (and ``ci_metric``) may name: a metric of ``symkit compare`` and
its relative improvement ``(baseline − arm) / baseline`` or difference ``baseline − arm``."""


# ---- the section ----------------------------------------------------------------------------
class ComparisonRule(Criterion):
    """One planned comparison (keys documented in params.yaml's ``compare`` comment)."""

    baseline: dict[str, Any] = Field(min_length=1)
    arm: dict[str, Any] = Field(min_length=1)
    model: str = Field("transformer", min_length=1)
    split: Literal["val", "test"] = "val"

    @model_validator(mode="after")
    def _known_metric(self) -> ComparisonRule:
        for field_name in ("metric", "ci_metric"):
            value = getattr(self, field_name)
            if value is not None and value not in METRIC_KEYS:
                raise ValueError(f"{field_name}: {value!r} is not a comparison metric; allowed: "
                                 f"{', '.join(METRIC_KEYS)}")
        return self

    @model_validator(mode="after")
    def _two_sides(self) -> ComparisonRule:
        if set(self.baseline) != set(self.arm):
            raise ValueError(f"baseline and arm must name the same params (baseline: "
                             f"{', '.join(sorted(self.baseline))}; arm: "
                             f"{', '.join(sorted(self.arm))})")
        for key in self.baseline:
            section = key.split(".", 1)[0]
            if "." not in key or section not in sections() or section in IGNORED_SECTIONS:
                allowed = ", ".join(s for s in sorted(sections()) if s not in IGNORED_SECTIONS)
                raise ValueError(f"baseline/arm key {key!r} is not a dotted params key of a "
                                 f"section that shapes results ({allowed})")
        if not self.changes:
            raise ValueError("baseline and arm give every param the same value: a rule must "
                             "name at least one param whose value differs")
        return self

    @property
    def changes(self) -> list[str]:
        """The keys whose values differ between the two sides (the factor compared)."""
        return sorted(k for k in self.baseline
                      if canonical(self.baseline[k]) != canonical(self.arm[k]))

    def criterion(self) -> Criterion:
        """The decision part, as the single-run judge reads it."""
        return Criterion(name=self.name, metric=self.metric, op=self.op,
                         threshold=self.threshold, judge=self.judge, ci=self.ci,
                         ci_metric=self.ci_metric, rationale=self.rationale)


class CompareConfig(StageConfig):
    """``compare`` section of params.yaml: ``symkit compare``'s defaults and the planned
    comparisons (documented there)."""

    SECTION: ClassVar[str] = "compare"

    n_boot: int = Field(2000, ge=1)
    ci_level: float = Field(0.95, gt=0.0, lt=1.0)
    seed: int = 0
    equivalence_margin: float = Field(0.005, gt=0.0, lt=1.0)
    multiplicity: Literal["bonferroni", "none"] = "bonferroni"
    rules: list[ComparisonRule]
    """Required, so that params.yaml spells the plan out; ``[]`` registers none."""

    @model_validator(mode="after")
    def _unique_names(self) -> CompareConfig:
        unique_rule_names(self.rules)
        return self


def _set_dotted(params: dict[str, Any], key: str, value: Any) -> None:
    node = params
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def check_against(cfg: CompareConfig, params: Mapping[str, Any],
                  source: str = "params.yaml") -> None:
    """ParamsError unless every rule's keys are params of ``params`` (flattened) and each side's
    values, set into ``params``, give a valid section: a typo or an impossible value fails at
    registration, not after a sweep."""
    from pipeline.stats.paired import flatten_params

    flat = flatten_params(params)
    for k, rule in enumerate(cfg.rules):
        for side in ("baseline", "arm"):
            values = getattr(rule, side)
            for key in sorted(values):
                if key not in flat:
                    raise ParamsError(
                        f"{source}: compare.rules[{k}].{side}: {key!r} is not a param of "
                        f"{source} (rule {rule.name!r}); name a key as `dvc exp run -S` would")
            trial = copy.deepcopy(dict(params))
            for key, value in values.items():
                _set_dotted(trial, key, value)
            for section in sorted({key.split(".", 1)[0] for key in values}):
                try:
                    parse_section(section, trial.get(section), section_class(section), source)
                except ParamsError as e:
                    raise ParamsError(f"compare.rules[{k}].{side} (rule {rule.name!r}) gives an "
                                      f"invalid {section} section: {e}") from None


# ---- the registration -----------------------------------------------------------------------
def record(section: Mapping[str, Any]) -> dict[str, Any]:
    """The registration of a ``compare`` section, as written in params.yaml."""
    frozen = dict(section)
    return {"schema": SCHEMA_VERSION, "compare": frozen, "hash": artifacts.sha256_json(frozen)}


@dataclass(frozen=True)
class Registered:
    """A usable registration: its parsed section, the hash it states, and problems found in it
    (an edited file); ``source`` names the arm it was read from."""

    config: CompareConfig
    raw: dict[str, Any]
    hash: str
    source: str
    problems: tuple[str, ...] = ()


def read_registration(data: Any, source: str) -> Registered | str:
    """The registration in ``data`` (a parsed :data:`REGISTRATION`), or why it is unusable."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
        return (f"{source}'s {REGISTRATION} is not a comparison registration of schema "
                f"{SCHEMA_VERSION}")
    raw = data.get("compare")
    if not isinstance(raw, dict):
        return f"{source}'s {REGISTRATION} has no compare block"
    try:
        cfg = parse_section("compare", raw, CompareConfig, f"{source}:{REGISTRATION}")
    except ParamsError as e:
        return f"the comparisons registered in {source} do not parse: {e}"
    problems = () if data.get("hash") == artifacts.sha256_json(raw) else (
        f"{REGISTRATION} in {source}: its hash does not match its compare block (edited after "
        "registration)",)
    return Registered(cfg, raw, str(data.get("hash")), source, problems)


# ---- judging --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmInfo:
    """What judging needs of one arm: its label, params flattened (the ignored sections left
    out), its params.yaml ``compare`` section as written (None without one) and its registration
    file as parsed (None without one)."""

    label: str
    flat: Mapping[str, Any]
    compare_section: Any
    registration: Any


Scorer = Callable[[int, int, ComparisonRule, float], dict[str, Any]]
"""``(i, j, rule, level)`` -> the paired comparison of arm ``i`` (baseline) and arm ``j`` for the
rule's model and split, at interval ``level``: :func:`pipeline.stats.paired.compare_pair`'s
metrics with ``n_pieces``, ``n_groups`` and ``n_seeds``; raises
:class:`pipeline.stats.paired.Refusal` when the pair cannot be compared."""


def _matches(values: Mapping[str, Any], flat: Mapping[str, Any]) -> bool:
    return all(k in flat and canonical(flat[k]) == canonical(v) for k, v in values.items())


def distinct(arms: Sequence[ArmInfo]) -> list[int]:
    """Indices of the first arm of each set of identical params, in order."""
    seen: set[str] = set()
    out = []
    for i, a in enumerate(arms):
        key = canonical(dict(a.flat))
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


@dataclass(frozen=True)
class ArmPair:
    """A pair of arms a rule applies to, by their indices (``i`` its baseline, ``j`` its arm);
    ``extra`` lists params that differ besides the rule's own (empty: the controlled comparison
    the rule declared)."""

    i: int
    j: int
    extra: tuple[str, ...] = ()


def matches(rule: ComparisonRule, arms: Sequence[ArmInfo]) -> list[ArmPair]:
    """The pairs ``rule`` is judged on: every controlled match; without one, the confounded
    matches with the fewest extra differences."""
    idx = distinct(arms)
    found = []
    for i in idx:
        if not _matches(rule.baseline, arms[i].flat):
            continue
        for j in idx:
            if j == i or not _matches(rule.arm, arms[j].flat):
                continue
            diff = {r["key"] for r in params_diff(arms[i].flat, arms[j].flat)}
            found.append(ArmPair(i, j, tuple(sorted(diff - set(rule.changes)))))
    controlled = [m for m in found if not m.extra]
    if controlled or not found:
        return controlled
    fewest = min(len(m.extra) for m in found)
    return [m for m in found if len(m.extra) == fewest]


def why_not_run(rule: ComparisonRule, arms: Sequence[ArmInfo]) -> str:
    """Why no pair of ``arms`` matches ``rule``: which side no arm matches."""
    def side(values: Mapping[str, Any]) -> str | None:
        if any(_matches(values, a.flat) for a in arms):
            return None
        wanted = ", ".join(f"{k}={canonical(v)}" for k, v in sorted(values.items()))
        return f"no arm has {wanted}"

    reasons = [r for r in (side(rule.baseline), side(rule.arm)) if r]
    return "; ".join(reasons) or "the only arm matching both sides is the same run"


def multiplicity(reg: CompareConfig, counts: Sequence[int]) -> tuple[int, float]:
    """``(m, level)``: the number of tests in the family (each rule once, or once per pair it
    is judged on) and the interval level the rules are judged at."""
    m = sum(max(1, c) for c in counts) if counts else len(reg.rules)
    if reg.multiplicity == "none" or m <= 1:
        return m, reg.ci_level
    return m, 1.0 - (1.0 - reg.ci_level) / m


def _flat_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, block in metrics.items():
        for stat in STATISTICS:
            b = block.get(stat)
            if isinstance(b, dict):
                out[f"{key}.{stat}"] = b.get("value")
                out[f"{key}.{stat}.ci_low"] = b.get("ci_low")
                out[f"{key}.{stat}.ci_high"] = b.get("ci_high")
    return out


def section_differences(old: Mapping[str, Any], new: Any) -> list[str]:
    """How a ``compare`` section ``new`` differs from the registered ``old``: settings key by
    key, rules by name (then key by key)."""
    from pipeline.decision.preregistration import diff_flat

    if not isinstance(new, Mapping):
        return [f"compare: registered a section, now {new!r}"]

    def by_name(section: Mapping[str, Any]) -> dict[str, Any]:
        rules = section.get("rules")
        return {str(r.get("name")): r for r in rules if isinstance(r, Mapping)} \
            if isinstance(rules, list) else {}

    out = diff_flat({k: v for k, v in old.items() if k != "rules"},
                    {k: v for k, v in new.items() if k != "rules"}, "compare")
    a, b = by_name(old), by_name(new)
    out += [f"compare rule {n!r} was registered but is no longer there"
            for n in sorted(set(a) - set(b))]
    out += [f"compare rule {n!r} was added after registration" for n in sorted(set(b) - set(a))]
    for n in sorted(set(a) & set(b)):
        out += diff_flat(a[n], b[n], f"compare rule {n!r}")
    return out


def _deviations(reg: Registered, arms: Sequence[ArmInfo], pair: Sequence[int],
                extra: Sequence[str]) -> list[str]:
    out = list(reg.problems)
    for k in pair:
        a = arms[k]
        if a.registration is None:
            out.append(f"{a.label} holds no {REGISTRATION}: it was run before the comparisons "
                       "were registered (or without the file)")
        else:
            theirs = read_registration(a.registration, a.label)
            if isinstance(theirs, str):
                out.append(theirs)
            elif theirs.hash != reg.hash:
                out.append(f"{a.label} was run with another registration of the comparisons "
                           f"({theirs.hash[:12]}, not {reg.hash[:12]} from {reg.source})")
        if a.compare_section is None:
            out.append(f"{a.label}'s params.yaml has no compare section")
        else:
            out += [f"{a.label}'s params.yaml: {d}"
                    for d in section_differences(reg.raw, a.compare_section)]
    if extra:
        out.append(f"{arms[pair[0]].label} and {arms[pair[1]].label} also differ in "
                   f"{', '.join(extra)}: not the controlled comparison the rule declared")
    return out


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.2g}%" if abs(x) < 0.01 else f"{abs(x) * 100:.1f}%"


def evidence(rule: ComparisonRule, base: str, arm: str, metrics: Mapping[str, Any],
             level: float, status: str) -> str:
    """One plain sentence: what the arm's metric did against the baseline's, its interval, what
    the rule asks, and why that gives ``status``."""
    metric, stat = rule.metric.split(".")
    block = (metrics.get(metric) or {}).get(stat)
    name = {"nats_per_note": "NLL per note", "nats_per_second": "NLL per second",
            "nats_per_token": "NLL per token"}[metric]
    if not isinstance(block, dict):
        return (f"{name} is not available for {base} against {arm} (token counts are compared "
                "only between arms with the same tokenizer), so the rule cannot be judged.")
    v, lo, hi = block["value"], block["ci_low"], block["ci_high"]
    lvl = f"{level * 100:.4g}% CI"
    if stat == "rel_improvement":
        direction = "lower" if v > 0 else "higher" if v < 0 else "the same as"
        said = (f"{arm}'s {name} on {rule.split} is {_pct(v)} {direction} than {base}'s "
                f"({lvl} {lo * 100:+.2f}% to {hi * 100:+.2f}% improvement)")
        asked = f"an improvement {rule.op} {rule.threshold * 100:g}%"
    else:
        said = (f"{base}'s {name} minus {arm}'s on {rule.split} is {v:.4g} nats ({lvl} "
                f"{lo:.4g} to {hi:.4g})")
        asked = f"a difference {rule.op} {rule.threshold:g} nats"
    why = {"PASS": "the whole interval meets it", "FAIL": "no value in the interval meets it",
           "INCONCLUSIVE": "the interval straddles the threshold, so the data cannot tell"}
    if rule.judge == "point" or status not in why:
        return f"{said}; the rule asks for {asked} (judged on the {rule.judge}): {status}."
    return f"{said}; the rule asks for {asked}: {why[status]}."


def judge(reg: Registered | None, arms: Sequence[ArmInfo], score: Scorer) -> dict[str, Any]:
    """The registered comparisons' verdicts for ``arms`` (compare.json's ``registered``).

    Without a registration, every comparison is NOT REGISTERED. Otherwise each rule is judged
    on its matching pairs (:func:`matches`) at the registered, multiplicity-adjusted level."""
    if reg is None:
        return {"registered": False, "source": None, "hash": None, "rules": [], "not_run": [],
                "m": 0, "level": None, "multiplicity": None, "counts": {}}
    found = {r.name: matches(r, arms) for r in reg.config.rules}
    m, level = multiplicity(reg.config, [len(found[r.name]) for r in reg.config.rules])
    judged, not_run = [], []
    for rule in reg.config.rules:
        if not found[rule.name]:
            not_run.append({"rule": rule.name, "reason": why_not_run(rule, arms)})
            continue
        for mt in found[rule.name]:
            base, arm = arms[mt.i].label, arms[mt.j].label
            entry: dict[str, Any] = {
                "rule": rule.name, "baseline": base, "arm": arm, "model": rule.model,
                "split": rule.split, "changes": rule.changes, "metric": rule.metric,
                "op": rule.op, "threshold": rule.threshold, "judge": rule.judge,
                "rationale": rule.rationale, "level": level}
            try:
                result = score(mt.i, mt.j, rule, level)
            except ValueError as e:  # a Refusal: the pair cannot be compared
                not_run.append({"rule": rule.name, "reason": f"{base} against {arm}: {e}"})
                continue
            v = evaluate(rule.criterion(), _flat_metrics(result["metrics"]), level)
            deviations = _deviations(reg, arms, (mt.i, mt.j), mt.extra)
            entry.update({
                "judged": v.status, "status": "DEVIATED" if deviations else v.status,
                "value": v.value, "ci_low": v.ci_low, "ci_high": v.ci_high,
                "n_pieces": result.get("n_pieces"), "n_groups": result.get("n_groups"),
                "n_seeds": result.get("n_seeds"),
                "evidence": evidence(rule, base, arm, result["metrics"], level, v.status),
                "deviations": deviations})
            judged.append(entry)
    counts: dict[str, int] = {}
    for e in judged:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    if not_run:
        counts["NOT RUN"] = len(not_run)
    return {"registered": True, "source": reg.source, "hash": reg.hash, "rules": judged,
            "not_run": not_run, "m": m, "level": level,
            "multiplicity": reg.config.multiplicity, "counts": dict(sorted(counts.items()))}


def coverage(registered: Mapping[str, Any], baseline: str, arm: str) -> list[dict[str, Any]]:
    """The judged rules whose pair is ``baseline`` against ``arm`` (empty: NOT REGISTERED)."""
    return [e for e in registered.get("rules") or []
            if e["baseline"] == baseline and e["arm"] == arm]


def level_words(registered: Mapping[str, Any], ci_level: float) -> str:
    """How the rules' intervals were formed, in words."""
    if registered.get("multiplicity") == "bonferroni" and registered.get("m", 0) > 1:
        return (f"{registered['level'] * 100:.4g}% intervals: the registered "
                f"{ci_level * 100:g}% level, Bonferroni-adjusted over {registered['m']} tests")
    level = registered.get("level")
    return f"{(level if level is not None else ci_level) * 100:.4g}% intervals"

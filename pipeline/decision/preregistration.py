"""The pre-registration: what ``symkit preregister`` freezes, and the check that makes the
registered rules the rules.

The record freezes the experiment's *identity* as far as it can be fixed before the test set is
scored: the split hash (computed from ``data/splits.parquet``), the sha256s of the val and test
pieces, the params sections that shape results (:data:`FROZEN_SECTIONS`, the decision criteria
among them) and the versions of the packages results depend on
(:data:`pipeline.core.artifacts.RESULT_PACKAGES`). ``identity_hash`` is the hash of that
identity, recomputed on every check. ``forced`` and ``looks_before`` say whether it was
registered over existing test scores (``symkit preregister --force``) and which.

:func:`check` compares a registration with the current experiment and with the test-access
ledger (:mod:`pipeline.decision.ledger`). The report judges with the *registered* criteria. Its
status (:attr:`Check.status`), strictest first:

- ``NOT REGISTERED``: no registration;
- ``DEVIATED``: the experiment is not the registered one: a loosened rule, another tokenizer, a
  newer torch, an edited hash, other pieces scored than registered, criteria that changed after
  an earlier look at these test pieces, a ledger that lost lines or lacks the current scores;
- ``FOLLOWED AFTER n LOOKS``: followed, but these test pieces were scored ``n`` times before
  (other scores, or under another registration): the rules may have been chosen knowing results;
- ``FOLLOWED, ORDER NOT SHOWN``: followed, no earlier look in the ledger, but git does not show
  the registration committed before the results (uncommitted, edited since its commit,
  committed with or after them, or no git);
- ``FOLLOWED``: none of the above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from pipeline.core import artifacts
from pipeline.core.artifacts import RESULT_PACKAGES
from pipeline.core.config import ParamsError, parse_section
from pipeline.decision import ledger
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.metrics import flatten
from pipeline.stats.power import pass_probability, power_summary, seed_t_half_width
from pipeline.training.config import LATER_KEYS

# Params keys added after registrations existed, with the value that keeps the earlier behaviour:
# absent from a registration and set to that value now is the same experiment, not a deviation.
LATER_DEFAULTS = {**{f"transformer.{sec}.{k}": v for sec, keys in LATER_KEYS.items()
                     for k, v in keys.items()},
                  "tokenize.from": None, "tokenize.also_train_on": None,
                  "generate.n_conditioned": 240, "generate.guidance": 1.0}

SCHEMA_VERSION = 3
FROZEN_SECTIONS = ("tokenize", "ngram", "transformer", "evaluate", "generate", "audit",
                   "criteria", "condition")
"""params.yaml sections that shape results and are known before scoring. ``corpus``, ``ingest``,
``dedupe`` and ``split`` are frozen through the split hash and the pieces; ``runtime`` and
``report`` do not change results. ``condition`` came later: a registration without it registered
an unconditioned model, which a ``condition`` section with ``use: []`` still is
(:func:`_condition_differences`)."""
BOUND_SPLITS = ("val", "test")
"""Splits whose pieces the registration lists, and the report compares with the scored ones."""


def identity(params: Mapping[str, Any], split_hash: str | None,
             packages: Mapping[str, Any],
             pieces: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The experiment identity: split hash, val and test pieces (sorted sha256s), frozen params
    sections (as written) and versions."""
    return {"split_hash": split_hash,
            "pieces": {s: sorted(pieces.get(s) or []) for s in BOUND_SPLITS}
            if pieces is not None else None,
            "params": {s: params.get(s) for s in FROZEN_SECTIONS},
            "packages": {p: packages.get(p) for p in RESULT_PACKAGES}}


def build(ident: dict[str, Any], looks_before: Sequence[Mapping[str, Any]] = ()
          ) -> dict[str, Any]:
    """The registration record. ``looks_before``: the ledger records of test scores of these
    pieces that existed when it was made, which only ``--force`` registers over."""
    looks = [{k: r.get(k) for k in ("source", "commit", "time", "n_pieces", "results_sha256")}
             | {"registration": (r.get("registration") or {}).get("identity_hash")}
             for r in looks_before]
    return {"schema": SCHEMA_VERSION, "identity": ident,
            "identity_hash": artifacts.sha256_json(ident),
            "forced": bool(looks), "looks_before": looks}


def test_scores_exist(eval_report: Any, split_hash: str | None) -> bool:
    """Does ``reports/eval.json`` hold test-split scores of the split ``split_hash``?"""
    if not isinstance(eval_report, dict):
        return False
    protocol = eval_report.get("protocol") or {}
    if split_hash is not None and protocol.get("split_hash") not in (None, split_hash):
        return False  # scores of another split: they say nothing about this one
    models = eval_report.get("models") or {}
    return any(isinstance(m, dict) and m.get("test") for m in models.values())


@dataclass(frozen=True)
class Check:
    """The outcome of comparing a registration with the current experiment."""

    registered: bool
    criteria: CriteriaConfig | None
    """The registered rules (None when there is no usable registration)."""
    deviations: list[str] = field(default_factory=list)
    looks: list[ledger.Look] = field(default_factory=list)
    """Earlier looks at the registered test pieces (other scores, or another registration)."""
    n_looks: int = 0
    """How many earlier looks: the ledger's, or the registration's ``looks_before`` if more."""
    order_shown: bool = False
    """git shows the registration committed before the results."""

    @property
    def status(self) -> str:
        if not self.registered:
            return "NOT REGISTERED"
        if self.deviations:
            return "DEVIATED"
        if self.n_looks:
            return f"FOLLOWED AFTER {self.n_looks} LOOK{'S' * (self.n_looks != 1)}"
        return "FOLLOWED" if self.order_shown else "FOLLOWED, ORDER NOT SHOWN"


@dataclass(frozen=True)
class Evidence:
    """What the check compares the registration with, beside the current identity: the scored
    pieces (``reports/eval/per_piece.parquet``), the ledger, and git's facts."""

    scored: Mapping[str, Sequence[str]] | None = None
    """split -> sha256s of the pieces scored (None: no per-piece table)."""
    results_sha256: str | None = None
    """:func:`pipeline.decision.ledger.results_digest` of the test rows scored."""
    records: Sequence[Mapping[str, Any]] = ()
    """The ledger's records."""
    git: Mapping[str, Any] = field(default_factory=dict)
    """:func:`pipeline.decision.history.registration_order`, plus ``ledger_rewritten``."""


def check(registered: Any, current: dict[str, Any], eval_report: Any = None,
          evidence: Evidence | None = None) -> Check:
    """Compare the registration ``registered`` (the parsed JSON, or None) with ``current`` (an
    :func:`identity`) and with ``evidence``. Every hash the record holds is recomputed."""
    evidence = evidence or Evidence()
    if registered is None:
        return Check(False, None)
    if not isinstance(registered, dict) or registered.get("schema") != SCHEMA_VERSION:
        schema = registered.get("schema") if isinstance(registered, dict) else None
        return Check(True, None, [
            f"reports/preregistration.json has schema {schema!r}, not {SCHEMA_VERSION}: it "
            "freezes less than this version checks; register again before scoring"])
    out: list[str] = []
    ident = registered.get("identity")
    if not isinstance(ident, dict):
        return Check(True, None, ["reports/preregistration.json has no identity block"])
    if registered.get("identity_hash") != artifacts.sha256_json(ident):
        out.append("identity_hash does not match the registered identity: "
                   "reports/preregistration.json was edited after registration")
    criteria = None
    try:
        criteria = parse_section("criteria", (ident.get("params") or {}).get("criteria"),
                                 CriteriaConfig, "reports/preregistration.json")
    except ParamsError as e:
        out.append(f"the registered criteria do not parse: {e}")
    out += _identity_differences(ident, current)
    protocol = eval_report.get("protocol") if isinstance(eval_report, dict) else None
    scored_on = protocol.get("split_hash") if isinstance(protocol, dict) else None
    if scored_on is not None and ident.get("split_hash") not in (None, scored_on):
        out.append(f"reports/eval.json scored split {scored_on!r}, not the registered "
                   f"{ident.get('split_hash')!r}")
    out += _piece_differences(ident.get("pieces"), evidence.scored)
    pieces = (ident.get("pieces") or {}).get("test") or []
    key = (str(evidence.results_sha256), registered.get("identity_hash"))
    earlier, this = ledger.earlier_looks(evidence.records, pieces, key)
    out += _criteria_changed_after(earlier, registered)
    if evidence.git.get("ledger_rewritten"):
        out.append(str(evidence.git["ledger_rewritten"]))
    if evidence.results_sha256 is not None and this is None:
        out.append("reports/ledger.jsonl holds no record of the test scores in "
                   "reports/eval/per_piece.parquet under this registration: evaluate records "
                   "every look, so the ledger was edited or evaluate ran without it (re-run "
                   "`dvc repro evaluate`; `symkit ledger --rebuild` adds the looks in git)")
    n_looks = max(len(earlier), len(registered.get("looks_before") or []))
    return Check(True, criteria, out, earlier, n_looks,
                 evidence.git.get("registration_precedes_results") is True)


def _piece_differences(registered: Any, scored: Mapping[str, Sequence[str]] | None
                       ) -> list[str]:
    """Registered val and test pieces against those the per-piece table scored."""
    if not isinstance(registered, dict):
        return ["the registration lists no pieces, so the scored pieces cannot be checked"]
    if scored is None:
        return []
    out = []
    for split in BOUND_SPLITS:
        want, got = set(registered.get(split) or []), set(scored.get(split) or [])
        if got and want != got:
            out.append(f"{split} pieces: {len(want)} registered, {len(got)} scored in "
                       f"reports/eval/per_piece.parquet, {len(got - want)} of them not "
                       f"registered and {len(want - got)} registered ones not scored")
    return out


def _criteria_changed_after(looks: Sequence[ledger.Look], registered: Any) -> list[str]:
    """One deviation per earlier look whose registration had other criteria than these: rules
    changed after test scores of these pieces were seen."""
    out = []
    for look in looks:
        changed = ledger.changes_since(look, registered)["criteria"]
        if changed:
            shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more"
                                              if len(changed) > 4 else "")
            out.append(f"the criteria changed after {look.label()} scored {look.overlap} of "
                       f"these test pieces under registration "
                       f"{str(look.registration.get('identity_hash'))[:12]}: {shown}")
    return out


def _identity_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    if old.get("split_hash") is None:
        out.append("no split hash was registered, so the split cannot be verified")
    elif old.get("split_hash") != new.get("split_hash"):
        out.append(f"split_hash: registered {old.get('split_hash')!r}, now "
                   f"{new.get('split_hash')!r} (the split changed)")
    old_params, new_params = old.get("params") or {}, new.get("params") or {}
    # the pieces are compared with the scored table (_piece_differences), not with params
    for section in FROZEN_SECTIONS:
        if section == "criteria":
            out += _rule_differences(old_params.get(section), new_params.get(section))
        elif section == "condition":
            out += _condition_differences(old_params, new_params)
        else:
            out += diff_flat(old_params.get(section), new_params.get(section), section)
    out += diff_flat(old.get("packages"), new.get("packages"), "package")
    return out


def _condition_differences(old_params: dict[str, Any], new_params: dict[str, Any]) -> list[str]:
    """The ``condition`` section's differences. A registration made before the section existed
    registered an unconditioned model: the same experiment as ``use: []`` (or no section) now,
    whatever the bands say, since only conditions in use reach a model."""
    old, new = old_params.get("condition"), new_params.get("condition")
    if old is None:  # registered before the section existed, or without one
        use = new.get("use") if isinstance(new, dict) else None
        return [] if not use else [f"condition.use: registered unconditioned, now {use!r}"]
    return diff_flat(old, new, "condition")


def _rule_differences(old: Any, new: Any) -> list[str]:
    def by_name(section: Any) -> dict[str, Any]:
        rules = section.get("rules") if isinstance(section, dict) else None
        return {str(r.get("name")): r for r in rules or [] if isinstance(r, dict)}

    a, b = by_name(old), by_name(new)
    out = [f"criterion {n!r} was registered but is no longer in params.yaml"
           for n in sorted(set(a) - set(b))]
    out += [f"criterion {n!r} was added to params.yaml after registration"
            for n in sorted(set(b) - set(a))]
    for n in sorted(set(a) & set(b)):
        out += diff_flat(a[n], b[n], f"criterion {n!r}")
    return out


def diff_flat(a: Any, b: Any, what: str) -> list[str]:
    fa = flatten(a, max_list=10**6) if isinstance(a, dict) else {"": a}
    fb = flatten(b, max_list=10**6) if isinstance(b, dict) else {"": b}
    out = []
    for k in sorted(set(fa) | set(fb)):
        x, y = fa.get(k, "<absent>"), fb.get(k, "<absent>")
        key = f"{what}.{k}" if k else what
        if x == "<absent>" and key in LATER_DEFAULTS and y == LATER_DEFAULTS[key] \
                and type(y) is type(LATER_DEFAULTS[key]):
            continue
        if x != y or type(x) is not type(y):
            out.append(f"{key}: registered {x!r}, now {y!r}")
    return out


COMPARISON_METRIC = "test.nll_per_note.rel_improvement"
COMPARISON_PAIR = "ngram_minus_transformer"


def power_note(criteria: CriteriaConfig, eval_report: Any, level: float) -> str | None:
    """What the model-comparison rule can detect, from eval.json's val-based power block (None
    without an interval-judged comparison rule or without val scores). ``symkit preregister``
    prints it when val has been scored before registration; the report always shows it."""
    rule = next((r for r in criteria.rules
                 if r.metric == COMPARISON_METRIC and r.judge == "interval"
                 and r.op in (">", ">=")), None)
    if rule is None or not isinstance(eval_report, dict):
        return None
    s = power_summary(eval_report, COMPARISON_PAIR, rule.threshold, level)
    if s is None:
        return None
    at_threshold = pass_probability(rule.threshold, s.se, rule.threshold, level)
    # the minimum detectable effect is a margin above the threshold, never a number to compare
    # the threshold with: the gain must clear the threshold by it
    warn = ""
    block = (eval_report.get("power") or {}).get(COMPARISON_PAIR) or {}
    seeds = int(block.get("n_seeds") or 1)
    effect, mde = s.effect_for_power, s.mde
    if seeds > 1:  # judged with the seeds as a t term: the expected half-width, not z · se
        half = seed_t_half_width(float(block.get("se_groups") or s.se),
                                 float(block.get("seed_sd") or 0.0), seeds, level)
        effect = rule.threshold + half + NormalDist().inv_cdf(s.power) * s.se
        mde = effect - rule.threshold
    source = (f"from val's per-group spread scaled to {s.n_groups} test groups"
              + (f" and the spread of the gain over {seeds} training seeds on val (sd "
                 f"{float(block.get('seed_sd') or 0.0):.2%})" if seeds > 1 else ""))
    return (f"{warn}Power of {rule.name}: {source}, the relative improvement has a standard "
            f"error of about {s.se:.2g}. For "
            f"its {level:.0%} interval's lower bound to clear {rule.threshold:.2%} with "
            f"{s.power:.0%} probability, the true gain must be about {effect:.2%} "
            f"(the minimum detectable effect, {mde:.2%}, above the threshold"
            + (f"; the seeds enter as a Student-t term at {seeds - 1} degrees of freedom"
               if seeds > 1 else "") + "); "
            f"a true gain of exactly {rule.threshold:.2%} passes with probability "
            f"{at_threshold:.1%}. This assumes test groups vary like val's.")

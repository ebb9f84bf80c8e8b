"""The pre-registration: what ``symkit preregister`` freezes, and the check that makes the
registered rules the rules.

The record freezes the experiment's *identity* as far as it can be fixed before the test set is
scored: the split hash (computed from ``data/splits.parquet``), the sha256s of the val and test
pieces, the params sections that shape results (:data:`FROZEN_SECTIONS`, the decision criteria
among them) and the versions of the packages results depend on
(:data:`pipeline.core.artifacts.RESULT_PACKAGES`). ``identity_hash`` is the hash of that
identity, recomputed on every check. ``forced`` and ``looks_before`` say whether it was
registered over existing test scores (``symkit preregister --force``) and which; ``supersedes``
names the earlier registrations of the same test pieces it replaces. Since schema 4 the identity
also binds the code that judges, trains and stops training (``identity.code``,
:mod:`pipeline.decision.bound_code`); a fix after a look goes through an *amendment*
(:func:`amend`, ``symkit preregister --amend "why"``), appended to ``amendments`` with the code it
binds, the files it changed and the looks before it, each amendment hashed onto the one before.

:func:`check` compares a registration with the current experiment, with the test-access
ledger (:mod:`pipeline.decision.ledger`) and with what git history holds
(:mod:`pipeline.decision.trail`). The report judges with the *registered* criteria. Its
status (:attr:`Check.status`), strictest first:

- ``NOT REGISTERED``: no registration;
- ``DEVIATED``: the experiment is not the registered one: a loosened rule, another tokenizer, a
  newer torch, changed judging code, an edited hash or amendment, other pieces scored than
  registered, criteria that changed after an earlier look at these test pieces, a ledger that
  lost lines (now or in any committed version) or lacks the current scores, an earlier committed
  registration of these test pieces that this one does not declare;
- ``UNVERIFIED``: nothing above, but history cannot be checked (no git, a shallow clone), so
  the looks and registrations it would show are unknown;
- ``FOLLOWED`` with what qualifies it: ``AFTER n LOOKS`` (these test pieces were scored before:
  other scores, another registration or other code), ``WITH k AMENDMENTS``, ``REPLACING r
  REGISTRATIONS``, ``AFTER t EARLIER TEST SETS`` (looks at other test pieces of this
  experiment), ``ORDER NOT SHOWN`` (git does not show the registration committed before the
  results); plain ``FOLLOWED`` when none applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core import artifacts
from pipeline.core.artifacts import RESULT_PACKAGES
from pipeline.core.config import ParamsError, parse_section
from pipeline.decision import bound_code, ledger
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.metrics import flatten
from pipeline.decision.trail import test_pieces_sha256
from pipeline.stats.power import gain_at_power
from pipeline.training.config import LATER_KEYS

# Params keys added after registrations existed, with the value that keeps the earlier behaviour:
# absent from a registration and set to that value now is the same experiment, not a deviation.
LATER_DEFAULTS = {**{f"transformer.{sec}.{k}": v for sec, keys in LATER_KEYS.items()
                     for k, v in keys.items()},
                  "tokenize.from": None, "tokenize.also_train_on": None,
                  "generate.n_conditioned": 240, "generate.guidance": 1.0}

SCHEMA_VERSION = 4
READABLE_SCHEMAS = (3, 4)
"""Schema 3 bound no code: its code is read from git at the registration's commit."""
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
             pieces: Mapping[str, Sequence[str]] | None = None,
             code: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The experiment identity: split hash, val and test pieces (sorted sha256s), frozen params
    sections (as written), versions and, for a registration, the bound code
    (:func:`pipeline.decision.bound_code.bound_code`)."""
    out = {"split_hash": split_hash,
           "pieces": {s: sorted(pieces.get(s) or []) for s in BOUND_SPLITS}
           if pieces is not None else None,
           "params": {s: params.get(s) for s in FROZEN_SECTIONS},
           "packages": {p: packages.get(p) for p in RESULT_PACKAGES}}
    if code is not None:
        out["code"] = dict(code)
    return out


def _look_summary(r: Mapping[str, Any]) -> dict[str, Any]:
    return ({k: r.get(k) for k in ("source", "commit", "time", "n_pieces", "results_sha256")}
            | {"registration": (r.get("registration") or {}).get("identity_hash")})


def build(ident: dict[str, Any], looks_before: Sequence[Mapping[str, Any]] = (),
          supersedes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The registration record. ``looks_before``: the ledger records of test scores of these
    pieces that existed when it was made; ``supersedes``: earlier committed registrations of
    these test pieces it replaces (:func:`pipeline.decision.trail.registrations` entries). Only
    ``--force`` registers over either."""
    looks = [_look_summary(r) for r in looks_before]
    replaced = [{k: r.get(k) for k in ("commit", "identity_hash")} for r in supersedes]
    return {"schema": SCHEMA_VERSION, "identity": ident,
            "identity_hash": artifacts.sha256_json(ident),
            "forced": bool(looks or replaced), "looks_before": looks, "supersedes": replaced,
            "amendments": []}


def amendment_hash(amendment: Mapping[str, Any], previous: str) -> str:
    """The hash of an amendment, chained onto ``previous`` (the identity hash, or the previous
    amendment's hash), so no amendment can be edited or dropped without the chain showing it."""
    return artifacts.sha256_json({"previous": previous,
                                  **{k: v for k, v in amendment.items() if k != "hash"}})


def chain_head(registered: Mapping[str, Any]) -> str:
    """The hash to publish: the last amendment's, or the identity hash."""
    amendments = registered.get("amendments") or []
    return str(amendments[-1]["hash"] if amendments else registered.get("identity_hash"))


def registered_code(registered: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The code the registration binds now: its last amendment's, or the identity's."""
    amendments = [a for a in registered.get("amendments") or [] if isinstance(a, dict)]
    if amendments and isinstance(amendments[-1].get("code"), dict):
        return amendments[-1]["code"]
    ident = registered.get("identity")
    return ident.get("code") if isinstance(ident, dict) else None


def stated_power(registered: Any) -> tuple[Mapping[str, Any] | None, int | None]:
    """(power block, amendment number): the newest power statement of a registration, its last
    amendment's that restated one, or its own (amendment None)."""
    if not isinstance(registered, Mapping):
        return None, None
    for a in reversed([a for a in registered.get("amendments") or [] if isinstance(a, dict)]):
        if isinstance(a.get("power"), Mapping):
            return a["power"], int(a.get("n") or 0)
    block = registered.get("power")
    return (block if isinstance(block, Mapping) else None), None


class NothingToAmend(ValueError):
    """An amendment was asked for, but the registration cannot take one or the code is as
    registered."""


def amend(registered: Mapping[str, Any], why: str, code: Mapping[str, Any],
          looks: Sequence[Mapping[str, Any]],
          power: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The registration with one more amendment: the code it binds from now on (``code``), the
    files that changed, ``why``, and the looks at these test pieces before it (``looks``:
    ledger records). Only code can be amended; params, pieces and versions cannot. ``power``:
    the power statement restated by the amended code at the registered sizes and the val
    pilot's spreads (the registration's own stays as it was stated); the report shows the
    newest (:func:`stated_power`)."""
    if not why.strip():
        raise NothingToAmend("--amend needs the reason, in words: --amend \"what the fix is\"")
    if registered.get("schema") != SCHEMA_VERSION:
        raise NothingToAmend(f"the registration has schema {registered.get('schema')!r}: only "
                             f"a schema {SCHEMA_VERSION} registration binds code to amend; "
                             "register again (--force, over its looks)")
    changed = bound_code.changes(registered_code(registered), code)
    if not changed:
        raise NothingToAmend("the code is the code the registration binds: nothing to amend")
    amendments = list(registered.get("amendments") or [])
    entry = {"n": len(amendments) + 1, "why": why.strip(), "changes": changed,
             "code": dict(code), "looks_before": [_look_summary(r) for r in looks]}
    if power is not None:
        entry["power"] = dict(power)
    previous = chain_head(registered)
    entry["hash"] = amendment_hash(entry, previous)
    return {**registered, "amendments": [*amendments, entry]}


def test_scores_exist(eval_report: Any, split_hash: str | None) -> bool:
    """Does ``reports/eval.json`` hold test-split scores of the split ``split_hash``?"""
    if not isinstance(eval_report, dict):
        return False
    protocol = eval_report.get("protocol") or {}
    if split_hash is not None and protocol.get("split_hash") not in (None, split_hash):
        return False  # scores of another split: they say nothing about this one
    models = eval_report.get("models") or {}
    return any(isinstance(m, dict) and m.get("test") for m in models.values())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'S' * (n != 1)}"


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
    unverified: str | None = None
    """Why history could not be checked (None: it was, or the caller does not check it)."""
    amendments: list[dict[str, Any]] = field(default_factory=list)
    replaced: list[dict[str, Any]] = field(default_factory=list)
    """Earlier registrations of these test pieces that this one declares it supersedes."""
    test_sets: list[dict[str, Any]] = field(default_factory=list)
    """Earlier test sets of this experiment (:func:`earlier_test_sets`)."""

    @property
    def status(self) -> str:
        if not self.registered:
            return "NOT REGISTERED"
        if self.deviations:
            return "DEVIATED"
        if self.unverified:
            return "UNVERIFIED"
        out = "FOLLOWED"
        if self.n_looks:
            out += f" AFTER {_plural(self.n_looks, 'LOOK')}"
        if self.amendments:
            out += f" WITH {_plural(len(self.amendments), 'AMENDMENT')}"
        if self.replaced:
            out += f", REPLACING {_plural(len(self.replaced), 'REGISTRATION')}"
        if self.test_sets:
            out += f", AFTER {_plural(len(self.test_sets), 'EARLIER TEST SET')}"
        if not self.order_shown:
            out += ", ORDER NOT SHOWN"
        return out


@dataclass(frozen=True)
class Evidence:
    """What the check compares the registration with, beside the current identity: the scored
    pieces (``reports/eval/per_piece.parquet``), the ledger, git's facts, the code that runs and
    what history holds."""

    scored: Mapping[str, Sequence[str]] | None = None
    """split -> sha256s of the pieces scored (None: no per-piece table)."""
    results_sha256: str | None = None
    """:func:`pipeline.decision.ledger.results_digest` of the test rows scored."""
    records: Sequence[Mapping[str, Any]] = ()
    """The ledger's records."""
    git: Mapping[str, Any] = field(default_factory=dict)
    """:func:`pipeline.decision.history.registration_order`, plus ``ledger_rewritten``."""
    code: Mapping[str, Any] | None = None
    """The code that runs (:func:`pipeline.decision.bound_code.bound_code`); None: not checked."""
    history: Mapping[str, Any] | None = None
    """:func:`pipeline.decision.trail.scan`; None: history not checked (the status is then
    UNVERIFIED at best)."""
    results: Mapping[str, str] = field(default_factory=dict)
    """Other current digests a look may have recorded, by record kind (``audit``)."""


def check(registered: Any, current: dict[str, Any], eval_report: Any = None,
          evidence: Evidence | None = None) -> Check:
    """Compare the registration ``registered`` (the parsed JSON, or None) with ``current`` (an
    :func:`identity`) and with ``evidence``. Every hash the record holds is recomputed."""
    evidence = evidence or Evidence()
    if registered is None:
        return Check(False, None)
    if not isinstance(registered, dict) or registered.get("schema") not in READABLE_SCHEMAS:
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
    amendments = [a for a in registered.get("amendments") or [] if isinstance(a, dict)]
    out += _amendment_problems(registered, amendments)
    criteria = None
    try:
        criteria = parse_section("criteria", (ident.get("params") or {}).get("criteria"),
                                 CriteriaConfig, "reports/preregistration.json")
    except ParamsError as e:
        out.append(f"the registered criteria do not parse: {e}")
    out += _identity_differences(ident, current)
    out += _code_differences(registered, evidence)
    protocol = eval_report.get("protocol") if isinstance(eval_report, dict) else None
    scored_on = protocol.get("split_hash") if isinstance(protocol, dict) else None
    if scored_on is not None and ident.get("split_hash") not in (None, scored_on):
        out.append(f"reports/eval.json scored split {scored_on!r}, not the registered "
                   f"{ident.get('split_hash')!r}")
    out += _piece_differences(ident.get("pieces"), evidence.scored)
    pieces = (ident.get("pieces") or {}).get("test") or []
    key = (str(evidence.results_sha256), registered.get("identity_hash"))
    code = (bound_code.judging_digest(evidence.code) if evidence.code is not None else None)
    run = ledger.Run(key, registered.get("identity_hash"), len(amendments), code,
                     {"scores": str(evidence.results_sha256), **evidence.results}
                     if evidence.results_sha256 is not None else dict(evidence.results))
    earlier, this = ledger.earlier_looks(evidence.records, pieces, run)
    out += _criteria_changed_after(earlier, registered)
    if evidence.git.get("ledger_rewritten"):
        out.append(str(evidence.git["ledger_rewritten"]))
    if evidence.results_sha256 is not None and this is None:
        out.append("reports/ledger.jsonl holds no record of the test scores in "
                   "reports/eval/per_piece.parquet under this registration: evaluate records "
                   "every look, so the ledger was edited or evaluate ran without it (re-run "
                   "`dvc repro evaluate`; `symkit ledger --rebuild` adds the looks in git)")
    hist = evidence.history
    unverified = None
    if hist is None:
        unverified = "history was not checked"
    elif not hist.get("checked"):
        unverified = str(hist.get("why_not") or "history cannot be read")
    else:
        out += list(hist.get("ledger_problems") or [])
        out += _registration_history(registered, hist.get("registrations") or [])
    n_looks = max(len(earlier), len(registered.get("looks_before") or []))
    sets = earlier_test_sets(evidence.records, pieces, hist, registered)
    return Check(True, criteria, out, earlier, n_looks,
                 evidence.git.get("registration_precedes_results") is True, unverified,
                 amendments, list(registered.get("supersedes") or []), sets)


def _amendment_problems(registered: Mapping[str, Any],
                        amendments: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each amendment must hash onto the one before (the first onto the identity hash)."""
    out, previous = [], str(registered.get("identity_hash"))
    for i, a in enumerate(amendments, 1):
        if a.get("n") != i or a.get("hash") != amendment_hash(a, previous):
            out.append(f"amendment {i} of reports/preregistration.json does not hash onto the "
                       "registration before it: an amendment was edited, dropped or reordered")
        previous = str(a.get("hash"))
    return out


def _code_differences(registered: Mapping[str, Any], evidence: Evidence) -> list[str]:
    """The bound code against the code that runs (skipped when the caller gives none)."""
    if evidence.code is None:
        return []
    code = registered_code(registered)
    where = "the registration"
    if code is None:
        code = (evidence.history or {}).get("code_at_registration")
        where = "the registration's commit"
    if code is None:
        return ["the registration binds no judging code, and git cannot give the code of its "
                "commit: whether the code that judges changed since cannot be checked "
                "(register again)"]
    changed = bound_code.changes(code, evidence.code)
    if not changed:
        return []
    return [f"the code that judges, trains or stops training is not the code of {where} ("
            + "; ".join(changed) + "): a change after registration is a deviation; a fix "
            "after a look is registered with `symkit preregister --amend \"why\"`"]


def _registration_history(registered: Mapping[str, Any],
                          versions: Sequence[Mapping[str, Any]]) -> list[str]:
    """Earlier committed registrations of the same test pieces that differ from this one and
    that it does not declare; committed versions of this registration whose amendments are not
    a prefix of its own."""
    mine = test_pieces_sha256(registered)
    me = registered.get("identity_hash")
    declared = {str(r.get("identity_hash")) for r in registered.get("supersedes") or []}
    own = [a.get("hash") for a in registered.get("amendments") or [] if isinstance(a, dict)]
    out = []
    for v in versions:
        if v.get("identity_hash") == me:
            had = list(v.get("amendments") or [])
            if own[:len(had)] != had:
                out.append(f"reports/preregistration.json as committed in "
                           f"{str(v.get('commit'))[:12]} had amendments this one lacks or "
                           "changed")
        elif mine is not None and v.get("test_pieces_sha256") == mine \
                and str(v.get("identity_hash")) not in declared:
            out.append(f"an earlier registration of these test pieces, committed in "
                       f"{str(v.get('commit'))[:12]} (identity "
                       f"{str(v.get('identity_hash'))[:12]}), differs from this one, which "
                       "does not declare it: a registration replacing another is made with "
                       "`symkit preregister --force` and says so")
    return out


def earlier_test_sets(records: Sequence[Mapping[str, Any]], pieces: Sequence[str],
                      hist: Mapping[str, Any] | None, registered: Mapping[str, Any]
                      ) -> list[dict[str, Any]]:
    """Other test sets of this experiment, from the ledger's looks that share no piece with
    ``pieces`` and the committed registrations of other test pieces: per test set, its size,
    looks and registrations, and the criteria it shares with this registration. Sorted by
    first appearance."""
    mine = set(pieces)
    rules = ((registered.get("identity") or {}).get("params") or {}).get("criteria") or {}
    names = {str(r.get("name")) for r in rules.get("rules") or [] if isinstance(r, dict)}
    sets: dict[str, dict[str, Any]] = {}
    looks: dict[str, set[str]] = {}
    for r in records:
        got = set(r.get("pieces") or [])
        if not got or got & mine:
            continue
        key = str(r.get("pieces_sha256"))
        entry = sets.setdefault(key, {"pieces_sha256": key, "n_pieces": len(got), "looks": 0,
                                      "registrations": [], "shared_criteria": []})
        looks.setdefault(key, set()).add(ledger.group_of(r))
        entry["looks"] = len(looks[key])
        reg = (r.get("registration") or {})
        if reg.get("identity_hash") and reg["identity_hash"] not in entry["registrations"]:
            entry["registrations"].append(reg["identity_hash"])
        entry["shared_criteria"] = sorted(set(entry["shared_criteria"])
                                          | (names & set(reg.get("criteria") or {})))
    own = test_pieces_sha256(registered)
    for v in (hist or {}).get("registrations") or []:
        key = v.get("test_pieces_sha256")
        if key is None or key == own:
            continue
        entry = sets.setdefault(key, {"pieces_sha256": key, "n_pieces": v.get("n_test"),
                                      "looks": 0, "registrations": [], "shared_criteria": []})
        if v.get("identity_hash") not in entry["registrations"]:
            entry["registrations"].append(v.get("identity_hash"))
        entry["shared_criteria"] = sorted(set(entry["shared_criteria"])
                                          | (names & set(v.get("criteria") or [])))
    return list(sets.values())


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


def _declared(look: ledger.Look, registered: Any) -> bool:
    """Does the registration declare ``look``: among the looks it was registered over
    (``looks_before``: the same scores under the same registration) or taken under a
    registration it says it supersedes?"""
    then = (look.registration or {}).get("identity_hash")
    if then is not None and then in {r.get("identity_hash")
                                     for r in registered.get("supersedes") or []}:
        return True
    return any(b.get("registration") == then
               and b.get("results_sha256") == look.record.get("results_sha256")
               for b in registered.get("looks_before") or [])


def _criteria_changed_after(looks: Sequence[ledger.Look], registered: Any) -> list[str]:
    """One deviation per earlier look whose registration had other criteria than these, unless
    the registration declares that look (registered with ``--force`` over it: the report then
    reads FOLLOWED AFTER n LOOKS and shows what changed since): rules changed after test scores
    of these pieces were seen, without saying so."""
    out = []
    for look in looks:
        if _declared(look, registered):
            continue
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


def comparison_rule(criteria: CriteriaConfig) -> Any:
    """The rule judging the model comparison's gain (an interval rule on
    :data:`COMPARISON_METRIC` from below), or None."""
    return next((r for r in criteria.rules if r.metric == COMPARISON_METRIC
                 and r.judge == "interval" and r.op in (">", ">=")), None)


def power_sentence(criteria: CriteriaConfig, se_groups: float, seed_sd: float, seeds: int,
                   level: float, at: str) -> str | None:
    """The one power statement (:func:`pipeline.stats.power.gain_at_power`): the true gain the
    comparison rule passes with 80% probability at these spreads (``at`` says whose)."""
    rule = comparison_rule(criteria)
    if rule is None:
        return None
    gain = gain_at_power(rule.threshold, se_groups, seed_sd, seeds, level)
    return (f"Power of {rule.name} at {at}: it passes with 80% probability only a true gain of "
            f"{gain:.2%} or more (its {level:.0%} interval must clear {rule.threshold:.2%}; "
            f"gain standard error {se_groups:.3g} over test groups, per-seed spread "
            f"{seed_sd:.3g} over {seeds} seeds).")


REPRODUCTION_RULE = ("half the smallest gain the registration calls meaningful (the comparison "
                     "rule's threshold): a re-run whose pooled NLL per note moves by less cannot "
                     "move the decision's gain by as much as half that gain")


def reproduction_tolerance(criteria: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The relative tolerance ``symkit reproduce`` holds a re-run's pooled NLL per note to,
    fixed at registration by :data:`REPRODUCTION_RULE` from the registered criteria (a params
    ``criteria`` section); None without a comparison rule. It never grows with the run's own
    noise."""
    rules = (criteria or {}).get("rules") if isinstance(criteria, Mapping) else None
    rule = next((r for r in rules or [] if isinstance(r, Mapping)
                 and r.get("metric") == COMPARISON_METRIC and r.get("judge") == "interval"
                 and r.get("op") in (">", ">=")), None)
    if rule is None or not isinstance(rule.get("threshold"), int | float):
        return None
    return {"tolerance": float(rule["threshold"]) / 2, "rule": REPRODUCTION_RULE}

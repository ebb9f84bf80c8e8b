"""The adaptation experiment's registration: its decision frozen before the target test set is
scored, and the check that makes the registered decision the one judged.

``symkit preregister`` run in an adaptation experiment's folder (its params.yaml has an
``adaptation`` section) writes ``reports/preregistration.json`` there. The record follows the
default experiment's (:mod:`pipeline.decision.preregistration`), with what this experiment scores:

- ``identity.split_hash`` and ``identity.pieces``: the *target's* split hash and its val and test
  pieces (the top-level pipeline's split; the arms are chosen on val and judged on test);
- ``identity.source``: the source's split hash and its val pieces (retention is judged there);
- ``identity.params``: ``tokenize`` and ``split`` as written, ``transformer`` and ``adaptation``
  resolved (a key the experiment leaves out takes the code's default, so a changed default is a
  changed experiment), and the decision (``adaptation.decision``) as a section of its own, so a
  look under other rules is named as such;
- ``identity.packages``: the versions of the packages results depend on.

``adapt-evaluate`` and ``adapt-audit`` read the target test rows through
:mod:`pipeline.decision.looks`, which appends each look to the experiment's test-access ledger
(``reports/ledger.jsonl``, :mod:`pipeline.decision.ledger`); ``adapt-evaluate`` judges with the
registered decision and states the status: NOT REGISTERED, DEVIATED (each difference named),
FOLLOWED AFTER n LOOKS, FOLLOWED, ORDER NOT SHOWN, or FOLLOWED, as the default experiment's report
does. A look is this run's when it was made under this registration (and its amendments) with
the judging code that runs and, where it recorded scores, these scores
(:class:`pipeline.decision.ledger.Run`); every other look at the target test pieces (other
scores, another registration or none, other code) counts as one earlier look.

The ledger is the experiment's own. The target's test pieces are also the default experiment's:
its ledger (the top-level ``reports/ledger.jsonl``) does not hold the adaptation's looks, and this
one does not hold the default experiment's; both count looks at *their* scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.adaptation.config import AdaptationConfig, DecisionSection
from pipeline.core import artifacts
from pipeline.core.artifacts import RESULT_PACKAGES
from pipeline.core.config import ParamsError, load_section, parse_section, read_params
from pipeline.core.splits import split_hash, split_hash_of
from pipeline.decision import bound_code, history, ledger
from pipeline.decision.preregistration import Check, diff_flat
from pipeline.training.config import TransformerStageConfig

KIND = "adaptation"
SCHEMA_VERSION = 1
REGISTRATION = Path("reports/preregistration.json")
LEDGER = Path("reports/ledger.jsonl")
PER_PIECE = Path("reports/adaptation/per_piece.parquet")
REPORT = Path("reports/adaptation.json")
SECTIONS = ("tokenize", "split", "transformer", "adaptation", "decision")
"""The frozen params sections, in the record's order."""


def is_adaptation(params: Path) -> bool:
    """Is ``params`` an adaptation experiment's params.yaml?"""
    return isinstance(read_params(params).get(KIND), dict)


def frozen_params(params: Path) -> dict[str, Any]:
    """The params sections the registration freezes (:data:`SECTIONS`)."""
    data = read_params(params)
    adaptation = load_section(KIND, params, AdaptationConfig).model_dump(mode="json")
    transformer = load_section("transformer", params, TransformerStageConfig)
    return {"tokenize": data.get("tokenize"), "split": data.get("split"),
            "transformer": transformer.model_dump(mode="json", by_alias=True),
            "adaptation": {k: v for k, v in adaptation.items() if k != "decision"},
            "decision": adaptation["decision"]}


def _split(splits: Path, split_report: Path, wanted: Sequence[str]
           ) -> tuple[str, dict[str, list[str]]]:
    table = artifacts.read_parquet(splits, columns=["sha256", "split"])
    digest = split_hash(table["sha256"].astype(str), table["split"].astype(str))
    reported = split_hash_of(artifacts.read_json_or_none(split_report))
    if reported is not None and reported != digest:
        raise artifacts.ArtifactError(
            f"{split_report.as_posix()} names split {reported[:12]} but {splits.as_posix()} "
            f"hashes to {digest[:12]}: re-run the split stage that wrote them")
    return digest, {s: sorted(table.loc[table["split"] == s, "sha256"].astype(str))
                    for s in wanted}


def identity(params: Path, *, target_splits: Path, target_split_report: Path,
             source_splits: Path, source_split_report: Path,
             packages: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The adaptation experiment's identity (module docstring)."""
    target_hash, target = _split(target_splits, target_split_report, ("val", "test"))
    source_hash, source = _split(source_splits, source_split_report, ("val",))
    packages = artifacts.package_versions() if packages is None else packages
    return {"kind": KIND, "split_hash": target_hash, "pieces": target,
            "source": {"split_hash": source_hash, "pieces": source},
            "params": frozen_params(params),
            "packages": {p: packages.get(p) for p in RESULT_PACKAGES}}


def register(params: Path, *, target_splits: Path, target_split_report: Path,
             source_splits: Path, source_split_report: Path, out: Path = REGISTRATION,
             ledger_path: Path = LEDGER, per_piece: Path = PER_PIECE, report: Path = REPORT,
             force: bool = False) -> dict[str, Any]:
    """Write the registration; refuse when this experiment's target test scores exist, unless
    ``force`` (the record then lists the looks it was registered over)."""
    ident = identity(params, target_splits=target_splits,
                     target_split_report=target_split_report, source_splits=source_splits,
                     source_split_report=source_split_report)
    old = artifacts.read_json_or_none(out)
    if isinstance(old, dict) and old.get("identity") == ident:
        return old
    found = ledger.existing_looks(ident["pieces"]["test"], ledger_path=ledger_path,
                                  per_piece=per_piece, eval_report=report, registration=out)
    ledger.append(found, ledger_path)  # looks found in git or the workspace are looks
    looks = found  # one record per look (ledger.existing_looks)
    if looks and not force:
        n = len(looks)
        raise ledger.AlreadyScored(
            f"this experiment's test scores of these {len(ident['pieces']['test'])} target "
            f"test pieces already exist ({n} look{'s' * (n != 1)}, in {ledger_path.as_posix()}"
            f", git history or {per_piece.as_posix()}): a registration made now would not "
            "precede them; pass --force (the report will read FOLLOWED AFTER n LOOKS at best)")
    record = {"schema": SCHEMA_VERSION, "kind": KIND, "identity": ident,
              "identity_hash": artifacts.sha256_json(ident), "forced": bool(looks),
              "looks_before": [{k: r.get(k) for k in ("source", "commit", "time", "n_pieces",
                                                      "results_sha256")}
                               | {"registration": (r.get("registration") or {}).get(
                                   "identity_hash")} for r in looks]}
    artifacts.write_json(out, record)
    return record


def registered_decision(registered: Any) -> DecisionSection | None:
    """The registered decision, or None when there is none that parses."""
    ident = registered.get("identity") if isinstance(registered, dict) else None
    params = ident.get("params") if isinstance(ident, dict) else None
    if not isinstance(params, dict) or not isinstance(params.get("decision"), dict):
        return None
    try:
        return parse_section("adaptation.decision", params["decision"], DecisionSection,
                             REGISTRATION.as_posix())
    except ParamsError:
        return None


def check(registered: Any, current: Mapping[str, Any], table: pd.DataFrame,
          records: Sequence[Mapping[str, Any]], git: Mapping[str, Any] | None = None, *,
          code: str | None = None) -> tuple[Check, DecisionSection | None]:
    """(the check, the registered decision) of ``registered`` (the parsed record, or None)
    against ``current`` (:func:`identity`), the scored per-piece ``table`` and the ledger's
    ``records``; ``code`` is the digest of the judging code that runs (default
    :func:`pipeline.decision.bound_code.judging_digest`), which tells this run's looks from
    earlier ones. Every hash the record holds is recomputed."""
    where = REGISTRATION.as_posix()
    if registered is None:
        return Check(False, None), None
    if not isinstance(registered, dict) or registered.get("kind") != KIND \
            or registered.get("schema") != SCHEMA_VERSION:
        return Check(True, None, [f"{where} is not an adaptation registration of schema "
                                  f"{SCHEMA_VERSION}: register again before scoring"]), None
    ident = registered.get("identity")
    if not isinstance(ident, dict):
        return Check(True, None, [f"{where} has no identity block"]), None
    out: list[str] = []
    if registered.get("identity_hash") != artifacts.sha256_json(ident):
        out.append(f"identity_hash does not match the registered identity: {where} was edited "
                   "after registration")
    decision = registered_decision(registered)
    if decision is None:
        out.append("the registered decision does not parse")
    for what, old, new in (("split_hash", ident.get("split_hash"), current.get("split_hash")),
                           ("source split_hash", (ident.get("source") or {}).get("split_hash"),
                            (current.get("source") or {}).get("split_hash"))):
        if old != new:
            out.append(f"{what}: registered {old!r}, now {new!r} (the split changed)")
    for section in SECTIONS:
        out += diff_flat((ident.get("params") or {}).get(section),
                         (current.get("params") or {}).get(section), section)
    out += diff_flat(ident.get("packages"), current.get("packages"), "package")
    registered_pieces = {**(ident.get("pieces") or {}),
                         "source_val": ((ident.get("source") or {}).get("pieces") or {}).get(
                             "val")}
    for split, want in registered_pieces.items():
        got = set(table.loc[table["split"] == split, "sha256"].astype(str))
        if got and set(want or []) != got:
            out.append(f"{split} pieces: {len(want or [])} registered, {len(got)} scored, "
                       f"{len(got - set(want or []))} of them not registered")
    rows = ledger.test_rows(table)
    scores = ledger.results_digest(rows)
    run = ledger.Run((scores, registered.get("identity_hash")), registered.get("identity_hash"),
                     len(registered.get("amendments") or []),
                     code if code is not None else bound_code.judging_digest(),
                     {"scores": scores})
    earlier, this = ledger.earlier_looks(records, (ident.get("pieces") or {}).get("test") or [],
                                         run)
    for look in earlier:
        if "decision" in ledger.changes_since(look, registered)["sections"]:
            out.append(f"the decision changed after {look.label()} scored {look.overlap} of "
                       "these target test pieces under another registration")
    if len(rows) and this is None:
        out.append(f"{LEDGER.as_posix()} holds no record of these target test scores under "
                   "this registration: adapt-evaluate records every look, so the ledger was "
                   "edited")
    git = git or {}
    n_looks = max(len(earlier), len(registered.get("looks_before") or []))
    return (Check(True, None, out, earlier, n_looks,
                  git.get("registration_precedes_results") is True), decision)


def order(registration: Path = REGISTRATION, results: Path = REPORT) -> dict[str, Any]:
    """git's facts on whether the registration was committed before the results."""
    return history.registration_order(registration, results)

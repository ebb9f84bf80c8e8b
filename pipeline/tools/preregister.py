"""``symkit preregister``: freeze the experiment's identity and its decision rules before the test
set is scored.

Pre-registration is an explicit act, not a pipeline stage: run it after ``split`` (it needs the
split hash) and before ``evaluate`` has scored the test split, then commit
``reports/preregistration.json`` on its own, before the results. The record
(:mod:`pipeline.report.registration`) holds:

- ``identity.split_hash``: from ``reports/split.json``;
- ``identity.params``: the params sections that shape results, as written (``tokenize``,
  ``ngram``, ``transformer``, ``evaluate``, ``generate``, ``audit``, ``criteria``);
- ``identity.packages``: the installed versions of the packages results depend on;
- ``identity_hash``: the hash of ``identity`` (the report recomputes it);
- ``registered_after_scoring`` and ``eval_report_sha256``: set only by ``--force`` when test
  scores of this split already existed, which the report counts as a deviation.

The report judges with the registered rules; any difference is a deviation, and the decision is
then DEVIATED. No timestamps: the commit that adds the file dates it, and the report says whether
that commit precedes the results.

The planned comparisons between runs (params.yaml's ``compare`` section) are frozen into a file of
their own, ``reports/preregistration_compare.json`` (:mod:`pipeline.report.comparisons`), so that
registering a comparison never changes the experiment's registration, which evaluate reads.
Register them before the runs they compare (commit the file, then ``symkit sweep`` or ``dvc exp
run``): every experiment carries the file it ran with, and ``symkit compare`` calls a rule
DEVIATED when an arm holds another registration or none. ``--comparisons-only`` registers them
alone, e.g. on an experiment whose test set is already scored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.config import load_section, parse_section, read_params
from pipeline.core.splits import split_hash_of
from pipeline.report import comparisons
from pipeline.report.comparisons import CompareConfig
from pipeline.report.criteria import CriteriaConfig
from pipeline.report.registration import build, identity, power_note, test_scores_exist


class AlreadyScored(RuntimeError):
    """Test scores of this split exist: registering now would not be pre-registration."""


def run(params: Path, *, split_report: Path, eval_report: Path, out: Path,
        force: bool = False) -> dict[str, Any]:
    """Write the registration; refuse when test scores of this split already exist, unless
    ``force`` (which the record then states)."""
    load_section("criteria", params, CriteriaConfig)  # the rules must be valid to be frozen
    split_hash = split_hash_of(artifacts.read_json_or_none(split_report))
    ident = identity(read_params(params), split_hash, artifacts.package_versions())
    scored = test_scores_exist(artifacts.read_json_or_none(eval_report), split_hash)
    old = artifacts.read_json_or_none(out)
    if scored and isinstance(old, dict) and old.get("identity") == ident \
            and not old.get("registered_after_scoring"):
        return old  # the same registration again: nothing to change
    if scored and not force:
        raise AlreadyScored(
            f"{eval_report} already holds test scores of split {split_hash}: a registration made "
            "now would not precede them. Register before `dvc repro evaluate`, or pass --force "
            "(the report will then say the rules were registered after scoring).")
    record = build(ident, artifacts.sha256_file(eval_report) if scored else None)
    artifacts.write_json(out, record)
    return record


def register_comparisons(params: Path, out: Path) -> dict[str, Any] | None:
    """Write the registration of params.yaml's ``compare`` section (validated, its rules' keys
    checked against params.yaml) to ``out``; None, and nothing written, without a section."""
    data = read_params(params)
    if data.get("compare") is None:
        return None
    cfg = parse_section("compare", data["compare"], CompareConfig, str(params))
    comparisons.check_against(cfg, data, str(params))
    rec = comparisons.record(data["compare"])
    if artifacts.read_json_or_none(out) != rec:
        artifacts.write_json(out, rec)
    return rec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-report", type=Path, default=Path("reports/split.json"))
    parser.add_argument("--eval-report", type=Path, default=Path("reports/eval.json"))
    parser.add_argument("--out", type=Path, default=Path("reports/preregistration.json"))
    parser.add_argument("--force", action="store_true",
                        help="register although test scores exist (recorded as a deviation)")
    parser.add_argument("--compare-out", type=Path,
                        default=Path(comparisons.REGISTRATION),
                        help="where the planned comparisons (params.yaml's compare section) "
                             "are registered")
    parser.add_argument("--comparisons-only", action="store_true",
                        help="register the planned comparisons only, leaving the experiment's "
                             "registration as it is")


def main(args: argparse.Namespace) -> int:
    if not args.comparisons_only:
        rc = _register_experiment(args)
        if rc:
            return rc
    rec = register_comparisons(args.params, args.compare_out)
    if rec is None:
        print(f"preregister: no compare section in {args.params}: no comparison registered")
        if args.comparisons_only:
            return 1
    else:
        rules = rec["compare"].get("rules") or []
        print(f"preregister: {len(rules)} planned comparison{'s' * (len(rules) != 1)} "
              f"({', '.join(r['name'] for r in rules) or 'none'}), {rec['hash'][:12]} -> "
              f"{args.compare_out} (commit it before running the arms)")
    return 0


def _register_experiment(args: argparse.Namespace) -> int:
    try:
        rec = run(args.params, split_report=args.split_report, eval_report=args.eval_report,
                  out=args.out, force=args.force)
    except AlreadyScored as e:
        print(f"symkit preregister: {e}", file=sys.stderr)
        print("symkit preregister: to register the planned comparisons alone: symkit "
              "preregister --comparisons-only", file=sys.stderr)
        return 1
    ident = rec["identity"]
    rules = (ident["params"].get("criteria") or {}).get("rules") or []
    print(f"preregister: {len(rules)} criteria, split {ident['split_hash']}, "
          f"identity {rec['identity_hash'][:12]} -> {args.out} (commit it before the results)")
    if ident["split_hash"] is None:
        print(f"preregister: warning: no split_hash in {args.split_report}; run `dvc repro "
              "split` and register again so the split can be verified", file=sys.stderr)
    criteria = load_section("criteria", args.params, CriteriaConfig)
    level = ((rec["identity"]["params"].get("evaluate") or {}).get("ci_level") or 0.95)
    note = power_note(criteria, artifacts.read_json_or_none(args.eval_report), float(level))
    print(f"preregister: {note}" if note else "preregister: the power of the comparison rule is "
          "stated in the report once val is scored (from val's per-group spread)")
    if rec["registered_after_scoring"]:
        print("preregister: warning: registered after test scores existed; the report will "
              "show this as a deviation", file=sys.stderr)
    return 0

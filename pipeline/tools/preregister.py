"""``symkit preregister``: freeze the decision criteria, the scoring protocol and the split.

Pre-registration is an explicit act, not a pipeline stage: run it after ``split`` and before test
scores are looked at, then commit ``reports/preregistration.json``. The report reads it as an
input and shows every difference from the current criteria, protocol or split as a deviation.

The file holds:

- ``criteria``: the ``criteria.rules`` of params.yaml, and ``criteria_hash``;
- ``protocol.params``: the ``evaluate`` section of params.yaml (how every model is scored) and
  ``protocol.eval_block``: the ``protocol`` block of ``reports/eval.json`` if it already exists;
  ``protocol_hash`` covers both;
- ``split_hash``: the split identity from ``reports/split.json`` (null if split has not run —
  the report then flags it as unverifiable);
- ``eval_report_sha256``: hash of ``reports/eval.json`` if it existed at registration, so a reader
  can see whether test scores could have been seen first.

No timestamps: the commit that adds the file dates it. An existing, different registration is not
overwritten without ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.config import load_section, read_params
from pipeline.report.criteria import CriteriaConfig
from pipeline.report.registration import build


def run(params: Path, *, split_report: Path, eval_report: Path, out: Path,
        force: bool = False) -> dict[str, Any]:
    """Write the registration; refuse to replace a different one unless ``force``."""
    criteria = load_section("criteria", params, CriteriaConfig)
    evaluate_params = read_params(params).get("evaluate")
    eval_json = artifacts.read_json_or_none(eval_report)
    record = build(criteria, evaluate_params, artifacts.read_json_or_none(split_report), eval_json,
                   artifacts.sha256_file(eval_report) if eval_report.exists() else None)
    old = artifacts.read_json_or_none(out)
    if old is not None and old != record and not force:
        raise FileExistsError(f"{out} already holds a different pre-registration; changing it "
                              "after test scores exist is a deviation. Pass --force to replace it.")
    artifacts.write_json(out, record)
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-report", type=Path, default=Path("reports/split.json"))
    parser.add_argument("--eval-report", type=Path, default=Path("reports/eval.json"))
    parser.add_argument("--out", type=Path, default=Path("reports/preregistration.json"))
    parser.add_argument("--force", action="store_true",
                        help="replace an existing, different pre-registration")


def main(args: argparse.Namespace) -> int:
    try:
        rec = run(args.params, split_report=args.split_report, eval_report=args.eval_report,
                  out=args.out, force=args.force)
    except FileExistsError as e:
        print(f"symkit preregister: {e}", file=sys.stderr)
        return 1
    print(f"preregister: {len(rec['criteria'])} criteria, split_hash={rec['split_hash']} "
          f"-> {args.out} (commit it)")
    if rec["split_hash"] is None:
        print(f"preregister: warning: no split_hash in {args.split_report}; run `symkit split` "
              "and register again (with --force) so the split can be verified", file=sys.stderr)
    if rec["eval_report_sha256"] is not None:
        print(f"preregister: warning: {args.eval_report} already exists; the report will note "
              "that scores existed at registration", file=sys.stderr)
    return 0

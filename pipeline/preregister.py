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

from pipeline import artifacts
from pipeline.config import load_section, read_params
from pipeline.criteria import CriteriaConfig, rules_as_dicts

SCHEMA_VERSION = 1


def _read_json(path: Path) -> Any:
    try:
        return artifacts.read_json(path) if path.exists() else None
    except ValueError:  # unreadable JSON is reported as absent, not a crash
        return None


def split_hash_of(split_report: Any) -> str | None:
    """The split identity from reports/split.json (``split_hash``, wherever it is nested)."""
    if not isinstance(split_report, dict):
        return None
    if isinstance(split_report.get("split_hash"), str):
        return split_report["split_hash"]
    for v in split_report.values():
        found = split_hash_of(v) if isinstance(v, dict) else None
        if found:
            return found
    return None


def protocol_of(evaluate_params: Any, eval_report: Any) -> dict[str, Any]:
    block = eval_report.get("protocol") if isinstance(eval_report, dict) else None
    return {"params": evaluate_params, "eval_block": block}


def build(criteria: CriteriaConfig, evaluate_params: Any, split_report: Any,
          eval_report: Any, eval_sha256: str | None) -> dict[str, Any]:
    """The registration record (a pure function of its inputs)."""
    rules = rules_as_dicts(criteria)
    protocol = protocol_of(evaluate_params, eval_report)
    return {
        "schema": SCHEMA_VERSION,
        "criteria": rules,
        "criteria_hash": artifacts.sha256_json(rules),
        "protocol": protocol,
        "protocol_hash": artifacts.sha256_json(protocol),
        "split_hash": split_hash_of(split_report),
        "eval_report_sha256": eval_sha256,
    }


def run(params: Path, *, split_report: Path, eval_report: Path, out: Path,
        force: bool = False) -> dict[str, Any]:
    """Write the registration; refuse to replace a different one unless ``force``."""
    criteria = load_section("criteria", params, CriteriaConfig)
    evaluate_params = read_params(params).get("evaluate")
    eval_json = _read_json(eval_report)
    record = build(criteria, evaluate_params, _read_json(split_report), eval_json,
                   artifacts.sha256_file(eval_report) if eval_report.exists() else None)
    old = _read_json(out)
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


def _diff_flat(a: Any, b: Any, what: str) -> list[str]:
    from pipeline.criteria import flatten

    fa = flatten(a, max_list=10**6) if isinstance(a, dict) else {"": a}
    fb = flatten(b, max_list=10**6) if isinstance(b, dict) else {"": b}
    out = []
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k, "<absent>") != fb.get(k, "<absent>"):
            key = f"{what}.{k}" if k else what
            out.append(f"{key}: pre-registered {fa.get(k, '<absent>')!r}, now "
                       f"{fb.get(k, '<absent>')!r}")
    return out


def deviations(registered: Any, current: dict[str, Any]) -> list[str]:
    """Human-readable differences between a registration and the current record (same shape as
    :func:`build`'s). An empty list means the decision follows the registration."""
    if not isinstance(registered, dict):
        return ["no pre-registration found (reports/preregistration.json): the criteria, protocol "
                "and split were not frozen before scoring"]
    out: list[str] = []
    old = {r.get("name"): r for r in registered.get("criteria") or [] if isinstance(r, dict)}
    new = {r["name"]: r for r in current["criteria"]}
    for name in sorted(set(old) - set(new), key=str):
        out.append(f"criterion {name!r} was pre-registered but has been removed")
    for name in sorted(set(new) - set(old), key=str):
        out.append(f"criterion {name!r} was added after pre-registration")
    for name in sorted(set(old) & set(new), key=str):
        out += _diff_flat(old[name], new[name], f"criterion {name!r}")
    reg_proto = registered.get("protocol") or {}
    out += _diff_flat(reg_proto.get("params"), current["protocol"]["params"], "protocol (evaluate)")
    if reg_proto.get("eval_block") is not None:
        out += _diff_flat(reg_proto["eval_block"], current["protocol"]["eval_block"],
                          "protocol (eval.json)")
    if registered.get("split_hash") is None:
        out.append("the split identity (split_hash) was not pre-registered, so the split cannot "
                   "be verified")
    elif registered["split_hash"] != current["split_hash"]:
        out.append(f"split_hash: pre-registered {registered['split_hash']!r}, now "
                   f"{current['split_hash']!r} (the split changed)")
    block = current["protocol"].get("eval_block")
    scored_on = block.get("split_hash") if isinstance(block, dict) else None
    if scored_on is not None and registered.get("split_hash") not in (None, scored_on):
        out.append(f"reports/eval.json scored split {scored_on!r}, not the pre-registered "
                   f"{registered['split_hash']!r}")
    if registered.get("eval_report_sha256") is not None:
        out.append("reports/eval.json already existed when the criteria were registered: test "
                   "scores may have been seen before the criteria were fixed")
    return out

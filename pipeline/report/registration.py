"""The pre-registration record: what ``symkit preregister`` freezes and how the report compares
the current experiment with it.

:func:`build` makes the record (a pure function of its inputs); :func:`deviations` lists, in
plain words, every difference between a registered record and the current one.
"""

from __future__ import annotations

from typing import Any

from pipeline.core import artifacts
from pipeline.core.splits import split_hash_of
from pipeline.report.criteria import CriteriaConfig, flatten, rules_as_dicts

SCHEMA_VERSION = 1


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


def _diff_flat(a: Any, b: Any, what: str) -> list[str]:
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

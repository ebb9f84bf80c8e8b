"""``symkit reproduce [--against REV]``: did a re-run reproduce the committed experiment?

Run it after ``make repro`` (or ``dvc repro``) in a clone. It compares the workspace with the
committed revision ``REV`` (default ``HEAD``) three ways and says which degree of reproduction
holds (README, "Reproducibility"):

1. **Artifacts, byte for byte:** every output hash that ``dvc.lock`` records, stage by stage, in
   ``REV`` against the workspace's ``dvc.lock`` (which ``dvc repro`` rewrote). Data outputs go
   to the DVC cache and are compared by these hashes, never re-read.
2. **Verdicts:** the ``decision.*`` keys of ``reports/metrics.json`` (the registered rules'
   decision, the counts and each criterion's verdict) must be equal; the keys that count looks at
   the test set (:data:`LOOK_KEYS`) are left out, since a re-run that re-scores it is a look.
3. **Model metrics within a tolerance:** for every model and scored split of ``REV``'s
   ``reports/eval.json``, the pooled NLL per note of the re-run against the committed one; the
   relative difference must lie within the tolerance fixed at registration
   (``identity.reproduction`` of ``REV``'s registration: half the comparison rule's threshold,
   :data:`pipeline.decision.preregistration.REPRODUCTION_RULE`), which the run's own noise never
   widens; ``--tolerance`` (0.1%) only where ``REV`` has no comparison rule. Test is compared
   too: this checks a run, it picks no winner.
4. **The same experiment:** the params that shape results (:data:`RESULT_SECTIONS`) and the
   code that judges, trains and stops training (:mod:`pipeline.decision.bound_code`, as
   ``REV`` held it) must be the same; any difference is not a reproduction.

The conclusion is ``byte-identical`` (every output hash equal: same CPU model and software),
``within tolerance`` (some outputs differ, typically training's on another CPU model, but every
verdict is equal and every model metric equivalent), or ``not reproduced`` (with the reasons).
Exit status 0 for the first two, 1 for ``not reproduced``, 2 when ``REV`` or a file is missing.
The record goes to ``--out`` (default ``reports/reproduce.json``), and one line per check to
stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pipeline.core import artifacts
from pipeline.decision.bound_code import bound_code, changes
from pipeline.decision.ledger import REGISTRATION
from pipeline.decision.preregistration import (
    FROZEN_SECTIONS,
    diff_flat,
    reproduction_tolerance,
)
from pipeline.decision.trail import code_at
from pipeline.tools.compare import fraction_arg
from pipeline.tools.runs import (
    Gate,
    RunSource,
    RunSourceError,
    add_gate_arguments,
    read_run,
    resolve_source,
    with_test_rows,
)

HELP = "did a re-run reproduce the committed experiment? (artifacts, verdicts, metrics)"

LOCK = "dvc.lock"
METRICS = "reports/metrics.json"
SCHEMA_VERSION = 1


class ReproduceError(ValueError):
    """A file the check needs is missing or unreadable; the message names it."""


def _read(src: RunSource, rel: str) -> bytes:
    data = src.read(rel)
    if data is None:
        raise ReproduceError(f"{src.where(rel)} does not exist: run `make repro` (or `dvc "
                             "repro`) first, and check against a revision that holds results")
    return data


def lock_outputs(text: bytes) -> dict[str, dict[str, str]]:
    """stage -> {output path -> its hash} from a ``dvc.lock`` (md5, with ``.dir`` for folders)."""
    try:
        lock = yaml.safe_load(text.decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ReproduceError(f"{LOCK} is not valid YAML: {e}") from e
    out: dict[str, dict[str, str]] = {}
    for stage, entry in sorted((lock.get("stages") or {}).items()):
        outs = (entry or {}).get("outs") or []
        out[stage] = {str(o.get("path")): str(o.get("md5") or o.get("hash") or "")
                      for o in outs if isinstance(o, dict)}
    return out


def artifact_check(committed: dict[str, dict[str, str]],
                   rerun: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Per stage, the outputs whose hash differs (or is missing) in the re-run."""
    stages = {}
    for stage, outs in committed.items():
        now = rerun.get(stage, {})
        differ = sorted(p for p, h in outs.items() if now.get(p) != h)
        stages[stage] = {"n_outputs": len(outs), "differ": differ}
    return {"identical": all(not s["differ"] for s in stages.values()), "stages": stages}


LOOK_KEYS = ("decision.overall", "decision.registration", "decision.earlier_looks")
"""Keys that count looks at the test set: a re-run that re-scores it on another CPU model is
itself a look (the ledger records it), so these may change while every verdict holds. They are
compared only where metrics.json has no ``decision.rules`` (the rules' own verdict)."""


def verdict_check(committed: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """The ``decision.*`` keys of two metrics.json files, and those that differ."""
    skip = LOOK_KEYS if "decision.rules" in committed and "decision.rules" in rerun else ()
    keys = sorted(k for k in set(committed) | set(rerun)
                  if k.startswith("decision.") and k not in skip)
    differ = [{"key": k, "committed": committed.get(k), "rerun": rerun.get(k)}
              for k in keys if committed.get(k) != rerun.get(k)]
    return {"equal": not differ, "n_keys": len(keys), "differ": differ}


def pooled_by_seed(rows: pd.DataFrame) -> pd.Series:
    """NLL per note of one model on one split, per training seed (one entry, seed -1, for a
    model without seeds): total NLL over total notes."""
    seeds = rows["seed"].fillna(-1).astype(int)
    sums = rows.assign(seed=seeds).groupby("seed")[["nll_nats", "n_notes"]].sum()
    return (sums["nll_nats"] / sums["n_notes"]).sort_index()


RESULT_SECTIONS = ("corpus", "ingest", "dedupe", "split", *FROZEN_SECTIONS)
"""params.yaml sections whose values shape results: a re-run with any other is another
experiment, not a reproduction."""


def registered_tolerance(src: RunSource, floor: float) -> dict[str, Any]:
    """The tolerance fixed at registration (``identity.reproduction`` of ``REV``'s
    registration), or the same rule applied to ``REV``'s registered or params.yaml criteria,
    or, without a comparison rule, ``floor`` (``--tolerance``)."""
    reg = _json_or_none(src.read(REGISTRATION))
    ident = reg.get("identity") if isinstance(reg, dict) else None
    fixed = ident.get("reproduction") if isinstance(ident, dict) else None
    if isinstance(fixed, dict) and isinstance(fixed.get("tolerance"), int | float):
        return {"tolerance": float(fixed["tolerance"]), "from": "registered"}
    criteria = ((ident or {}).get("params") or {}).get("criteria") if ident else None
    if criteria is None:
        data = src.read("params.yaml")
        criteria = (yaml.safe_load(data) or {}).get("criteria") if data else None
    rule = reproduction_tolerance(criteria)
    if rule is not None:
        return {"tolerance": rule["tolerance"], "from": "the registration's rule"}
    return {"tolerance": floor, "from": "stated tolerance"}


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data is not None else None
    except json.JSONDecodeError:
        return None


def params_check(against: RunSource, workspace: RunSource) -> list[str]:
    """The params that shape results (:data:`RESULT_SECTIONS`) that differ between ``REV`` and
    the workspace, one line each."""
    def sections(src: RunSource) -> dict[str, Any]:
        data = src.read("params.yaml")
        doc = (yaml.safe_load(data) or {}) if data else {}
        return {k: doc.get(k) for k in RESULT_SECTIONS}

    a, b = sections(against), sections(workspace)
    return [line for k in RESULT_SECTIONS for line in diff_flat(a[k], b[k], k)]


def code_check(against: RunSource) -> list[str] | None:
    """The bound code (judging, recipe, stopping) of ``REV`` against the code that runs, one line
    per part that differs; None when ``REV`` holds none of it (results kept apart from the
    code)."""
    if against.kind != "git" or against.commit is None:
        return None
    then = code_at(against.commit)
    if all(d is None for part in then.values() for d in part.values()):
        return None
    return changes(then, bound_code())


def metric_check(against: RunSource, workspace: RunSource, floor: float,
                 gate: Gate | None = None) -> dict[str, Any]:
    """Each model's pooled NLL per note on each scored split of ``against``, re-run against
    committed, within the tolerance fixed at registration (:func:`registered_tolerance`; the
    run's own seed spread never widens it). Not a test over pieces: a re-run is the same
    experiment on the same pieces. Test rows are read through ``gate`` (default: recorded
    nowhere)."""
    tolerance = registered_tolerance(against, floor)
    arms = [read_run(against, "committed"), read_run(workspace, "rerun")]
    models = sorted(arms[0].eval.get("models") or {})
    splits = [s for s in (arms[0].protocol.get("splits") or []) if s in ("val", "test")]
    if "test" in splits:
        gate = gate or Gate("reproduce", None, None)
        arms = [with_test_rows(a, gate) for a in arms]
    rows = []
    for model in models:
        for split in splits:
            a, b = (arm.per_piece[(arm.per_piece["model"] == model)
                                  & (arm.per_piece["split"] == split)] for arm in arms)
            row: dict[str, Any] = {"model": model, "split": split}
            reason = None
            if a.empty:
                reason = "the committed run scored no piece"
            elif set(a["sha256"]) != set(b["sha256"]):
                reason = (f"the re-run scored other pieces ({b['sha256'].nunique()} against "
                          f"{a['sha256'].nunique()})")
            elif set(a["seed"].dropna()) != set(b["seed"].dropna()):
                reason = "the re-run has other training seeds"
            if reason:
                rows.append({**row, "within_tolerance": False, "reason": reason})
                continue
            committed, rerun = pooled_by_seed(a), pooled_by_seed(b)
            c, r = float(committed.mean()), float(rerun.mean())
            tol = {**tolerance, "n_seeds": len(committed)}
            rel = (c - r) / c
            rows.append({**row, **tol, "committed": c, "rerun": r, "rel_difference": rel,
                         "within_tolerance": abs(rel) <= tol["tolerance"]})
    return {"within_tolerance": bool(rows) and all(r["within_tolerance"] for r in rows),
            "floor": floor, "models": rows}


def run(against: str, *, tolerance: float, ledger_path: Path | None = None,
        registration: Path | None = None) -> dict[str, Any]:
    """The reproduction record of the workspace against revision ``against``; reading the test
    scores is a look, recorded in ``ledger_path`` (None: nowhere) under ``registration``."""
    src = resolve_source(against)
    if src.kind != "git":
        raise RunSourceError(f"{against!r} is a folder: give a git revision (commit, branch or "
                             "tag) holding the committed results")
    ws = resolve_source("workspace")
    arts = artifact_check(lock_outputs(_read(src, LOCK)), lock_outputs(_read(ws, LOCK)))
    verdicts = verdict_check(json.loads(_read(src, METRICS)), json.loads(_read(ws, METRICS)))
    metrics = metric_check(src, ws, tolerance, Gate("reproduce", ledger_path, registration))
    reasons = []
    params = params_check(src, ws)
    if params:
        reasons.append("params that shape results differ: " + "; ".join(params[:5])
                       + (f" and {len(params) - 5} more" if len(params) > 5 else ""))
    code = code_check(src)
    if code:
        reasons.append("the code that judges, trains or stops training differs: "
                       + "; ".join(code))
    if not verdicts["equal"]:
        reasons.append("verdicts differ: " + ", ".join(
            f"{d['key']} {d['committed']} -> {d['rerun']}" for d in verdicts["differ"]))
    if not metrics["within_tolerance"]:
        reasons.append("NLL per note moved beyond its tolerance: " + ", ".join(
            f"{r['model']} on {r['split']}" for r in metrics["models"]
            if not r["within_tolerance"]))
    same_scores = all(m.get("rel_difference") == 0.0 for m in metrics["models"])
    if arts["identical"] and same_scores and not reasons:
        conclusion = "byte-identical"
    elif not reasons:
        conclusion = "within tolerance"
    else:
        conclusion = "not reproduced"
    return {"schema_version": SCHEMA_VERSION, "against": against, "commit": src.commit,
            "conclusion": conclusion, "reasons": reasons, "artifacts": arts,
            "verdicts": verdicts, "metrics": metrics, "params_differ": params,
            "code_differs": code}


def summary_lines(r: dict[str, Any]) -> list[str]:
    arts = r["artifacts"]["stages"]
    differ = {s: v["differ"] for s, v in arts.items() if v["differ"]}
    n_out = sum(v["n_outputs"] for v in arts.values())
    lines = [f"reproduce: artifacts: {n_out - sum(map(len, differ.values()))} of {n_out} "
             f"recorded outputs identical" + ("" if not differ else "; differ in " + "; ".join(
                 f"{s} ({', '.join(p)})" for s, p in differ.items()))]
    v = r["verdicts"]
    lines.append(f"reproduce: verdicts: {v['n_keys'] - len(v['differ'])} of {v['n_keys']} "
                 "decision keys equal")
    for m in r["metrics"]["models"]:
        if "reason" in m:
            lines.append(f"reproduce: {m['model']} on {m['split']}: not compared: {m['reason']}")
        else:
            lines.append(
                f"reproduce: {m['model']} on {m['split']}: NLL/note {m['committed']:.6g} -> "
                f"{m['rerun']:.6g}, relative difference {m['rel_difference']:+.3%}: "
                + ("within" if m["within_tolerance"] else "BEYOND")
                + f" ±{m['tolerance']:.2%} ({m['from']})")
    lines.append(f"reproduce: {r['conclusion']}" + (": " + "; ".join(r["reasons"])
                                                      if r["reasons"] else ""))
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", default="HEAD",
                        help="committed revision to check the workspace against (default HEAD)")
    parser.add_argument("--tolerance", type=fraction_arg, default=0.001,
                        help="relative tolerance on pooled NLL per note where the revision "
                             "registers none and has no comparison rule (default 0.001 = 0.1%%)")
    parser.add_argument("--out", type=Path, default=Path("reports/reproduce.json"),
                        help="the record (default reports/reproduce.json)")
    add_gate_arguments(parser, "compares test scores")


def main(args: argparse.Namespace) -> int:
    try:
        record = run(args.against, tolerance=args.tolerance, ledger_path=args.ledger,
                     registration=args.preregistration)
    except (RunSourceError, ReproduceError) as e:
        print(f"symkit reproduce: {e}", file=sys.stderr)
        return 2
    artifacts.write_json(args.out, record)
    for line in summary_lines(record):
        print(line)
    return 1 if record["conclusion"] == "not reproduced" else 0

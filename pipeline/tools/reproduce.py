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
   ``reports/eval.json``, ``symkit compare REV workspace`` on NLL per note; the interval of the
   relative difference must lie within ``--equivalence-margin`` (compare's equivalence check).
   Test is compared too: this checks a run, it picks no winner.

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

import yaml

from pipeline.core import artifacts
from pipeline.tools.compare import (
    Refusal,
    Settings,
    Source,
    SourceError,
    compare,
    fraction_arg,
    load_arm,
    positive_arg,
    resolve_source,
)

LOCK = "dvc.lock"
METRICS = "reports/metrics.json"
SCHEMA_VERSION = 1


class ReproduceError(ValueError):
    """A file the check needs is missing or unreadable; the message names it."""


def _read(src: Source, rel: str) -> bytes:
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


def metric_check(against: Source, workspace: Source, margin: float, n_boot: int,
                 seed: int) -> dict[str, Any]:
    """compare's equivalence check of NLL per note, every model and scored split of ``against``."""
    arms = [load_arm(against, "committed"), load_arm(workspace, "rerun")]
    models = sorted(arms[0].eval.get("models") or {})
    splits = [s for s in (arms[0].protocol.get("splits") or []) if s in ("val", "test")]
    rows = []
    for model in models:
        for split in splits:
            cfg = Settings(split=split, model=model, n_boot=n_boot, seed=seed,
                           equivalence_margin=margin)
            try:
                m = compare(arms, cfg)["comparisons"][0]["metrics"]["nats_per_note"]
            except Refusal as e:
                rows.append({"model": model, "split": split, "equivalent": False,
                             "reason": str(e)})
                continue
            rel = m["rel_improvement"]
            rows.append({"model": model, "split": split, "equivalent": bool(m["equivalent"]),
                         "committed": m["baseline"]["value"], "rerun": m["arm"]["value"],
                         "rel_difference": rel["value"], "ci_low": rel["ci_low"],
                         "ci_high": rel["ci_high"]})
    return {"equivalent": bool(rows) and all(r["equivalent"] for r in rows),
            "margin": margin, "models": rows}


def run(against: str, *, margin: float, n_boot: int, seed: int) -> dict[str, Any]:
    """The reproduction record of the workspace against revision ``against``."""
    src = resolve_source(against)
    if src.kind != "git":
        raise SourceError(f"{against!r} is a folder: give a git revision (commit, branch or tag) "
                          "holding the committed results")
    ws = resolve_source("workspace")
    arts = artifact_check(lock_outputs(_read(src, LOCK)), lock_outputs(_read(ws, LOCK)))
    verdicts = verdict_check(json.loads(_read(src, METRICS)), json.loads(_read(ws, METRICS)))
    metrics = metric_check(src, ws, margin, n_boot, seed)
    reasons = []
    if not verdicts["equal"]:
        reasons.append("verdicts differ: " + ", ".join(
            f"{d['key']} {d['committed']} -> {d['rerun']}" for d in verdicts["differ"]))
    if not metrics["equivalent"]:
        reasons.append("NLL per note not equivalent within the margin: " + ", ".join(
            f"{r['model']} on {r['split']}" for r in metrics["models"] if not r["equivalent"]))
    if arts["identical"] and not reasons:
        conclusion = "byte-identical"
    elif not reasons:
        conclusion = "within tolerance"
    else:
        conclusion = "not reproduced"
    return {"schema_version": SCHEMA_VERSION, "against": against, "commit": src.commit,
            "conclusion": conclusion, "reasons": reasons, "artifacts": arts,
            "verdicts": verdicts, "metrics": metrics}


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
                f"{m['rerun']:.6g}, relative difference {m['rel_difference']:+.3%} "
                f"[{m['ci_low']:+.3%}, {m['ci_high']:+.3%}]: "
                + ("equivalent" if m["equivalent"] else "NOT equivalent")
                + f" within ±{r['metrics']['margin']:.2%}")
    lines.append(f"reproduce: {r['conclusion']}" + (": " + "; ".join(r["reasons"])
                                                      if r["reasons"] else ""))
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", default="HEAD",
                        help="committed revision to check the workspace against (default HEAD)")
    parser.add_argument("--equivalence-margin", type=fraction_arg, default=0.005,
                        help="relative margin on NLL per note (default 0.005 = 0.5%%)")
    parser.add_argument("--n-boot", type=positive_arg, default=2000,
                        help="bootstrap replicates (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("reports/reproduce.json"),
                        help="the record (default reports/reproduce.json)")


def main(args: argparse.Namespace) -> int:
    try:
        record = run(args.against, margin=args.equivalence_margin, n_boot=args.n_boot,
                     seed=args.seed)
    except (SourceError, ReproduceError) as e:
        print(f"symkit reproduce: {e}", file=sys.stderr)
        return 2
    artifacts.write_json(args.out, record)
    for line in summary_lines(record):
        print(line)
    return 1 if record["conclusion"] == "not reproduced" else 0

"""``symkit report``: flat metrics, pre-registered decision, and the experiment report.

Inputs (all optional; a missing or unreadable one is shown as "not available"): every stage's
``reports/*.json``, ``reports/eval/per_piece.parquet``, ``reports/audit/per_sample.parquet``,
``reports/plots/train_log.tsv``, ``reports/samples/``, ``data/manifest.parquet``,
``data/splits.parquet``, ``data/dedupe/pairs.parquet``, ``reports/preregistration.json``,
``reports/report.env.json``, and the ``criteria``/``evaluate``/``report`` sections of params.yaml.
Outputs: ``reports/metrics.json`` (flat dotted keys, for ``dvc metrics show/diff``),
``reports/report.md`` and ``reports/report.html`` (self-contained).

:func:`run` is a pure function of those files: same inputs, same bytes (no timestamps; figures
are deterministic PNGs). ``main`` first writes the environment sidecar ``reports/report.env.json``
(git commit, params hash, package versions), which ``run`` then reads like any other input.
"""

from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline.core import artifacts
from pipeline.core.artifacts import read_json_or_none
from pipeline.core.config import load_section, read_params
from pipeline.report.criteria import CriteriaConfig, build_metrics, evaluate_all, overall
from pipeline.report.document import (
    Document,
    Heading,
    Para,
    Table,
    fmt,
    render_html,
    render_markdown,
)
from pipeline.report.registration import build as build_registration
from pipeline.report.registration import deviations
from pipeline.report.sections import ReportConfig, add_sections


@dataclass(frozen=True)
class ReportPaths:
    """Every input and output; defaults equal dvc.yaml's paths (the CLI flags mirror them)."""

    ingest: Path = Path("reports/ingest.json")
    dedupe: Path = Path("reports/dedupe.json")
    split: Path = Path("reports/split.json")
    leakage: Path = Path("reports/leakage.json")
    tokenize: Path = Path("reports/tokenize.json")
    ngram: Path = Path("reports/ngram.json")
    train: Path = Path("reports/train.json")
    train_env: Path = Path("reports/train.env.json")
    eval: Path = Path("reports/eval.json")
    audit: Path = Path("reports/audit.json")
    per_piece: Path = Path("reports/eval/per_piece.parquet")
    per_sample: Path = Path("reports/audit/per_sample.parquet")
    train_log: Path = Path("reports/plots/train_log.tsv")
    samples_dir: Path = Path("reports/samples")
    manifest: Path = Path("data/manifest.parquet")
    splits: Path = Path("data/splits.parquet")
    pairs: Path = Path("data/dedupe/pairs.parquet")
    preregistration: Path = Path("reports/preregistration.json")
    env: Path = Path("reports/report.env.json")
    metrics_out: Path = Path("reports/metrics.json")
    md_out: Path = Path("reports/report.md")
    html_out: Path = Path("reports/report.html")


STAGE_REPORTS = ("ingest", "dedupe", "split", "leakage", "tokenize", "ngram", "train", "eval",
                 "audit")
"""Stage reports flattened into metrics.json, each under its own name."""


@dataclass(frozen=True)
class ReportSummary:
    decision: str
    n_deviations: int
    n_metrics: int


def _ci_cell(v: Any, digits: int) -> str:
    """The CI a verdict used, naming its metric when that is not the criterion's own."""
    if v.ci_low is None and v.ci_high is None:
        return ""
    ci = f"[{fmt(v.ci_low, digits)}, {fmt(v.ci_high, digits)}]"
    return ci if v.ci_metric == v.metric else f"{v.ci_metric} {ci}"


def run(cfg: ReportConfig, criteria: CriteriaConfig, evaluate_params: Any,
        paths: ReportPaths) -> ReportSummary:
    """Build metrics.json, judge the criteria, write report.md and report.html."""
    reports = {stem: read_json_or_none(getattr(paths, stem)) for stem in STAGE_REPORTS}
    metrics = build_metrics(reports)
    verdicts = evaluate_all(criteria, metrics)
    decision = overall(verdicts)
    registered = read_json_or_none(paths.preregistration)
    current = build_registration(criteria, evaluate_params, reports["split"], reports["eval"], None)
    devs = deviations(registered, current)
    metrics["decision.overall"] = decision
    for status in ("PASS", "FAIL", "INCONCLUSIVE"):
        metrics[f"decision.n_{status.lower()}"] = sum(v.status == status for v in verdicts)
    metrics["decision.n_deviations"] = len(devs)
    for v in verdicts:
        metrics[f"decision.criteria.{v.name}"] = v.status
    metrics = dict(sorted(metrics.items()))

    doc = Document(cfg.title)
    doc.add(Para(f"Overall decision: {decision}", "warn" if decision != "PASS" else "p"))
    if devs:
        doc.add(Heading("Deviations from the pre-registration"),
                Para(f"{len(devs)} deviation(s): the decision below does not follow the "
                     "pre-registered plan as written. Read it with that in mind.", "warn"),
                *[Para(d, "warn") for d in devs])
    else:
        doc.add(Para("No deviations: criteria, scoring protocol and split match the "
                     "pre-registration."))
    doc.add(Heading("Decision"),
            Table(["criterion", "metric", "rule", "value", "95% CI", "status", "evidence"],
                  [[v.name, v.metric, f"{v.op} {fmt(v.threshold, cfg.digits)}",
                    fmt(v.value, cfg.digits), _ci_cell(v, cfg.digits), v.status, v.evidence]
                   for v in verdicts], status_col=5),
            Table(["criterion", "rationale"], [[r.name, r.rationale] for r in criteria.rules]))
    inputs = {f.name: getattr(paths, f.name) for f in fields(paths)}
    add_sections(doc, cfg, reports, metrics, inputs, registered, read_json_or_none(paths.env))

    artifacts.write_json(paths.metrics_out, metrics)
    artifacts.write_text(paths.md_out, render_markdown(doc))
    artifacts.write_text(paths.html_out, render_html(doc))
    return ReportSummary(decision, len(devs), len(metrics))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(ReportPaths):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=Path, default=f.default,
                            dest=f"path_{f.name}")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("report", args.params, ReportConfig)
    criteria = load_section("criteria", args.params, CriteriaConfig)
    params = read_params(args.params)
    paths = ReportPaths(**{f.name: getattr(args, f"path_{f.name}") for f in fields(ReportPaths)})
    artifacts.write_sidecar(paths.env, {"git_commit": git_commit(),
                                        "params_sha256": artifacts.sha256_json(params)})
    s = run(cfg, criteria, params.get("evaluate"), paths)
    print(f"report: decision {s.decision}, {s.n_deviations} deviation(s), {s.n_metrics} metrics "
          f"-> {paths.html_out}")
    return 0

"""``symkit compare A B [C ...]``: is the difference between evaluated runs real?

Each argument is an *arm*: the evaluation results of one run, read from a directory (or
``workspace``, the current directory) or from a git revision of the repository in the current
directory (a commit, branch, tag or DVC experiment name) by :mod:`pipeline.tools.runs`. The
first arm is the baseline; every other arm is compared with it on the pieces both scored
(:mod:`pipeline.stats.paired`), and the command says which parameters differ, whether the
difference is significant after Holm's correction, and whether the arms are equivalent within a
margin. See ``docs/compare.md``.

Besides an arm's scores, its training logs are drawn (the learning curves) and the baseline's
registered comparisons (``reports/preregistration_compare.json``) are judged
(:mod:`pipeline.decision.registered_comparisons`), with the registered settings: every
comparison says which registered rule covers it or that none does (NOT REGISTERED). Comparing on
test (``--split test``, or a comparison registered on test) reads every arm's test scores, and
reading test scores is a look: each arm's test rows are read through
:func:`pipeline.decision.looks.test_scores` (command ``compare``), which appends the look to the
test-access ledger of the working directory (``reports/ledger.jsonl``, with the registration
there) first; otherwise no test row is read. Outputs:
``compare.json``, ``compare.md`` and ``compare.html`` in ``--out``, and the figures in
``figures/`` under it unless ``--no-figures``; no timestamps or absolute paths (a revision
appears as the user gave it, a directory as its path relative to the current one). This module
compares the arms; the words, the document and the figures are
:mod:`pipeline.report.compare_document`'s.

A tool, not a DVC stage: no stage runs it, nothing here imports torch, and matplotlib is loaded
only when figures are drawn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core import artifacts
from pipeline.core.config import parse_section
from pipeline.decision import registered_comparisons as registered
from pipeline.decision.registered_comparisons import CompareConfig
from pipeline.report.compare_document import build_document, draw_figures, render, verdict
from pipeline.stats import paired as stats
from pipeline.stats.paired import Refusal
from pipeline.tools.pairing import (
    check_split_hashes,
    compared_scores,
    exclusions,
    judge_registered,
    reads_test,
)
from pipeline.tools.runs import (
    EVAL,
    PARAMS,
    EvaluatedRun,
    Gate,
    RunSourceError,
    add_gate_arguments,
    params_section,
    read_curves,
    read_run,
    resolve_source,
    with_test_rows,
)

HELP = "compare evaluated runs on the same pieces: is the difference real?"

FIGURES = "figures"
TEST_WARNING = ("compared on test: test results must not be used to pick a winner among arms "
                "(a sweep picks on val, then scores its one choice on test)")
SCHEMA_VERSION = 1


def unique_labels(names: Sequence[str]) -> list[str]:
    """The arms' names (each :class:`pipeline.tools.runs.RunSource`'s ``name``), a repeated one
    suffixed ``#2``, ``#3``, ... (``HEAD``, ``HEAD#2``)."""
    labels: list[str] = []
    for n in names:
        label, k = n, 1
        while label in labels:
            k += 1
            label = f"{n}#{k}"
        labels.append(label)
    return labels


# ---- the comparison -------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The command's options (recorded in compare.json)."""

    split: str = "val"
    model: str = "transformer"
    n_boot: int = 2000
    ci_level: float = 0.95
    seed: int = 0
    equivalence_margin: float = 0.005

    @property
    def alpha(self) -> float:
        return round(1.0 - self.ci_level, 12)


def _arm_record(arm: EvaluatedRun, scores: stats.ArmScores) -> dict[str, Any]:
    p = arm.protocol
    return {"label": arm.label, "source": arm.source.name, "kind": arm.source.kind,
            "commit": arm.source.commit, "ref": arm.source.ref,
            "split_hash": p.get("split_hash"), "tokenizer_hash": p.get("tokenizer_hash"),
            "transformer_stride": p.get("transformer_stride"),
            "seeds": scores.seeds, "n_seeds": scores.n_seeds, "n_pieces": len(scores.shas),
            "train_config_hash": (arm.train or {}).get("config_hash")}


def compare(arms: Sequence[EvaluatedRun], cfg: Settings) -> dict[str, Any]:
    """compare.json's content for ``arms`` (the first is the baseline). Refusals first: split
    hashes, the model's rows, the pieces and groups of every pair; then the statistics, one
    Generator ``default_rng([seed, k])`` for the comparison with arm ``k`` (1-based), so adding
    an arm changes no other comparison's draws."""
    check_split_hashes(arms)
    left_out = exclusions(arms, cfg.split, cfg.model)
    drop = {p["sha256"] for items in left_out.values() for p in items}
    scores = compared_scores(arms, cfg.split, cfg.model, drop)
    base, base_scores = arms[0], scores[0]
    pairs = [stats.pair(base_scores, s, base.label, a.label, cfg.split)
             for a, s in zip(arms[1:], scores[1:], strict=True)]
    flat_base = stats.flatten_params(base.params)
    comparisons = []
    for k, (arm, p) in enumerate(zip(arms[1:], pairs, strict=True), start=1):
        metrics, omitted = stats.comparable_metrics(base.protocol, arm.protocol)
        diff = stats.params_diff(flat_base, stats.flatten_params(arm.params))
        comparisons.append({
            "arm": arm.label, "baseline": base.label, "rng": [cfg.seed, k],
            "design": stats.design_label(len(diff)), "params_diff": diff,
            "protocol_diff": stats.protocol_diff(base.protocol, arm.protocol),
            **stats.pair_summary(p),
            "metrics": stats.compare_pair(p, metrics, n_boot=cfg.n_boot, level=cfg.ci_level,
                                          rng=np.random.default_rng([cfg.seed, k]),
                                          margin=cfg.equivalence_margin),
            "omitted_metrics": omitted})
    stats.apply_holm([c["metrics"] for c in comparisons], cfg.alpha)
    judged = judge_registered(arms)
    for c in comparisons:
        c["registered_rules"] = [e["rule"] for e in
                                 registered.coverage(judged, c["baseline"], c["arm"])]
        for key, block in c["metrics"].items():
            block["conclusion"] = stats.conclusion(block)
            block["verdict"] = verdict(c, key, cfg, n_comparisons=len(comparisons))
    warnings = [TEST_WARNING] if cfg.split == "test" else []
    if drop:
        warnings.append(
            f"{len(drop)} {cfg.split} piece{'s' * (len(drop) > 1)} left out of every comparison "
            "because an arm encodes them lossily or did not score them ("
            + "; ".join(f"{label}: {len(items)}" for label, items in left_out.items() if items)
            + "; the pieces and reasons are under excluded in compare.json)")
    warnings += [f"{c['arm']!r}: the scoring protocol differs from {c['baseline']!r}'s but no "
                 "parameter does: one arm's eval.json may be stale (re-run `dvc repro evaluate`)"
                 for c in comparisons if c["protocol_diff"] and not c["params_diff"]]
    return {
        "schema_version": SCHEMA_VERSION, "split": cfg.split, "model": cfg.model,
        "baseline": base.label, "warnings": warnings,
        "settings": {"n_boot": cfg.n_boot, "ci_level": cfg.ci_level, "alpha": cfg.alpha,
                     "seed": cfg.seed, "equivalence_margin": cfg.equivalence_margin,
                     "p_value": "two-sided bootstrap: min(1, 2 * min(1 + #(d <= 0), "
                                "1 + #(d >= 0)) / (n_boot + 1)) over the replicate differences",
                     "multiple_comparisons": "holm, per metric, across the comparisons"},
        "arms": [_arm_record(a, s) for a, s in zip(arms, scores, strict=True)],
        "excluded": {"n_pieces": len(drop), "by_arm": left_out},
        "comparisons": comparisons,
        "registered": judged,
    }


# ---- command line ---------------------------------------------------------------------------
def run(sources: Sequence[str], cfg: Settings, out: Path, *, figures: bool = True,
        ledger_path: Path | None = None, registration: Path | None = None) -> dict[str, Any]:
    """Resolve, load and compare the arms; write compare.json, .md and .html into ``out`` and,
    with ``figures``, the PNGs that compare.md links into ``out/figures``. Test rows are read
    only when the comparison needs them (:func:`pipeline.tools.pairing.reads_test`), through
    the gate: the look goes to ``ledger_path`` (None: nowhere) under ``registration``."""
    resolved = [resolve_source(name) for name in sources]
    labels = unique_labels([src.name for src in resolved])
    arms = [read_run(src, label) for src, label in zip(resolved, labels, strict=True)]
    if reads_test(cfg.split, arms[0]):
        gate = Gate("compare", ledger_path, registration)
        arms = [with_test_rows(a, gate) for a in arms]
    result = compare(arms, cfg)
    drawn = None
    if figures:
        scores = {a.label: s for a, s in zip(arms, compared_scores(arms, cfg.split, cfg.model),
                                                   strict=True)}
        drawn = draw_figures(result, scores, {a.label: read_curves(a.source) for a in arms},
                             cfg)
    md, html = render(build_document(result, cfg, drawn))
    for d in drawn or []:
        if d.png is not None:
            artifacts.write_bytes(out / FIGURES / f"{d.name}.png", d.png)
    artifacts.write_json(out / "compare.json", result)
    artifacts.write_text(out / "compare.md", md)
    artifacts.write_text(out / "compare.html", html)
    return result


def summary_line(c: dict[str, Any]) -> str:
    """One line per comparison for stdout (NLL per note)."""
    m = c["metrics"]["nats_per_note"]
    rel = m["rel_improvement"]
    return (f"compare: {c['arm']} vs {c['baseline']} ({c['design']}): nats/note "
            f"{m['baseline']['value']:.4f} -> {m['arm']['value']:.4f}, improvement "
            f"{rel['value']:+.2%} [{rel['ci_low']:+.2%}, {rel['ci_high']:+.2%}], p = "
            f"{m['p_value']:.3g}, Holm p = {m['p_holm']:.3g}: {m['conclusion']}")


def registered_lines(judged: dict[str, Any]) -> list[str]:
    """One line per registered rule judged or not run, for stdout."""
    out = [f"compare: registered {e['rule']}: {e['status']}: {e['evidence']}"
           + (f" Deviations: {'; '.join(e['deviations'])}." if e["deviations"] else "")
           for e in judged.get("rules") or []]
    out += [f"compare: registered {e['rule']}: NOT RUN: {e['reason']}"
            for e in judged.get("not_run") or []]
    if judged.get("note"):
        out.append(f"compare: {judged['note']}")
    return out


def fraction_arg(text: str) -> float:
    """argparse type: a number strictly between 0 and 1 (a coverage or a relative margin)."""
    v = float(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"{text}: must lie strictly between 0 and 1")
    return v


def positive_arg(text: str) -> int:
    """argparse type: an integer >= 1 (a count of replicates)."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be an integer >= 1")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arms", nargs="+", metavar="ARM",
                        help="two or more runs, the first is the baseline: a directory with "
                             f"{PARAMS} and {EVAL}, `workspace`, or a git commit, branch, tag "
                             "or DVC experiment name")
    parser.add_argument("--split", choices=["val", "test"], default="val",
                        help="split compared (default val; test only to report a choice "
                             "already made on val)")
    parser.add_argument("--model", default="transformer",
                        help="model whose scores are compared across arms (default transformer)")
    parser.add_argument("--n-boot", type=positive_arg,
                        help="bootstrap replicates (default: the baseline's params.yaml "
                             "compare.n_boot, else 2000)")
    parser.add_argument("--ci-level", type=fraction_arg,
                        help="interval coverage; alpha = 1 - ci-level (default: the "
                             "baseline's compare.ci_level, else 0.95)")
    parser.add_argument("--seed", type=int, help="bootstrap seed (default: the baseline's "
                                                    "compare.seed, else 0)")
    parser.add_argument("--equivalence-margin", type=fraction_arg,
                        help="relative margin for `equivalent` (default: the baseline's "
                             "compare.equivalence_margin, else 0.005 = 0.5%%)")
    parser.add_argument("--out", type=Path, default=Path("reports/compare"),
                        help="output folder (default reports/compare)")
    add_gate_arguments(parser, "compares test scores")
    parser.add_argument("--no-figures", dest="figures", action="store_false",
                        help="skip the figures (forest plot, learning curves, per-piece "
                             "scatter): faster, and matplotlib is not loaded")


def baseline_defaults(name: str) -> CompareConfig:
    """The settings in the baseline arm's params.yaml ``compare`` section (the built-in defaults
    when it has none): the options' defaults, read from the arm like everything else of it."""
    src = resolve_source(name)
    raw = params_section(src, "compare")
    if raw is None:
        return CompareConfig(rules=[])
    return parse_section("compare", raw, CompareConfig, src.where(PARAMS))


def main(args: argparse.Namespace) -> int:
    if len(args.arms) < 2:
        print("symkit compare: give at least two arms (the first is the baseline)",
              file=sys.stderr)
        return 2
    try:
        defaults = baseline_defaults(args.arms[0])
    except RunSourceError as e:
        print(f"symkit compare: {e}", file=sys.stderr)
        return 2
    cfg = Settings(
        split=args.split, model=args.model,
        n_boot=defaults.n_boot if args.n_boot is None else args.n_boot,
        ci_level=defaults.ci_level if args.ci_level is None else args.ci_level,
        seed=defaults.seed if args.seed is None else args.seed,
        equivalence_margin=(defaults.equivalence_margin if args.equivalence_margin is None
                            else args.equivalence_margin))
    if cfg.split == "test":
        print(f"symkit compare: warning: {TEST_WARNING}", file=sys.stderr)
    try:
        result = run(args.arms, cfg, args.out, figures=args.figures, ledger_path=args.ledger,
                     registration=args.preregistration)
    except (Refusal, RunSourceError) as e:
        print(f"symkit compare: {e}", file=sys.stderr)
        return 2
    for c in result["comparisons"]:
        print(summary_line(c))
    for line in registered_lines(result["registered"]):
        print(line)
    print(f"compare: wrote {(args.out / 'compare.json').as_posix()}, compare.md, compare.html"
          + (f" and {FIGURES}/*.png" if args.figures else ""))
    return 0

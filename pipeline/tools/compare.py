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
comparison says which registered rule covers it or that none does (NOT REGISTERED). Outputs:
``compare.json``, ``compare.md`` and ``compare.html`` in ``--out``, and the figures in
``figures/`` under it unless ``--no-figures``; no timestamps or absolute paths (sources appear as
the user gave them). This module compares the arms; the words, the document and the figures are
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
import pandas as pd

from pipeline.core import artifacts
from pipeline.core.config import parse_section
from pipeline.decision import registered_comparisons as registered
from pipeline.decision.registered_comparisons import REGISTRATION, CompareConfig, ComparisonRule
from pipeline.report.compare_document import build_document, draw_figures, render, verdict
from pipeline.stats import paired as stats
from pipeline.stats.paired import Refusal
from pipeline.tools.runs import (
    EVAL,
    PARAMS,
    EvaluatedRun,
    RunSourceError,
    params_section,
    read_curves,
    read_run,
    resolve_source,
)

HELP = "compare evaluated runs on the same pieces: is the difference real?"

FIGURES = "figures"
TEST_WARNING = ("compared on test: test results must not be used to pick a winner among arms "
                "(a sweep picks on val, then scores its one choice on test)")
SCHEMA_VERSION = 1


def unique_labels(names: Sequence[str]) -> list[str]:
    """The names as given, a repeated one suffixed ``#2``, ``#3``, ... (``HEAD``, ``HEAD#2``)."""
    labels: list[str] = []
    for n in names:
        label, k = n, 1
        while label in labels:
            k += 1
            label = f"{n}#{k}"
        labels.append(label)
    return labels


def check_split_hashes(arms: Sequence[EvaluatedRun]) -> None:
    """:class:`Refusal` unless every arm's ``protocol.split_hash`` is present and the same."""
    hashes = {a.label: a.protocol.get("split_hash") for a in arms}
    listed = "; ".join(f"{label!r}: {h}" for label, h in hashes.items())
    if any(not h for h in hashes.values()):
        raise Refusal(f"no protocol.split_hash in {EVAL} of some arms ({listed}); re-run "
                      "`dvc repro evaluate` for them")
    if len(set(hashes.values())) > 1:
        raise Refusal(f"the arms were scored on different splits (protocol.split_hash): {listed}. "
                      "Scores on different pieces cannot be paired; compare runs of one split")


def model_rows(arm: EvaluatedRun, model: str, split: str) -> pd.DataFrame:
    """The arm's rows of ``model`` on ``split``; :class:`Refusal` when there are none."""
    pp = arm.per_piece
    rows = pp[(pp["model"] == model) & (pp["split"] == split)]
    if rows.empty:
        have = sorted(set(pp.loc[pp["split"] == split, "model"]))
        raise Refusal(f"arm {arm.label!r} has no {model!r} scores on {split} (models scored "
                      f"there: {', '.join(have) or 'none'}); choose another --model or --split")
    return rows


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


def exclusions(arms: Sequence[EvaluatedRun], split: str,
               model: str) -> dict[str, list[dict[str, str]]]:
    """Per arm (by label), the ``split`` pieces its evaluate lists as encoded lossily
    (``fidelity.pieces``: scored, but its tokens lose notes) or as not scored with a reason
    (``excluded.pieces``, e.g. ``not_encoded``), restricted to pieces some arm scored with
    ``model`` on ``split``. Every piece listed for any arm is left out of every comparison: a
    tokenizer that drops notes, or fails on the hardest pieces, must not look better for it."""
    scored: set[str] = set()
    for a in arms:
        pp = a.per_piece
        scored.update(pp.loc[(pp["model"] == model) & (pp["split"] == split), "sha256"])
    out = {}
    for a in arms:
        items: dict[str, str] = {}
        for p in (a.eval.get("fidelity") or {}).get("pieces") or []:
            if p.get("split") == split and p.get("sha256") in scored:
                items[p["sha256"]] = "lossy: " + ", ".join(p.get("flags") or [])
        for p in (a.eval.get("excluded") or {}).get("pieces") or []:
            if p.get("sha256") in scored:
                items.setdefault(p["sha256"], f"not scored: {p.get('reason')}")
        out[a.label] = [{"sha256": sha, "reason": r} for sha, r in sorted(items.items())]
    return out


def dropped(arms: Sequence[EvaluatedRun], split: str, model: str) -> set[str]:
    """Every piece :func:`exclusions` lists for some arm."""
    return {p["sha256"] for items in exclusions(arms, split, model).values() for p in items}


def compared_scores(arms: Sequence[EvaluatedRun], cfg: Settings,
                    drop: set[str] | None = None) -> list[stats.ArmScores]:
    """Each arm's scores of ``cfg.model`` on ``cfg.split``, without the pieces in ``drop``
    (default: every piece :func:`exclusions` lists for some arm)."""
    if drop is None:
        drop = dropped(arms, cfg.split, cfg.model)
    out = []
    for a in arms:
        rows = model_rows(a, cfg.model, cfg.split)
        out.append(stats.arm_scores(rows[~rows["sha256"].isin(drop)], a.label))
    return out


def _metrics_for(a: EvaluatedRun, b: EvaluatedRun) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The metrics two arms are compared on, and those left out with the reason: per token
    only when both use the same tokenizer."""
    tok_a, tok_b = a.protocol.get("tokenizer_hash"), b.protocol.get("tokenizer_hash")
    metrics = [m for m in stats.METRICS if m[0] != "nats_per_token"]
    if tok_a and tok_a == tok_b:
        return [*metrics, ("nats_per_token", "n_tokens")], {}
    return metrics, {"nats_per_token": (
        f"tokenizer_hash differs ({str(tok_a)[:12]} vs {str(tok_b)[:12]}): token counts are "
        "not comparable across tokenizers; per note and per second are")}


def judge_registered(arms: Sequence[EvaluatedRun]) -> dict[str, Any]:
    """The baseline's registered comparisons judged on ``arms``
    (:func:`pipeline.decision.registered_comparisons.judge`): each rule's pair is scored like a
    comparison,
    on its own model and split, with the registered ``n_boot`` and ``seed``, and with the
    generator of the comparison of arm ``j`` when the pair's baseline is the first arm
    (``default_rng([seed, j])``; ``[seed, i, j]`` otherwise)."""
    infos = [registered.ArmInfo(a.label, stats.flatten_params(a.params), a.params.get("compare"),
                                a.registration) for a in arms]
    base = arms[0]
    if base.registration is None:
        out = registered.judge(None, infos, _no_scorer)
        out["note"] = (f"{base.label} (the baseline) holds no {REGISTRATION}: no comparison was "
                       "registered (`symkit preregister` freezes params.yaml's compare section)")
        return out
    reg = registered.read_registration(base.registration, base.label)
    if isinstance(reg, str):
        out = registered.judge(None, infos, _no_scorer)
        out["note"] = reg
        return out
    drops: dict[tuple[str, str], set[str]] = {}

    def score(i: int, j: int, rule: ComparisonRule, level: float) -> dict[str, Any]:
        key = (rule.split, rule.model)
        if key not in drops:
            drops[key] = dropped(arms, rule.split, rule.model)
        a, b = arms[i], arms[j]
        sa, sb = (stats.arm_scores(rows[~rows["sha256"].isin(drops[key])], arm.label)
                  for arm, rows in ((a, model_rows(a, rule.model, rule.split)),
                                    (b, model_rows(b, rule.model, rule.split))))
        p = stats.pair(sa, sb, a.label, b.label, rule.split)
        rng = np.random.default_rng([reg.config.seed, j] if i == 0 else
                                    [reg.config.seed, i, j])
        metrics = stats.compare_pair(p, _metrics_for(a, b)[0], n_boot=reg.config.n_boot,
                                     level=level, rng=rng,
                                     margin=reg.config.equivalence_margin)
        return {"metrics": metrics, "n_pieces": p.n_pieces, "n_groups": p.n_groups,
                "n_seeds": [p.a.n_seeds, p.b.n_seeds]}

    return registered.judge(reg, infos, score)


def _no_scorer(i: int, j: int, rule: ComparisonRule, level: float) -> dict[str, Any]:
    raise AssertionError("nothing is scored without a registration")


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
    scores = compared_scores(arms, cfg, drop)
    base, base_scores = arms[0], scores[0]
    pairs = [stats.pair(base_scores, s, base.label, a.label, cfg.split)
             for a, s in zip(arms[1:], scores[1:], strict=True)]
    flat_base = stats.flatten_params(base.params)
    comparisons = []
    for k, (arm, p) in enumerate(zip(arms[1:], pairs, strict=True), start=1):
        metrics, omitted = _metrics_for(base, arm)
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
            block["conclusion"] = _conclusion(block)
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


def _conclusion(block: dict[str, Any]) -> str:
    """``arm_lower`` / ``arm_higher`` (significant after Holm), else ``equivalent`` or
    ``inconclusive``."""
    if block["significant"]:
        return "arm_lower" if block["diff"]["value"] > 0 else "arm_higher"
    return "equivalent" if block["equivalent"] else "inconclusive"


# ---- command line ---------------------------------------------------------------------------
def run(sources: Sequence[str], cfg: Settings, out: Path, *,
        figures: bool = True) -> dict[str, Any]:
    """Resolve, load and compare the arms; write compare.json, .md and .html into ``out`` and,
    with ``figures``, the PNGs that compare.md links into ``out/figures``."""
    labels = unique_labels(sources)
    arms = [read_run(resolve_source(name), label) for name, label in zip(sources, labels,
                                                                           strict=True)]
    result = compare(arms, cfg)
    drawn = None
    if figures:
        scores = {a.label: s for a, s in zip(arms, compared_scores(arms, cfg), strict=True)}
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
        result = run(args.arms, cfg, args.out, figures=args.figures)
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

"""``symkit controls``: how often each decision criterion passes a good and a bad model, and all
of them together the good model and each bad one, at the registered split's sizes and a val
pilot's spreads (``--run``: the run's own) (:mod:`pipeline.decision.criteria_controls`), as
Markdown tables.

Run it before ``symkit preregister``: a rule that passes its good control less than 80% of the
time, or its bad control more than 5%, cannot tell the two apart at these sizes and should be
redesigned (or the sizes raised) before it is frozen. Rules on metrics without controls are
listed as such. Exit status 1 when any rule misses the standard, so a script can stop on it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core import artifacts
from pipeline.core.config import load_section, read_params
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.criteria_controls import (
    BAD_AT_MOST,
    GOOD_AT_LEAST,
    Sizes,
    joint_block,
    rates,
    run_sizes,
)
from pipeline.decision.spreads import SpreadsUnavailable, from_run
from pipeline.tools.preregister import pilot_sizes

HELP = "how often the criteria pass a good and bad models at measured spreads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draws", type=int, default=1000,
                        help="simulated experiments per control (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    parser.add_argument("--pilot", type=Path, default=Path("reports/pilot"),
                        help="the val pilot whose spreads to simulate at (`symkit evaluate "
                             "--pilot reports/pilot`; default reports/pilot)")
    parser.add_argument("--run", action="store_true",
                        help="simulate at the spreads the run measured instead (reports/eval.json, "
                             "reports/eval/per_piece.parquet, reports/audit.json)")
    parser.add_argument("--splits", type=Path, default=Path("data/splits.parquet"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))


def sizes_of(args: argparse.Namespace, params: dict) -> Sizes:
    """The design to simulate: the registered split with the pilot's spreads, or the run's."""
    if not args.run:
        return pilot_sizes(params, args.splits, args.pilot, args.tokens)
    eval_report = artifacts.read_json_or_none(Path("reports/eval.json"))
    audit = artifacts.read_json_or_none(Path("reports/audit.json"))
    table = artifacts.read_table_or_none(Path("reports/eval/per_piece.parquet"))
    if not isinstance(eval_report, dict) or not isinstance(audit, dict) or table is None:
        raise SpreadsUnavailable("--run needs reports/eval.json, reports/audit.json and "
                                 "reports/eval/per_piece.parquet")
    level = float((params.get("evaluate") or {}).get("ci_level", 0.95))
    return run_sizes(params, audit, from_run(eval_report, table, audit, level=level))


def main(args: argparse.Namespace) -> int:
    cfg = load_section("criteria", args.params, CriteriaConfig)
    try:
        sizes = sizes_of(args, read_params(args.params))
    except SpreadsUnavailable as e:
        print(f"symkit controls: {e}", file=sys.stderr)
        return 2
    for field, value in sizes.spreads.to_dict().items():
        if field != "source":
            shown = "not measured" if value is None else f"{value:.4g}"
            print(f"spread {field} = {shown} ({sizes.spreads.source.get(field, '')})")
    found = rates(cfg, sizes, draws=args.draws, seed=args.seed)
    print(f"| criterion | control | planted truth | passes (of {args.draws}) | standard |")
    print("|---|---|---|---|---|")
    for r in found:
        want = f">= {GOOD_AT_LEAST:.0%}" if r.case == "good" else f"<= {BAD_AT_MOST:.0%}"
        print(f"| {r.rule} | {r.case} | {r.truth} | {r.pass_rate:.1%} | "
              f"{want}: {'met' if r.meets_standard else 'MISSED'} |")
    for rule in cfg.rules:
        if not any(r.rule == rule.name for r in found):
            print(f"| {rule.name} | - | no control for {rule.metric} | - | - |")
    joint = joint_block(cfg, sizes, args.draws, args.seed)
    print()
    print(f"| all rules together | model | passes (of {args.draws}) | standard |")
    print("|---|---|---|---|")
    g = joint["good"]
    print(f"| good | {g['truth']} | {g['all']:.1%} | >= {GOOD_AT_LEAST:.0%}: "
          f"{'met' if g['all'] >= GOOD_AT_LEAST else 'MISSED'} |")
    for b in joint["bad"]:
        print(f"| bad: {b['model']} | {b['truth']} | {b['all']:.1%} | <= {BAD_AT_MOST:.0%}: "
              f"{'met' if b['all'] <= BAD_AT_MOST else 'MISSED'} |")
    return 0 if all(r.meets_standard for r in found) and joint["meets_standard"] else 1

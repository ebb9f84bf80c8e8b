"""``symkit controls``: how often each decision criterion passes a good and a bad model at the
default experiment's sample sizes (:mod:`pipeline.decision.criteria_controls`), as a Markdown table.

Run it before ``symkit preregister``: a rule that passes its good control less than 80% of the
time, or its bad control more than 5%, cannot tell the two apart at these sizes and should be
redesigned (or the sizes raised) before it is frozen. Rules on metrics without controls are
listed as such. Exit status 1 when any rule misses the standard, so a script can stop on it.
"""

from __future__ import annotations

import argparse

from pipeline.core.config import load_section
from pipeline.decision.criteria import CriteriaConfig
from pipeline.decision.criteria_controls import BAD_AT_MOST, GOOD_AT_LEAST, rates

HELP = "how often each criterion passes a good and a bad model at the default sizes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draws", type=int, default=1000,
                        help="simulated experiments per control (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("criteria", args.params, CriteriaConfig)
    found = rates(cfg, draws=args.draws, seed=args.seed)
    print(f"| criterion | control | planted truth | passes (of {args.draws}) | standard |")
    print("|---|---|---|---|---|")
    for r in found:
        want = f">= {GOOD_AT_LEAST:.0%}" if r.case == "good" else f"<= {BAD_AT_MOST:.0%}"
        print(f"| {r.rule} | {r.case} | {r.truth} | {r.pass_rate:.1%} | "
              f"{want}: {'met' if r.meets_standard else 'MISSED'} |")
    for rule in cfg.rules:
        if not any(r.rule == rule.name for r in found):
            print(f"| {rule.name} | - | no control for {rule.metric} | - | - |")
    return 0 if all(r.meets_standard for r in found) else 1

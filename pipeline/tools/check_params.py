"""``symkit check-params``: validate every section of params.yaml without running anything."""

from __future__ import annotations

import argparse

from pipeline.core.config import check_all, read_params
from pipeline.decision.registered_comparisons import CompareConfig, check_against

HELP = "validate every section of params.yaml"


def main(args: argparse.Namespace) -> int:
    sections = check_all(args.params)
    if "compare" in sections:  # the planned comparisons name params of the other sections
        cfg = sections["compare"]
        assert isinstance(cfg, CompareConfig)
        check_against(cfg, read_params(args.params), str(args.params))
    print(f"{args.params}: {len(sections)} sections valid ({', '.join(sections)})")
    return 0

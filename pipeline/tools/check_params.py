"""``symkit check-params``: validate every section of params.yaml without running anything."""

from __future__ import annotations

import argparse

from pipeline.core.config import check_all


def main(args: argparse.Namespace) -> int:
    sections = check_all(args.params)
    print(f"{args.params}: {len(sections)} sections valid ({', '.join(sections)})")
    return 0

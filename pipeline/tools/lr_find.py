"""``symkit lr-find``: the learning-rate range test for the ``transformer`` section of
params.yaml on the train split's tokens (:mod:`pipeline.training.lr_find` states the test and
the rule that suggests a learning rate). Prints the suggestion beside the configured
``transformer.optim.lr``, draws the curve (``--figure``) and writes the numbers (``--json``).
CPU, fp32, ``runtime.torch_threads`` threads; the same inputs give the same numbers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeline.core import artifacts
from pipeline.core.config import load_section, read_params
from pipeline.tokens.contract import TokenInfo, refuse_compound
from pipeline.training import lr_find
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import load_corpus

HELP = "learning-rate range test: where the loss falls fastest, and a suggested learning rate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--start", type=float, default=lr_find.START)
    parser.add_argument("--end", type=float, default=lr_find.END)
    parser.add_argument("--steps", type=int, default=lr_find.STEPS)
    parser.add_argument("--figure", type=Path, default=Path("reports/lr_find.png"))
    parser.add_argument("--json", type=Path, default=Path("reports/lr_find.json"))


def main(args: argparse.Namespace) -> int:
    cfg = load_section("transformer", args.params, TransformerStageConfig)
    if not Path(args.tokens).exists() or not Path(args.info).exists():
        print(f"symkit lr-find: {args.tokens} or {args.info} missing: run `dvc repro tokenize` "
              "first", file=sys.stderr)
        return 2
    try:
        lr_find.schedule(args.start, args.end, args.steps)
    except ValueError as e:
        print(f"symkit {e}", file=sys.stderr)
        return 2
    info = TokenInfo.read(args.info)
    refuse_compound(info, "symkit lr-find")
    corpus = load_corpus(args.tokens, info)
    threads = int((read_params(args.params).get("runtime") or {}).get("torch_threads", 1))
    test = lr_find.range_test(cfg, info, corpus, start=args.start, end=args.end,
                              steps=args.steps, threads=threads)
    configured = cfg.optim.lr
    print(f"lr-find: {len(test.lrs)} steps from {test.lrs[0]:.2g} to {test.lrs[-1]:.2g} "
          f"({test.stopped}); smoothed loss {test.smoothed[0]:.3f} -> "
          f"{min(test.smoothed):.3f} at its lowest")
    if test.suggestion is None:
        print("lr-find: too few steps to suggest a learning rate")
    else:
        print(f"lr-find: suggested transformer.optim.lr {test.suggestion:.2g} (the lowest "
              f"smoothed loss's learning rate / {lr_find.DIVIDE:g}); steepest descent at "
              f"{test.steepest:.2g}; configured {configured:.2g} "
              f"({configured / test.suggestion:.2g} times the suggestion)")
    if args.figure:
        from pipeline.render.figures import lr_range_png

        artifacts.write_bytes(args.figure, lr_range_png(
            np.asarray(test.lrs), np.asarray(test.losses), np.asarray(test.smoothed),
            {"suggested": test.suggestion, "configured": configured,
             "steepest": test.steepest}))
    if args.json:
        artifacts.write_json(args.json, {
            "start": args.start, "end": args.end, "steps": args.steps, "stopped": test.stopped,
            "suggestion": test.suggestion, "steepest": test.steepest,
            "configured": configured,
            "rule": f"the learning rate of the lowest loss (centred running median over "
                    f"{lr_find.HALF} steps each side) / {lr_find.DIVIDE:g}",
            "lrs": test.lrs, "losses": test.losses, "smoothed": test.smoothed})
    return 0

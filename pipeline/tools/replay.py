"""``symkit replay --step N``: recompute optimiser step N of a training seed and print the pieces
it saw, its loss and gradient norm, beside the values the log holds
(:mod:`pipeline.training.replay`). It starts from the newest kept checkpoint at or before the
step (``transformer.checkpoint.keep_last`` of them are kept; from the initialisation when none
is), so a step late in a long run costs up to that many steps of training.

Run it with the params of the run (the checkpoints' identity must match; a changed param is
refused, naming it) on the same machine and thread count for values equal to the log's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pipeline.conditions.config import ConditionConfig
from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, load_section
from pipeline.tokens.contract import TokenInfo, refuse_compound
from pipeline.training.checkpoint import CheckpointMismatch
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import load_corpus
from pipeline.training.replay import example_labels, replay
from pipeline.training.resume import checkpoint_dir

HELP = "recompute one training step: its pieces, loss and gradient norm, beside the log's"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=int, required=True, help="the step, 1-based as logged")
    parser.add_argument("--seed", type=int, default=None,
                        help="the training seed (default: transformer.seed, the first)")
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--augmented", type=Path, default=Path("data/tokens/augmented.parquet"))
    parser.add_argument("--out", type=Path, default=Path("data/transformer"),
                        help="the model folder whose checkpoints/ the run wrote")
    parser.add_argument("--logs", type=Path, default=Path("reports/plots/train_log"),
                        help="where the logged values are read from, to compare")


def logged(logs: Path, seed: int, step: int) -> dict[str, str] | None:
    """Step ``step``'s row of ``seed-<seed>.tsv`` as written (strings), or None."""
    table = artifacts.read_table_or_none(Path(logs) / f"seed-{seed}.tsv")
    if table is None or "step" not in table.columns:
        return None
    row = table[pd.to_numeric(table["step"], errors="coerce") == step]
    return None if row.empty else {k: str(v) for k, v in row.iloc[0].items()}


def main(args: argparse.Namespace) -> int:
    cfg = load_section("transformer", args.params, TransformerStageConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    condition = load_section("condition", args.params, ConditionConfig)
    seed = cfg.seed if args.seed is None else args.seed
    if seed not in cfg.seeds:
        print(f"symkit replay: --seed {seed} was not trained: transformer.seed and "
              f"transformer.replicates give {cfg.seeds}", file=sys.stderr)
        return 2
    if condition.use:
        print(f"symkit replay: condition.use = {condition.use}: a conditioned run is not "
              "replayed yet (its pieces' condition ids would have to be read as training "
              "reads them)", file=sys.stderr)
        return 2
    if not Path(args.tokens).exists() or not Path(args.info).exists():
        print(f"symkit replay: {args.tokens} or {args.info} missing", file=sys.stderr)
        return 2
    info = TokenInfo.read(args.info)
    refuse_compound(info, "symkit replay")
    augmented = args.augmented if cfg.data.use_augmented else None
    corpus = load_corpus(args.tokens, info, augmented)
    rcfg = cfg.replicate(seed)
    threads = runtime.torch_threads
    folder = checkpoint_dir(args.out, rcfg, info, threads, 1)
    try:
        got = replay(rcfg, info, corpus, folder, args.step, threads=threads,
                     labels=example_labels(args.tokens, info, augmented))
    except (CheckpointMismatch, ValueError) as e:
        print(f"symkit replay: {e}", file=sys.stderr)
        return 1
    where = f"checkpoint at step {got.started_from}" if got.started_from else "initialisation"
    print(f"replay: seed {seed}, step {got.step} (from the {where}): loss {got.loss:.6g} nats "
          f"per token, gradient norm {got.grad_norm:.6g}, learning rate {got.lr:.6g}")
    row = logged(args.logs, seed, args.step)
    if row is not None:
        same = all(f"{v:.6g}" == f"{float(row[k]):.6g}" for k, v in
                   (("train_loss", got.loss), ("grad_norm", got.grad_norm)))
        print(f"replay: logged loss {row['train_loss']}, gradient norm {row['grad_norm']}: "
              + ("equal to the log's precision" if same else
                 "DIFFERENT: another machine, thread count or code than the run's"))
    print(f"replay: its {len(got.rows)} windows (example, window start, piece, transposition):")
    for r in got.rows.itertuples(index=False):
        print(f"  {r.example:6d} {r.offset:6d}  {getattr(r, 'sha256', '?')} "
              f"{getattr(r, 'transpose', 0):+d}")
    return 0

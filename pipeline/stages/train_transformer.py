"""Stage ``train_transformer``: train the decoder-only transformer over several training seeds,
resumably.

Inputs: ``data/tokens/tokens.parquet`` (train and val rows), optional
``data/tokens/augmented.parquet``, ``data/tokens/info.json`` and, when ``condition.use`` names
conditions, ``data/conditions.parquet`` (the model is then conditioned on them: each piece's
labels, learned from train, enter as a condition embedding and are dropped to "none" with
probability ``condition.dropout``; docs/conditioning.md).
The seeds ``seed, seed+1, ..., seed+replicates-1`` are trained one after the other, each its own
run with its own checkpoints (the split never changes; the seed sets init, data order and
dropout). Outputs: the first seed's best weights ``data/transformer/model.safetensors`` +
``model.json``; every seed's in ``data/transformer/replicates/seed-<s>/`` with an ``index.json``;
resumable checkpoints in ``data/transformer/checkpoints/run-<id>/`` (a persistent DVC output);
the deterministic summary ``reports/train.json`` and per-step logs
``reports/plots/train_log/seed-<s>.tsv``; timings and environment in ``reports/train.env.json``.

Under ``torchrun`` the same command trains with DistributedDataParallel (rank 0 writes). The
training itself is ``pipeline.training.loop.train``; this module reads the inputs, calls it once
per seed and writes the outputs (``pipeline.training.outputs``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from pipeline.conditions.assign import PieceConditions, piece_conditions
from pipeline.conditions.config import ConditionConfig
from pipeline.conditions.table import read_conditions
from pipeline.core.config import ParamsError, RuntimeConfig, load_section
from pipeline.tokens.contract import TokenInfo
from pipeline.training.checkpoint import CheckpointMismatch
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import Corpus, load_corpus
from pipeline.training.device import DistInfo, barrier, process_group
from pipeline.training.loop import NonFiniteError, condition_identity, train
from pipeline.training.outputs import collect, stage_summary, summarise, write_outputs
from pipeline.training.resume import checkpoint_dir

HELP = "train the transformer (resumable)"


def run(cfg: TransformerStageConfig, runtime: RuntimeConfig, *, tokens: Path, info: Path,
        augmented: Path | None, out_dir: Path, summary: Path, log_dir: Path, env: Path,
        fresh: bool = False, condition: ConditionConfig | None = None,
        conditions: Path | None = None) -> dict[str, Any]:
    """Train every seed and write every output; returns the summary dict (``reports/train.json``).

    Seed ``s`` is the run of ``cfg`` with ``seed: s`` (:meth:`TransformerStageConfig.replicate`),
    checkpointed in its own ``out_dir/checkpoints/run-<id>/``, so a rerun finds finished seeds
    finished and resumes the interrupted one. ``fresh`` deletes every run's checkpoints under
    ``out_dir/checkpoints`` first. ``condition`` (with ``condition.use``) trains a conditioned
    model on the labels of ``conditions``."""
    dist = DistInfo.from_env()
    threads = runtime.torch_threads
    condition = condition or ConditionConfig()
    with process_group(dist, cfg.device):
        tinfo = TokenInfo.read(info)
        _check_compound(cfg, condition, tinfo)
        pieces = _piece_conditions(cfg, condition, conditions)
        corpus = _read_corpus(cfg, tokens, tinfo, augmented, pieces)
        ident = condition_identity(corpus, condition.dropout)
        if fresh and dist.is_main:
            shutil.rmtree(Path(out_dir) / "checkpoints", ignore_errors=True)
        barrier(dist)  # no rank looks for checkpoints before --fresh has removed them
        reps = []
        for i, seed in enumerate(cfg.seeds, 1):
            if dist.is_main:
                _echo(f"replicate {i}/{cfg.replicates} (seed {seed})")
            rcfg = cfg.replicate(seed)
            ckpt_dir = checkpoint_dir(out_dir, rcfg, tinfo, threads, dist.world_size, ident)
            result = train(rcfg, tinfo, corpus, ckpt_dir, threads=threads, dist=dist, echo=_echo,
                           cond_dropout=condition.dropout)
            reps.append(collect(seed, result, tinfo, summarise(rcfg.train, tinfo, corpus, result)))
            del result  # the training state (optimiser, device copies) goes before the next seed
        out = stage_summary(reps)
        if dist.is_main:
            write_outputs(reps, out, out_dir=Path(out_dir), summary=summary, log_dir=log_dir,
                          env=env, threads=threads, world_size=dist.world_size)
        return out


def _check_compound(cfg: TransformerStageConfig, condition: ConditionConfig,
                    info: TokenInfo) -> None:
    """Compound tokens (CPWord, Octuple) train :class:`models.compound.CompoundGPT`, without the
    options it does not take yet: packing and conditions (each a ParamsError naming its key)."""
    if not info.compound:
        return
    if cfg.data.pack:
        raise ParamsError(f"transformer.data.pack = true with tokenize.tokenizer: "
                          f"{info.tokenizer}: packing is not supported for compound tokens yet; "
                          "set pack: false")
    if condition.use:
        raise ParamsError(f"condition.use = {condition.use} with tokenize.tokenizer: "
                          f"{info.tokenizer}: conditioning a model of compound tokens is not "
                          "supported yet; set condition.use: []")


def _piece_conditions(cfg: TransformerStageConfig, condition: ConditionConfig,
                      conditions: Path | None) -> PieceConditions | None:
    """The pieces' condition ids when ``condition.use`` names conditions, else None."""
    if not condition.use:
        return None
    if cfg.data.pack:
        raise ParamsError(f"transformer.data.pack = true with condition.use = {condition.use}: a "
                          "packed row holds several pieces, each with its own conditions; set "
                          "pack: false to train a conditioned model")
    if conditions is None:
        raise ParamsError(f"condition.use = {condition.use}: pass the condition table "
                          "(--conditions data/conditions.parquet, made by `symkit conditions`)")
    table = read_conditions(conditions)
    try:
        pieces = piece_conditions(table, condition.use)
    except ValueError as e:
        raise ParamsError(f"condition.use = {condition.use}: {e}") from None
    empty = [n for n, labels in zip(pieces.vocab.names, pieces.vocab.labels, strict=True)
             if not labels]
    if empty:
        raise ParamsError(f"condition.use = {condition.use}: no train piece has a label for "
                          f"{empty[0]!r} in {conditions}; a condition without labels cannot be "
                          "learned (drop it from condition.use)")
    return pieces


def _read_corpus(cfg: TransformerStageConfig, tokens: Path, info: TokenInfo,
                 augmented: Path | None, conditions: PieceConditions | None = None) -> Corpus:
    corpus = load_corpus(tokens, info, augmented if cfg.data.use_augmented else None, conditions)
    if cfg.data.use_augmented and (augmented is None or not Path(augmented).exists()):
        _echo(f"transformer.data.use_augmented is true but {augmented} does not exist; "
              "training without augmentations")
    for reason, n in sorted(corpus.skipped.items()):
        _echo(f"skipped {n} token rows ({reason}); counted in reports/train.json")
    return corpus


def _echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens/tokens.parquet"))
    parser.add_argument("--augmented", type=Path, default=Path("data/tokens/augmented.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"))
    parser.add_argument("--out", type=Path, default=Path("data/transformer"),
                        help="model folder; checkpoints go to OUT/checkpoints/")
    parser.add_argument("--summary", type=Path, default=Path("reports/train.json"))
    parser.add_argument("--log", type=Path, default=Path("reports/plots/train_log"),
                        help="folder of per-step logs, one seed-<s>.tsv per training seed")
    parser.add_argument("--env", type=Path, default=Path("reports/train.env.json"))
    parser.add_argument("--conditions", type=Path, default=Path("data/conditions.parquet"),
                        help="condition table (`symkit conditions`); read only when "
                             "condition.use names conditions")
    parser.add_argument("--fresh", action="store_true",
                        help="delete OUT/checkpoints/ (every seed's runs) first instead of "
                             "resuming")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("transformer", args.params, TransformerStageConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    condition = load_section("condition", args.params, ConditionConfig)
    try:
        run(cfg, runtime, tokens=args.tokens, info=args.info, augmented=args.augmented,
            out_dir=args.out, summary=args.summary, log_dir=args.log, env=args.env,
            fresh=args.fresh, condition=condition, conditions=args.conditions)
    except ParamsError:
        raise
    except (CheckpointMismatch, NonFiniteError, FileNotFoundError, ValueError) as e:
        print(f"symkit train-transformer: {e}", file=sys.stderr)
        return 1
    return 0

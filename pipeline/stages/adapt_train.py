"""``symkit adapt-train ARM``: train one arm of an adaptation experiment.

The arm's config is the experiment's ``transformer`` section (the pretraining's architecture and
optimiser) turned into that arm by :func:`pipeline.adaptation.config.arm_config`: the same
``adaptation.steps`` and training seeds for every arm, started from ``adaptation.pretrained``
(except ``scratch``), with the arm's frozen prefixes or LoRA rank. It trains on the target
corpus's tokens, tokenised with the pretraining's tokenizer (``symkit tokenize --from``), so
``finetune.init_from`` accepts the pretrained model (its tokenizer hash is checked).

Outputs, like ``train-transformer``'s: ``data/arms/<ARM>/`` (the first seed's best weights,
``replicates/`` with every seed's, ``checkpoints/`` to resume), ``reports/arms/<ARM>.json`` (the
arm, its kind, its parameter counts, the estimator's memory figure and the training summary),
per-step logs under ``reports/plots/arms/<ARM>/`` and the sidecar
``reports/sidecars/arms/<ARM>.env.json``, outside ``reports/arms`` (a dep of adapt_evaluate) so
that its timings never reach ``dvc.lock``
(wall time, tokens/s and the measured peak memory: the process's RSS increase over each seed's
training, sampled every 5 ms; ``peak_rss_cold_bytes`` is the first seed's, which includes what the
process sets up once, ``peak_rss_warm_bytes`` the largest of the later seeds', what the
estimator models). ``zero_shot`` is not trained: ``adapt-evaluate`` scores the
pretrained model itself.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig, arm_config
from pipeline.core.artifacts import read_json, write_sidecar
from pipeline.core.config import ParamsError, RuntimeConfig, load_section
from pipeline.core.memory import PeakRSS
from pipeline.tokens.contract import TokenInfo, refuse_compound
from pipeline.training.checkpoint import CheckpointMismatch
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import load_corpus
from pipeline.training.device import DistInfo
from pipeline.training.estimate import estimate
from pipeline.training.loop import NonFiniteError, train
from pipeline.training.outputs import collect, stage_summary, summarise, write_outputs
from pipeline.training.resume import checkpoint_dir

HELP = "train one arm of an adaptation experiment (experiments/adaptation)"

SIDECARS = Path("reports/sidecars/arms")
"""Where each arm's sidecar goes (timings, peak memory; git-ignored, not a DVC output)."""


def memory_estimate(cfg: TransformerStageConfig, info: TokenInfo, train_tokens: int
                    ) -> dict[str, int]:
    """``symkit estimate``'s figures for this arm on CPU in fp32 (gradients and AdamW moments of
    the trainable parameters only)."""
    m, ft = cfg.model, cfg.finetune
    e = estimate(vocab_size=info.vocab_size, seq_len=m.max_seq_len, n_layer=m.n_layer,
                 n_head=m.n_head, n_embd=m.n_embd, micro_batch=cfg.train.micro_batch,
                 mlp_ratio=m.mlp_ratio, bias=m.bias, precision="fp32", dropout=m.dropout,
                 attn_dropout=m.attn_dropout, freeze=ft.freeze, lora_rank=ft.lora_rank,
                 lora_targets=ft.lora_targets, device="cpu", train_tokens=train_tokens)
    return {"total_bytes": e.total_bytes, "params": e.params,
            "params_trainable": e.params_trainable, "optimizer_bytes": e.optimizer_bytes,
            "grads_bytes": e.grads_bytes, "activations_bytes": e.activations_bytes}


def run(cfg: AdaptationConfig, base: TransformerStageConfig, runtime: RuntimeConfig, arm: str,
        *, tokens: Path, info: Path, out_dir: Path, summary: Path, log_dir: Path, env: Path,
        fresh: bool = False) -> dict[str, Any]:
    """Train arm ``arm`` over its seeds; returns its summary."""
    spec = cfg.arm(arm)
    tinfo = TokenInfo.read(info)
    refuse_compound(tinfo, "symkit adapt-train")
    acfg = arm_config(base, cfg, arm)
    threads = runtime.torch_threads
    dist = DistInfo.from_env()
    if dist.world_size > 1:
        raise ParamsError("adapt-train runs in one process; run it without torchrun")
    if fresh:
        shutil.rmtree(Path(out_dir) / "checkpoints", ignore_errors=True)
    t0 = time.perf_counter()
    corpus = load_corpus(tokens, tinfo, None)
    reps, peaks = [], {}
    for i, seed in enumerate(acfg.seeds, 1):
        _echo(f"{arm}: replicate {i}/{acfg.replicates} (seed {seed})")
        rcfg = acfg.replicate(seed)
        ckpt_dir = checkpoint_dir(out_dir, rcfg, tinfo, threads, 1)
        with PeakRSS() as rss:
            result = train(rcfg, tinfo, corpus, ckpt_dir, threads=threads, dist=dist,
                           echo=_echo)
        peaks[str(seed)] = rss.delta
        reps.append(collect(seed, result, tinfo, summarise(rcfg.train, tinfo, corpus, result)))
        del result
    train_summary = stage_summary(reps)
    train_tokens = int(sum(len(e) for e in corpus.train))
    params = reps[0].meta["training_params"]
    out = {"arm": arm, "kind": spec.kind, "trained": True, "model": Path(out_dir).as_posix(),
           "seeds": list(acfg.seeds), "params": params,
           "init_from": acfg.finetune.init_from, "freeze": list(acfg.finetune.freeze),
           "lora_rank": acfg.finetune.lora_rank, "lr": acfg.optim.lr, "steps": acfg.train.max_steps,
           "tokens_per_step": acfg.train.micro_batch * acfg.train.grad_accum
           * acfg.model.max_seq_len,
           "estimate": memory_estimate(acfg, tinfo, train_tokens), "train": train_summary}
    write_outputs(reps, out, out_dir=Path(out_dir), summary=summary, log_dir=log_dir, env=env,
                  threads=threads, world_size=1)
    warm = [peaks[str(s)] for s in acfg.seeds[1:]]
    write_sidecar(env, {**read_json(env), "peak_rss_delta_bytes": peaks,
                        "peak_rss_cold_bytes": peaks[str(acfg.seeds[0])],
                        "peak_rss_warm_bytes": max(warm) if warm else None,
                        "stage_seconds": time.perf_counter() - t0})
    return out


def _echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arm", help="arm name, a key of adaptation.arms")
    parser.add_argument("--tokens", type=Path, default=Path("data/target/tokens/tokens.parquet"))
    parser.add_argument("--info", type=Path, default=Path("data/target/tokens/info.json"))
    parser.add_argument("--out", type=Path, default=None, help="default: data/arms/ARM")
    parser.add_argument("--summary", type=Path, default=None,
                        help="default: reports/arms/ARM.json")
    parser.add_argument("--log", type=Path, default=None, help="default: reports/plots/arms/ARM")
    parser.add_argument("--env", type=Path, default=None,
                        help="default: reports/sidecars/arms/ARM.env.json")
    parser.add_argument("--fresh", action="store_true",
                        help="delete OUT/checkpoints/ first instead of resuming")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("adaptation", args.params, AdaptationConfig)
    base = load_section("transformer", args.params, TransformerStageConfig)
    runtime = load_section("runtime", args.params, RuntimeConfig)
    arm = args.arm
    if arm == ZERO_SHOT:
        raise ParamsError(f"{ZERO_SHOT} trains nothing: symkit adapt-evaluate scores "
                          f"adaptation.pretrained ({cfg.pretrained}) as that arm")
    cfg.arm(arm)  # an unknown arm fails before anything is read
    try:
        run(cfg, base, runtime, arm, tokens=args.tokens, info=args.info,
            out_dir=args.out or Path("data/arms") / arm,
            summary=args.summary or Path("reports/arms") / f"{arm}.json",
            log_dir=args.log or Path("reports/plots/arms") / arm,
            env=args.env or SIDECARS / f"{arm}.env.json", fresh=args.fresh)
    except ParamsError:
        raise
    except (CheckpointMismatch, NonFiniteError, FileNotFoundError, ValueError) as e:
        print(f"symkit adapt-train: {e}", file=sys.stderr)
        return 1
    return 0

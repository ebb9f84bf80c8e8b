"""``symkit estimate``: memory and compute of a transformer configuration, before training it.

The counts and what each covers are :mod:`pipeline.training.estimate`'s; this command reads the
``transformer`` section, ``runtime.torch_threads`` (and the vocabulary size from
``data/tokens/info.json`` when it exists) and prints them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from pipeline.core.config import RuntimeConfig, load_section
from pipeline.tokens.contract import TokenInfo, refuse_compound
from pipeline.training.config import TransformerStageConfig
from pipeline.training.estimate import BYTES, estimate

HELP = "memory and compute estimate for a transformer config"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--info", type=Path, default=Path("data/tokens/info.json"),
                        help="vocab size from here when it exists")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the vocab size")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--precision", choices=sorted(BYTES), default=None,
                        help="default: transformer.precision (auto counts as fp32)")
    parser.add_argument("--attention", choices=["auto", "flash", "math"], default="auto")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="default: cuda when transformer.device is cuda, else cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: runtime.torch_threads)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("transformer", args.params, TransformerStageConfig)
    vocab = args.vocab_size
    if vocab is None:
        info = TokenInfo.read(args.info) if args.info.exists() else None
        refuse_compound(info, "symkit estimate")
        vocab = info.vocab_size if info is not None else 512
    precision = args.precision or (cfg.precision if cfg.precision != "auto" else "fp32")
    m = cfg.model
    est = estimate(vocab_size=vocab, seq_len=args.seq_len or m.max_seq_len, n_layer=m.n_layer,
                   n_head=m.n_head, n_embd=m.n_embd, mlp_ratio=m.mlp_ratio, bias=m.bias,
                   micro_batch=args.micro_batch or cfg.train.micro_batch, precision=precision,
                   dropout=m.dropout, attn_dropout=m.attn_dropout, attention=args.attention,
                   device=args.device or ("cuda" if cfg.device == "cuda" else "cpu"),
                   freeze=cfg.finetune.freeze, lora_rank=cfg.finetune.lora_rank,
                   lora_targets=cfg.finetune.lora_targets,
                   activation_checkpointing=cfg.activation_checkpointing,
                   threads=args.threads or load_section("runtime", args.params,
                                                        RuntimeConfig).torch_threads)
    if args.json:
        print(json.dumps(asdict(est), indent=2, sort_keys=True))
        return 0
    print(f"vocab {vocab}, seq_len {args.seq_len or m.max_seq_len}, micro-batch "
          f"{args.micro_batch or cfg.train.micro_batch}, precision {precision}"
          + (", activation checkpointing" if cfg.activation_checkpointing else ""))
    print(f"parameters           {est.params:,} (matmul {est.params_matmul:,}, trainable "
          f"{est.params_trainable:,})")
    for name in ("weights", "best", "grads", "optimizer", "activations", "backward", "threads",
                 "total"):
        print(f"{name + ' memory':<21}{_mib(getattr(est, name + '_bytes'))}")
    print(f"FLOPs/token forward  {est.flops_per_token_forward:,.0f}")
    print(f"FLOPs/token training {est.flops_per_token_train:,.0f}")
    return 0

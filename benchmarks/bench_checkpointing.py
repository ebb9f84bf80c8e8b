"""Activation checkpointing: peak memory against the estimate, and the cost in step time.

Run: ``python benchmarks/bench_checkpointing.py [--steps 6] [--repeats 3] [--threads 2]
[--device cpu|cuda] [--settings default larger]`` (``--repeats 0``: memory only).

Data: synthetic pieces the size of the default corpus (370 pieces × ~1,400 tokens, vocab 300).
Two settings, each trained by ``pipeline.training.loop.train`` with
``transformer.activation_checkpointing`` off (the baseline) and on, everything else equal:
- ``default``: the ``transformer`` defaults of ``TransformerStageConfig`` (4 × 128, 256 tokens,
  micro-batch 4, dropout 0.1);
- ``larger``: 8 blocks × 256 wide, 512 tokens, micro-batch 8.

Memory: each run in a fresh process (``--memory-child``) after a warm-up on a tiny model (which
pays the one-off imports): on CUDA ``max_memory_allocated``; on CPU the process RSS increase
while ``train`` runs (sampled every 5 ms) with :data:`pipeline.core.memory.FIXED_MMAP`, under
which freed tensors leave RSS, so RSS follows the tensors alive: what the estimate
(``pipeline.training.estimate``, ``activation_checkpointing`` passed) models. Printed: measured,
estimate, estimate / measured, and on / off of each.

Speed: in this process, after one untimed short call per side, ``--repeats`` rounds each time
both sides, alternating which goes first; a side's time is the ``train`` call's steady seconds
per step (steps 2..N-1, from ``on_step`` timestamps), in wall time and in process CPU time (all
threads; less sensitive to other processes on a shared machine). Printed as on / off per step
(median of the paired rounds; above 1 = slower with checkpointing). The load average is printed
before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_train import (  # the same corpus, options and load line
    VOCAB,
    load_average,
    start,
    synthetic_data,
    training_parser,
)

from pipeline.core.memory import FIXED_MMAP, PeakRSS
from pipeline.tokens.contract import TokenInfo
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import Corpus
from pipeline.training.estimate import estimate
from pipeline.training.loop import train

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "larger": {"model": {"n_layer": 8, "n_head": 8, "n_embd": 256, "max_seq_len": 512},
               "train": {"micro_batch": 8}},
}


def make_cfg(setting: str, on: bool, device: str, steps: int) -> TransformerStageConfig:
    s = SETTINGS[setting]
    return TransformerStageConfig.model_validate({
        "device": device, "precision": "fp32", "activation_checkpointing": on,
        "model": s.get("model", {}),
        "train": {**s.get("train", {}), "max_steps": steps, "eval_every": 10**6,
                  "log_every": 10**6},
        "data": {"val_max_windows": 4},  # the final evaluation stays short
        "optim": {"warmup_steps": 1}, "checkpoint": {"every": 10**6}})


def step_seconds(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus,
                 on_step: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Steady (wall, process CPU) seconds per step of one ``train`` call (steps 2..N-1);
    ``on_step`` is called after each step."""
    marks: list[tuple[float, float]] = []

    def mark(_: object) -> None:
        marks.append((time.perf_counter(), time.process_time()))
        on_step()

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, info, corpus, Path(tmp), threads=torch.get_num_threads(), echo=lambda _: None,
              on_step=mark)
    n = max(1, len(marks) - 2)
    return (marks[-2][0] - marks[0][0]) / n, (marks[-2][1] - marks[0][1]) / n


def memory_child(args: argparse.Namespace) -> None:
    """Runs in a fresh process: warm up, then measure one ``train`` call; prints JSON."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        info, corpus = synthetic_data(Path(tmp))
        tiny = TransformerStageConfig.model_validate({
            "device": args.device, "precision": "fp32",
            "model": {"max_seq_len": 8, "n_layer": 1, "n_head": 1, "n_embd": 8},
            "train": {"max_steps": 2, "micro_batch": 1, "eval_every": 10**6, "log_every": 10**6},
            "optim": {"warmup_steps": 1}, "checkpoint": {"every": 10**6}})
        step_seconds(tiny, info, corpus)
        cfg = make_cfg(args.setting, args.on, args.device, args.steps)
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        after: list[int] = []  # peak so far, after each step
        with PeakRSS() as rss:
            step_seconds(cfg, info, corpus, lambda: after.append(
                torch.cuda.max_memory_allocated() if cuda else rss.peak - rss.start))
        whole = torch.cuda.max_memory_allocated() if cuda else rss.delta
        print(json.dumps({"steps": after[-2], "whole": whole,
                          "train_tokens": int(sum(len(e) for e in corpus.train))}))


def memory(args: argparse.Namespace, setting: str, on: bool) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    key, value = FIXED_MMAP.split("=")
    env[key] = value
    child = subprocess.run(
        [sys.executable, __file__, "--memory-child", "--setting", setting,
         *(["--on"] if on else []), "--device", args.device, "--steps", str(args.steps),
         "--threads", str(args.threads)],
        check=True, capture_output=True, text=True, env=env)
    return json.loads(child.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> None:
    ap = training_parser(steps=6)
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--setting", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = start(ap, memory_child)
    if args is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        info, corpus = synthetic_data(Path(tmp))
        for setting in args.settings:
            cfgs = {on: make_cfg(setting, on, args.device, args.steps) for on in (False, True)}
            m, tr = cfgs[False].model, cfgs[False].train
            print(f"== {setting}: {m.n_layer} blocks × {m.n_embd}, {tr.micro_batch}×"
                  f"{m.max_seq_len} tokens, {args.device} fp32, {args.threads} threads")
            measured: dict[bool, int] = {}
            for on in (False, True):
                mem = memory(args, setting, on)
                est = estimate(vocab_size=VOCAB, seq_len=m.max_seq_len, n_layer=m.n_layer,
                               n_head=m.n_head, n_embd=m.n_embd, micro_batch=tr.micro_batch,
                               dropout=m.dropout, attn_dropout=m.attn_dropout,
                               device="cuda" if args.device.startswith("cuda") else "cpu",
                               train_tokens=0 if args.device.startswith("cuda")
                               else mem["train_tokens"], activation_checkpointing=on,
                               threads=args.threads)
                measured[on] = mem["steps"]
                print(f"checkpointing {'on ' if on else 'off'}  peak {_mib(mem['steps'])} "
                      f"measured, {_mib(est.total_bytes)} estimated (activations "
                      f"{_mib(est.activations_bytes)}); estimate / measured "
                      f"{est.total_bytes / max(mem['steps'], 1):.2f}; whole call "
                      f"{_mib(mem['whole'])}")
            print(f"memory        on / off {measured[True] / max(measured[False], 1):.2f} "
                  "(measured peaks)")
            if not args.repeats:
                continue
            for on in (False, True):  # warm-up, untimed
                step_seconds(cfgs[on].model_copy(update={"train": tr.model_copy(
                    update={"max_steps": 4})}), info, corpus)
            ratios: dict[int, list[float]] = {0: [], 1: []}  # wall, process CPU
            secs: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.repeats):
                pair = {}
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    pair[on] = step_seconds(cfgs[on], info, corpus)
                    secs[on].append(pair[on][0])
                for k in (0, 1):
                    ratios[k].append(pair[True][k] / pair[False][k])
            print(f"step time     off {statistics.median(secs[False]):.3f} s, on "
                  f"{statistics.median(secs[True]):.3f} s (wall, medians)")
            for k, what in ((0, "wall"), (1, "process CPU time")):
                print(f"              on / off {statistics.median(ratios[k]):.2f} ({what}; median "
                      f"of {args.repeats} paired rounds, min {min(ratios[k]):.2f}, max "
                      f"{max(ratios[k]):.2f})")
    print(load_average())


if __name__ == "__main__":
    main()

"""Training throughput and memory of the transformer, with the estimator's prediction beside it.

Run: ``python benchmarks/bench_train.py [--steps 20] [--device cpu|cuda] [--threads 2]``.

Data: synthetic pieces the size of the default corpus (370 pieces × ~1,400 tokens, vocab 300).
Model and batch: the ``transformer`` defaults of ``TransformerStageConfig``.

Printed (ratios against baselines measured in the same run):
- ``bare step``: forward + backward + AdamW on one fixed batch, no data pipeline (baseline);
- ``training loop``: ``pipeline.training.loop.train`` (windows, masking, clipping, logging,
  one final checkpoint and evaluation; set-up time included); ratio = loop / bare tokens per
  second (1.0 = no overhead; the bare baseline is the better of a run before and after);
- peak memory: CUDA ``max_memory_allocated``; on CPU the process RSS increase over the run
  (sampled every 5 ms), next to ``pipeline.tools.estimate`` (ratio = estimate / measured);
- on CUDA also bf16 vs fp32 tokens/s and model FLOPs utilisation (MFU).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from models.transformer import GPT, TransformerConfig
from pipeline.tokens.contract import TokenInfo
from pipeline.tools.estimate import estimate, peak_tflops, saved_activation_bytes
from pipeline.training.config import TransformerStageConfig
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.synthetic import write_token_data


class PeakRSS:
    """Peak resident memory of this process while the context is open (sampling thread)."""

    def __enter__(self) -> PeakRSS:
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def delta(self) -> int:
        return self.peak - self.start


def bare_step_tokens_per_s(cfg: TransformerStageConfig, vocab: int, device: str, steps: int,
                           amp: torch.dtype | None) -> float:
    m = cfg.model
    arch = TransformerConfig(vocab_size=vocab, max_seq_len=m.max_seq_len, n_layer=m.n_layer,
                             n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                             attn_dropout=m.attn_dropout)
    model = GPT(arch, torch.Generator().manual_seed(0)).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.001)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (cfg.train.micro_batch, m.max_seq_len), generator=g).to(device)

    def step() -> None:
        with torch.autocast(device.split(":")[0], dtype=amp, enabled=amp is not None):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: allocator, optimizer state, kernel selection
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps * x.numel() / (time.perf_counter() - t0)


def activations_saved(cfg: TransformerStageConfig, vocab: int, device: str,
                      amp: torch.dtype | None) -> int:
    m = cfg.model
    arch = TransformerConfig(vocab_size=vocab, max_seq_len=m.max_seq_len, n_layer=m.n_layer,
                             n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                             attn_dropout=m.attn_dropout)
    model = GPT(arch, torch.Generator().manual_seed(0)).to(device).train()
    x = torch.randint(0, vocab, (cfg.train.micro_batch, m.max_seq_len)).to(device)
    with torch.autocast(device.split(":")[0], dtype=amp, enabled=amp is not None):
        return saved_activation_bytes(model, x, x)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def loop_run(cfg: TransformerStageConfig, data: dict, device: str, threads: int):
    info = TokenInfo.read(data["info"])
    corpus = load_corpus(data["tokens"], info)
    with tempfile.TemporaryDirectory() as tmp:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            result = train(cfg, info, corpus, Path(tmp), threads=threads, echo=lambda _: None)
            seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else rss.delta
    return result, seconds, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocab = 300
    with tempfile.TemporaryDirectory() as tmp:
        data = write_token_data(Path(tmp), n_pieces=370, vocab_size=vocab, mean_len=1400)
        precisions = ["fp32", "bf16"] if args.device == "cuda" else ["fp32"]
        base_tps = None
        for precision in precisions:
            cfg = TransformerStageConfig.model_validate({
                "device": args.device, "precision": precision,
                "train": {"max_steps": args.steps, "eval_every": 10**6, "log_every": 10**6},
                "optim": {"warmup_steps": 1}, "checkpoint": {"every": 10**6}})
            amp = torch.bfloat16 if precision == "bf16" else None
            # The loop runs first so its RSS increase is not hidden by heap freed by others.
            result, seconds, peak = loop_run(cfg, data, args.device, args.threads)
            # Best of two baselines, so a noisy neighbour cannot flatter the loop.
            bare = max(bare_step_tokens_per_s(cfg, vocab, args.device, args.steps, amp)
                       for _ in range(2))
            tps = result.tokens_this_run / seconds
            est = estimate(vocab_size=vocab, seq_len=cfg.model.max_seq_len,
                           n_layer=cfg.model.n_layer, n_head=cfg.model.n_head,
                           n_embd=cfg.model.n_embd, micro_batch=cfg.train.micro_batch,
                           precision=precision, dropout=cfg.model.dropout,
                           attn_dropout=cfg.model.attn_dropout,
                           device="cuda" if args.device == "cuda" else "cpu")
            print(f"== {args.device} {precision}, {result.params['total']:,} params, "
                  f"batch {cfg.train.micro_batch}×{cfg.model.max_seq_len}, {args.steps} steps, "
                  f"{args.threads} threads")
            print(f"bare step      {bare:10,.0f} tokens/s   (baseline)")
            print(f"training loop  {tps:10,.0f} tokens/s   ratio {tps / bare:.2f}")
            what = "CUDA max allocated" if args.device == "cuda" else "RSS increase"
            print(f"peak memory    {peak / 2**20:10,.1f} MiB ({what}); estimate "
                  f"{est.total_bytes / 2**20:,.1f} MiB; estimate/measured "
                  f"{est.total_bytes / max(peak, 1):.2f}")
            saved = activations_saved(cfg, vocab, args.device, amp)
            print(f"activations    {saved / 2**20:10,.1f} MiB saved by autograd; estimate "
                  f"{est.activations_bytes / 2**20:,.1f} MiB; estimate/measured "
                  f"{est.activations_bytes / saved:.2f}")
            if args.device == "cuda":
                base_tps = base_tps or tps
                name = torch.cuda.get_device_name()
                peak_tf = peak_tflops(name)
                mfu = (tps * est.flops_per_token_train / (peak_tf * 1e12)) if peak_tf else None
                print(f"vs fp32 loop   ratio {tps / base_tps:.2f}; MFU "
                      f"{'n/a' if mfu is None else f'{100 * mfu:.2f}%'} ({name})")
            else:
                steps_default = TransformerStageConfig().train.max_steps
                tok = steps_default * cfg.train.micro_batch * cfg.model.max_seq_len
                print(f"default run    ~{tok / tps / 60:.1f} min of training for "
                      f"{steps_default} steps (evaluations extra)")


if __name__ == "__main__":
    main()

"""The training loop: one honest step, validation, early stopping, checkpoints, resume.

One optimiser step (``_train_step``):
load the step's micro-batches -> forward under autocast -> masked cross-entropy summed over valid
targets and divided by the step's *global* count of valid targets (so micro-batches and ranks are
weighted by tokens, and DDP's gradient averaging is undone by the factor ``world_size``) ->
backward (``no_sync`` on all but the last micro-batch) -> unscale (fp16) -> clip the gradient
norm (always measured, logged every step) -> stop on a non-finite loss or gradient -> optimiser
and scheduler step -> clear gradients.

Resuming: the checkpoint holds everything the next step depends on (weights, optimiser,
scheduler, grad scaler, RNG states of every rank, counters, the log); the data order is a pure
function of the step (see ``pipeline.training.data``). On CPU an interrupted run resumed from its
last checkpoint ends with exactly the same weights as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist
from torch import nn

from models.lora import param_counts
from models.transformer import export_state
from pipeline.artifacts import sha256_file, sha256_json
from pipeline.training import checkpoint as ckpt
from pipeline.training.data import Corpus, Shard, TokenInfo, WindowStream, make_batch, val_windows
from pipeline.training.setup import (
    DistInfo,
    build_model,
    lr_factor,
    make_optimizer,
    resolve_device,
    resolve_precision,
)

if TYPE_CHECKING:
    from pipeline.train_transformer import TransformerStageConfig

FRESH_HINT = ("rerun with `symkit train-transformer --fresh` (deletes the old checkpoints), "
              "delete data/transformer/checkpoints/, or set transformer.checkpoint.on_mismatch: "
              "restart")


class NonFiniteError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the last good checkpoint is kept."""


@dataclass
class TrainState:
    """Counters and history; everything here goes into every checkpoint."""

    step: int = 0
    tokens: int = 0
    best_val: float | None = None
    best_step: int = 0
    evals_since_best: int = 0
    stop_reason: str | None = None
    skipped_steps: int = 0  # fp16 steps skipped by the grad scaler (inf/NaN gradients)
    log: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainResult:
    state: TrainState
    model: nn.Module
    best: dict[str, torch.Tensor]
    params: dict[str, int]
    finetune: dict[str, Any]
    fingerprint: dict[str, Any]
    device: str
    precision: str
    reproducible: bool
    resumed_from: str | None
    seconds: float
    steps_this_run: int
    tokens_this_run: int
    n_train_examples: int
    n_val_windows: int


def fingerprint(cfg: TransformerStageConfig, info: TokenInfo, threads: int,
                world_size: int) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: result-affecting config and data hashes."""
    from pipeline.train_transformer import result_config

    conf = result_config(cfg, threads, world_size)
    init = cfg.finetune.init_from
    if init:
        conf["init_sha256"] = sha256_file(Path(init) / "model.safetensors")
    conf["vocab_size"] = info.vocab_size
    return {"config": conf, "config_hash": sha256_json(conf),
            "tokenizer_hash": info.tokenizer_hash, "split_hash": info.split_hash}


def _gather_rng(device: str, dist: DistInfo) -> dict[str, torch.Tensor]:
    """RNG states of every rank (dropout draws from the default generators), gathered."""
    mine = {"torch_cpu": torch.get_rng_state()}
    if device.startswith("cuda"):
        mine["cuda"] = torch.cuda.get_rng_state(device)
    if dist.world_size == 1:
        return {f"{k}.rank0": v for k, v in mine.items()}
    out = {}
    comm = device if device.startswith("cuda") else "cpu"
    for k, v in sorted(mine.items()):
        parts = [torch.empty_like(v, device=comm) for _ in range(dist.world_size)]
        tdist.all_gather(parts, v.to(comm))
        out.update({f"{k}.rank{r}": p.cpu() for r, p in enumerate(parts)})
    return out


def _restore_rng(rng: dict[str, torch.Tensor], device: str, rank: int) -> None:
    if f"torch_cpu.rank{rank}" in rng:
        torch.set_rng_state(rng[f"torch_cpu.rank{rank}"])
    if device.startswith("cuda") and f"cuda.rank{rank}" in rng:
        torch.cuda.set_rng_state(rng[f"cuda.rank{rank}"], device)


@torch.no_grad()
def evaluate(model: nn.Module, windows: list, seq_len: int, pad_id: int, device: str,
             amp: torch.dtype | None, batch_size: int) -> float | None:
    """Token-weighted mean NLL (nats) over ``windows``; None when there are none."""
    if not windows:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for b0 in range(0, len(windows), batch_size):
        batch = make_batch(windows[b0 : b0 + batch_size], seq_len, pad_id)
        with _autocast(device, amp):
            _, nll = model(batch.x.to(device), batch.y.to(device), batch.mask.to(device),
                           reduction="sum")
        total += float(nll)
        count += batch.n_valid
    model.train(was_training)
    return total / max(count, 1)


def _autocast(device: str, amp: torch.dtype | None):
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=amp)


def train(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus, ckpt_dir: Path, *,
          threads: int, dist: DistInfo | None = None,
          on_step: Callable[[TrainState], None] | None = None,
          echo: Callable[[str], None] = print) -> TrainResult:
    """Train (or resume) according to ``cfg``; checkpoints in ``ckpt_dir`` (rank 0 writes).

    ``on_step`` is called after every completed step (after its checkpoint, if any); an
    exception raised there behaves like a kill. Global torch RNG state is forked, so the caller's
    RNG is left untouched.
    """
    dist = dist or DistInfo()
    torch.set_num_threads(threads)
    device = resolve_device(cfg.device, local_rank=dist.local_rank)
    dtype = device.split(":")[0]
    amp, use_scaler, precision = resolve_precision(cfg.precision, dtype)
    fp = fingerprint(cfg, info, threads, dist.world_size)
    devices = [torch.device(device)] if dtype == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _train(cfg, info, corpus, Path(ckpt_dir), dist, device, amp, use_scaler,
                      precision, fp, on_step, echo if dist.is_main else (lambda _: None))


def _train(cfg, info, corpus, ckpt_dir, dist, device, amp, use_scaler, precision, fp, on_step,
           echo) -> TrainResult:
    t0 = time.perf_counter()
    dtype = device.split(":")[0]
    # Dropout draws from the default generators: seed them per rank, checkpoint their states.
    torch.manual_seed(cfg.seed + dist.rank)
    model, ft_report = build_model(cfg, info.vocab_size, torch.Generator().manual_seed(cfg.seed))
    model.to(device)
    opt = make_optimizer(model, cfg, dtype)
    o, tr = cfg.optim, cfg.train
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, warmup=o.warmup_steps, max_steps=tr.max_steps, schedule=o.schedule,
        min_ratio=o.min_lr / o.lr))
    scaler = torch.amp.GradScaler(dtype, enabled=use_scaler)
    state = TrainState()
    best = export_state(model)
    resumed_from = None

    if dist.is_main:
        ckpt.remove_stale(ckpt_dir)
    if dist.world_size > 1:
        tdist.barrier()
    last = ckpt.latest_checkpoint(ckpt_dir)
    discard = False
    if last is not None:
        loaded = ckpt.load_checkpoint(last)
        try:
            ckpt.check_compatible(last, loaded.state, fp, FRESH_HINT)
        except ckpt.CheckpointMismatch:
            if cfg.checkpoint.on_mismatch == "refuse":
                raise
            echo(f"checkpoint {last} is from a different run; discarding its checkpoints "
                 "(checkpoint.on_mismatch: restart)")
            discard, loaded = True, None
        if loaded is not None:
            model.load_state_dict(loaded.model)
            opt.load_state_dict(loaded.optimizer)
            sched.load_state_dict(loaded.state["scheduler"])
            if use_scaler and loaded.state.get("scaler"):
                scaler.load_state_dict(loaded.state["scaler"])
            state = TrainState(**loaded.state["train_state"])
            best = loaded.best
            _restore_rng(loaded.rng, device, dist.rank)
            resumed_from = last.name
            echo(f"resumed from {last} (step {state.step})")
    if dist.world_size > 1:
        tdist.barrier()  # every rank has read the checkpoint before rank 0 deletes anything
    if discard and dist.is_main:
        for old in ckpt.list_checkpoints(ckpt_dir):
            shutil.rmtree(old)
    if state.stop_reason == "wall_clock":
        state.stop_reason = None  # a guard stop is a pause: continue the same run

    raw, ddp = model, None
    if dist.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = ddp = DDP(model, device_ids=[dist.local_rank] if dtype == "cuda" else None)
    fwd = torch.compile(model) if cfg.compile else model

    T = cfg.model.max_seq_len
    stream = WindowStream(corpus.train, T, cfg.seed)
    shard = Shard(dist.rank, dist.world_size, tr.micro_batch, tr.grad_accum)
    vwin = val_windows(corpus.val, T, cfg.data.val_max_windows)
    trainable = [p for p in raw.parameters() if p.requires_grad]
    start_step, start_tokens, guard_fired = state.step, state.tokens, False
    t_train = time.perf_counter()
    last_ckpt = last if resumed_from else None
    model.train()

    def save(step: int) -> None:
        nonlocal last_ckpt
        rng = _gather_rng(device, dist)
        if dist.is_main:
            last_ckpt = ckpt.save_checkpoint(
                ckpt_dir, step, model=export_state(raw), best=best, optimizer=opt.state_dict(),
                rng=rng, keep_last=cfg.checkpoint.keep_last,
                state={**fp, "train_state": asdict(state), "scheduler": sched.state_dict(),
                       "data_position": step * shard.effective_batch,  # next stream position
                       "scaler": scaler.state_dict() if use_scaler else {},
                       "model_config": raw.config.to_dict()})

    while state.stop_reason is None:
        if state.step >= tr.max_steps:
            state.stop_reason = "max_steps"
            break
        lr = opt.param_groups[0]["lr"]
        loss, gnorm, n_tok, skipped = _train_step(fwd, ddp, opt, scaler, trainable, stream, shard,
                                                  state.step, T, info.pad_id, device, amp,
                                                  o.grad_clip, last_ckpt)
        sched.step()
        state.step += 1
        state.tokens += n_tok
        state.skipped_steps += int(skipped)
        row = {"step": state.step, "train_loss": loss, "val_loss": None, "lr": lr,
               "grad_norm": gnorm}
        if tr.max_tokens and state.tokens >= tr.max_tokens:
            state.stop_reason = "max_tokens"
        elif state.step >= tr.max_steps:
            state.stop_reason = "max_steps"
        if tr.max_minutes is not None and state.stop_reason is None:
            over = torch.tensor(float(time.perf_counter() - t0 > 60 * tr.max_minutes))
            if dist.world_size > 1:  # every rank must stop at the same step
                tdist.all_reduce(over, op=tdist.ReduceOp.MAX)
            if over.item():
                state.stop_reason, guard_fired = "wall_clock", True
        # No extra evaluation at a wall-clock pause: the resumed run must match an unpaused one.
        if state.step % tr.eval_every == 0 or state.stop_reason in ("max_steps", "max_tokens"):
            val = evaluate(raw, vwin, T, info.pad_id, device, amp, 2 * tr.micro_batch)
            row["val_loss"] = val
            if val is not None and (state.best_val is None or val < state.best_val):
                state.best_val, state.best_step, state.evals_since_best = val, state.step, 0
                best = export_state(raw)
            elif val is not None:
                state.evals_since_best += 1
                if tr.patience and state.evals_since_best >= tr.patience and not state.stop_reason:
                    state.stop_reason = "early_stopping"
        state.log.append(row)
        if state.step % tr.log_every == 0 or state.stop_reason or state.step == 1:
            elapsed = max(time.perf_counter() - t_train, 1e-9)
            val_txt = "" if row["val_loss"] is None else (
                f" | val {row['val_loss']:.4f} (ppl {math.exp(min(row['val_loss'], 50)):.2f})")
            examples = state.step * shard.effective_batch
            echo(f"step {state.step}/{tr.max_steps} | examples {examples} | epoch "
                 f"{examples / len(stream):.2f} | tokens {state.tokens}"
                 f" | loss {loss:.4f} (ppl {math.exp(min(loss, 50)):.2f}){val_txt} | lr {lr:.2e}"
                 f" | grad_norm {gnorm:.3f} | {(state.tokens - start_tokens) / elapsed:.0f} tok/s")
        if state.step % cfg.checkpoint.every == 0 or state.stop_reason:
            save(state.step)
        if on_step is not None:
            on_step(state)

    if state.best_val is None:
        best, state.best_step = export_state(raw), state.step  # no validation data: last weights
    return TrainResult(
        state=state, model=raw, best=best, params=param_counts(raw), finetune=ft_report,
        fingerprint=fp, device=device, precision=precision, reproducible=not guard_fired,
        resumed_from=resumed_from, seconds=time.perf_counter() - t0,
        steps_this_run=state.step - start_step, tokens_this_run=state.tokens - start_tokens,
        n_train_examples=len(stream), n_val_windows=len(vwin))


def _train_step(fwd, ddp, opt, scaler, trainable, stream: WindowStream, shard: Shard, step: int,
                T: int, pad_id: int, device: str, amp, clip: float,
                last_ckpt: Path | None) -> tuple[float, float, int, bool]:
    """One optimiser step -> (train loss, grad norm, valid targets, skipped by the scaler)."""
    n_global = sum(stream.n_valid(k) for k in shard.step_positions(step))
    nll_local = torch.zeros((), device=device)
    for micro in range(shard.grad_accum):
        batch = make_batch([stream.window(k) for k in shard.micro_positions(step, micro)], T,
                           pad_id)
        last = micro == shard.grad_accum - 1
        sync = contextlib.nullcontext() if last or ddp is None else ddp.no_sync()
        with sync:
            with _autocast(device, amp):
                _, nll = fwd(batch.x.to(device), batch.y.to(device), batch.mask.to(device),
                             reduction="sum")
            scaler.scale(nll * (shard.world_size / n_global)).backward()
        nll_local += nll.detach().float()
    if ddp is not None:
        tdist.all_reduce(nll_local)
    loss = float(nll_local) / n_global
    if scaler.is_enabled():
        scaler.unscale_(opt)
    gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, clip if clip > 0 else math.inf))
    where = f"last good checkpoint: {last_ckpt}" if last_ckpt else "no checkpoint written yet"
    if not math.isfinite(loss) or (not math.isfinite(gnorm) and not scaler.is_enabled()):
        raise NonFiniteError(
            f"non-finite value at step {step + 1}: train loss {loss}, grad norm {gnorm}; stopped "
            f"without saving ({where}). Usual causes: learning rate too high, fp16 overflow "
            "(try precision: bf16 or fp32), or bad token ids (run `symkit doctor`).")
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(opt)
    scaler.update()
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    opt.zero_grad(set_to_none=True)
    return loss, gnorm, n_global, skipped

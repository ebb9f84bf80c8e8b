"""Stage wiring for ``train_transformer``: process group, inputs, :func:`loop.train`, outputs.

Outputs (rank 0 only):
- ``<out>/model.safetensors`` + ``model.json``: the best weights (LoRA merged into the base),
  config, vocabulary ids, tokenizer and split hashes, parameter counts;
- ``summary`` (``reports/train.json``): deterministic run summary;
- ``log_tsv`` (``reports/plots/train_log.tsv``): ``step, train_loss, val_loss, lr, grad_norm``;
- ``env`` (``reports/train.env.json``): timings, throughput, device and environment (sidecar).
"""

from __future__ import annotations

import copy
import math
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist

from models.lora import merge_lora, param_counts
from models.transformer import save_model
from pipeline.artifacts import sha256_json, write_json, write_sidecar, write_text
from pipeline.training.data import Corpus, TokenInfo, load_corpus
from pipeline.training.loop import TrainResult, fingerprint, train
from pipeline.training.setup import DistInfo

if TYPE_CHECKING:
    from pipeline.config import RuntimeConfig
    from pipeline.train_transformer import TransformerStageConfig

LOG_COLUMNS = ("step", "train_loss", "val_loss", "lr", "grad_norm")


def _echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkpoint_dir(out_dir: Path, cfg: TransformerStageConfig, info: TokenInfo, threads: int,
                   world_size: int) -> Path:
    """``OUT/checkpoints/run-<identity>``: one sub-folder per run identity.

    The identity hashes the result-affecting config, tokenizer and split. A controlled comparison
    (``dvc exp run -S ...``) so starts its own run instead of meeting another run's checkpoints, and
    switching back finds the earlier run finished. Resuming still verifies every hash.
    """
    run_id = sha256_json(fingerprint(cfg, info, threads, world_size))
    return Path(out_dir) / "checkpoints" / f"run-{run_id[:16]}"


def run_stage(cfg: TransformerStageConfig, runtime: RuntimeConfig, *, tokens: Path, info: Path,
              augmented: Path | None, out_dir: Path, summary: Path, log_tsv: Path, env: Path,
              fresh: bool = False) -> dict[str, Any]:
    dist = DistInfo.from_env()
    own_group = dist.world_size > 1 and not tdist.is_initialized()
    if own_group:
        cuda = torch.cuda.is_available() and cfg.device in ("auto", "cuda")
        if cuda:
            torch.cuda.set_device(dist.local_rank)
        tdist.init_process_group("nccl" if cuda else "gloo")
    try:
        tinfo = TokenInfo.read(info)
        corpus = load_corpus(tokens, tinfo, augmented if cfg.data.use_augmented else None)
        if cfg.data.use_augmented and (augmented is None or not Path(augmented).exists()):
            _echo(f"transformer.data.use_augmented is true but {augmented} does not exist; "
                  "training without augmentations")
        for reason, n in sorted(corpus.skipped.items()):
            _echo(f"skipped {n} token rows ({reason}); counted in reports/train.json")
        ckpt_dir = checkpoint_dir(out_dir, cfg, tinfo, runtime.torch_threads, dist.world_size)
        if fresh and dist.is_main:
            shutil.rmtree(ckpt_dir.parent, ignore_errors=True)
        if dist.world_size > 1:
            tdist.barrier()
        result = train(cfg, tinfo, corpus, ckpt_dir, threads=runtime.torch_threads, dist=dist,
                       echo=_echo)
        out = summarise(cfg, tinfo, corpus, result)
        if dist.is_main:
            write_outputs(result, tinfo, out, out_dir=Path(out_dir), summary=summary,
                          log_tsv=log_tsv, env=env, threads=runtime.torch_threads,
                          world_size=dist.world_size)
        return out
    finally:
        if own_group:
            tdist.destroy_process_group()


def _ppl(x: float | None) -> float | None:
    return None if x is None else math.exp(min(x, 700.0))


def summarise(cfg: TransformerStageConfig, info: TokenInfo, corpus: Corpus,
              r: TrainResult) -> dict[str, Any]:
    """Deterministic summary: counts and losses only (no timings, devices or paths)."""
    s = r.state
    eff = cfg.train.micro_batch * cfg.train.grad_accum * r.fingerprint["config"]["world_size"]
    last = s.log[-1] if s.log else {}
    return {
        "steps": s.step,
        "examples": s.step * eff,
        "epochs": s.step * eff / max(1, r.n_train_examples),
        "tokens": s.tokens,
        "effective_batch": eff,
        "stop_reason": s.stop_reason,
        "reproducible": r.reproducible,
        "best_step": s.best_step,
        "best_val_loss": s.best_val,
        "best_val_ppl": _ppl(s.best_val),
        "final_train_loss": last.get("train_loss"),
        "final_train_ppl": _ppl(last.get("train_loss")),
        "skipped_steps": s.skipped_steps,
        "precision": r.precision,
        "params": r.params,
        "n_train_examples": r.n_train_examples,
        "n_augmented_examples": corpus.n_augmented,
        "n_val_examples": len(corpus.val),
        "n_val_windows": r.n_val_windows,
        "skipped_rows": dict(sorted(corpus.skipped.items())),
        "finetune": {"init_from": r.finetune["init_from"],
                     "frozen_tensors": len(r.finetune["frozen"]),
                     "lora_layers": len(r.finetune["lora_layers"])},
        "config_hash": r.fingerprint["config_hash"],
        "tokenizer_hash": info.tokenizer_hash,
        "split_hash": info.split_hash,
        "vocab_size": info.vocab_size,
    }


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def log_table(rows: list[dict[str, Any]]) -> str:
    lines = ["\t".join(LOG_COLUMNS)]
    lines += ["\t".join(_fmt(row[c]) for c in LOG_COLUMNS) for row in rows]
    return "\n".join(lines) + "\n"


def final_model(r: TrainResult) -> torch.nn.Module:
    """A plain GPT holding the best weights (adapters merged), on CPU."""
    model = copy.deepcopy(r.model).to("cpu")
    model.load_state_dict(r.best)
    return merge_lora(model)


def write_outputs(r: TrainResult, info: TokenInfo, summary_obj: dict[str, Any], *, out_dir: Path,
                  summary: Path, log_tsv: Path, env: Path, threads: int, world_size: int) -> None:
    model = final_model(r)
    save_model(out_dir, model, {
        "vocab_size": info.vocab_size, "pad_id": info.pad_id, "bos_id": info.bos_id,
        "eos_id": info.eos_id, "tokenizer_hash": info.tokenizer_hash,
        "split_hash": info.split_hash, "params": param_counts(model),
        "training_params": r.params, "best_step": r.state.best_step,
        "best_val_loss": r.state.best_val, "config_hash": r.fingerprint["config_hash"],
    })
    write_json(summary, summary_obj)
    write_text(log_tsv, log_table(r.state.log))
    facts: dict[str, Any] = {
        "device": r.device, "precision": r.precision, "seconds": r.seconds,
        "steps_this_run": r.steps_this_run, "tokens_this_run": r.tokens_this_run,
        "tokens_per_s": r.tokens_this_run / r.seconds if r.seconds > 0 else None,
        "resumed_from": r.resumed_from, "torch_threads": threads, "world_size": world_size,
        "reproducible": r.reproducible,
    }
    if r.device.startswith("cuda"):
        facts["cuda_device"] = torch.cuda.get_device_name(r.device)
        facts["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(r.device)
    write_sidecar(env, facts)

"""What ``train_transformer`` writes from a :class:`~pipeline.training.loop.TrainResult`.

:func:`summarise` makes the deterministic summary; :func:`write_outputs` writes (rank 0 only):
- ``<out>/model.safetensors`` + ``model.json``: the best weights (LoRA merged into the base),
  config, vocabulary ids, tokenizer and split hashes, parameter counts;
- ``summary`` (``reports/train.json``): deterministic run summary;
- ``log_tsv`` (``reports/plots/train_log.tsv``): ``step, train_loss, val_loss, lr, grad_norm``;
- ``env`` (``reports/train.env.json``): timings, throughput, device and environment (sidecar).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch

from models.lora import merge_lora, param_counts
from models.transformer import save_model
from pipeline.core.artifacts import write_json, write_sidecar, write_text
from pipeline.tokens.contract import TokenInfo
from pipeline.training.config import TrainSection
from pipeline.training.data import Corpus
from pipeline.training.loop import TrainResult

LOG_COLUMNS = ("step", "train_loss", "val_loss", "lr", "grad_norm")


def _ppl(x: float | None) -> float | None:
    return None if x is None else math.exp(min(x, 700.0))


def summarise(tr: TrainSection, info: TokenInfo, corpus: Corpus,
              r: TrainResult) -> dict[str, Any]:
    """Deterministic summary: counts and losses only (no timings, devices or paths)."""
    s = r.state
    eff = tr.micro_batch * tr.grad_accum * r.fingerprint["config"]["world_size"]
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

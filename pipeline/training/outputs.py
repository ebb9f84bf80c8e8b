"""What ``train_transformer`` writes from the :class:`~pipeline.training.loop.TrainResult` of each
replicate (one training run per seed ``seed, seed+1, ...``).

:func:`summarise` makes one replicate's deterministic summary; :func:`collect` keeps what the
outputs need of a finished replicate (its final model on CPU, metadata, summary, log and timings),
so the training state can go before the next seed trains; :func:`stage_summary` joins the
replicates' summaries. :func:`write_outputs` writes (rank 0 only):
- ``<out>/model.safetensors`` + ``model.json``: the first seed's best weights (LoRA merged into the
  base), config, vocabulary ids, tokenizer and split hashes, parameter counts, seed;
- ``<out>/replicates/``: ``index.json`` (``seeds`` in training order, ``folders`` by seed) and a
  folder ``seed-<s>/`` per seed holding its ``model.safetensors`` + ``model.json`` (the first seed's
  are byte-identical to ``<out>/model.*``);
- ``summary`` (``reports/train.json``): the first seed's summary, plus ``seeds``, ``replicates``
  (each seed's losses, steps and stop reason) and ``best_val_loss_spread``;
- ``log_dir`` (``reports/plots/train_log/``): ``seed-<s>.tsv`` per seed with
  ``step, train_loss, val_loss, lr, grad_norm`` (compound tokens: then ``train_loss_<codebook>``
  and ``val_loss_<codebook>`` per codebook, and ``train_loss``/``val_loss`` are their mean);
- ``env`` (``reports/train.env.json``): timings, throughput, device and environment (sidecar),
  for the whole stage and per seed.

Both folders are written whole (:func:`atomic_dir`): a seed no longer trained leaves no folder
or log behind.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.lora import merge_lora, param_counts
from models.transformer import save_model
from pipeline.core.artifacts import atomic_dir, write_json, write_sidecar, write_text
from pipeline.tokens.contract import TokenInfo, codebook_key
from pipeline.training.config import TrainSection
from pipeline.training.data import Corpus
from pipeline.training.loop import TrainResult

LOG_COLUMNS = ("step", "train_loss", "val_loss", "lr", "grad_norm")
REPLICATES = "replicates"
"""The replicates folder's name inside the model folder."""
REPLICATE_KEYS = ("best_step", "best_val_loss", "final_train_loss", "steps", "stop_reason",
                  "epochs", "config_hash")
"""Keys of each seed's entry in ``train.json: replicates``."""


def seed_folder(seed: int) -> str:
    """``seed-<s>``: a seed's folder in ``<out>/replicates/`` (its log is ``seed-<s>.tsv``)."""
    return f"seed-{seed}"


def _ppl(x: float | None) -> float | None:
    return None if x is None else math.exp(min(x, 700.0))


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None


def summarise(tr: TrainSection, info: TokenInfo, corpus: Corpus,
              r: TrainResult) -> dict[str, Any]:
    """One replicate's deterministic summary: counts and losses only (no timings, devices or
    paths)."""
    s = r.state
    eff = tr.micro_batch * tr.grad_accum * r.fingerprint["config"]["world_size"]
    last = s.log[-1] if s.log else {}
    return {
        "steps": s.step,
        "examples": r.examples,
        "epochs": r.examples / max(1, r.n_train_examples),
        "tokens": s.tokens,
        "effective_batch": eff,
        "padded_share": r.padded_share,
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
        **({} if not info.compound else {"codebooks": _codebook_losses(s, info)}),
        **({} if r.conditions is None else {"condition": {
            "names": list(r.conditions.names), "vocab_hash": r.conditions.hash,
            "labels": {n: list(x) for n, x in zip(r.conditions.names, r.conditions.labels,
                                                    strict=True)},
            "dropout": r.fingerprint["config"]["condition"]["dropout"]}}),
    }


def _codebook_losses(s: Any, info: TokenInfo) -> dict[str, dict[str, Any]]:
    """Compound tokens: per codebook key, its ``name``, its last training loss and its
    validation loss at the best step (the step whose mean over codebooks was lowest)."""
    last = s.log[-1] if s.log else {}
    at_best = next((row for row in s.log if row["step"] == s.best_step), {})
    return {key: {"name": book["name"], "final_train_loss": last.get(f"train_loss_{key}"),
                  "best_val_loss": at_best.get(f"val_loss_{key}")}
            for key, book in zip(info.codebook_keys(), info.codebooks or [], strict=True)}


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def log_table(rows: list[dict[str, Any]], codebooks: Sequence[str] = ()) -> str:
    """The per-step TSV: :data:`LOG_COLUMNS`, then for compound tokens ``train_loss_<key>`` and
    ``val_loss_<key>`` of each codebook key in ``codebooks``, in the tokenizer's order."""
    columns = [*LOG_COLUMNS, *(f"{x}_loss_{k}" for k in codebooks for x in ("train", "val"))]
    lines = ["\t".join(columns)]
    lines += ["\t".join(_fmt(row[c]) for c in columns) for row in rows]
    return "\n".join(lines) + "\n"


def final_model(r: TrainResult) -> torch.nn.Module:
    """A plain GPT holding the best weights (adapters merged), on CPU."""
    model = copy.deepcopy(r.model).to("cpu")
    model.load_state_dict(r.best)
    return merge_lora(model)


@dataclass(frozen=True)
class Replicate:
    """What the outputs need of one finished replicate."""

    seed: int
    model: torch.nn.Module  # best weights, adapters merged, on CPU
    meta: dict[str, Any]  # model.json's entries besides format and config
    summary: dict[str, Any]  # :func:`summarise`
    log: list[dict[str, Any]]  # one row per step (LOG_COLUMNS)
    timing: dict[str, Any]  # sidecar facts of this seed: seconds, steps and tokens this run, ...
    device: str
    precision: str
    reproducible: bool


def collect(seed: int, r: TrainResult, info: TokenInfo, summary: dict[str, Any]) -> Replicate:
    """Keep what the outputs need of replicate ``seed`` (its result can then be dropped)."""
    model = final_model(r)
    meta = {
        "vocab_size": info.vocab_size, "pad_id": info.pad_id, "bos_id": info.bos_id,
        "eos_id": info.eos_id, "tokenizer_hash": info.tokenizer_hash,
        "split_hash": info.split_hash, "params": param_counts(model),
        "training_params": r.params, "best_step": r.state.best_step,
        "best_val_loss": r.state.best_val, "config_hash": r.fingerprint["config_hash"],
        "seed": seed,
    }
    if info.compound:  # the scorer reads each codebook's specials and masked ids from here
        meta["codebooks"] = info.codebooks
    cond = r.fingerprint["config"].get("condition")
    if cond is not None:  # only a conditioned model's model.json names its conditions
        meta["condition"] = {**cond, "vocab": r.conditions.to_dict()}
    timing = {"seconds": r.seconds, "steps_this_run": r.steps_this_run,
              "tokens_this_run": r.tokens_this_run,
              "tokens_per_s": _rate(r.tokens_this_run, r.seconds),
              "resumed_from": r.resumed_from}
    return Replicate(seed=seed, model=model, meta=meta, summary=summary, log=list(r.state.log),
                     timing=timing, device=r.device, precision=r.precision,
                     reproducible=r.reproducible)


def spread(values: list[float]) -> dict[str, float | None]:
    """``mean``, ``sd`` (ddof = 1; None for fewer than two values), ``min``, ``max``."""
    if not values:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values)}


def stage_summary(reps: list[Replicate]) -> dict[str, Any]:
    """``reports/train.json``: the first seed's summary at the top level, plus ``seeds``,
    ``replicates`` (:data:`REPLICATE_KEYS` of every seed, the first included) and the spread of
    the seeds' best validation losses (seeds without one left out)."""
    vals = [r.summary["best_val_loss"] for r in reps if r.summary["best_val_loss"] is not None]
    return {**reps[0].summary,
            "seeds": [r.seed for r in reps],
            "replicates": {str(r.seed): {k: r.summary[k] for k in REPLICATE_KEYS} for r in reps},
            "best_val_loss_spread": spread(vals)}


def write_outputs(reps: list[Replicate], summary_obj: dict[str, Any], *, out_dir: Path,
                  summary: Path, log_dir: Path, env: Path, threads: int,
                  world_size: int) -> None:
    """Write every output of the stage (see the module docstring); ``reps`` in training order."""
    out_dir = Path(out_dir)
    first = reps[0]
    save_model(out_dir, first.model, first.meta)
    with atomic_dir(out_dir / REPLICATES) as tmp:
        for rep in reps:
            save_model(tmp / seed_folder(rep.seed), rep.model, rep.meta)
        write_json(tmp / "index.json", {"seeds": [r.seed for r in reps],
                                        "folders": {str(r.seed): seed_folder(r.seed)
                                                    for r in reps}})
    write_json(summary, summary_obj)
    with atomic_dir(log_dir) as tmp:
        for rep in reps:
            books = [codebook_key(c["name"]) for c in rep.meta.get("codebooks", [])]
            write_text(tmp / f"{seed_folder(rep.seed)}.tsv", log_table(rep.log, books))
    seconds = sum(r.timing["seconds"] for r in reps)
    tokens = sum(r.timing["tokens_this_run"] for r in reps)
    facts: dict[str, Any] = {
        "device": first.device, "precision": first.precision, "seconds": seconds,
        "steps_this_run": sum(r.timing["steps_this_run"] for r in reps),
        "tokens_this_run": tokens, "tokens_per_s": _rate(tokens, seconds),
        "resumed_from": first.timing["resumed_from"], "torch_threads": threads,
        "world_size": world_size, "reproducible": all(r.reproducible for r in reps),
        "replicates": {str(r.seed): r.timing for r in reps},
    }
    if first.device.startswith("cuda"):
        facts["cuda_device"] = torch.cuda.get_device_name(first.device)
        facts["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(first.device)
    write_sidecar(env, facts)



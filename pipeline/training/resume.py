"""Where a run continues from: its identity, the newest usable checkpoint, every rank's RNG.

A run's identity (:func:`fingerprint`) is the result-affecting config, the data hashes and a
digest of the training code (:data:`TRAIN_CODE`); its checkpoints live in their own folder
(:func:`checkpoint_dir`), so after a change to that code a re-run starts afresh instead of
continuing, or returning as finished, a run the old code made. :func:`find_resume` picks the
newest checkpoint there that can be read, checks that the same run wrote it, and returns a
:class:`Resume`: the loaded checkpoint, or nothing to resume.

- A damaged checkpoint (truncated or missing file) is skipped with a warning and set aside as
  ``unreadable-step-XXXXXXXX``; the one before it is used. Resuming from an older checkpoint is
  still exact, the steps since are replayed. With none readable the run starts fresh.
- A checkpoint of another run is refused (``checkpoint.on_mismatch: refuse``) or its folder is
  emptied and the run starts fresh (``restart``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from pipeline.core.artifacts import code_digest, sha256_file, sha256_json
from pipeline.tokens.contract import TokenInfo
from pipeline.training import checkpoint as ckpt
from pipeline.training.config import CheckpointSection, TransformerStageConfig, result_config
from pipeline.training.device import DistInfo, TrainDevice, barrier

FRESH_HINT = ("rerun with `symkit train-transformer --fresh` (deletes the old checkpoints), "
              "delete data/transformer/checkpoints/, or set transformer.checkpoint.on_mismatch: "
              "restart")

TRAIN_CODE = ("pipeline.training.loop", "pipeline.training.data", "pipeline.training.setup",
              "pipeline.training.device", "pipeline.training.config",
              "pipeline.training.checkpoint", __name__, "models.transformer", "models.compound",
              "models.loading", "models.lora",
              "models.base", "pipeline.conditions.assign", "pipeline.conditions.extract",
              "pipeline.conditions.vocab", "pipeline.tokens.contract")
"""The modules whose code a training run's result depends on: their bytes enter the run identity
(a test checks that the list holds every symkit module they import, save those that cannot change
a result)."""


def fingerprint(cfg: TransformerStageConfig, info: TokenInfo, threads: int,
                world_size: int, conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: result-affecting config and data hashes, the
    conditions of a conditioned run (names, vocabulary, every piece's ids, dropout) and the
    training code's digest."""
    conf = result_config(cfg, threads, world_size)
    init = cfg.finetune.init_from
    if init:
        conf["init_sha256"] = sha256_file(Path(init) / "model.safetensors")
    conf["vocab_size"] = info.vocab_size
    if conditions is not None:
        conf["condition"] = conditions
    return {"config": conf, "config_hash": sha256_json(conf),
            "tokenizer_hash": info.tokenizer_hash, "split_hash": info.split_hash,
            "code_digest": code_digest(TRAIN_CODE)}


def checkpoint_dir(out_dir: Path, cfg: TransformerStageConfig, info: TokenInfo, threads: int,
                   world_size: int, conditions: dict[str, Any] | None = None) -> Path:
    """``OUT/checkpoints/run-<identity>``: one sub-folder per run identity.

    The identity hashes the result-affecting config, tokenizer, split and training code. A
    controlled comparison (``dvc exp run -S ...``) so starts its own run instead of meeting another
    run's checkpoints, and switching back finds the earlier run finished (with the same code).
    Resuming still verifies every hash.
    """
    run_id = sha256_json(fingerprint(cfg, info, threads, world_size, conditions))
    return Path(out_dir) / "checkpoints" / f"run-{run_id[:16]}"


@dataclass(frozen=True)
class Resume:
    """The outcome of :func:`find_resume`."""

    checkpoint: ckpt.Checkpoint | None  # loaded and from this run; None: start fresh
    discard_old: bool = False  # the folder holds another run's checkpoints (on_mismatch: restart)
    unreadable: tuple[Path, ...] = field(default=())  # damaged checkpoints newer than the one used

    @property
    def resumed_from(self) -> str | None:
        """The checkpoint folder's name (``step-00000300``), or None for a fresh start."""
        return None if self.checkpoint is None else self.checkpoint.path.name


def find_resume(ckpt_dir: Path, fp: dict[str, Any], on_mismatch: str,
                echo: Callable[[str], None]) -> Resume:
    """The newest readable checkpoint in ``ckpt_dir`` written by the run ``fp``.

    Reads only; :func:`open_resume` tidies the folder. Raises
    :class:`~pipeline.training.checkpoint.CheckpointMismatch` when the newest readable checkpoint
    is another run's and ``on_mismatch`` is ``refuse``.
    """
    found = ckpt.list_checkpoints(ckpt_dir)
    unreadable: list[Path] = []
    for path in reversed(found):  # newest first
        try:
            loaded = ckpt.load_checkpoint(path)
            ckpt.check_compatible(path, loaded.state, fp, FRESH_HINT)
        except ckpt.CheckpointUnreadable as e:
            unreadable.append(path)
            echo(f"warning: checkpoint {path} is unreadable ({e}); falling back to the one "
                 "before it")
            continue
        except ckpt.CheckpointMismatch:
            if on_mismatch == "refuse":
                raise
            echo(f"checkpoint {path} is from a different run; discarding its checkpoints "
                 "(checkpoint.on_mismatch: restart)")
            return Resume(None, discard_old=True)
        return Resume(loaded, unreadable=tuple(unreadable))
    if unreadable:
        echo(f"warning: no readable checkpoint in {ckpt_dir}; starting fresh")
    return Resume(None, unreadable=tuple(unreadable))


def open_resume(ckpt_dir: Path, fp: dict[str, Any], policy: CheckpointSection, dist: DistInfo,
                echo: Callable[[str], None]) -> Resume:
    """:func:`find_resume` on every rank, with rank 0 tidying the folder around it: leftovers of
    a killed write are deleted before anyone reads, and damaged or discarded checkpoints are moved
    or deleted only after every rank has read its checkpoint."""
    if dist.is_main:
        ckpt.remove_stale(ckpt_dir)
    barrier(dist)
    resume = find_resume(ckpt_dir, fp, policy.on_mismatch, echo)
    barrier(dist)
    if dist.is_main:
        for path in resume.unreadable:
            echo(f"moved the unreadable checkpoint to {ckpt.set_aside(path)}")
        if resume.discard_old:
            for old in ckpt.list_checkpoints(ckpt_dir):
                shutil.rmtree(old)
        if resume.checkpoint is None:
            remove_superseded(ckpt_dir, fp, echo)
    return resume


def remove_superseded(ckpt_dir: Path, fp: dict[str, Any], echo: Callable[[str], None]) -> None:
    """Delete the sibling run folders of ``ckpt_dir`` whose newest checkpoint is this run's
    (same config, tokenizer and split) made by other training code: this code can never resume
    them, and one folder a code change would pile up. Runs of other configs keep theirs (a
    ``dvc exp`` switching back finds them); a folder whose newest state cannot be read is left."""
    keys = ("config_hash", "tokenizer_hash", "split_hash")
    for other in sorted(Path(ckpt_dir).parent.glob("run-*")):
        if other == Path(ckpt_dir) or not other.is_dir():
            continue
        found = ckpt.list_checkpoints(other)
        try:
            state = ckpt.read_state(found[-1]) if found else {}
        except ckpt.CheckpointUnreadable:
            continue
        if state and all(state.get(k) == fp[k] for k in keys) \
                and state.get("code_digest") != fp["code_digest"]:
            shutil.rmtree(other)
            echo(f"removed {other.name}: this run's checkpoints made by other training code")


def gather_rng(dev: TrainDevice) -> dict[str, torch.Tensor]:
    """RNG states of every rank (dropout draws from the default generators), gathered; a
    collective call: every rank must make it."""
    mine = {"torch_cpu": torch.get_rng_state()}
    if dev.device_type == "cuda":
        mine["cuda"] = torch.cuda.get_rng_state(dev.device)
    if dev.dist.world_size == 1:
        return {f"{k}.rank0": v for k, v in mine.items()}
    out = {}
    for k, v in sorted(mine.items()):
        parts = [torch.empty_like(v, device=dev.comm_device) for _ in range(dev.dist.world_size)]
        tdist.all_gather(parts, v.to(dev.comm_device))
        out.update({f"{k}.rank{r}": p.cpu() for r, p in enumerate(parts)})
    return out


def restore_rng(rng: dict[str, torch.Tensor], dev: TrainDevice) -> None:
    """Put this rank's saved RNG states back."""
    rank = dev.dist.rank
    if f"torch_cpu.rank{rank}" in rng:
        torch.set_rng_state(rng[f"torch_cpu.rank{rank}"])
    if dev.device_type == "cuda" and f"cuda.rank{rank}" in rng:
        torch.cuda.set_rng_state(rng[f"cuda.rank{rank}"], dev.device)

"""Resumable checkpoints without pickles.

A checkpoint is a folder ``<dir>/step-00000123/`` holding

- ``model.safetensors``  — the training model's state (LoRA layers included, if any);
- ``best.safetensors``   — the best-so-far weights (same structure);
- ``optimizer.safetensors`` — optimiser state tensors flattened as ``state.<param>.<name>``, plus
  RNG states as ``rng.<name>`` (uint8 tensors);
- ``state.json`` — step, data-stream position, counters, log rows, optimiser param groups,
  scheduler and grad-scaler state, the run's config, ``config_hash``, ``tokenizer_hash``,
  ``split_hash`` and ``code_digest``.

It is written into a temporary sibling folder (each file through ``pipeline.core.artifacts``) and
renamed into place, so a kill at any moment leaves whole checkpoints only; the newest ``keep_last``
are kept. :func:`load_checkpoint` raises :class:`CheckpointUnreadable` for a damaged folder (a
truncated file, say) and :class:`CheckpointMismatch` for another format; :func:`check_compatible`
refuses to resume a checkpoint made by a different run. Choosing which checkpoint to resume is
``pipeline.training.resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from pipeline.core.artifacts import dumps_json, write_bytes, write_text

CHECKPOINT_FORMAT = "symkit-checkpoint-v1"
PREFIX = "step-"
REQUIRED_STATE = ("optimizer_param_groups", "train_state", "scheduler")
"""``state.json`` keys a resume reads (besides the hashes :func:`check_compatible` compares)."""


class CheckpointMismatch(RuntimeError):
    """The latest checkpoint belongs to a different run (config, tokenizer or split differ)."""


class CheckpointUnreadable(RuntimeError):
    """A checkpoint folder is damaged: a file is missing, truncated or not what it should be."""


@dataclass
class Checkpoint:
    path: Path
    model: dict[str, torch.Tensor]
    best: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, torch.Tensor]
    state: dict[str, Any]


def flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """``optimizer.state_dict()`` -> (tensors keyed ``state.<param>.<name>``, param groups)."""
    tensors = {}
    for pid, st in sd["state"].items():
        for name, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{pid}.{name}"] = t.detach().to("cpu").contiguous()
    return tensors, sd["param_groups"]


def unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = t
    return {"state": state, "param_groups": groups}


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (temporary folders are ignored)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def save_checkpoint(ckpt_dir: Path, step: int, *, model: dict[str, torch.Tensor],
                    best: dict[str, torch.Tensor], optimizer: dict[str, Any],
                    rng: dict[str, torch.Tensor], state: dict[str, Any], keep_last: int) -> Path:
    """Write checkpoint ``step`` atomically and prune to the newest ``keep_last``."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"{PREFIX}{step:08d}"
    tmp = ckpt_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        opt_tensors, groups = flatten_optimizer(optimizer)
        opt_tensors.update({f"rng.{k}": v.contiguous() for k, v in rng.items()})
        write_bytes(tmp / "model.safetensors", save(model))
        write_bytes(tmp / "best.safetensors", save(best))
        write_bytes(tmp / "optimizer.safetensors", save(opt_tensors))
        write_text(tmp / "state.json", dumps_json(
            {**state, "format": CHECKPOINT_FORMAT, "step": step, "optimizer_param_groups": groups}))
        if final.exists():  # the same step written again (a resumed, finished run)
            old = ckpt_dir / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


def remove_stale(ckpt_dir: Path) -> None:
    """Delete temporary folders left by a kill during a checkpoint write."""
    if Path(ckpt_dir).is_dir():
        for p in sorted(Path(ckpt_dir).iterdir()):
            if p.is_dir() and p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a whole checkpoint folder. Raises :class:`CheckpointUnreadable` naming the damaged
    file, or :class:`CheckpointMismatch` for a checkpoint of another format."""
    path = Path(path)
    state = read_state(path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatch(f"{path}: format {state.get('format')!r}, expected "
                                 f"{CHECKPOINT_FORMAT!r}")
    missing = [k for k in REQUIRED_STATE if k not in state]
    if missing:
        raise CheckpointUnreadable(f"{path / 'state.json'}: no {', '.join(missing)}")
    tensors = _read(path / "optimizer.safetensors", load)
    rng = {k[4:]: v for k, v in tensors.items() if k.startswith("rng.")}
    opt = {k: v for k, v in tensors.items() if k.startswith("state.")}
    return Checkpoint(
        path=path,
        model=_read(path / "model.safetensors", load),
        best=_read(path / "best.safetensors", load),
        optimizer=unflatten_optimizer(opt, state["optimizer_param_groups"]),
        rng=rng,
        state=state,
    )


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint folder's ``state.json`` alone (no tensors). Raises
    :class:`CheckpointUnreadable` when it is missing, damaged or not a JSON object."""
    state = _read(Path(path) / "state.json", lambda b: json.loads(b.decode("utf-8")))
    if not isinstance(state, dict):
        raise CheckpointUnreadable(f"{Path(path) / 'state.json'}: not a JSON object")
    return state


def _read(file: Path, parse: Callable[[bytes], Any]) -> Any:
    """``parse(bytes of file)``; any failure becomes :class:`CheckpointUnreadable` naming it."""
    try:
        return parse(file.read_bytes())
    except FileNotFoundError:
        raise CheckpointUnreadable(f"{file}: missing") from None
    except (OSError, ValueError, SafetensorError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise CheckpointUnreadable(f"{file}: {e}") from None


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint folder to ``unreadable-step-XXXXXXXX`` beside it: it is no
    longer a checkpoint (so it never counts against ``keep_last``), but stays for inspection."""
    path = Path(path)
    target = path.with_name(f"unreadable-{path.name}")
    if target.exists():
        target = path.with_name(f"unreadable-{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, target)
    return target


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _diff(old.get(k, "<absent>"), new.get(k, "<absent>"), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_compatible(path: Path, saved: dict[str, Any], expected: dict[str, Any],
                     fresh_hint: str) -> None:
    """Raise :class:`CheckpointMismatch` naming every difference between the run that wrote the
    checkpoint at ``path`` and this one (``config``, ``tokenizer_hash``, ``split_hash``,
    ``code_digest``)."""
    problems = []
    for key in ("tokenizer_hash", "split_hash", "code_digest"):
        if saved.get(key) != expected.get(key):
            problems.append(f"{key} differs: checkpoint {saved.get(key)!r}, "
                            f"now {expected.get(key)!r}")
    if saved.get("config_hash") != expected.get("config_hash"):
        changes = _diff(saved.get("config", {}), expected.get("config", {}))
        problems.append("config differs: " + ("; ".join(changes) or "(hash only)"))
    if problems:
        raise CheckpointMismatch(
            f"refusing to resume from {path}: it was written by a different run.\n  - "
            + "\n  - ".join(problems) + f"\nTo start fresh: {fresh_hint}")

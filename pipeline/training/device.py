"""Where and how one training process runs: device, precision and its place in the process group.

:func:`make_device` turns ``transformer.device``, ``transformer.precision`` and the process-group
coordinates into one frozen :class:`TrainDevice`, decided once per run; everything downstream reads
it instead of re-deciding. The decisions themselves (:func:`resolve_device`,
:func:`resolve_precision`) take the availability flags as parameters, so they are tested without
the hardware they are about.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from pipeline.core.config import ParamsError


@dataclass(frozen=True)
class DistInfo:
    """Process-group coordinates; ``world_size == 1`` means no DDP."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> DistInfo:
        """Read ``torchrun``'s ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (defaults: one process)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                   int(env.get("LOCAL_RANK", 0)))


def barrier(dist: DistInfo) -> None:
    """Wait for every rank (a no-op for one process)."""
    if dist.world_size > 1:
        tdist.barrier()


@contextlib.contextmanager
def process_group(dist: DistInfo, device_pref: str) -> Iterator[None]:
    """Join ``torchrun``'s process group while the block runs: NCCL when training on CUDA, else
    gloo. Nothing to do for one process, or when the caller already joined one (the DDP test)."""
    own = dist.world_size > 1 and not tdist.is_initialized()
    if own:
        cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
        if cuda:
            torch.cuda.set_device(dist.local_rank)
        tdist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield
    finally:
        if own:
            tdist.destroy_process_group()


def resolve_device(pref: str, *, cuda: bool | None = None, mps: bool | None = None,
                   local_rank: int = 0) -> str:
    """``auto`` -> CUDA, else MPS, else CPU. An unavailable explicit choice is a ParamsError."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if mps is None:
        mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if pref == "auto":
        pref = "cuda" if cuda else "mps" if mps else "cpu"
    if pref == "cuda":
        if not cuda:
            raise ParamsError("transformer.device = 'cuda': no CUDA device is available "
                              "(use 'auto' or 'cpu')")
        return f"cuda:{local_rank}"
    if pref == "mps" and not mps:
        raise ParamsError("transformer.device = 'mps': MPS is not available (use 'auto' or 'cpu')")
    return pref


def resolve_precision(precision: str, device_type: str,
                      bf16_supported: bool | None = None) -> tuple[torch.dtype | None, bool, str]:
    """-> (autocast dtype or None for fp32, use a GradScaler, resolved name).

    ``auto``: bf16 on CUDA when supported, else fp16 with a GradScaler on CUDA; fp32 on CPU and
    MPS. bf16 needs no scaler (same exponent range as fp32); fp16 does (gradients underflow).
    """
    if bf16_supported is None:
        bf16_supported = device_type == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "auto":
        if device_type != "cuda":
            return None, False, "fp32"
        precision = "bf16" if bf16_supported else "fp16"
    if precision == "fp32":
        return None, False, "fp32"
    if precision == "bf16":
        if device_type == "mps" or (device_type == "cuda" and not bf16_supported):
            raise ParamsError(f"transformer.precision = 'bf16': not supported on this "
                              f"{device_type} device (use 'auto', 'fp16' or 'fp32')")
        return torch.bfloat16, False, "bf16"
    if device_type != "cuda":
        raise ParamsError(f"transformer.precision = 'fp16': only on CUDA, not {device_type} "
                          "(use 'auto' or 'fp32')")
    return torch.float16, True, "fp16"


@dataclass(frozen=True)
class TrainDevice:
    """Everything about *where* one process trains, decided once by :func:`make_device`."""

    device: str  # "cpu", "mps" or "cuda:<local_rank>"
    amp: torch.dtype | None  # autocast dtype; None trains in fp32
    use_scaler: bool  # fp16 only: scale the loss so small gradients do not underflow
    precision: str  # resolved name: "fp32", "bf16" or "fp16"
    dist: DistInfo

    @property
    def device_type(self) -> str:
        """``cpu``, ``mps`` or ``cuda`` (what ``torch.autocast`` and ``GradScaler`` take)."""
        return self.device.split(":")[0]

    @property
    def comm_device(self) -> str:
        """Where tensors sent between ranks live: NCCL needs CUDA tensors, gloo CPU ones."""
        return self.device if self.device_type == "cuda" else "cpu"

    @property
    def rng_devices(self) -> list[torch.device]:
        """Devices whose RNG ``torch.random.fork_rng`` must save and restore."""
        return [torch.device(self.device)] if self.device_type == "cuda" else []

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """Mixed precision for a forward pass (nothing for fp32)."""
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.amp)


def make_device(device: str, precision: str, dist: DistInfo) -> TrainDevice:
    """``transformer.device`` / ``transformer.precision`` on this process -> :class:`TrainDevice`.

    Raises ParamsError when the choice is not available here."""
    resolved = resolve_device(device, local_rank=dist.local_rank)
    amp, use_scaler, name = resolve_precision(precision, resolved.split(":")[0])
    return TrainDevice(resolved, amp, use_scaler, name, dist)

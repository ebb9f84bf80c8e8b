"""Where training runs: device and precision resolved once, and DistributedDataParallel on CPU
(gloo, 2 processes, activation checkpointing on) matching one process with the same effective
batch: the data shards tile each step and the loss is weighted by global token count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from pipeline.core.config import ParamsError
from pipeline.tokens.contract import TokenInfo
from pipeline.training import checkpoint as ckpt
from pipeline.training.data import load_corpus
from pipeline.training.device import DistInfo, make_device, resolve_device, resolve_precision
from pipeline.training.loop import train
from tests._transformer_data import tiny_config, write_token_data

# Dropout off: each rank draws its own dropout masks, which one process cannot reproduce.
OVERRIDES = {"model": {"dropout": 0.0}, "train": {"max_steps": 4, "eval_every": 2},
             "checkpoint": {"every": 2}}


def _worker(rank: int, world: int, init_file: str, data: dict, out: str) -> None:
    os.environ.pop("RANK", None)
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                             world_size=world)
    try:
        # Activation checkpointing on here, off in the one process: DDP's hooks see the
        # recomputing backward and the weights still match.
        cfg = tiny_config(train={**OVERRIDES["train"], "micro_batch": 4, "grad_accum": 1},
                          model=OVERRIDES["model"], checkpoint=OVERRIDES["checkpoint"],
                          activation_checkpointing=True)
        info = TokenInfo.read(Path(data["info"]))
        result = train(cfg, info, load_corpus(Path(data["tokens"]), info), Path(out), threads=1,
                       dist=DistInfo(rank, world, rank), echo=lambda _: None)
        if rank == 0:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in result.model.state_dict().items()},
                      str(Path(out) / "final.safetensors"))
    finally:
        tdist.destroy_process_group()


def test_two_gloo_processes_match_one_process(tmp_path):
    data = write_token_data(tmp_path / "tokens", n_pieces=30, mean_len=80)
    # One process: micro-batch 4 × 2 accumulation steps = effective batch 8.
    cfg = tiny_config(train={**OVERRIDES["train"], "micro_batch": 4, "grad_accum": 2},
                      model=OVERRIDES["model"], checkpoint=OVERRIDES["checkpoint"])
    info = TokenInfo.read(data["info"])
    single = train(cfg, info, load_corpus(data["tokens"], info), tmp_path / "single", threads=1,
                   echo=lambda _: None)
    # Two processes: micro-batch 4 × 1 step × 2 ranks = effective batch 8.
    ctx_data = {k: str(v) for k, v in data.items()}
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), ctx_data, str(tmp_path / "ddp")),
             nprocs=2, join=True)
    ddp = load_file(tmp_path / "ddp" / "final.safetensors")
    ref = single.model.state_dict()
    assert sorted(ddp) == sorted(ref)
    for k in ref:
        assert torch.allclose(ddp[k], ref[k], atol=1e-5, rtol=1e-4), k
    # rank 0 wrote the checkpoints; they name the world size in their config
    last = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "ddp"))
    assert last.state["config"]["world_size"] == 2
    assert {"torch_cpu.rank0", "torch_cpu.rank1"} <= set(last.rng)
    losses = [r["train_loss"] for r in single.state.log]
    assert [r["train_loss"] for r in last.state["train_state"]["log"]] == pytest.approx(
        losses, rel=1e-5)


def test_device_resolution():
    assert resolve_device("auto", cuda=True, mps=True, local_rank=1) == "cuda:1"
    assert resolve_device("auto", cuda=False, mps=True) == "mps"
    assert resolve_device("auto", cuda=False, mps=False) == "cpu"
    with pytest.raises(ParamsError, match="no CUDA"):
        resolve_device("cuda", cuda=False, mps=False)


def test_precision_resolution():
    assert resolve_precision("auto", "cuda", True) == (torch.bfloat16, False, "bf16")
    assert resolve_precision("auto", "cuda", False) == (torch.float16, True, "fp16")
    assert resolve_precision("auto", "cpu", False) == (None, False, "fp32")
    assert resolve_precision("auto", "mps", False) == (None, False, "fp32")
    assert resolve_precision("fp16", "cuda", True) == (torch.float16, True, "fp16")
    assert resolve_precision("bf16", "cpu", False) == (torch.bfloat16, False, "bf16")
    with pytest.raises(ParamsError, match="fp16"):
        resolve_precision("fp16", "cpu", False)
    with pytest.raises(ParamsError, match="bf16"):
        resolve_precision("bf16", "cuda", False)


def test_device_is_decided_once():
    dev = make_device("cpu", "auto", DistInfo(rank=1, world_size=2, local_rank=1))
    assert (dev.device, dev.device_type, dev.amp, dev.use_scaler, dev.precision) == (
        "cpu", "cpu", None, False, "fp32")
    assert dev.comm_device == "cpu" and dev.rng_devices == [] and dev.dist.rank == 1
    with dev.autocast():  # fp32: no autocast
        assert not torch.is_autocast_enabled("cpu")
    with make_device("cpu", "bf16", DistInfo()).autocast():
        assert torch.is_autocast_enabled("cpu")


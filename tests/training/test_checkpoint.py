"""Checkpoints: their contents (no pickles), the optimiser state flattened and back, partial and
stale folders ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.config import RuntimeConfig
from pipeline.stages.train_transformer import run
from pipeline.training import checkpoint as ckpt
from tests._transformer_data import run_ckpt_dir, tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=80)


def _run(cfg, data, out: Path) -> dict:
    return run(cfg, RUNTIME, tokens=data["tokens"], info=data["info"], augmented=None,
               out_dir=out / "model", summary=out / "train.json", log_dir=out / "log",
               env=out / "env.json")


def test_checkpoint_contents(data, tmp_path):
    cfg = tiny_config()
    _run(cfg, data, tmp_path)
    folders = ckpt.list_checkpoints(run_ckpt_dir(tmp_path / "model"))
    assert [p.name for p in folders] == ["step-00000009", "step-00000012"]  # keep_last = 2
    last = folders[-1]
    assert sorted(p.name for p in last.iterdir()) == [
        "best.safetensors", "model.safetensors", "optimizer.safetensors", "state.json"]
    state = json.loads((last / "state.json").read_text())
    for key in ("config", "config_hash", "tokenizer_hash", "split_hash", "code_digest",
                "scheduler", "scaler",
                "train_state", "optimizer_param_groups", "model_config", "step",
                "data_position"):
        assert key in state, key
    assert state["tokenizer_hash"] == "tok-hash" and state["split_hash"] == "split-hash"
    assert state["train_state"]["step"] == 12 and len(state["train_state"]["log"]) == 12
    assert state["scheduler"]["last_epoch"] == 12 and state["data_position"] == 12 * 8
    opt = load_file(last / "optimizer.safetensors")
    assert "rng.torch_cpu.rank0" in opt
    assert any(k.endswith(".exp_avg") for k in opt) and any(k.endswith(".exp_avg_sq") for k in opt)
    loaded = ckpt.load_checkpoint(last)
    assert set(loaded.model) == set(load_file(last / "model.safetensors"))


def test_optimizer_flatten_round_trip():
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.sum().backward()
    opt.step()
    tensors, groups = ckpt.flatten_optimizer(opt.state_dict())
    back = ckpt.unflatten_optimizer(tensors, json.loads(json.dumps(groups)))
    fresh = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone())], lr=0.1)
    fresh.load_state_dict(back)
    for name in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(fresh.state_dict()["state"][0][name], opt.state_dict()["state"][0][name])


def test_partial_and_stale_folders_are_ignored(data, tmp_path):
    cfg = tiny_config(train={"max_steps": 3}, checkpoint={"every": 3})
    _run(cfg, data, tmp_path)
    cdir = run_ckpt_dir(tmp_path / "model")
    (cdir / ".tmp-step-00000099-dead").mkdir()
    (cdir / "step-00000050").mkdir()  # no state.json: an incomplete folder is never "latest"
    assert ckpt.latest_checkpoint(cdir).name == "step-00000003"
    _run(cfg, data, tmp_path)
    assert not (cdir / ".tmp-step-00000099-dead").exists()

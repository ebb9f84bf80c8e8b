"""Checkpoints: exact resume after a kill, contents without pickles, atomicity, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.config import RuntimeConfig
from pipeline.stages.train_transformer import run
from pipeline.tokens.contract import TokenInfo
from pipeline.training import checkpoint as ckpt
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.resume import checkpoint_dir
from tests._transformer_data import run_ckpt_dir, tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)


class Killed(RuntimeError):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=80)


def _run(cfg, data, out: Path) -> dict:
    return run(cfg, RUNTIME, tokens=data["tokens"], info=data["info"], augmented=None,
               out_dir=out / "model", summary=out / "train.json", log_dir=out / "log",
               env=out / "env.json")


def _kill_at(step: int):
    def hook(state):
        if state.step == step:
            raise Killed(f"killed after step {state.step}")
    return hook


def _train_until_killed(cfg, data, out: Path, step: int) -> None:
    info = TokenInfo.read(data["info"])
    with pytest.raises(Killed):
        train(cfg, info, load_corpus(data["tokens"], info),
              checkpoint_dir(out / "model", cfg, info, 1, 1),
              threads=1, on_step=_kill_at(step), echo=lambda _: None)


def _move_run_to(model_dir: Path, cfg, data) -> None:
    """Put the finished run's checkpoints in the folder where run ``cfg`` will look for its own."""
    target = checkpoint_dir(model_dir, cfg, TokenInfo.read(data["info"]), 1, 1)
    run_ckpt_dir(model_dir).rename(target)


def test_other_runs_get_their_own_folder(data, tmp_path):
    _run(tiny_config(train={"max_steps": 3}), data, tmp_path)
    _run(tiny_config(train={"max_steps": 3}, seed=8), data, tmp_path)  # no refusal: a new run
    assert len(list((tmp_path / "model" / "checkpoints").glob("run-*"))) == 2


def _assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = load_file(a), load_file(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_resume_after_kill_gives_identical_weights(data, tmp_path):
    cfg = tiny_config()  # dropout on, grad accumulation on, checkpoint every 3 steps
    _run(cfg, data, tmp_path / "straight")
    # Killed after step 7: the last checkpoint is step 6, so step 7 is replayed on resume.
    _train_until_killed(cfg, data, tmp_path / "resumed", 7)
    assert ckpt.latest_checkpoint(run_ckpt_dir(tmp_path / "resumed" / "model")).name.endswith("6")
    _run(cfg, data, tmp_path / "resumed")
    _assert_same_weights(tmp_path / "straight" / "model/model.safetensors",
                         tmp_path / "resumed" / "model/model.safetensors")
    for name in ("step-00000012/model.safetensors", "step-00000012/optimizer.safetensors"):
        _assert_same_weights(run_ckpt_dir(tmp_path / "straight" / "model") / name,
                             run_ckpt_dir(tmp_path / "resumed" / "model") / name)
    for name in ("train.json", "log/seed-7.tsv", "model/model.json"):
        a, b = tmp_path / "straight" / name, tmp_path / "resumed" / name
        assert a.read_bytes() == b.read_bytes(), name
    env = json.loads((tmp_path / "resumed" / "env.json").read_text())
    assert env["resumed_from"] == "step-00000006" and env["steps_this_run"] == 6


DAMAGE = {  # what can be left of a checkpoint folder: file -> its damaged bytes (None: gone)
    "truncated model.safetensors": ("model.safetensors", lambda b: b[: len(b) // 2]),
    "truncated state.json": ("state.json", lambda b: b[: len(b) // 2]),
    "missing optimizer.safetensors": ("optimizer.safetensors", None),
}


def _damage(folder: Path, how: str) -> str:
    name, cut = DAMAGE[how]
    f = folder / name
    if cut is None:
        f.unlink()
    else:
        f.write_bytes(cut(f.read_bytes()))
    return name


def _assert_same_run(straight: Path, resumed: Path) -> None:
    _assert_same_weights(straight / "model/model.safetensors", resumed / "model/model.safetensors")
    for name in ("step-00000012/model.safetensors", "step-00000012/optimizer.safetensors"):
        _assert_same_weights(run_ckpt_dir(straight / "model") / name,
                             run_ckpt_dir(resumed / "model") / name)
    for name in ("train.json", "log/seed-7.tsv", "model/model.json"):
        assert (straight / name).read_bytes() == (resumed / name).read_bytes(), name


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_the_one_before(data, tmp_path, capsys, how):
    cfg = tiny_config()  # a checkpoint every 3 steps, the newest 2 kept
    _run(cfg, data, tmp_path / "straight")
    # Killed after step 10 (say, while the disk filled up): checkpoints 6 and 9, 9 damaged.
    _train_until_killed(cfg, data, tmp_path / "resumed", 10)
    cdir = run_ckpt_dir(tmp_path / "resumed" / "model")
    name = _damage(cdir / "step-00000009", how)
    with pytest.raises(ckpt.CheckpointUnreadable, match=name):
        ckpt.load_checkpoint(cdir / "step-00000009")
    capsys.readouterr()
    _run(cfg, data, tmp_path / "resumed")
    err = capsys.readouterr().err
    assert f"warning: checkpoint {cdir / 'step-00000009'} is unreadable" in err
    assert name in err  # says why
    env = json.loads((tmp_path / "resumed" / "env.json").read_text())
    assert env["resumed_from"] == "step-00000006" and env["steps_this_run"] == 6
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")
    # The damaged folder stays for inspection, out of the way of keep_last.
    assert (cdir / "unreadable-step-00000009" / "best.safetensors").exists()
    assert [p.name for p in ckpt.list_checkpoints(cdir)] == ["step-00000009", "step-00000012"]


def test_no_readable_checkpoint_starts_fresh(data, tmp_path, capsys):
    cfg = tiny_config()
    _run(cfg, data, tmp_path / "straight")
    _train_until_killed(cfg, data, tmp_path / "resumed", 4)  # only checkpoint 3 on disk
    cdir = run_ckpt_dir(tmp_path / "resumed" / "model")
    _damage(cdir / "step-00000003", "truncated model.safetensors")
    capsys.readouterr()
    _run(cfg, data, tmp_path / "resumed")
    err = capsys.readouterr().err
    assert f"checkpoint {cdir / 'step-00000003'} is unreadable" in err
    assert f"no readable checkpoint in {cdir}; starting fresh" in err
    env = json.loads((tmp_path / "resumed" / "env.json").read_text())
    assert env["resumed_from"] is None and env["steps_this_run"] == 12
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_rerun_of_finished_run_changes_nothing(data, tmp_path):
    cfg = tiny_config()
    first = _run(cfg, data, tmp_path)
    before = (tmp_path / "model" / "model.safetensors").read_bytes()
    second = _run(cfg, data, tmp_path)
    assert first == second
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == before


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


@pytest.mark.parametrize(("change", "expect"), [
    ("config", "optim.lr: 0.003 -> 0.001"),
    ("tokenizer", "tokenizer_hash differs"),
    ("split", "split_hash differs"),
], ids=str)
def test_mismatch_is_refused_with_reason(data, tmp_path, change, expect):
    cfg = tiny_config(train={"max_steps": 3})
    _run(cfg, data, tmp_path)
    new_data = dict(data)
    if change == "config":
        cfg = tiny_config(train={"max_steps": 3}, optim={"lr": 0.001, "min_lr": 0.0001})
    else:
        key = "tokenizer_hash" if change == "tokenizer" else "split_hash"
        new_data = write_token_data(tmp_path / "tokens2", n_pieces=30, mean_len=80,
                                    info_extra={key: "other"})
    # Another run's checkpoints where this one looks (copied by hand, say).
    _move_run_to(tmp_path / "model", cfg, new_data)
    with pytest.raises(ckpt.CheckpointMismatch) as err:
        _run(cfg, new_data, tmp_path)
    assert expect in str(err.value) and "--fresh" in str(err.value)


def test_a_change_to_the_training_code_starts_a_new_run(data, tmp_path, monkeypatch, capsys):
    """A run made by other training code is neither resumed nor taken as finished: the re-run
    gets its own folder and removes the old code's, which it could never resume; the old run's
    checkpoints put where it looks are refused. Another config's run keeps its folder."""
    import shutil

    from models import transformer

    cfg = tiny_config(train={"max_steps": 3})
    _run(tiny_config(train={"max_steps": 3}, seed=8), data, tmp_path)
    other = run_ckpt_dir(tmp_path / "model")
    _run(cfg, data, tmp_path)
    folders = tmp_path / "model" / "checkpoints"
    mine = next(r for r in folders.glob("run-*") if r != other)
    kept = tmp_path / "old-code-run"
    shutil.copytree(mine, kept)
    changed = tmp_path / "transformer.py"
    changed.write_bytes(Path(transformer.__file__).read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(transformer, "__file__", str(changed))
    capsys.readouterr()
    _run(cfg, data, tmp_path)
    runs = set(folders.glob("run-*"))
    assert other in runs and mine not in runs and len(runs) == 2
    assert f"removed {mine.name}" in capsys.readouterr().err
    new = (runs - {other}).pop()
    shutil.rmtree(new)
    shutil.move(kept, new)
    with pytest.raises(ckpt.CheckpointMismatch, match="code_digest differs"):
        _run(cfg, data, tmp_path)


def test_mismatch_restart_discards_old_run(data, tmp_path):
    _run(tiny_config(train={"max_steps": 3}), data, tmp_path)
    cfg = tiny_config(train={"max_steps": 3}, optim={"lr": 0.001, "min_lr": 0.0001},
                      checkpoint={"on_mismatch": "restart"})
    _run(cfg, data, tmp_path / "ref")
    _move_run_to(tmp_path / "model", cfg, data)
    _run(cfg, data, tmp_path)
    _assert_same_weights(tmp_path / "model" / "model.safetensors",
                         tmp_path / "ref" / "model" / "model.safetensors")

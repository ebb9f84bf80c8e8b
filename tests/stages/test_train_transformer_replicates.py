"""Training-seed replicates of ``train_transformer``: one run per seed, each its own model and
checkpoints; the first seed's outputs are those of a one-seed run; resume per seed; the replicate
folders and logs written whole."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

import pipeline.stages.train_transformer as stage
from pipeline.core.artifacts import atomic_dir
from pipeline.core.config import RuntimeConfig
from pipeline.tokens.contract import TokenInfo
from pipeline.training.config import result_config
from pipeline.training.resume import checkpoint_dir
from tests._transformer_data import tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)
# Two seeds (7 and 8), 6 steps each, a checkpoint every 3 steps.
FEW = {"replicates": 2, "train": {"max_steps": 6, "eval_every": 3},
       "checkpoint": {"every": 3}}


class Killed(RuntimeError):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=80)


def _run(cfg, data, out: Path) -> dict:
    return stage.run(cfg, RUNTIME, tokens=data["tokens"], info=data["info"], augmented=None,
                     out_dir=out / "model", summary=out / "train.json", log_dir=out / "log",
                     env=out / "env.json")


def _outputs(out: Path) -> dict[str, bytes]:
    """Every deterministic output file (not the checkpoints, not the sidecar) by relative path."""
    files = [out / "model" / "model.safetensors", out / "model" / "model.json",
             out / "train.json", *(out / "model" / "replicates").rglob("*"),
             *(out / "log").rglob("*")]
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(files) if p.is_file()}


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_two_seeds_each_get_a_model_a_log_and_a_summary(data, tmp_path, capsys):
    out = _run(tiny_config(**FEW), data, tmp_path / "a")
    err = capsys.readouterr().err
    assert "replicate 1/2 (seed 7)" in err and "replicate 2/2 (seed 8)" in err
    a = tmp_path / "a"
    reps = a / "model" / "replicates"
    assert sorted(p.name for p in reps.iterdir()) == ["index.json", "seed-7", "seed-8"]
    assert (reps / "index.json").read_text() == (
        '{\n  "folders": {\n    "7": "seed-7",\n    "8": "seed-8"\n  },\n'
        '  "seeds": [\n    7,\n    8\n  ]\n}\n')
    for name in ("model.safetensors", "model.json"):  # the first seed is the stage's model
        assert (reps / "seed-7" / name).read_bytes() == (a / "model" / name).read_bytes()
    assert sorted(p.name for p in (reps / "seed-8").iterdir()) == ["model.json",
                                                                   "model.safetensors"]
    w7, w8 = (load_file(reps / f"seed-{s}" / "model.safetensors") for s in (7, 8))
    assert sorted(w7) == sorted(w8) and not torch.equal(w7["wte.weight"], w8["wte.weight"])
    m7, m8 = _json(reps / "seed-7" / "model.json"), _json(reps / "seed-8" / "model.json")
    assert (m7["seed"], m8["seed"]) == (7, 8) and m7["config_hash"] != m8["config_hash"]

    # train.json: the first seed at the top level, every seed under replicates
    summary = _json(a / "train.json")
    assert summary == out and summary["seeds"] == [7, 8]
    assert summary["steps"] == 6 and summary["config_hash"] == m7["config_hash"]
    assert sorted(summary["replicates"]) == ["7", "8"]
    for seed, meta in (("7", m7), ("8", m8)):
        rep = summary["replicates"][seed]
        assert sorted(rep) == ["best_step", "best_val_loss", "config_hash", "epochs",
                               "final_train_loss", "steps", "stop_reason"]
        assert rep["steps"] == 6 and rep["stop_reason"] == "max_steps"
        assert rep["best_val_loss"] == meta["best_val_loss"] and rep["config_hash"] == meta[
            "config_hash"]
    first = {k: summary[k] for k in summary["replicates"]["7"]}
    assert first == summary["replicates"]["7"]
    vals = [summary["replicates"][s]["best_val_loss"] for s in ("7", "8")]
    spread = summary["best_val_loss_spread"]
    assert spread["mean"] == pytest.approx(sum(vals) / 2)
    assert spread["sd"] == pytest.approx(abs(vals[0] - vals[1]) / 2 ** 0.5)  # ddof = 1
    assert (spread["min"], spread["max"]) == (min(vals), max(vals))

    # one log per seed, today's columns, one row per step
    assert sorted(p.name for p in (a / "log").iterdir()) == ["seed-7.tsv", "seed-8.tsv"]
    for s in (7, 8):
        rows = (a / "log" / f"seed-{s}.tsv").read_text().splitlines()
        assert rows[0].split("\t") == ["step", "train_loss", "val_loss", "lr", "grad_norm"]
        assert len(rows) == 7
    assert (a / "log" / "seed-7.tsv").read_bytes() != (a / "log" / "seed-8.tsv").read_bytes()

    # the sidecar: the whole stage, and each seed
    env = _json(a / "env.json")
    assert sorted(env["replicates"]) == ["7", "8"]
    assert env["steps_this_run"] == 12 and env["reproducible"] is True
    assert env["seconds"] == pytest.approx(sum(r["seconds"] for r in env["replicates"].values()))
    assert env["tokens_this_run"] == sum(r["tokens_this_run"] for r in env["replicates"].values())
    assert env["replicates"]["8"]["resumed_from"] is None
    assert len(list((a / "model" / "checkpoints").glob("run-*"))) == 2

    # a second run from scratch writes the same bytes
    _run(tiny_config(**FEW), data, tmp_path / "b")
    assert _outputs(tmp_path / "a") == _outputs(tmp_path / "b")
    assert len(_outputs(tmp_path / "a")) == 3 + 5 + 2


def test_first_replicate_is_the_one_seed_run(data, tmp_path):
    """The number of replicates is not part of a run's identity: the first seed of a two-seed
    run is the one-seed run (same checkpoints folder, same bytes)."""
    info = TokenInfo.read(data["info"])
    cfgs = [tiny_config(replicates=n) for n in (1, 2, 3)]
    assert len({json.dumps(result_config(c, 1, 1), sort_keys=True) for c in cfgs}) == 1
    assert "replicates" not in result_config(cfgs[2], 1, 1)
    assert len({checkpoint_dir(Path("m"), c, info, 1, 1).name for c in cfgs}) == 1

    _run(tiny_config(**{**FEW, "replicates": 1}), data, tmp_path / "one")
    _run(tiny_config(**FEW), data, tmp_path / "two")
    one, two = _outputs(tmp_path / "one"), _outputs(tmp_path / "two")
    for name in ("model/model.safetensors", "model/model.json",
                 "model/replicates/seed-7/model.safetensors", "log/seed-7.tsv"):
        assert one[name] == two[name], name
    runs = {p.name for p in (tmp_path / "one" / "model" / "checkpoints").iterdir()}
    assert len(runs) == 1 and runs < {
        p.name for p in (tmp_path / "two" / "model" / "checkpoints").iterdir()}
    top = {k: v for k, v in _json(tmp_path / "two" / "train.json").items()
           if k not in ("seeds", "replicates", "best_val_loss_spread")}
    assert top == {k: v for k, v in _json(tmp_path / "one" / "train.json").items()
                   if k not in ("seeds", "replicates", "best_val_loss_spread")}


def test_kill_during_second_seed_resumes_that_seed(data, tmp_path, monkeypatch):
    cfg = tiny_config(**FEW)
    _run(cfg, data, tmp_path / "straight")

    real_train = stage.train

    def killed_in_seed_8(rcfg, *args, **kw):
        def hook(state):
            if state.step == 4:  # the last checkpoint is step 3: step 4 is replayed
                raise Killed("killed after step 4 of seed 8")
        if rcfg.seed == 8:
            kw["on_step"] = hook
        return real_train(rcfg, *args, **kw)

    monkeypatch.setattr(stage, "train", killed_in_seed_8)
    with pytest.raises(Killed):
        _run(cfg, data, tmp_path / "resumed")
    assert not (tmp_path / "resumed" / "model" / "model.safetensors").exists()
    monkeypatch.setattr(stage, "train", real_train)

    _run(cfg, data, tmp_path / "resumed")
    assert _outputs(tmp_path / "resumed") == _outputs(tmp_path / "straight")
    env = _json(tmp_path / "resumed" / "env.json")
    assert env["replicates"]["7"]["steps_this_run"] == 0  # found finished
    assert env["replicates"]["7"]["resumed_from"] == "step-00000006"
    assert env["replicates"]["8"]["steps_this_run"] == 3
    assert env["replicates"]["8"]["resumed_from"] == "step-00000003"
    assert env["resumed_from"] == "step-00000006" and env["steps_this_run"] == 3


def test_fewer_replicates_leave_no_stale_seed(data, tmp_path):
    _run(tiny_config(**FEW), data, tmp_path)
    out = _run(tiny_config(**{**FEW, "replicates": 1}), data, tmp_path)
    assert out["seeds"] == [7] and sorted(out["replicates"]) == ["7"]
    assert out["best_val_loss_spread"]["sd"] is None
    reps = tmp_path / "model" / "replicates"
    assert sorted(p.name for p in reps.iterdir()) == ["index.json", "seed-7"]
    assert _json(reps / "index.json") == {"seeds": [7], "folders": {"7": "seed-7"}}
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["seed-7.tsv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", "log", "model",
                                                          "train.json"]  # no temp folders
    env = _json(tmp_path / "env.json")
    assert sorted(env["replicates"]) == ["7"] and env["steps_this_run"] == 0


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_files_get_the_mode_a_plain_write_gets(tmp_path, umask):
    from pipeline.core import artifacts

    old = os.umask(umask)
    try:
        artifacts.write_text(tmp_path / "report.md", "x")
        (tmp_path / "plain.md").write_text("x")
    finally:
        os.umask(old)
    mode = (tmp_path / "report.md").stat().st_mode & 0o777
    assert mode == (tmp_path / "plain.md").stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_dir_replaces_whole_and_keeps_old_on_failure(tmp_path):
    target = tmp_path / "train_log"
    target.write_text("an older layout: a file where the folder goes")
    (tmp_path / ".train_log.0123abcd.tmp").mkdir()  # left by a killed write
    with atomic_dir(target) as tmp:
        (tmp / "seed-1.tsv").write_text("a")
        (tmp / "seed-2.tsv").write_text("b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_log"]
    with atomic_dir(target) as tmp:
        (tmp / "seed-1.tsv").write_text("c")
    assert sorted(p.name for p in target.iterdir()) == ["seed-1.tsv"]
    with pytest.raises(Killed), atomic_dir(target) as tmp:
        (tmp / "seed-9.tsv").write_text("d")
        raise Killed("killed while writing")
    assert [(p.name, p.read_text()) for p in target.iterdir()] == [("seed-1.tsv", "c")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_log"]


# ----------------------------------------------------------------------------- DDP (torchrun)
def _ddp_worker(rank: int, world: int, port: int, data: dict, out: str) -> None:
    # What torchrun sets; the stage joins the group itself (gloo on CPU).
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    cfg = tiny_config(**{**FEW, "train": {"max_steps": 3, "eval_every": 3, "micro_batch": 4,
                                          "grad_accum": 1}})
    res = stage.run(cfg, RUNTIME, tokens=Path(data["tokens"]), info=Path(data["info"]),
                    augmented=None, out_dir=Path(out) / "model", summary=Path(out) / "train.json",
                    log_dir=Path(out) / "log", env=Path(out) / "env.json")
    Path(out, f"rank{rank}.json").write_text(json.dumps(res, sort_keys=True))


def test_ddp_trains_every_seed_and_rank_0_writes(tmp_path):
    data = write_token_data(tmp_path / "tokens", n_pieces=30, mean_len=80)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp"
    mp.spawn(_ddp_worker, args=(2, port, {k: str(v) for k, v in data.items()}, str(out)),
             nprocs=2, join=True)
    assert (out / "rank0.json").read_text() == (out / "rank1.json").read_text()
    summary = _json(out / "train.json")
    assert summary["seeds"] == [7, 8] and summary["effective_batch"] == 8
    assert sorted(p.name for p in (out / "model" / "replicates").iterdir()) == [
        "index.json", "seed-7", "seed-8"]
    assert sorted(p.name for p in (out / "log").iterdir()) == ["seed-7.tsv", "seed-8.tsv"]
    assert _json(out / "env.json")["world_size"] == 2
    runs = sorted((out / "model" / "checkpoints").glob("run-*"))
    assert len(runs) == 2
    for run in runs:
        state = _json(run / "step-00000003" / "state.json")
        assert state["config"]["world_size"] == 2

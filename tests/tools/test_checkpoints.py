"""``symkit checkpoints push|pull`` through a DVC remote in a local folder: a run killed in clone
A after a pushed checkpoint resumes in clone B after a pull, to the weights of an uninterrupted
run; an upload cut short is never pulled; a failed push warns and returns."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from models.transformer import export_state
from pipeline.cli import main
from pipeline.tokens.contract import TokenInfo
from pipeline.tools.checkpoints import MARK, Store, pull, push, store_of
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.resume import checkpoint_dir
from tests._transformer_data import TINY_PARAMS, tiny_config, write_token_data

CFG = {"train": {"max_steps": 12, "eval_every": 4}, "checkpoint": {"every": 3, "keep_last": 2}}


class Killed(Exception):
    pass


def clone(root: Path, remote: Path) -> Path:
    """A git + DVC repository whose default remote is the folder ``remote``."""
    root.mkdir(parents=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    for argv in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                 [sys.executable, "-m", "dvc", "remote", "add", "-d", "store", str(remote)]):
        subprocess.run(argv, cwd=root, env=env, check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    paths = write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=20, mean_len=40)
    info = TokenInfo.read(paths["info"])
    return info, load_corpus(paths["tokens"], info)


def run(data, out: Path, kill_at: int | None = None):
    info, corpus = data
    cfg = tiny_config(**CFG)

    def on_step(state):
        if state.step == kill_at:
            raise Killed

    folder = checkpoint_dir(out, cfg, info, 1, 1)
    with contextlib.suppress(Killed):
        return train(cfg, info, corpus, folder, threads=1, echo=lambda _: None, on_step=on_step)


def test_a_run_killed_in_one_clone_resumes_in_another_to_the_same_weights(data, tmp_path):
    remote = tmp_path / "remote"
    a, b = clone(tmp_path / "a", remote), clone(tmp_path / "b", remote)
    out_a, out_b = a / "data" / "transformer", b / "data" / "transformer"
    assert run(data, out_a, kill_at=8) is None  # killed after the checkpoints at 3 and 6
    store = store_of(a, None)
    assert push(out_a, store, keep=2) == [f"{p.parent.name}/{p.name}" for p in
                                         sorted((out_a / "checkpoints").glob("run-*/step-*"))]
    assert push(out_a, store, keep=2) == []  # nothing new
    (run_name,) = store.runs()
    assert store.complete(run_name) == ["step-00000003", "step-00000006"]

    assert pull(out_b, store_of(b, None)) == [f"{run_name}/step-00000006"]
    assert pull(out_b, store_of(b, None)) == []  # the newest is here already
    resumed = run(data, out_b)
    assert resumed.resumed_from == "step-00000006" and resumed.state.step == 12
    whole = run(data, tmp_path / "c" / "data" / "transformer")
    for name, tensor in export_state(whole.model).items():
        assert torch.equal(tensor, export_state(resumed.model)[name]), name


def test_an_upload_cut_short_is_not_pulled_and_old_ones_are_pruned(data, tmp_path):
    remote = tmp_path / "remote"
    a, b = clone(tmp_path / "a", remote), clone(tmp_path / "b", remote)
    out_a = a / "data" / "transformer"
    run(data, out_a)  # 12 steps: checkpoints 9 and 12 kept
    store = store_of(a, None)
    push(out_a, store, keep=1)
    (run_name,) = store.runs()
    assert store.complete(run_name) == ["step-00000012"]  # 9 pruned to keep_last 1
    # a newer step whose upload stopped before its COMPLETE list
    half = Path(store.join(run_name, "step-00000015"))
    half.mkdir()
    (half / "state.json").write_text("{}")
    assert pull(b / "data" / "transformer", store_of(b, None)) == [f"{run_name}/step-00000012"]
    # a damaged file is refused, and nothing half-pulled stays
    sums = json.loads(Path(store.join(run_name, "step-00000012", MARK)).read_text())
    Path(store.join(run_name, "step-00000012", "state.json")).write_text("{}")
    (b / "data" / "transformer" / "checkpoints" / run_name / "step-00000012").rename(
        tmp_path / "moved")
    with pytest.raises(ValueError, match="does not match its sha256"):
        pull(b / "data" / "transformer", store_of(b, None))
    assert sorted(p.name for p in (b / "data" / "transformer" / "checkpoints" / run_name)
                  .iterdir()) == []
    assert "state.json" in sums


def test_a_failed_push_warns_and_returns(data, tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote folder should be")
    a = clone(tmp_path / "a", blocked / "remote")
    run(data, a / "data" / "transformer", kill_at=4)
    (a / "params.yaml").write_text(yaml.safe_dump({"transformer": TINY_PARAMS}))
    monkeypatch.chdir(a)
    assert main(["checkpoints", "push", "--watch", "0", "--rounds", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("warning: push failed") == 2 and "trying again next round" in err
    assert isinstance(store_of(a, None), Store)

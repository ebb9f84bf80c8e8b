"""pipeline.training.replay: a replayed step equals the logged one bit for bit, from the
initialisation and from a kept checkpoint, and names the pieces the step saw."""

from __future__ import annotations

import pytest

from pipeline.tokens.contract import TokenInfo
from pipeline.training.checkpoint import CheckpointMismatch, list_checkpoints
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.replay import example_labels, replay
from tests._transformer_data import tiny_config, write_token_data

CFG = {"train": {"max_steps": 12, "eval_every": 4}, "checkpoint": {"every": 3, "keep_last": 2}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    paths = write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=20, mean_len=40,
                             n_augmented=3)
    info = TokenInfo.read(paths["info"])
    corpus = load_corpus(paths["tokens"], info, paths["augmented"])
    cfg = tiny_config(**CFG)
    folder = tmp_path_factory.mktemp("ckpt")
    result = train(cfg, info, corpus, folder, threads=1, echo=lambda _: None)
    return cfg, info, corpus, folder, result.state.log, paths


@pytest.mark.parametrize("step", [1, 5, 11, 12])
def test_a_replayed_step_equals_the_logged_one(run, step):
    cfg, info, corpus, folder, log, paths = run
    assert [p.name for p in list_checkpoints(folder)] == ["step-00000009", "step-00000012"]
    got = replay(cfg, info, corpus, folder, step, threads=1,
                 labels=example_labels(paths["tokens"], info, paths["augmented"]))
    row = log[step - 1]
    assert (got.loss, got.grad_norm, got.lr) == (row["train_loss"], row["grad_norm"], row["lr"])
    assert got.started_from == (9 if step > 9 else 0)
    assert len(got.rows) == cfg.train.micro_batch * cfg.train.grad_accum
    assert got.rows["sha256"].notna().all()
    assert set(got.rows["transpose"]) <= {-1, 0, 1}


def test_labels_follow_the_corpus_order(run):
    _, info, corpus, _, _, paths = run
    labels = example_labels(paths["tokens"], info, paths["augmented"])
    assert len(labels) == len(corpus.train)
    assert (labels["transpose"] != 0).sum() == corpus.n_augmented == 6


def test_another_runs_checkpoints_are_refused(run):
    cfg, info, corpus, folder, _, _ = run
    other = tiny_config(**CFG, optim={"lr": 0.001})
    with pytest.raises(CheckpointMismatch, match="lr"):
        replay(other, info, corpus, folder, 11, threads=1)
    with pytest.raises(ValueError, match="count from 1"):
        replay(cfg, info, corpus, folder, 0, threads=1)

"""The training loop on a 2-layer, 16-dim model and a synthetic corpus, a few steps: what a run
reports, its determinism, the stop rules, the non-finite guard and the validation loss."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from models.transformer import export_state
from pipeline.conditions.assign import piece_conditions
from pipeline.tokens.contract import TokenInfo
from pipeline.training.data import Corpus, WindowStream, load_corpus, val_window_plan
from pipeline.training.device import DistInfo, TrainDevice, make_device
from pipeline.training.loop import (
    NonFiniteError,
    Pending,
    TrainState,
    _read_pending,
    _track_best,
    condition_identity,
    evaluate,
    train,
)
from pipeline.training.resume import fingerprint
from pipeline.training.setup import lr_factor
from tests._transformer_data import tiny_config, write_token_data

# Effective batch 2 × 2 = 4 windows of up to 17 tokens; a validation loss at steps 2 and 4.
SMALL = {"model": {"max_seq_len": 16, "n_embd": 16, "n_head": 2, "n_layer": 2},
         "train": {"max_steps": 4, "eval_every": 2, "micro_batch": 2, "grad_accum": 2},
         "checkpoint": {"every": 2}}
CPU = make_device("cpu", "fp32", DistInfo())


def _cfg(**overrides):
    merged = {k: {**SMALL.get(k, {}), **overrides.pop(k, {})} for k in SMALL}
    return tiny_config(**merged, **overrides)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[TokenInfo, Corpus]:
    paths = write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=20, mean_len=30)
    info = TokenInfo.read(paths["info"])
    return info, load_corpus(paths["tokens"], info)


def _train(cfg, data, folder: Path, **kw):
    info, corpus = data
    return train(cfg, info, corpus, folder, threads=1, echo=lambda _: None, **kw)


@pytest.fixture(scope="module")
def result(data, tmp_path_factory):
    return _train(_cfg(), data, tmp_path_factory.mktemp("run"))


def test_a_run_reports_its_steps_tokens_and_log(data, result):
    info, corpus = data
    cfg, s = _cfg(), result.state
    assert (s.step, s.stop_reason, result.steps_this_run, result.resumed_from) == (
        4, "max_steps", 4, None)
    assert result.reproducible and result.conditions is None
    stream = WindowStream(corpus.train, 16, cfg.seed)
    assert s.tokens == result.tokens_this_run == stream.n_targets(range(0, 16))
    assert result.examples == 16 and result.n_train_examples == len(corpus.train)
    assert result.n_val_windows == len(val_window_plan(corpus.val, 16, 64))
    assert result.padded_share == pytest.approx(1 - s.tokens / (4 * 4 * 16))
    assert [r["step"] for r in s.log] == [1, 2, 3, 4]
    assert all(math.isfinite(r["train_loss"]) and r["grad_norm"] > 0 for r in s.log)
    o = cfg.optim
    assert [r["lr"] for r in s.log] == pytest.approx(
        [o.lr * lr_factor(k, warmup=o.warmup_steps, max_steps=4, schedule=o.schedule,
                          min_ratio=o.min_lr / o.lr) for k in range(4)])
    vals = {r["step"]: r["val_loss"] for r in s.log if r["val_loss"] is not None}
    assert sorted(vals) == [2, 4]
    assert s.best_val == min(vals.values()) and vals[s.best_step] == s.best_val
    assert result.fingerprint == fingerprint(cfg, info, 1, 1)
    assert result.params["trainable"] == result.params["total"] > 0


def test_training_is_deterministic_and_leaves_the_callers_rng_alone(data, result, tmp_path):
    before = torch.get_rng_state()
    again = _train(_cfg(), data, tmp_path)
    assert torch.equal(torch.get_rng_state(), before)
    assert sorted(again.best) == sorted(result.best)
    assert all(torch.equal(again.best[k], result.best[k]) for k in result.best)
    assert [r["train_loss"] for r in again.state.log] == [r["train_loss"]
                                                          for r in result.state.log]


def test_max_tokens_stops_at_the_first_step_that_reaches_it(data, result, tmp_path):
    first = result.state.log[0]
    per_step = WindowStream(data[1].train, 16, _cfg().seed).n_targets(range(0, 4))
    out = _train(_cfg(train={"max_tokens": per_step + 1}), data, tmp_path)
    assert out.state.stop_reason == "max_tokens" and out.state.step == 2
    assert out.state.tokens >= per_step + 1 > per_step
    assert out.state.log[0]["train_loss"] == first["train_loss"]
    assert out.state.log[-1]["val_loss"] is not None  # a length stop evaluates the last step


def test_patience_counts_evaluations_without_improvement():
    state = TrainState(step=1)
    assert _track_best(state, 3.0, patience=2) and state.best_val == 3.0
    state.step = 2
    assert not _track_best(state, 3.5, patience=2) and state.stop_reason is None
    state.step = 3
    assert _track_best(state, 2.0, patience=2)  # an improvement resets the count
    assert (state.best_step, state.evals_since_best) == (3, 0)
    for step in (4, 5):
        state.step = step
        assert not _track_best(state, 2.0, patience=2)  # equal is no improvement
    assert state.stop_reason == "early_stopping" and state.best_step == 3
    assert not _track_best(TrainState(), None, patience=1)  # no validation: nothing recorded
    never = TrainState()
    for _ in range(5):
        _track_best(never, 1.0, patience=0)
    assert never.stop_reason is None  # patience 0: never stops early


def _pending(*values: tuple[float, float], n: int = 4) -> Pending:
    p = Pending()
    for k, v in enumerate(values, start=1):
        p.rows.append({"step": k, "train_loss": None, "grad_norm": None})
        p.values.append(torch.tensor(v))
        p.n_targets.append(n)
    return p


def test_pending_steps_are_read_together_and_a_non_finite_one_stops_training():
    p = _pending((8.0, 1.5), (6.0, 0.5))
    rows = list(p.rows)
    _read_pending(p, CPU, None)
    assert [(r["train_loss"], r["grad_norm"]) for r in rows] == [(2.0, 1.5), (1.5, 0.5)]
    assert p.rows == p.values == p.n_targets == []
    with pytest.raises(NonFiniteError, match=r"non-finite value at step 2: train loss nan.*"
                                             r"last good checkpoint: ck/step-00000001"):
        _read_pending(_pending((8.0, 1.0), (math.nan, 1.0), (4.0, 1.0)), CPU,
                      Path("ck/step-00000001"))
    with pytest.raises(NonFiniteError, match=r"grad norm inf.*no checkpoint written yet"):
        _read_pending(_pending((8.0, math.inf)), CPU, None)
    # fp16: the grad scaler skips overflowing updates, so only the loss counts
    fp16 = TrainDevice("cpu", torch.float16, True, "fp16", DistInfo())
    _read_pending(_pending((8.0, math.inf)), fp16, None)


def test_evaluate_is_the_token_weighted_mean_nll(result):
    model = result.model
    rng = np.random.default_rng(0)
    windows = [np.concatenate([[1], rng.integers(3, 64, n)]) for n in (16, 3, 9, 1)]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for w in windows:
            x, y = torch.as_tensor(w[None, :-1]), torch.as_tensor(w[None, 1:])
            total += F.cross_entropy(model(x)[0][0], y[0], reduction="sum").item()
            count += len(w) - 1
    model.train()
    one = evaluate(model, windows, 16, 0, CPU, batch_size=1)
    assert one == pytest.approx(total / count, rel=1e-5)
    assert evaluate(model, windows, 16, 0, CPU, batch_size=8) == pytest.approx(one, rel=1e-5)
    assert model.training  # the mode it had
    assert evaluate(model, [], 16, 0, CPU, batch_size=4) is None


def test_condition_identity_names_what_the_run_was_conditioned_on():
    assert condition_identity(Corpus(train=[], val=[]), 0.1) is None
    table = pd.DataFrame({"sha256": ["a", "b"], "split": ["train", "train"],
                          "mode": ["major", "minor"]})
    pc = piece_conditions(table, ["mode"])
    ident = condition_identity(Corpus(train=[], val=[], conditions=pc), 0.25)
    assert ident == {"names": ["mode"], "vocab_hash": pc.vocab.hash,
                     "ids_sha256": pc.digest(), "dropout": 0.25}


def test_without_validation_the_last_weights_are_kept(data, tmp_path):
    info, corpus = data
    seen = []
    out = train(_cfg(train={"max_steps": 3}), info, Corpus(train=corpus.train, val=[]),
                tmp_path, threads=1, echo=lambda _: None, on_step=lambda st: seen.append(st.step))
    assert seen == [1, 2, 3]  # after every step
    assert out.state.best_val is None and out.state.best_step == 3 and out.n_val_windows == 0
    assert all(r["val_loss"] is None for r in out.state.log)
    final = export_state(out.model)
    assert all(torch.equal(out.best[k], final[k]) for k in final)

"""Where a run continues from: its identity (config, data, conditions, training code), the newest
usable checkpoint, damaged and mismatched checkpoints, and an exact resume after a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from pipeline.conditions.assign import piece_conditions
from pipeline.core.artifacts import code_digest, sha256_file, sha256_json
from pipeline.core.config import RuntimeConfig
from pipeline.stages.train_transformer import run
from pipeline.tokens.contract import TokenInfo
from pipeline.training import checkpoint as ckpt
from pipeline.training.config import result_config
from pipeline.training.data import Corpus, load_corpus
from pipeline.training.loop import train
from pipeline.training.resume import (
    TRAIN_CODE,
    checkpoint_dir,
    find_resume,
    fingerprint,
    remove_superseded,
)
from tests._transformer_data import BOS, EOS, PAD, run_ckpt_dir, tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)
INFO = TokenInfo(vocab_size=12, pad_id=PAD, bos_id=BOS, eos_id=EOS, tokenizer_hash="t",
                 split_hash="s")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=30, mean_len=80)


def _run(cfg, data, out: Path) -> dict:
    return run(cfg, RUNTIME, tokens=data["tokens"], info=data["info"], augmented=None,
               out_dir=out / "model", summary=out / "train.json", log_dir=out / "log",
               env=out / "env.json")


# ---------------------------------------------------------------------------------- identity
def test_fingerprint_is_the_result_config_the_data_and_the_code():
    cfg = tiny_config()
    fp = fingerprint(cfg, INFO, 2, 1)
    assert sorted(fp) == ["code_digest", "config", "config_hash", "split_hash", "tokenizer_hash"]
    assert fp["config"] == {**result_config(cfg, 2, 1), "vocab_size": 12}
    assert fp["config_hash"] == sha256_json(fp["config"])
    assert (fp["tokenizer_hash"], fp["split_hash"]) == ("t", "s")
    assert fp["code_digest"] == code_digest(TRAIN_CODE)
    assert "condition" not in fp["config"] and "init_sha256" not in fp["config"]
    # what cannot change the weights leaves the identity alone; what can, changes it
    quiet = tiny_config(compile=True, replicates=3, train={"log_every": 1, "max_minutes": 5.0},
                        checkpoint={"every": 1, "keep_last": 9})
    assert fingerprint(quiet, INFO, 2, 1) == fp
    for other in (fingerprint(tiny_config(optim={"lr": 0.002}), INFO, 2, 1),
                  fingerprint(cfg, INFO, 1, 1), fingerprint(cfg, INFO, 2, 2)):
        assert other["config_hash"] != fp["config_hash"]


def test_the_model_to_fine_tune_enters_the_identity_by_its_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights one")
    cfg = tiny_config(finetune={"init_from": str(tmp_path)})
    fp = fingerprint(cfg, INFO, 1, 1)
    assert fp["config"]["init_sha256"] == sha256_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"weights two")
    assert fingerprint(cfg, INFO, 1, 1)["config_hash"] != fp["config_hash"]


def test_checkpoint_dir_is_named_by_the_run_identity(tmp_path):
    cfg = tiny_config()
    folder = checkpoint_dir(tmp_path, cfg, INFO, 1, 1)
    run_id = sha256_json(fingerprint(cfg, INFO, 1, 1))
    assert folder == tmp_path / "checkpoints" / f"run-{run_id[:16]}"
    assert checkpoint_dir(tmp_path, cfg, INFO, 1, 1) == folder  # a pure function
    assert checkpoint_dir(tmp_path, tiny_config(seed=8), INFO, 1, 1) != folder


def test_find_resume_without_checkpoints_starts_fresh(tmp_path):
    said = []
    for folder in (tmp_path / "absent", tmp_path):
        resume = find_resume(folder, fingerprint(tiny_config(), INFO, 1, 1), "refuse", said.append)
        assert resume.checkpoint is None and resume.resumed_from is None
        assert not resume.discard_old and resume.unreadable == ()
    assert said == []


def _fake_run(folder: Path, **state) -> None:
    """A run folder whose newest checkpoint holds ``state`` (read_state reads nothing else)."""
    (folder / "step-00000003").mkdir(parents=True)
    (folder / "step-00000003" / "state.json").write_text(json.dumps(state))


def test_remove_superseded_deletes_this_runs_folders_of_other_code_only(tmp_path):
    fp = fingerprint(tiny_config(), INFO, 1, 1)
    same = {k: fp[k] for k in ("config_hash", "tokenizer_hash", "split_hash")}
    root = tmp_path / "checkpoints"
    _fake_run(root / "run-oldcode", **same, code_digest="older code")
    _fake_run(root / "run-othercfg", **{**same, "config_hash": "x"}, code_digest="older code")
    _fake_run(root / "run-samecode", **same, code_digest=fp["code_digest"])
    (root / "run-broken" / "step-00000001").mkdir(parents=True)
    (root / "run-broken" / "step-00000001" / "state.json").write_text("{trunc")
    said = []
    remove_superseded(root / "run-mine", fp, said.append)
    assert sorted(p.name for p in root.iterdir()) == ["run-broken", "run-othercfg",
                                                      "run-samecode"]
    assert said == ["removed run-oldcode: this run's checkpoints made by other training code"]


# ------------------------------------------------------------------ resuming a trained run
class Killed(RuntimeError):
    pass


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


def test_a_run_resumes_with_activation_checkpointing_toggled(data, tmp_path):
    """Checkpointing changes no bit of a CPU run (models/transformer.py), so it stays out of the
    run identity: a run killed with it on resumes with it off, e.g. after the reverse, an
    out-of-memory stop, and ends exactly where a run without it ends; packed rows alike."""
    for pack in (False, True):
        cfg = tiny_config(data={"pack": pack})
        straight, resumed = tmp_path / f"straight-{pack}", tmp_path / f"resumed-{pack}"
        _run(cfg, data, straight)
        _train_until_killed(cfg.model_copy(update={"activation_checkpointing": True}), data,
                            resumed, 7)
        _run(cfg, data, resumed)
        assert json.loads((resumed / "env.json").read_text())["resumed_from"] == "step-00000006"
        _assert_same_run(straight, resumed)


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


def test_conditions_enter_the_run_identity():
    from pipeline.training.loop import condition_identity

    table = pd.DataFrame({"sha256": ["a", "b"], "split": ["train", "train"],
                          "mode": ["major", "minor"]})
    pc = piece_conditions(table, ["mode"])
    cfg = tiny_config()
    corpus = Corpus(train=[], val=[], conditions=pc)
    plain = checkpoint_dir(tmp := Path("m"), cfg, INFO, 1, 1)
    assert plain == checkpoint_dir(tmp, cfg, INFO, 1, 1, None)
    ident = condition_identity(corpus, 0.1)
    with_cond = checkpoint_dir(tmp, cfg, INFO, 1, 1, ident)
    assert with_cond != plain
    assert checkpoint_dir(tmp, cfg, INFO, 1, 1, condition_identity(corpus, 0.2)) != with_cond
    swapped = piece_conditions(table.assign(mode=["minor", "major"]), ["mode"])
    assert checkpoint_dir(tmp, cfg, INFO, 1, 1, condition_identity(
        Corpus(train=[], val=[], conditions=swapped), 0.1)) != with_cond


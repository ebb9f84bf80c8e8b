"""``symkit diagnose``: the committed c91013e logs through the command, a run's checkpoints in
place of its logs, the JSON it writes and its exit status."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli import main
from pipeline.core import artifacts
from pipeline.tokens.contract import TokenInfo
from pipeline.tools.diagnose import logs_from_checkpoints
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from tests._transformer_data import tiny_config, write_token_data

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "train_log_c91013e"


def test_the_command_names_seed_1236s_noisy_early_stop(tmp_path, capsys):
    out = tmp_path / "diagnosis.json"
    rc = main(["diagnose", "--logs", str(FIXTURE), "--train-report", str(FIXTURE / "train.json"),
               "--params", str(FIXTURE / "params.yaml"), "--json", str(out)])
    said = capsys.readouterr().out
    assert rc == 1
    assert "seed 1236: 1000 steps, 1 flag" in said
    assert "step 1000: early_stop_in_noise: stopped at step 1000 of 2000" in said
    assert "on 64 validation windows, patience 3" in said
    assert "transformer.data.val_max_windows: 0" in said
    seeds = artifacts.read_json(out)["seeds"]
    assert [f["kind"] for f in seeds["1236"]] == ["early_stop_in_noise"]
    assert set(seeds) == {"1234", "1235", "1236"}


def test_a_run_without_logs_is_read_from_its_checkpoints(tmp_path, capsys):
    paths = write_token_data(tmp_path / "tokens", n_pieces=20, mean_len=40)
    info = TokenInfo.read(paths["info"])
    cfg = tiny_config(train={"max_steps": 40, "eval_every": 10},
                      checkpoint={"every": 20, "keep_last": 2})
    ckpts = tmp_path / "checkpoints"
    train(cfg, info, load_corpus(paths["tokens"], info), ckpts / "run-a", threads=1,
          echo=lambda _: None)
    (seed, (log, facts)), = logs_from_checkpoints(ckpts).items()
    assert seed == str(cfg.seed) and len(log) == 40 and facts.max_steps == 40
    rc = main(["diagnose", "--checkpoints", str(ckpts)])
    said = capsys.readouterr().out
    assert f"seed {cfg.seed}: 40 steps" in said and rc in (0, 1)
    assert main(["diagnose", "--logs", str(tmp_path / "none")]) == 2
    assert "no training log" in capsys.readouterr().err

"""``symkit replay --step N``: the command finds the seed's run folder, recomputes the step and
says whether it equals the log to the log's precision; bad arguments are refused by name."""

from __future__ import annotations

import yaml

from pipeline.cli import main
from pipeline.core import artifacts
from pipeline.tokens.contract import TokenInfo
from pipeline.tools.replay import logged
from pipeline.training.data import load_corpus
from pipeline.training.loop import train
from pipeline.training.resume import checkpoint_dir
from tests._transformer_data import TINY_PARAMS, tiny_config, write_token_data


def test_the_command_replays_a_logged_step(tmp_path, capsys):
    paths = write_token_data(tmp_path / "tokens", n_pieces=20, mean_len=40)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"transformer": TINY_PARAMS,
                                      "runtime": {"torch_threads": 1}}))
    info = TokenInfo.read(paths["info"])
    cfg = tiny_config().replicate(TINY_PARAMS["seed"])
    out = tmp_path / "transformer"
    state = train(cfg, info, load_corpus(paths["tokens"], info),
                  checkpoint_dir(out, cfg, info, 1, 1), threads=1, echo=lambda _: None).state
    logs = tmp_path / "logs"
    rows = ["step\ttrain_loss\tgrad_norm"] + [
        f"{r['step']}\t{r['train_loss']:.6g}\t{r['grad_norm']:.6g}" for r in state.log]
    artifacts.write_text(logs / f"seed-{cfg.seed}.tsv", "\n".join(rows) + "\n")
    assert logged(logs, cfg.seed, 7)["train_loss"] == f"{state.log[6]['train_loss']:.6g}"
    assert logged(logs, cfg.seed, 999) is None
    args = ["replay", "--params", str(params), "--tokens", str(paths["tokens"]), "--info",
            str(paths["info"]), "--out", str(out), "--logs", str(logs)]
    assert main([*args, "--step", "7"]) == 0
    said = capsys.readouterr().out
    assert f"seed {cfg.seed}, step 7" in said and "equal to the log's precision" in said
    assert said.count("\n  ") == cfg.train.micro_batch * cfg.train.grad_accum  # its windows
    assert main([*args, "--step", "7", "--seed", "99"]) == 2
    assert "--seed 99 was not trained" in capsys.readouterr().err

"""``symkit lr-find``: it prints the suggestion beside the configured learning rate and writes
the figure and the numbers; without tokens it says what to run."""

from __future__ import annotations

import yaml

from pipeline.cli import main
from pipeline.core import artifacts
from pipeline.tools.lr_find import add_arguments
from tests._transformer_data import TINY_PARAMS, write_token_data


def test_the_command_suggests_a_learning_rate_and_writes_its_curve(tmp_path, capsys):
    paths = write_token_data(tmp_path / "tokens", n_pieces=20, mean_len=40)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"transformer": TINY_PARAMS}))
    figure, out = tmp_path / "lr.png", tmp_path / "lr.json"
    rc = main(["lr-find", "--params", str(params), "--tokens", str(paths["tokens"]),
               "--info", str(paths["info"]), "--start", "1e-4", "--end", "10", "--steps", "60",
               "--figure", str(figure), "--json", str(out)])
    said = capsys.readouterr().out
    assert rc == 0
    assert "suggested transformer.optim.lr" in said and "configured 0.003" in said
    got = artifacts.read_json(out)
    assert got["configured"] == 0.003 and len(got["lrs"]) == len(got["losses"])
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["lr-find", "--params", str(params), "--tokens", str(tmp_path / "none"),
                 "--info", str(paths["info"])]) == 2
    assert "dvc repro tokenize" in capsys.readouterr().err


def test_the_range_defaults_are_the_rules():
    import argparse

    from pipeline.training import lr_find

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    got = parser.parse_args([])
    assert (got.start, got.end, got.steps) == (lr_find.START, lr_find.END, lr_find.STEPS)

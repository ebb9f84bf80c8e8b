"""``symkit estimate`` (pipeline.tools.estimate): what it reads (the ``transformer`` section, the
vocabulary size from info.json) and prints, as a table or as JSON. The estimator's figures are
tested in tests/training/test_estimate.py."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from pipeline.cli import main as cli_main
from pipeline.tokens.contract import TokenInfo
from pipeline.tools import estimate as command
from pipeline.training.config import TransformerStageConfig
from pipeline.training.estimate import estimate

SECTION = ("transformer:\n  device: {device}\n  precision: {precision}\n"
           "  model: {{n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 64}}\n"
           "  train: {{micro_batch: 3}}\n"
           "  finetune: {{lora_rank: 2, lora_targets: [attn.qkv], init_from: pre}}\n")


def _json(tmp_path, monkeypatch, capsys, *args, device="auto", precision="auto") -> dict:
    """The command's JSON, its arguments parsed as the CLI parses them."""
    (tmp_path / "params.yaml").write_text(SECTION.format(device=device, precision=precision))
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    command.add_arguments(parser)
    assert command.main(parser.parse_args(["--json", *args])) == 0
    return json.loads(capsys.readouterr().out)


def _library(vocab: int, **kw) -> dict:
    cfg = TransformerStageConfig.model_validate({
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "max_seq_len": 64}})
    m = cfg.model
    args = {"vocab_size": vocab, "seq_len": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "mlp_ratio": m.mlp_ratio, "bias": m.bias, "micro_batch": 3, "precision": "fp32",
            "dropout": m.dropout, "attn_dropout": m.attn_dropout, "attention": "auto",
            "device": "cpu", "freeze": [], "lora_rank": 2, "lora_targets": ["attn.qkv"],
            "threads": 2}  # runtime.torch_threads' default, which a params file without it gets
    return asdict(estimate(**{**args, **kw}))


def test_json_is_the_estimators_figures_for_the_section(tmp_path, monkeypatch, capsys):
    got = _json(tmp_path, monkeypatch, capsys)
    assert got == _library(512)  # no info.json: a vocabulary of 512, auto precision as fp32
    assert got["params_trainable"] < got["params"]  # the section's LoRA adapters only


def test_the_vocabulary_comes_from_info_json_unless_given(tmp_path, monkeypatch, capsys):
    TokenInfo(vocab_size=700, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t",
              split_hash="s").write(tmp_path / "data" / "tokens" / "info.json")
    assert _json(tmp_path, monkeypatch, capsys) == _library(700)
    assert _json(tmp_path, monkeypatch, capsys, "--vocab-size", "300") == _library(300)


@pytest.mark.parametrize(("device", "precision", "args", "want"), [
    ("cuda", "bf16", [], {"device": "cuda", "precision": "bf16"}),
    ("mps", "auto", [], {"device": "cpu", "precision": "fp32"}),
    ("cuda", "fp16", ["--device", "cpu", "--precision", "fp32", "--seq-len", "32",
                      "--micro-batch", "5", "--attention", "math"],
     {"device": "cpu", "precision": "fp32", "seq_len": 32, "micro_batch": 5,
      "attention": "math"}),
])
def test_the_section_s_device_and_precision_unless_overridden(tmp_path, monkeypatch, capsys,
                                                              device, precision, args, want):
    got = _json(tmp_path, monkeypatch, capsys, *args, device=device, precision=precision)
    assert got == _library(512, **want)


def test_the_table_lists_every_memory_term(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text(SECTION.format(device="cpu", precision="fp32"))
    monkeypatch.chdir(tmp_path)
    assert cli_main(["estimate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    est = _library(512)
    assert lines[0] == "vocab 512, seq_len 64, micro-batch 3, precision fp32"
    assert lines[1] == (f"parameters           {est['params']:,} (matmul "
                        f"{est['params_matmul']:,}, trainable {est['params_trainable']:,})")
    assert [line.split()[0] for line in lines[2:10]] == [
        "weights", "best", "grads", "optimizer", "activations", "backward", "threads", "total"]
    assert lines[9] == f"total memory         {est['total_bytes'] / 2**20:,.1f} MiB"
    assert lines[10] == f"FLOPs/token forward  {est['flops_per_token_forward']:,.0f}"


def test_the_threads_come_from_runtime_unless_given(tmp_path, monkeypatch, capsys):
    """runtime.torch_threads above one counts the parallel kernels' scratch; one does not."""
    (tmp_path / "params.yaml").write_text(SECTION.format(device="cpu", precision="fp32")
                                          + "runtime:\n  torch_threads: 1\n")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["estimate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == _library(512, threads=1)
    assert cli_main(["estimate", "--json", "--threads", "4"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == _library(512, threads=4) and got["threads_bytes"] > 0


def test_the_section_s_activation_checkpointing_is_counted(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text(SECTION.format(device="cpu", precision="fp32")
                                          + "  activation_checkpointing: true\n")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["estimate", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == _library(512, activation_checkpointing=True) != _library(512)
    assert cli_main(["estimate"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", activation checkpointing")


def test_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("transformer: {}\n")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["estimate", "--vocab-size", "300", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "parameters           864,512" in out and "precision bf16" in out


def test_compound_tokens_are_refused(compound_tokens, tmp_path, monkeypatch):
    from pipeline.core.config import ParamsError

    with pytest.raises(ParamsError, match=r"tokenize\.tokenizer: CPWord — symkit estimate reads"):
        _json(tmp_path, monkeypatch, None, "--info", str(compound_tokens["info"]))

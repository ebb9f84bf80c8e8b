"""``symkit adapt-train`` (pipeline.stages.adapt_train): one arm of an adaptation experiment
trained over its seeds, its summary with the estimator's memory figure, and its timing sidecar.

A scratch arm on synthetic tokens (no pretrained model needed); the trained arms, their weights
and the whole experiment are tested in tests/adaptation/."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pipeline.adaptation.config import AdaptationConfig, arm_config
from pipeline.cli import main as cli
from pipeline.core.artifacts import read_json
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.stages import adapt_train
from pipeline.tokens.contract import TokenInfo
from pipeline.training.estimate import estimate
from tests._transformer_data import tiny_config, write_token_data

RUNTIME = RuntimeConfig(torch_threads=1)
ARMS = {"scratch": {"kind": "scratch"}, "lora": {"kind": "lora", "lora_rank": 2},
        "partial": {"kind": "partial", "freeze": ["wte", "wpe"]}}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_token_data(tmp_path_factory.mktemp("target"), n_pieces=20, mean_len=60,
                            seed=1, name="tgt")


def _cfg(**over) -> AdaptationConfig:
    return parse_section("adaptation", {"pretrained": "pre", "seed": 5, "seeds": 3, "steps": 2,
                                        "arms": ARMS, **over}, AdaptationConfig)


def _run(data, root, arm="scratch", **kw):
    return adapt_train.run(_cfg(), tiny_config(), RUNTIME, arm, tokens=data["tokens"],
                           info=data["info"], out_dir=root / "arm", summary=root / "arm.json",
                           log_dir=root / "log", env=root / "sidecars" / "arm.env.json", **kw)


@pytest.mark.parametrize("arm", ["scratch", "lora", "partial"])
def test_the_memory_estimate_is_the_estimators_for_the_arm_on_cpu_in_fp32(data, arm):
    info = TokenInfo.read(data["info"])
    acfg = arm_config(tiny_config(), _cfg(), arm)
    got = adapt_train.memory_estimate(acfg, info, train_tokens=1000)
    m, ft = acfg.model, acfg.finetune
    want = estimate(vocab_size=info.vocab_size, seq_len=m.max_seq_len, n_layer=m.n_layer,
                    n_head=m.n_head, n_embd=m.n_embd, micro_batch=acfg.train.micro_batch,
                    mlp_ratio=m.mlp_ratio, bias=m.bias, dropout=m.dropout,
                    attn_dropout=m.attn_dropout, freeze=ft.freeze, lora_rank=ft.lora_rank,
                    lora_targets=ft.lora_targets, precision="fp32", device="cpu",
                    train_tokens=1000)
    assert got == {k: asdict(want)[k] for k in ("total_bytes", "params", "params_trainable",
                                                "optimizer_bytes", "grads_bytes",
                                                "activations_bytes")}
    trainable = got["params_trainable"] < got["params"]
    assert trainable is (arm != "scratch")  # lora and partial train part of the model


def test_a_scratch_arm_trains_every_seed_and_records_its_run(data, tmp_path):
    out = _run(data, tmp_path)
    assert read_json(tmp_path / "arm.json") == out
    assert (out["arm"], out["kind"], out["trained"], out["init_from"]) == (
        "scratch", "scratch", True, None)
    assert out["seeds"] == [5, 6, 7] and out["steps"] == 2 and out["lora_rank"] == 0
    assert out["tokens_per_step"] == 4 * 2 * 32  # micro_batch x grad_accum x max_seq_len
    assert out["estimate"]["params_trainable"] == out["params"]["trainable"]
    assert out["model"] == (tmp_path / "arm").as_posix()
    assert sorted(p.name for p in (tmp_path / "arm" / "replicates").iterdir()) == [
        "index.json", "seed-5", "seed-6", "seed-7"]
    env = read_json(tmp_path / "sidecars" / "arm.env.json")
    peaks = env["peak_rss_delta_bytes"]
    assert sorted(peaks) == ["5", "6", "7"] and env["peak_rss_cold_bytes"] == peaks["5"]
    assert env["peak_rss_warm_bytes"] == max(peaks["6"], peaks["7"])
    assert env["stage_seconds"] > 0


def test_fresh_starts_over_without_the_old_checkpoints(data, tmp_path):
    stale = tmp_path / "arm" / "checkpoints" / "run-stale" / "junk"
    stale.parent.mkdir(parents=True)
    stale.write_text("from another run")
    _run(data, tmp_path, fresh=True)
    assert not stale.parent.exists()


def test_one_process_only(data, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ParamsError, match="adapt-train runs in one process; run it without "
                                          "torchrun"):
        _run(data, tmp_path)
    assert not (tmp_path / "arm").exists()


def test_the_cli_reports_a_missing_token_table_in_one_line(data, tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text(
        "adaptation:\n  pretrained: pre\n  steps: 2\n  arms:\n    scratch: {kind: scratch}\n",
        encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert cli(["adapt-train", "scratch", "--info", str(data["info"]),
                "--tokens", "missing.parquet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.parquet" in err[0]
    assert not (tmp_path / "reports").exists()


def test_compound_tokens_are_refused_before_anything_is_read(compound_tokens, tmp_path):
    with pytest.raises(ParamsError,
                       match=r"tokenize\.tokenizer: CPWord — symkit adapt-train reads"):
        _run(compound_tokens, tmp_path)
    assert not (tmp_path / "arm").exists()

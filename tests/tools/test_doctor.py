"""symkit doctor: each check passes on healthy inputs and fails on the bug it is meant to find."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import models.transformer as mt
from pipeline.cli import main as cli_main
from pipeline.core.artifacts import write_json, write_parquet
from pipeline.tokens.contract import TokenInfo, tokens_table
from pipeline.tools import doctor
from pipeline.training.data import make_batch
from pipeline.training.synthetic import write_token_data
from tests._transformer_data import tiny_config

CFG = tiny_config()


def _by_name(results) -> dict[str, doctor.CheckResult]:
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_token_data(tmp_path_factory.mktemp("tokens"), n_pieces=20, mean_len=60)


def test_healthy_data_passes_and_missing_tokenizer_is_skipped(data, tmp_path):
    res = _by_name(doctor.run_checks(CFG, tokens=data["tokens"], info=data["info"],
                                     tokenizer=tmp_path / "none.json"))
    assert res["decode"].status == "SKIP" and "not found" in res["decode"].detail
    for name in ("token_ids", "data_order", "init_loss", "padding", "causal", "overfit"):
        assert res[name].status == "PASS", res[name]


def test_without_token_data_model_checks_run_on_synthetic_pieces(tmp_path):
    res = _by_name(doctor.run_checks(CFG, tokens=tmp_path / "x.parquet", info=tmp_path / "i.json",
                                     tokenizer=tmp_path / "t.json"))
    assert res["data"].status == "SKIP"
    assert all(res[n].status == "PASS" for n in ("data_order", "init_loss", "padding", "overfit"))


def test_out_of_range_ids_fail_token_check():
    info = TokenInfo(vocab_size=10, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="",
                     split_hash="")
    assert doctor.check_token_ids([np.array([3, 4, 5])], info).status == "PASS"
    assert doctor.check_token_ids([np.array([3, 12])], info).failed
    assert doctor.check_token_ids([np.array([3, 2, 5])], info).failed


def _arch_and_batch():
    arch = mt.TransformerConfig(vocab_size=64, max_seq_len=32, n_layer=2, n_head=2, n_embd=32)
    rng = np.random.default_rng(0)
    batch = make_batch([np.concatenate([[1], rng.integers(3, 64, 40)])[:33],
                        np.concatenate([[1], rng.integers(3, 64, 10), [2]])], 32, 0)
    return arch, batch


def test_padding_leak_is_caught(monkeypatch):
    arch, batch = _arch_and_batch()
    assert doctor.check_padding(arch, batch, 0, seed=0).status == "PASS"
    # A bug: the loss forgets the mask, so padded positions (as target 0) count.
    real = mt.masked_cross_entropy
    monkeypatch.setattr(mt, "masked_cross_entropy",
                        lambda logits, targets, mask=None, reduction="mean": real(
                            logits, targets.clamp(min=0), None, reduction))
    assert doctor.check_padding(arch, batch, 0, seed=0).failed


def test_future_leak_is_caught(monkeypatch):
    arch, batch = _arch_and_batch()
    assert doctor.check_causal(arch, batch, seed=0).status == "PASS"
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, is_causal=False, **kw: real(q, k, v, is_causal=False, **kw))
    assert doctor.check_causal(arch, batch, seed=0).failed


def test_bad_init_and_untrainable_model_are_caught(monkeypatch):
    arch, batch = _arch_and_batch()
    res = doctor.check_init_loss(arch, batch, seed=0)
    assert res.status == "PASS" and "ln(64)" in res.detail
    assert doctor.check_overfit(arch, batch, seed=0, steps=300).status == "PASS"
    assert doctor.check_overfit(arch, batch, seed=0, steps=20, lr=0.0).failed
    real = mt.GPT.reset_parameters

    def loud_init(self, generator=None):
        real(self, generator)
        self.wte.weight.data.mul_(100.0)

    monkeypatch.setattr(mt.GPT, "reset_parameters", loud_init)
    assert doctor.check_init_loss(arch, batch, seed=0).failed


def test_data_order_detects_a_nondeterministic_stream(monkeypatch):
    examples = [np.arange(1, 20 + i) for i in range(6)]
    assert doctor.check_data_order(examples, 8, seed=1).status == "PASS"
    import pipeline.training.data as tdata

    counter = iter(range(10**6))
    real = tdata.WindowStream._plan
    monkeypatch.setattr(tdata.WindowStream, "_plan",
                        lambda self, epoch: real(self, epoch + next(counter)))
    assert doctor.check_data_order(examples, 8, seed=1).failed


def _tokenizer_files(tmp_path: Path, random_ids: bool):
    import miditok
    import symusic

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=True))
    tok.save(tmp_path / "tokenizer.json")
    rows = []
    for i in range(3):
        score = symusic.Score(480)
        track = symusic.Track(program=0)
        for j in range(6 + i):
            track.notes.append(symusic.Note(j * 480, 480, 60 + j, 80))
        score.tracks.append(track)
        ids = tok.encode(score).ids
        if random_ids:
            ids = np.random.default_rng(i).integers(3, len(tok), len(ids)).tolist()
        rows.append({"sha256": f"{i:064d}", "split": "train", "track": 0, "ids": ids,
                     "n_tokens": len(ids), "n_notes": 6 + i, "roundtrip_f1": 1.0})
    write_parquet(tmp_path / "tokens.parquet", tokens_table(rows))
    write_json(tmp_path / "info.json", {"vocab_size": len(tok), "pad_id": tok.pad_token_id,
                                        "bos_id": tok.vocab["BOS_None"],
                                        "eos_id": tok.vocab["EOS_None"], "tokenizer_hash": "h",
                                        "split_hash": "s"})
    return [np.asarray(r["ids"]) for r in rows], [r["n_notes"] for r in rows]


def test_decode_check_with_a_real_tokenizer(tmp_path):
    rows, notes = _tokenizer_files(tmp_path, random_ids=False)
    info = TokenInfo.read(tmp_path / "info.json")
    res = doctor.check_decode(tmp_path / "tokenizer.json", rows, notes, info)
    assert res.status == "PASS" and "notes [6, 7, 8]" in res.detail
    rows, notes = _tokenizer_files(tmp_path, random_ids=True)
    assert doctor.check_decode(tmp_path / "tokenizer.json", rows, notes, info).failed
    wrong = TokenInfo(info.vocab_size + 1, 0, 1, 2, "", "")
    assert "info.json says" in doctor.check_decode(tmp_path / "tokenizer.json", rows, notes,
                                                   wrong).detail


def test_cli_exit_status(tmp_path, monkeypatch, capsys):
    _tokenizer_files(tmp_path, random_ids=True)
    (tmp_path / "params.yaml").write_text(json.dumps({"transformer": {
        "model": {"max_seq_len": 32, "n_layer": 1, "n_head": 2, "n_embd": 16}}}))
    monkeypatch.chdir(tmp_path)
    rc = cli_main(["doctor", "--tokens", "tokens.parquet", "--info", "info.json", "--tokenizer",
                   "tokenizer.json", "--overfit-steps", "50"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL  decode" in out and "PASS  padding" in out


def test_compound_tokens_are_refused_before_any_check(compound_tokens, tmp_path):
    from pipeline.core.config import ParamsError

    with pytest.raises(ParamsError, match=r"tokenize\.tokenizer: CPWord — symkit doctor reads"):
        doctor.run_checks(CFG, tokens=compound_tokens["tokens"], info=compound_tokens["info"],
                          tokenizer=tmp_path / "tokenizer.json")

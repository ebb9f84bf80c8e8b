"""Loading trained models: each unusable model named with its reason (or raised, strictly), the
token checks, the replicates of a model trained over several seeds, and the transformer's
scoring stride."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from models.ngram import NGramLM
from models.transformer import GPT, TransformerConfig, save_model
from pipeline.core.artifacts import write_json
from pipeline.core.config import ParamsError
from pipeline.inference.loading import (
    ModelSpec,
    ModelUnavailable,
    add_model_arguments,
    default_specs,
    load_models,
    load_ngram,
    load_transformer,
    named_seeds,
    replicate_specs,
    set_torch_threads,
)
from pipeline.tokens.contract import TokenInfo
from tests.stages.test_train_ngram import BOS, EOS, PAD, VOCAB, write_corpus


def _fit_and_save(paths: dict[str, Path], out: Path, order: int, smoothing: str = "kneser_ney",
                  **meta) -> NGramLM:
    train = [np.array(r["ids"], dtype=np.int64)
             for r in pq.read_table(paths["tokens"]).to_pylist() if r["split"] == "train"]
    model = NGramLM(order=order, smoothing=smoothing, vocab_size=VOCAB, bos_id=BOS,
                    eos_id=EOS, pad_id=PAD).fit(train)
    model.save(out, metadata={"tokenizer_hash": "tok-hash", "split_hash": "split-hash", **meta})
    return model


@pytest.fixture
def setup(tmp_path):
    paths = write_corpus(tmp_path / "data")
    _fit_and_save(paths, tmp_path / "data" / "ngram", order=3)
    _fit_and_save(paths, tmp_path / "data" / "unigram", order=1, smoothing="unigram")
    return paths, tmp_path



def test_load_models_reports_failures(setup):
    paths, root = setup
    info = TokenInfo.read(paths["info"])
    stale = root / "data" / "stale"
    _fit_and_save(paths, stale, order=2, tokenizer_hash="other")
    empty = root / "data" / "empty"
    empty.mkdir()
    wider = root / "data" / "wider"
    NGramLM(order=2, vocab_size=VOCAB + 1, bos_id=BOS, eos_id=EOS).fit([np.array([3, 4])]).save(
        wider, metadata={"tokenizer_hash": "tok-hash", "split_hash": "split-hash"})

    def broken(d, device):
        raise RuntimeError("bad weights")

    specs = [ModelSpec("ngram", root / "data" / "ngram", load_ngram),
             ModelSpec("stale", stale, load_ngram), ModelSpec("empty", empty, load_ngram),
             ModelSpec("broken", root / "data" / "unigram", broken),
             ModelSpec("wider", wider, load_ngram)]
    models, unavailable = load_models(specs, info=info)
    assert list(models) == ["ngram"]
    assert unavailable["stale"].startswith("stale: tokenizer_hash")
    assert unavailable["empty"].startswith("missing")
    assert unavailable["broken"] == "load failed: RuntimeError: bad weights"
    assert unavailable["wider"].startswith("incompatible: vocab_size, eos_id = (13, 2)")
    models, _ = load_models(specs[1:2])  # without info nothing is compared
    assert list(models) == ["stale"]


def test_any_split_accepts_another_split_never_another_tokenizer(setup):
    """A model trained on another corpus or split with this tokenizer (a pretrained model scored
    zero-shot) loads only when the caller asks for it; another tokenizer never does."""
    paths, root = setup
    info = TokenInfo.read(paths["info"])
    elsewhere, other_tok = root / "data" / "elsewhere", root / "data" / "other_tok"
    _fit_and_save(paths, elsewhere, order=2, split_hash="another-split")
    _fit_and_save(paths, other_tok, order=2, split_hash="another-split", tokenizer_hash="other")
    specs = [ModelSpec("elsewhere", elsewhere, load_ngram),
             ModelSpec("other_tok", other_tok, load_ngram)]
    models, unavailable = load_models(specs, info=info)
    assert not models and unavailable["elsewhere"].startswith("stale: split_hash another-split")
    models, unavailable = load_models(specs, info=info, any_split=True)
    assert list(models) == ["elsewhere"]
    assert unavailable["other_tok"].startswith("stale: tokenizer_hash other != tok-hash")



def _save_transformer(folder: Path, seed: int = 0) -> None:
    """An untrained GPT with a 16-token context, trained (so says model.json) on the corpus."""
    cfg = TransformerConfig(vocab_size=VOCAB, max_seq_len=16, n_layer=1, n_head=2, n_embd=16)
    save_model(folder, GPT(cfg, torch.Generator().manual_seed(seed)), {
        "bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "tokenizer_hash": "tok-hash",
        "split_hash": "split-hash"})


def _replicated(folder: Path, seeds: list[int], folders: dict[str, str] | None = None) -> None:
    names = folders or {}
    for s in seeds:
        _save_transformer(folder / "replicates" / names.get(str(s), f"seed-{s}"), seed=s)
    write_json(folder / "replicates" / "index.json", {"seeds": seeds, "folders": names})


def test_replicate_specs_list_every_seed_in_order(tmp_path):
    spec = ModelSpec("transformer", tmp_path / "t", load_transformer)
    assert spec.key == "transformer" and replicate_specs(spec) == [spec]  # no index: one model
    _replicated(tmp_path / "t", [8, 7], {"7": "first"})
    specs = replicate_specs(spec)
    assert [(s.key, s.seed, s.model_dir.name) for s in specs] == [
        ("transformer@seed-7", 7, "first"), ("transformer@seed-8", 8, "seed-8")]
    assert all(s.name == "transformer" and s.loader is load_transformer for s in specs)
    write_json(tmp_path / "t" / "replicates" / "index.json", {"seeds": []})
    assert replicate_specs(spec) == [spec]


def test_strict_loading_raises_naming_the_model_and_why(tmp_path):
    spec = ModelSpec("ngram", tmp_path / "nowhere", load_ngram)
    models, unavailable = load_models([spec])
    assert models == {} and unavailable["ngram"].startswith("missing: ")
    with pytest.raises(ModelUnavailable, match=r"^ngram \(.*nowhere\): missing: "):
        load_models([spec], strict=True)


def test_the_transformers_stride_must_fit_its_context(tmp_path):
    _save_transformer(tmp_path / "t")
    assert load_transformer(tmp_path / "t").stride == 4  # the scorer's own: max_seq_len // 4
    assert load_transformer(tmp_path / "t", stride=16).stride == 16
    for bad in (0, 17):
        with pytest.raises(ParamsError, match=rf"evaluate\.stride: {bad} .*use 1\.\.16"):
            load_transformer(tmp_path / "t", stride=bad)
    specs = default_specs(tmp_path / "n", tmp_path / "t", ["transformer", "ngram"], stride=3)
    assert [(s.name, s.model_dir.name) for s in specs] == [("transformer", "t"), ("ngram", "n")]
    assert specs[0].loader(tmp_path / "t", "cpu").stride == 3 and specs[1].loader is load_ngram


def test_named_seeds_loads_every_seed_of_a_replicated_transformer(tmp_path):
    info = TokenInfo(vocab_size=VOCAB, pad_id=PAD, bos_id=BOS, eos_id=EOS,
                     tokenizer_hash="tok-hash", split_hash="split-hash")
    assert named_seeds(["ngram"], transformer_dir=tmp_path / "t", device="cpu", info=info) == {}
    _save_transformer(tmp_path / "t")
    once = named_seeds(["transformer"], transformer_dir=tmp_path / "t", device="cpu", info=info)
    assert once == {"transformer": {}}  # trained once: no replicates
    _replicated(tmp_path / "t", [1, 2])
    seeds = named_seeds(["ngram", "transformer"], transformer_dir=tmp_path / "t", device="cpu",
                        info=info)
    assert sorted(seeds["transformer"]) == [1, 2]
    (tmp_path / "t" / "replicates" / "seed-2" / "model.json").write_text("{not json")
    with pytest.raises(ModelUnavailable, match="transformer@seed-2"):
        named_seeds(["transformer"], transformer_dir=tmp_path / "t", device="cpu", info=info)


def test_torch_threads_are_fixed_only_for_a_transformer(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    set_torch_threads(3, ["ngram"])
    assert calls == []
    set_torch_threads(3, ["ngram", "transformer@seed-1234"])
    set_torch_threads(2, ["transformer"])
    assert calls == [3, 2]


def test_model_folders_default_to_the_training_stages_outputs():
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args([])
    assert (args.ngram_dir, args.transformer_dir) == (Path("data/ngram"),
                                                      Path("data/transformer"))

"""The arms' models as scoring and sampling load them, and the one-tokenizer check of the two
corpora."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.adaptation.arms import arm_specs, same_tokenizer
from pipeline.adaptation.config import ZERO_SHOT, AdaptationConfig
from pipeline.core.artifacts import write_json
from pipeline.core.config import ParamsError, parse_section
from pipeline.inference.loading import load_transformer
from pipeline.tokens.contract import TokenInfo


def test_one_spec_per_arm_and_seed_in_arm_order(tmp_path):
    cfg = parse_section("adaptation", {
        "pretrained": str(tmp_path / "pre"),
        "arms": {"scratch": {"kind": "scratch"}, "lora": {"kind": "lora", "lora_rank": 2}}},
        AdaptationConfig)
    write_json(tmp_path / "arms" / "lora" / "replicates" / "index.json",
               {"seeds": [5, 4], "folders": {"4": "seed-4", "5": "seed-5"}})
    specs = arm_specs(cfg, tmp_path / "arms")
    assert [(s.key, s.model_dir) for s in specs] == [
        (ZERO_SHOT, tmp_path / "pre"), ("scratch", tmp_path / "arms" / "scratch"),
        ("lora@seed-4", tmp_path / "arms" / "lora" / "replicates" / "seed-4"),
        ("lora@seed-5", tmp_path / "arms" / "lora" / "replicates" / "seed-5")]
    assert all(s.loader is load_transformer for s in specs)


def test_both_corpora_must_share_one_tokenizer(tmp_path):
    info = TokenInfo(vocab_size=50, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="tok-a",
                     split_hash="target")
    info.write(tmp_path / "target.json")
    replace(info, split_hash="source").write(tmp_path / "source.json")
    assert same_tokenizer(tmp_path / "target.json", tmp_path / "source.json") == info
    replace(info, tokenizer_hash="tok-b").write(tmp_path / "source.json")
    with pytest.raises(ParamsError, match=r"target tokens \(.*target\.json\) use tokenizer tok-a,"
                                          r" the source's \(.*source\.json\) tok-b; tokenise the "
                                          r"target with `symkit tokenize --from`"):
        same_tokenizer(tmp_path / "target.json", tmp_path / "source.json")

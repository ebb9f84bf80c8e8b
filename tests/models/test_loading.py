"""models.loading: a model folder read back as the class that was trained."""

from __future__ import annotations

import pytest
import torch

from models.compound import CompoundGPT
from models.loading import load_trained, model_class
from models.transformer import GPT, TransformerConfig, load_model, save_model


def _config(**kw) -> TransformerConfig:
    return TransformerConfig(max_seq_len=8, n_layer=1, n_head=2, n_embd=8, **kw)


@pytest.mark.parametrize(("kw", "cls"), [({"vocab_size": 12}, GPT),
                                         ({"vocab_size": 12, "codebook_sizes": (7, 5)},
                                          CompoundGPT)], ids=["one stream", "compound"])
def test_the_class_follows_model_json(tmp_path, kw, cls):
    cfg = _config(**kw)
    assert model_class(cfg) is cls
    model = cls(cfg, torch.Generator().manual_seed(1))
    save_model(tmp_path, model, {"seed": 1})
    loaded, meta = load_trained(tmp_path)
    assert type(loaded) is cls and meta["seed"] == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values(), strict=True))


def test_the_single_stream_loader_refuses_a_compound_model(tmp_path):
    cfg = _config(vocab_size=12, codebook_sizes=(7, 5))
    save_model(tmp_path, CompoundGPT(cfg, torch.Generator().manual_seed(1)), {})
    with pytest.raises(ValueError, match="CompoundGPT"):
        load_model(tmp_path)

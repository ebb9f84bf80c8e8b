"""models.lora: adapters that start as the identity, train alone, draw only from their own
generator and merge back into plain linear layers; freezing by prefix; parameter counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.lora import LORA_TARGETS, LoRALinear, apply_lora, freeze, merge_lora, param_counts
from tests.models.test_transformer import T, V, _model, _trained


def _linear(seed: int = 0) -> nn.Linear:
    torch_gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(6, 4)
    with torch.no_grad():
        layer.weight.normal_(generator=torch_gen)
        layer.bias.normal_(generator=torch_gen)
    return layer


def test_lora_starts_as_identity_counts_params_and_merges():
    m = _trained()
    x = torch.randint(3, V, (2, T))
    before = m(x)[0]
    total = param_counts(m)["total"]
    names = apply_lora(m, rank=2, alpha=4.0, targets=["attn.qkv", "mlp.proj"],
                       generator=torch.Generator().manual_seed(0))
    assert names == ["blocks.0.attn.qkv", "blocks.0.mlp.proj", "blocks.1.attn.qkv",
                     "blocks.1.mlp.proj"]
    c = param_counts(m)
    assert c["frozen"] == total
    assert c["trainable"] == 2 * (2 * (16 + 48) + 2 * (64 + 16))
    assert torch.allclose(m(x)[0], before, atol=1e-6)  # B = 0
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, LoRALinear):
                mod.lora_B.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    adapted = m(x)[0]
    assert not torch.allclose(adapted, before, atol=1e-4)
    merge_lora(m)
    assert not any(isinstance(mod, LoRALinear) for mod in m.modules())
    assert torch.allclose(m(x)[0], adapted, atol=1e-5)
    assert sorted(m.state_dict()) == sorted(_model().state_dict())


def test_freeze_by_prefix():
    m = _model()
    frozen = freeze(m, ["wte", "blocks.1."])
    assert "wte.weight" in frozen and all(n.startswith(("wte", "blocks.1.")) for n in frozen)
    c = param_counts(m)
    assert c["frozen"] == V * 16 + sum(p.numel() for p in m.blocks[1].parameters())
    with pytest.raises(ValueError, match="match no parameter"):
        freeze(m, ["blocks.9."])
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        apply_lora(_model(), 2, 4.0, targets=["attn.q"])


def test_a_wrapped_layer_is_its_base_plus_the_scaled_update():
    base = _linear()
    lora = LoRALinear(base, rank=2, alpha=6.0, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    assert torch.equal(lora(x), base(x))  # B = 0
    assert lora.scaling == 3.0 and lora.lora_A.shape == (2, 6) and lora.lora_B.shape == (4, 2)
    assert float(lora.lora_A.detach().abs().max()) <= 1 / 6 ** 0.5  # Kaiming bound 1/sqrt(in)
    with torch.no_grad():
        lora.lora_B.normal_(generator=torch.Generator().manual_seed(3))
    want = base(x) + 3.0 * (x @ lora.lora_A.T @ lora.lora_B.T)
    assert torch.allclose(lora(x), want, atol=1e-6)
    merged = lora.merged()
    assert type(merged) is nn.Linear and torch.allclose(merged(x), lora(x), atol=1e-6)
    assert all(p.requires_grad for p in merged.parameters())
    assert not any(p.requires_grad for p in base.parameters())
    with pytest.raises(ValueError, match="rank must be >= 1, got 0"):
        LoRALinear(_linear(), rank=0, alpha=1.0)


def test_only_the_adapters_learn():
    m = _model()
    apply_lora(m, rank=2, alpha=2.0, generator=torch.Generator().manual_seed(0))
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    x = torch.randint(3, V, (2, T), generator=torch.Generator().manual_seed(1))
    _, loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert all(p.grad is None for p in m.parameters() if not p.requires_grad)
    assert any(float(p.grad.abs().sum()) > 0 for n, p in m.named_parameters() if
               n.endswith("lora_B"))


def test_adapters_draw_from_their_generator_only():
    one, two, other = _model(), _model(), _model()
    state = torch.get_rng_state()
    names = apply_lora(one, 2, 4.0, generator=torch.Generator().manual_seed(5))
    assert names == apply_lora(two, 2, 4.0, generator=torch.Generator().manual_seed(5))
    apply_lora(other, 2, 4.0, generator=torch.Generator().manual_seed(6))
    a = {n: p for n, p in one.named_parameters() if n.endswith("lora_A")}
    b = {n: p for n, p in two.named_parameters() if n.endswith("lora_A")}
    c = {n: p for n, p in other.named_parameters() if n.endswith("lora_A")}
    assert len(a) == 2 * len(LORA_TARGETS) and all(torch.equal(a[n], b[n]) for n in a)
    assert not any(torch.equal(a[n], c[n]) for n in a)
    merge_lora(one)
    assert torch.equal(torch.get_rng_state(), state)  # no draw from the global generator
    plain = _model()
    assert merge_lora(plain) is plain  # nothing to merge: unchanged


def test_dropout_acts_on_the_update_only_in_training():
    lora = LoRALinear(_linear(), rank=2, alpha=2.0, dropout=0.5)
    with torch.no_grad():
        lora.lora_B.fill_(1.0)
    x = torch.ones(8, 6)
    lora.eval()
    assert torch.equal(lora(x), lora(x))
    lora.train()
    torch.manual_seed(0)
    assert not torch.allclose(lora(x), lora.eval()(x))


def test_adapters_get_the_same_gradients_with_activation_checkpointing():
    """The adapters sit inside the blocks, so a checkpointed block recomputes them too, with the
    same LoRA dropout masks: their gradients are bit-identical with it on or off."""
    grads = []
    for on in (False, True):
        m = _trained().train()
        apply_lora(m, 2, 4.0, list(LORA_TARGETS), dropout=0.3,
                   generator=torch.Generator().manual_seed(1))
        m.activation_checkpointing = on
        torch.manual_seed(5)
        x = torch.randint(3, V, (3, T), generator=torch.Generator().manual_seed(2))
        m(x, x)[1].backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    assert sorted(grads[0]) == sorted(grads[1]) and grads[0]
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


def test_tied_weights_are_counted_once():
    m = _model()
    unique = {id(p): p.numel() for p in m.parameters()}
    assert param_counts(m) == {"total": sum(unique.values()),
                               "trainable": sum(unique.values()), "frozen": 0}
    assert freeze(m, ["wte"]) == ["wte.weight"]
    assert param_counts(m)["frozen"] == V * 16

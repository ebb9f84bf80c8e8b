"""models.transformer (GPT, masked loss, save and load)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models.transformer import (
    GPT,
    IGNORE_INDEX,
    TransformerConfig,
    load_model,
    save_model,
)

V, T = 40, 16
BOS, EOS, PAD = 1, 2, 0


def _model(seed: int = 0, **kw) -> GPT:
    cfg = TransformerConfig(vocab_size=V, max_seq_len=T, n_layer=2, n_head=2, n_embd=16, **kw)
    return GPT(cfg, torch.Generator().manual_seed(seed)).eval()


def _trained(seed: int = 0) -> GPT:
    """A model with non-trivial weights (a few random steps), so tests can tell positions apart."""
    m = _model(seed).train()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    with torch.enable_grad():  # also when called from a no_grad test
        for _ in range(5):
            x = torch.randint(3, V, (4, T), generator=g)
            _, loss = m(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
    return m.eval()


def test_shapes_and_init_loss():
    m = _model()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, V, (2, 3, T), generator=g)
    logits, loss = m(x, y)
    assert logits.shape == (3, T, V)
    assert abs(float(loss.detach()) - math.log(V)) < 0.1
    assert m(x)[1] is None
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, T + 1, dtype=torch.long))


def test_same_seed_same_weights_and_tied_embeddings():
    a, b = _model(3), _model(3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(_model(4).wte.weight, a.wte.weight)
    assert not any(n.startswith("lm_head") for n, _ in a.named_parameters())


@torch.no_grad()
def test_loss_ignores_padding_and_masked_positions():
    m = _trained()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (2, T), generator=g)
    y = torch.randint(3, V, (2, T), generator=g)
    y[1, 10:] = IGNORE_INDEX
    logits, loss = m(x, y)
    valid = y != IGNORE_INDEX
    manual = F.cross_entropy(logits[valid], y[valid])
    assert float(loss) == pytest.approx(float(manual), abs=1e-6)
    # padding values after the end, and targets hidden by the mask, do not matter
    x2 = x.clone()
    x2[1, 10:] = torch.randint(0, V, (T - 10,), generator=g)
    assert float(m(x2, y)[1]) == pytest.approx(float(loss), abs=1e-6)
    mask = torch.ones_like(y, dtype=torch.bool)
    mask[0, :5] = False
    y3 = y.clone()
    y3[0, :5] = 7
    a = m(x, y3, loss_mask=mask)[1]
    b = m(x, torch.where(mask, y, torch.full_like(y, 9)), loss_mask=mask)[1]
    assert float(a) == pytest.approx(float(b), abs=1e-6)
    # sum == mean * count
    assert float(m(x, y, reduction="sum")[1]) == pytest.approx(float(loss) * int(valid.sum()),
                                                               rel=1e-5)


@torch.no_grad()
def test_attention_is_causal():
    m = _trained()
    x = torch.randint(3, V, (1, T))
    x2 = x.clone()
    x2[0, 10] = (x[0, 10] + 1 - 3) % (V - 3) + 3
    a, b = m(x)[0], m(x2)[0]
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_packed_pieces_see_only_themselves():
    """Three pieces packed in one row (plus padding) get the logits each has alone, and the summed
    loss of the row is the sum of the pieces' losses: packing changes no number."""
    m = _trained()
    g = torch.Generator().manual_seed(1)
    pieces = [torch.randint(3, V, (n,), generator=g) for n in (5, 7, 2)]
    x = torch.full((1, T), PAD)
    x[0, :14] = torch.cat(pieces)
    segments = torch.tensor([[0] * 5 + [1] * 7 + [2] * 2 + [-1] * 2])
    y = torch.full((1, T), IGNORE_INDEX)
    y[0, :14] = torch.randint(3, V, (14,), generator=g)
    packed, loss = m(x, y, reduction="sum", segments=segments)
    start, alone_loss = 0, torch.zeros(())
    for p in pieces:
        n = len(p)
        alone, nll = m(p[None], y[:, start : start + n], reduction="sum")
        assert torch.allclose(packed[0, start : start + n], alone[0], atol=1e-5), n
        start, alone_loss = start + n, alone_loss + nll
    assert loss.item() == pytest.approx(alone_loss.item(), rel=1e-5)
    # without the segments the later pieces see the earlier ones: the test can tell
    plain, _ = m(x)
    assert not torch.allclose(plain[0, 5:12], packed[0, 5:12], atol=1e-3)
    # one segment over the whole row is the plain causal model
    same, _ = m(x, segments=torch.zeros((1, T), dtype=torch.long))
    assert torch.allclose(same, plain, atol=1e-5)


# ------------------------------------------------------------------- activation checkpointing
def _saved_bytes(m: GPT, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward outside checkpointed blocks in one ``m(x, x)``."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x, x)
    return sum(seen.values())


def _grads(on: bool, packed: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradients of two training steps' losses (dropout on everywhere) and the RNG state after."""
    m = _model(dropout=0.2, attn_dropout=0.2).train()
    m.activation_checkpointing = on
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(11)  # dropout draws from the default generator, as training seeds it
    for _ in range(2):
        x = torch.randint(3, V, (3, T), generator=g)
        segments = (torch.randint(0, 3, (3, T), generator=g).sort(dim=1).values if packed
                    else None)
        _, loss = m(x, x, segments=segments)
        loss.backward()
    return {n: p.grad for n, p in m.named_parameters()}, torch.get_rng_state()


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_activation_checkpointing_gives_bit_identical_gradients(packed):
    """Recomputed in backward, each block draws the dropout masks of its first forward (the
    checkpoint restores the generator for it) and leaves the generator where it was: gradients
    and the RNG state equal those without checkpointing bit for bit on CPU."""
    off, rng_off = _grads(False, packed)
    on, rng_on = _grads(True, packed)
    assert all(torch.equal(on[n], off[n]) for n in off)
    assert torch.equal(rng_on, rng_off)


def test_activation_checkpointing_keeps_less_and_only_while_training():
    m = _model(dropout=0.1).train()
    x = torch.randint(3, V, (2, T))
    full = _saved_bytes(m, x)
    m.activation_checkpointing = True
    assert _saved_bytes(m, x) < full / 2  # the blocks' activations are no longer kept
    assert _saved_bytes(m.eval(), x) == _saved_bytes(_model(dropout=0.1), x)  # eval: plain
    with torch.no_grad():
        assert torch.equal(m(x)[0], _model(dropout=0.1)(x)[0])
    assert "activation_checkpointing" not in m.config.to_dict()  # never in model.json


# ------------------------------------------------------------------------------------ save, load
def test_save_load_round_trip(tmp_path):
    m = _trained()
    save_model(tmp_path, m, {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "vocab_size": V})
    loaded, _ = load_model(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 loaded.state_dict().values(), strict=True))

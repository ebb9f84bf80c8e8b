"""models.compound (the compound-token transformer, its per-codebook loss and NLL)."""

from __future__ import annotations

import math

import pytest
import torch

from models.base import IGNORE_INDEX
from models.compound import (
    CodebookLoss,
    CompoundGPT,
    codebook_cross_entropy,
    sequence_nll,
)
from models.transformer import GPT, TransformerConfig
from pipeline.training.estimate import count_params

SIZES = (10, 9, 12)  # three codebooks; ids 0-3 are PAD, BOS, EOS, MASK in each, as in miditok
IGNORE = 4  # miditok's Ignore_None in CPWord's codebooks after the first
T = 8


def _cfg(sizes=SIZES, **kw) -> TransformerConfig:
    return TransformerConfig(vocab_size=sum(sizes), max_seq_len=T, n_layer=2, n_head=2,
                             n_embd=16, codebook_sizes=list(sizes), **kw)


def _model(seed: int = 0, **kw) -> CompoundGPT:
    return CompoundGPT(_cfg(**kw), torch.Generator().manual_seed(seed)).eval()


def _ids(g: torch.Generator, batch: int, sizes=SIZES) -> torch.Tensor:
    """(batch, T, K) random ids above the special ones, each in its codebook's range."""
    return torch.stack([torch.randint(5, n, (batch, T), generator=g) for n in sizes], dim=-1)


def _trained(seed: int = 0) -> CompoundGPT:
    """A model with non-trivial weights (a few random steps), so tests can tell steps apart."""
    m = _model(seed).train()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for _ in range(5):
            x = _ids(g, 4)
            _, loss = m(x[:, :-1], x[:, 1:])
            loss.mean.backward()
            opt.step()
            opt.zero_grad()
    return m.eval()


# --------------------------------------------------------------------------- the loss by hand
# Two sequences, three steps, two codebooks (sizes 5 and 6). Sequence 1's last step is padding;
# sequence 0's middle step has no value in codebook 1 (miditok's Ignore_None, id 4 there). Id 4
# of codebook 0 is a real value (CPWord's Family_Metric) and is scored: mask ids are per codebook.
LOGITS = (
    torch.tensor([[[0.5, -1.0, 2.0, 0.0, 1.0], [1.5, 0.2, -0.3, 0.7, 0.0],
                   [0.0, 0.0, 1.0, 2.0, -2.0]],
                  [[-0.5, 0.3, 0.8, 1.1, 0.4], [2.2, -0.7, 0.1, 0.0, 0.9],
                   [9.0, 9.0, 9.0, 9.0, 9.0]]]),
    torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [3.0, 0.0, 0.0, 0.0, 7.0, 0.0],
                   [-1.0, 0.5, 1.5, 0.0, 0.2, 2.5]],
                  [[0.0, 1.0, 0.0, 1.0, 0.0, 1.0], [0.4, 0.4, 1.4, -0.6, 0.0, 0.3],
                   [9.0, 9.0, 9.0, 9.0, 9.0, 9.0]]]),
)
P = IGNORE_INDEX
TARGETS = torch.tensor([[[2, 5], [4, IGNORE], [3, 2]],
                        [[1, 3], [0, 2], [P, P]]])
MASK_IDS = ((), (IGNORE,))


def _ce(row: list[float], target: int) -> float:
    """Cross-entropy of one target by hand: log(sum(exp(row))) - row[target]."""
    return math.log(sum(math.exp(v) for v in row)) - row[target]


def _by_hand(codebook: int, positions: list[tuple[int, int]]) -> list[float]:
    return [_ce(LOGITS[codebook][b, t].tolist(), int(TARGETS[b, t, codebook]))
            for b, t in positions]


CB0 = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]  # every step but the padded one
CB1 = [(0, 0), (0, 2), (1, 0), (1, 1)]  # and not the Ignore one


def test_per_codebook_loss_equals_the_hand_computation():
    loss = codebook_cross_entropy(LOGITS, TARGETS, MASK_IDS)
    cb0, cb1 = _by_hand(0, CB0), _by_hand(1, CB1)
    assert loss.counts.tolist() == [5, 4]
    assert loss.sums.tolist() == pytest.approx([sum(cb0), sum(cb1)], abs=1e-5)
    assert loss.per_codebook.tolist() == pytest.approx([sum(cb0) / 5, sum(cb1) / 4], abs=1e-6)
    assert float(loss.mean) == pytest.approx((sum(cb0) / 5 + sum(cb1) / 4) / 2, abs=1e-6)
    assert float(loss.mean) == pytest.approx(float(loss.per_codebook.mean()), abs=1e-7)
    # without the mask ids the Ignore target is predicted like any other (logit 7: cheap)
    plain = codebook_cross_entropy(LOGITS, TARGETS)
    assert plain.counts.tolist() == [5, 5]
    assert float(plain.sums[1]) == pytest.approx(sum(cb1) + _ce(LOGITS[1][0, 1].tolist(), 4),
                                                 abs=1e-5)


def test_a_codebook_with_nothing_to_score_is_left_out_of_the_mean():
    targets = TARGETS.clone()
    targets[..., 1] = torch.where(targets[..., 1] == P, P, IGNORE)  # codebook 1: all Ignore
    logits = [lg.clone().requires_grad_(True) for lg in LOGITS]
    loss = codebook_cross_entropy(logits, targets, MASK_IDS)
    cb0 = sum(_by_hand(0, CB0)) / 5
    assert loss.counts.tolist() == [5, 0]
    assert loss.scored.tolist() == [True, False]
    assert loss.per_codebook.tolist() == pytest.approx([cb0, 0.0], abs=1e-6)
    assert float(loss.mean.detach()) == pytest.approx(cb0, abs=1e-6)  # not cb0 / 2
    loss.mean.backward()
    assert logits[1].grad is not None and not logits[1].grad.any()
    assert logits[0].grad is not None and logits[0].grad.any()
    # nothing scored anywhere: 0, as the single-stream loss of an all-padding batch
    empty = codebook_cross_entropy(LOGITS, torch.full_like(TARGETS, P))
    assert empty.counts.tolist() == [0, 0] and float(empty.mean) == 0.0


def test_loss_mask_hides_a_step_in_every_codebook():
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[0, 2] = False
    masked = codebook_cross_entropy(LOGITS, TARGETS, MASK_IDS, loss_mask=mask)
    hidden = TARGETS.clone()
    hidden[0, 2] = P
    assert masked.counts.tolist() == [4, 3]
    assert torch.equal(masked.sums, codebook_cross_entropy(LOGITS, hidden, MASK_IDS).sums)


def test_sequence_nll_sums_the_scored_targets_of_each_sequence():
    nll, steps = sequence_nll(LOGITS, TARGETS, MASK_IDS)
    by_hand = [sum(_by_hand(0, [p for p in CB0 if p[0] == b]))
               + sum(_by_hand(1, [p for p in CB1 if p[0] == b])) for b in (0, 1)]
    assert nll.tolist() == pytest.approx(by_hand, abs=1e-5)
    # the Ignore step still counts (codebook 0 is scored there); the padded one does not
    assert steps.tolist() == [3, 2]
    # the same as the loss's sums, in another order
    loss = codebook_cross_entropy(LOGITS, TARGETS, MASK_IDS)
    assert float(nll.sum()) == pytest.approx(float(loss.sums.sum()), abs=1e-5)


@torch.no_grad()
def test_sequence_nll_of_a_model_equals_log_softmax_gathered():
    """An independent torch computation: log_softmax of each head, gathered at the targets."""
    m = _trained()
    g = torch.Generator().manual_seed(2)
    x, y = _ids(g, 3), _ids(g, 3)
    y[0, 5:] = P
    y[1, 2, 1] = IGNORE
    y[2, :, 2] = IGNORE  # codebook 2 empty in a whole sequence
    mask_ids = ((), (0, IGNORE), (0, IGNORE))
    logits, loss = m(x, y, mask_ids=mask_ids)
    nll, steps = sequence_nll(logits, y, mask_ids)
    expected = torch.zeros(3, dtype=torch.float64)
    for k, lg in enumerate(logits):
        lp = torch.log_softmax(lg.double(), dim=-1)
        for b in range(3):
            for t in range(T):
                target = int(y[b, t, k])
                if target != P and target not in mask_ids[k]:
                    expected[b] -= lp[b, t, target]
    assert torch.allclose(nll.double(), expected, atol=1e-4)
    assert steps.tolist() == [5, T, T]
    assert loss is not None and loss.counts.tolist() == [3 * T - 3, 3 * T - 4, 2 * T - 3]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="expected one per codebook"):
        codebook_cross_entropy(LOGITS, TARGETS, ((4,),))
    with pytest.raises(ValueError, match=r"expected \(batch, time, 2\)"):
        codebook_cross_entropy(LOGITS, TARGETS[..., :1])
    with pytest.raises(ValueError, match=r"expected \(batch, time, 3\)"):
        _model()(torch.zeros(1, T, 2, dtype=torch.long))


# ------------------------------------------------------------------------------------ the model
def test_shapes_tied_heads_and_init_loss():
    m = _model()
    g = torch.Generator().manual_seed(0)
    x = _ids(g, 2)
    y = torch.stack([torch.randint(0, n, (2, T), generator=g) for n in SIZES], dim=-1)
    logits, loss = m(x, y)
    assert [tuple(lg.shape) for lg in logits] == [(2, T, n) for n in SIZES]
    assert isinstance(loss, CodebookLoss)
    # near-uniform heads at initialisation: each codebook's loss is about log(size)
    assert loss.per_codebook.tolist() == pytest.approx([math.log(n) for n in SIZES], abs=0.1)
    assert m(x)[1] is None
    assert [n for n, _ in m.named_parameters() if n.startswith("wte")] == [
        "wte.0.weight", "wte.1.weight", "wte.2.weight"]
    assert not any("head" in n for n, _ in m.named_parameters())  # heads are the tables


def test_parameter_count_is_the_single_stream_one():
    """Summed tables have the rows of one table over the whole vocabulary: a compound model has
    the parameters of the single-stream model of vocab_size = sum of the codebook sizes, and the
    estimate's formula counts both."""
    single = GPT(TransformerConfig(vocab_size=sum(SIZES), max_seq_len=T, n_layer=2, n_head=2,
                                   n_embd=16), torch.Generator().manual_seed(0))
    expected = count_params(sum(SIZES), T, n_layer=2, n_embd=16)["total"]
    assert single.num_params() == expected
    assert _model().num_params() == expected


def test_config_round_trips_and_refusals():
    cfg = _cfg()
    assert cfg.codebook_sizes == SIZES
    assert cfg.to_dict()["codebook_sizes"] == list(SIZES)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    single = TransformerConfig(vocab_size=27)
    assert "codebook_sizes" not in single.to_dict()  # single-stream model.json unchanged
    with pytest.raises(ValueError, match="must equal the sum"):
        TransformerConfig(vocab_size=26, codebook_sizes=list(SIZES))
    with pytest.raises(ValueError, match="one size >= 1"):
        TransformerConfig(vocab_size=0, codebook_sizes=[])
    with pytest.raises(ValueError, match="CompoundGPT"):
        GPT(cfg)
    with pytest.raises(ValueError, match="GPT, not CompoundGPT"):
        CompoundGPT(single)


@torch.no_grad()
@pytest.mark.parametrize("changed", range(len(SIZES)), ids=lambda k: f"codebook{k}")
def test_attention_is_causal_in_every_codebook(changed):
    """Changing one codebook's id at step 5 leaves every head's logits before step 5 as they
    were, and changes them from step 5 on."""
    m = _trained()
    x = _ids(torch.Generator().manual_seed(3), 1)
    x2 = x.clone()
    x2[0, 5, changed] = (x[0, 5, changed] + 1) % SIZES[changed]
    for a, b in zip(m(x)[0], m(x2)[0], strict=True):
        assert torch.equal(a[:, :5], b[:, :5])
        assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-6)


def test_packed_pieces_see_only_themselves():
    m = _trained()
    g = torch.Generator().manual_seed(4)
    x = _ids(g, 1)
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    packed = m(x, segments=segments)[0]
    alone = m(x[:, 3:])[0]
    for p, a in zip(packed, alone, strict=True):
        assert torch.allclose(p[:, 3:], a, atol=1e-5)


def test_same_seed_same_logits_bit_for_bit():
    x = _ids(torch.Generator().manual_seed(5), 2)
    with torch.no_grad():
        a, b, c = (_model(seed)(x)[0] for seed in (7, 7, 8))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(a, c, strict=True))


def test_a_tiny_model_overfits_one_compound_batch():
    """Heads and masking learn: 300 Adam steps on one batch of 4 sequences bring the mean loss
    from about log(size) (2.3 nats) below 0.05 (0.017 here), Ignore targets never scored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = CompoundGPT(_cfg(), torch.Generator().manual_seed(0)).train()
        g = torch.Generator().manual_seed(6)
        x, y = _ids(g, 4), _ids(g, 4)
        y[:, ::2, 1:] = IGNORE  # every other step is "metric": no value after codebook 0
        y[3, 6:] = P
        mask_ids = ((), (IGNORE,), (IGNORE,))
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
        first = None
        for _ in range(300):
            _, loss = m(x, y, mask_ids=mask_ids)
            first = float(loss.mean.detach()) if first is None else first
            loss.mean.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        assert loss.counts.tolist() == [30, 15, 15]
        assert first > 2.0
        assert float(loss.mean.detach()) < 0.05, loss.per_codebook.tolist()
        assert float(loss.per_codebook.max().detach()) < 0.1  # every head learned, not only some
    finally:
        torch.set_num_threads(threads)

"""models.checks: every model the project ships meets the sequence-model contract (the n-gram at
each order and smoothing it fits, the transformer's scorer, conditioned or not, through its
safetensors round trip), and each check fails on a model with one planted bug."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.checks import (
    ContractError,
    check_chain_rule,
    check_sequence_model,
    sample_sequences,
)
from models.ngram import SMOOTHINGS, NGramLM
from models.transformer import GPT, TransformerConfig, save_model
from pipeline.inference.scorer import TransformerScorer, load_scorer
from pipeline.stages.train_ngram import NGramConfig

V, T = 40, 16
PAD, BOS, EOS = 0, 1, 2
SEQS = sample_sequences(range(3, V), n=12, max_len=2 * T + 8)  # longer than T: windows slide
ALL_CHECKS = ["check_fit", "check_attributes", "check_token_nll", "check_next_logprobs",
              "check_chain_rule", "check_score", "check_deterministic", "check_round_trip"]


def _ngram(order: int = 3, smoothing: str = "kneser_ney", **kw) -> NGramLM:
    return NGramLM(order=order, smoothing=smoothing, vocab_size=V, bos_id=BOS, eos_id=EOS,
                   pad_id=PAD, **kw)


def _save_ngram(model: NGramLM, folder: Path) -> None:
    model.save(folder)


# --------------------------------------------------------------------------- the shipped models
@pytest.mark.parametrize("order", NGramConfig().orders, ids=lambda o: f"order{o}")
@pytest.mark.parametrize("smoothing", SMOOTHINGS)
def test_ngram_meets_the_contract(smoothing: str, order: int):
    done = check_sequence_model(lambda: _ngram(order, smoothing), SEQS, save=_save_ngram,
                                load=NGramLM.load)
    assert done == ALL_CHECKS


def _gpt(seed: int = 0, cond_slot_sizes: tuple[int, ...] = ()) -> GPT:
    """A tiny GPT after a few training steps on random ids (weights that tell positions apart),
    all from one explicit generator."""
    cfg = TransformerConfig(vocab_size=V, max_seq_len=T, n_layer=2, n_head=2, n_embd=16,
                            cond_slot_sizes=cond_slot_sizes)
    g = torch.Generator().manual_seed(seed)
    model = GPT(cfg, g).train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    with torch.enable_grad():
        for _ in range(4):
            x = torch.randint(3, V, (4, T), generator=g)
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model.eval()


def _save_scorer(scorer: TransformerScorer, folder: Path) -> None:
    save_model(folder, scorer.model, {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD,
                                      "vocab_size": V})


@pytest.mark.parametrize("cond_slot_sizes", [(), (3, 5)], ids=["plain", "conditioned"])
def test_transformer_scorer_meets_the_contract(cond_slot_sizes):
    """The scorer over a trained GPT (a conditioned one scored without conditions), saved as
    safetensors and loaded back by load_scorer, as evaluate loads it (with load_scorer's
    stride and batch size: another batching moves the last bits of a score)."""
    def make() -> TransformerScorer:
        return TransformerScorer(_gpt(0, cond_slot_sizes), bos_id=BOS, eos_id=EOS, pad_id=PAD)

    done = check_sequence_model(make, SEQS, save=_save_scorer, load=load_scorer)
    assert done == [c for c in ALL_CHECKS if c not in ("check_fit", "check_score")]


def test_a_random_initial_transformer_meets_it_too():
    """Without training, without PAD, windows that do not overlap (stride = context)."""
    cfg = TransformerConfig(vocab_size=V, max_seq_len=T, n_layer=1, n_head=1, n_embd=8)

    def make() -> TransformerScorer:
        return TransformerScorer(GPT(cfg, torch.Generator().manual_seed(3)), bos_id=BOS,
                                 eos_id=EOS, pad_id=None, stride=T)

    assert "check_chain_rule" in check_sequence_model(make, SEQS)


def test_sample_sequences_are_fixed_by_their_seed():
    a, b = sample_sequences(range(3, V), seed=1), sample_sequences(range(3, V), seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(s) for s in a[:2]] == [0, 1] and len(a) == 12
    assert all(set(s.tolist()) <= set(range(3, V)) for s in a)
    assert not np.array_equal(a[5], sample_sequences(range(3, V), seed=2)[5])


# --------------------------------------------------------------------------- planted bugs
class Wrapped:
    """A fitted n-gram behind the contract's surface, to plant one bug at a time."""

    def __init__(self) -> None:
        self.inner = _ngram(3)
        self.vocab_size, self.eos_id = V, EOS

    def fit(self, seqs):
        self.inner.fit(seqs)
        return self

    def token_nll(self, seqs):
        return self.inner.token_nll(seqs)

    def next_logprobs(self, contexts):
        return self.inner.next_logprobs(contexts)


class NotNormalised(Wrapped):
    def next_logprobs(self, contexts):
        return super().next_logprobs(contexts) + np.log(1.25)  # probabilities sum to 1.25


class EOSMissing(Wrapped):
    def token_nll(self, seqs):  # forgets the EOS target: len(seq) values
        return [t[:-1] for t in super().token_nll(seqs)]


class EOSSwapped(Wrapped):
    def next_logprobs(self, contexts):  # EOS's probability lives in another column
        lp = super().next_logprobs(contexts)
        lp[:, [EOS, 3]] = lp[:, [3, EOS]]
        return lp


class OtherDistribution(Wrapped):
    """token_nll from a bigram, next_logprobs from a trigram: each alone looks fine."""

    def fit(self, seqs):
        self.bigram_ = _ngram(2).fit(seqs)
        return super().fit(seqs)

    def token_nll(self, seqs):
        return self.bigram_.token_nll(seqs)


class BatchDependent(Wrapped):
    def token_nll(self, seqs):  # a per-batch normaliser leaking into each sequence's scores
        return [t + 1e-3 * len(seqs) for t in super().token_nll(seqs)]


class Unsmoothed(Wrapped):
    """A maximum-likelihood bigram: an unseen pair has probability 0 (infinite NLL)."""

    def fit(self, seqs):
        counts = np.zeros((V, V))
        for s in seqs:
            full = [BOS, *map(int, s), EOS]
            np.add.at(counts, (full[:-1], full[1:]), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.logp_ = np.log(counts / counts.sum(axis=1, keepdims=True))
        self.logp_[~np.isfinite(self.logp_).any(axis=1)] = np.log(1 / V)  # unseen history
        return self

    def next_logprobs(self, contexts):
        return np.stack([self.logp_[c[-1] if len(c) else BOS] for c in contexts]) \
            if len(contexts) else np.zeros((0, V))

    def token_nll(self, seqs):
        out = []
        for s in seqs:
            full = [BOS, *map(int, s), EOS]
            out.append(-self.logp_[full[:-1], full[1:]])
        return out


class ReturnsNothing(Wrapped):
    def fit(self, seqs):
        super().fit(seqs)  # and forgets to return self


class Clamping(NGramLM):
    def fit(self, seqs):
        self.order = min(self.order, 2)  # "fixes" a hyper-parameter in fit
        return super().fit(seqs)


class Unseeded(Wrapped):
    calls = 0

    def next_logprobs(self, contexts):  # state that changes with every call
        Unseeded.calls += 1
        lp = super().next_logprobs(contexts)
        return lp - np.log(np.exp(lp).sum(axis=1, keepdims=True)) + 1e-12 * (Unseeded.calls % 2)


class Sorting(Wrapped):
    def token_nll(self, seqs):
        out = super().token_nll(seqs)
        for s in seqs:
            s.sort()  # scores, then sorts its input in place
        return out


class SortsTraining(Wrapped):
    def fit(self, seqs):
        for s in seqs:
            s.sort()  # "normalises" its training data in place
        return super().fit(seqs)


def _float32_load(folder: Path) -> NGramLM:
    """Loads the arrays back in single precision, as a lossy format would."""
    model = NGramLM.load(folder)
    model.alpha_ = [a.astype(np.float32).astype(np.float64) for a in model.alpha_]
    return model


@pytest.mark.parametrize(("make", "load", "check", "says"), [
    (NotNormalised, None, "check_next_logprobs", "probabilities sum to 1.25"),
    (EOSMissing, None, "check_token_nll", "expected (1,): its ids, then EOS"),
    (EOSSwapped, None, "check_chain_rule", "EOS after all"),
    (OtherDistribution, None, "check_chain_rule", "token_nll gives"),
    (BatchDependent, None, "check_token_nll", "alone"),
    (Unsmoothed, None, "check_token_nll", "is not finite"),
    (ReturnsNothing, None, "check_fit", "fit returned NoneType"),
    (lambda: Clamping(order=3, vocab_size=V, bos_id=BOS, eos_id=EOS, pad_id=PAD), None,
     "check_fit", "changed hyper-parameter 'order' from 3 to 2"),
    (Unseeded, None, "check_deterministic", "a second call"),
    (Sorting, None, "check_token_nll", "token_nll changed sequence 2 it was given"),
    (SortsTraining, None, "check_fit", "fit changed sequence 2 it was given"),
    (_ngram, _float32_load, "check_round_trip", "the loaded model gives other numbers"),
    (lambda: NGramLM(order=3), None, "check_attributes", "vocab_size is None"),
], ids=["not-normalised", "eos-missing", "eos-swapped", "two-distributions", "batch-dependent",
        "unsmoothed", "fit-returns-none", "fit-changes-params", "unseeded", "mutates-input",
        "fit-mutates-input", "lossy-load", "no-id-space"])
def test_each_planted_bug_is_caught_by_its_check(make, load, check, says):
    save = _save_ngram if load is not None else None
    with pytest.raises(ContractError, match=f"^{check}: ") as e:
        check_sequence_model(make, SEQS, save=save, load=load)
    assert says in str(e.value)


def test_the_chain_rule_check_names_the_target():
    model = OtherDistribution().fit(SEQS)
    with pytest.raises(ContractError, match=r"check_chain_rule: OtherDistribution: target \d+ "):
        check_chain_rule(model, SEQS[3][:5])


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="save and load together"):
        check_sequence_model(_ngram, SEQS, save=_save_ngram)
    with pytest.raises(ValueError, match="at least 2 ids"):
        check_sequence_model(_ngram, [np.array([3])])

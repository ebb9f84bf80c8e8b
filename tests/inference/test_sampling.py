"""Sampling over the SequenceModel protocol: filtering, determinism, batch independence, and
conditions with classifier-free guidance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.inference.sampling import SamplingParams, draw, filtered_probs, sample_sequences


class TableModel:
    """Next-token distribution depends only on the last id (a fixed random bigram table)."""

    def __init__(self, vocab_size: int = 12, eos_id: int = 2, seed: int = 0):
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(vocab_size + 1, vocab_size))
        self.table = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.calls = 0

    def next_logprobs(self, contexts):
        self.calls += 1
        last = [int(c[-1]) if len(c) else self.vocab_size for c in contexts]
        return self.table[last]

    def token_nll(self, seqs):
        raise NotImplementedError


LOGP = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))


def test_greedy_is_one_hot_on_argmax():
    p = filtered_probs(LOGP, SamplingParams(temperature=0))
    assert p.tolist() == [0, 1, 0, 0, 0]
    assert draw(p, None) == 1


def test_top_k_keeps_k_most_probable():
    p = filtered_probs(LOGP, SamplingParams(top_k=2))
    assert set(np.flatnonzero(p)) == {1, 3}
    assert p[1] / p[3] == pytest.approx(0.4 / 0.3)


def test_top_p_keeps_smallest_set_reaching_mass():
    p = filtered_probs(LOGP, SamplingParams(top_p=0.7))  # 0.4 + 0.3 reaches 0.7
    assert set(np.flatnonzero(p)) == {1, 3}
    p = filtered_probs(LOGP, SamplingParams(top_p=0.71))
    assert set(np.flatnonzero(p)) == {1, 3, 4}


def test_forbidden_ids_never_kept():
    p = filtered_probs(LOGP, SamplingParams(temperature=0), forbid=[1])
    assert np.argmax(p) == 3 and p[1] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20, 5), min_size=2, max_size=30), st.floats(0.1, 3.0),
       st.integers(0, 10), st.floats(0.05, 1.0))
def test_filtered_probs_is_a_distribution(logits, t, k, top_p):
    x = np.asarray(logits) - np.logaddexp.reduce(logits)
    p = filtered_probs(x, SamplingParams(temperature=t, top_k=k, top_p=top_p))
    assert p.sum() == pytest.approx(1.0)
    assert (p >= 0).all()
    assert p[int(np.argmax(x))] > 0  # the most probable id always survives


def test_draw_frequencies_follow_the_distribution():
    p = filtered_probs(LOGP, SamplingParams())
    rng = np.random.default_rng(7)
    counts = np.bincount([draw(p, rng) for _ in range(20000)], minlength=5) / 20000
    assert np.abs(counts - p).max() < 0.02


def test_samples_do_not_depend_on_batch_size_and_are_seeded():
    model = TableModel()
    prompts = [np.array([5]), np.array([], dtype=int), np.array([7, 8]), np.array([3])]

    def go(batch):
        rngs = [np.random.default_rng([1, i]) for i in range(len(prompts))]
        return sample_sequences(model, prompts, max_new_tokens=20, params=SamplingParams(),
                                rngs=rngs, forbid=[0], batch_size=batch)

    a, b = go(1), go(3)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert all(0 not in x for x in a)  # forbidden
    assert all(2 not in x for x in a)  # EOS ends a sample and is not returned
    rngs = [np.random.default_rng([2, i]) for i in range(len(prompts))]
    c = sample_sequences(model, prompts, max_new_tokens=20, params=SamplingParams(), rngs=rngs)
    assert [x.tolist() for x in a] != [x.tolist() for x in c]


def test_greedy_needs_no_generators_and_stops_at_eos():
    model = TableModel()
    model.table[:, :] = -10.0
    model.table[:, 4] = 0.0  # always 4 ...
    model.table[4, :] = -10.0
    model.table[4, 2] = 0.0  # ... then EOS
    out = sample_sequences(model, [np.array([1])], max_new_tokens=10,
                           params=SamplingParams(temperature=0), rngs=None)
    assert out[0].tolist() == [4]
    with pytest.raises(ValueError, match="generator"):
        sample_sequences(model, [np.array([1])], max_new_tokens=3, params=SamplingParams(),
                         rngs=None)


# ------------------------------------------------------------------------------ conditions
class ToyConditioned:
    """A 'model' whose next id is the condition id + 5 when conditioned, uniform over 5..8
    without a condition (id 0 of the slot)."""

    vocab_size, eos_id = 10, 2

    def next_logprobs(self, contexts, conds=None):
        out = np.full((len(contexts), 10), -np.inf)
        if conds is None:  # unconditioned: every slot "none"
            conds = np.zeros((len(contexts), 1), dtype=np.int64)
        for r, c in enumerate(conds):
            if c[0] == 0:
                out[r, 5:9] = np.log(0.25)
            else:
                out[r, 5:9] = np.log(0.02)
                out[r, 5 + int(c[0])] = np.log(0.94)
        return out


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # log(0) = -inf, on purpose
def test_guidance_mixes_conditioned_and_unconditioned_log_probabilities():
    from pipeline.inference.sampling import guided

    c = np.log(np.array([[0.7, 0.2, 0.1, 0.0]]))
    u = np.log(np.array([[0.25, 0.25, 0.5, 0.0]]))
    assert np.allclose(guided(c, u, 1.0), c)
    assert np.allclose(guided(c, u, 0.0), u)
    strong = np.exp(guided(c, u, 3.0))
    assert np.isclose(strong.sum(), 1.0) and strong[0, 3] == 0.0
    assert strong[0, 0] > 0.7  # pushed further towards what the condition favours
    # an id impossible under one side only is impossible under a positive-weight mix
    c2 = np.log(np.array([[0.5, 0.5, 0.0]]))
    u2 = np.log(np.array([[0.4, 0.3, 0.3]]))
    assert np.exp(guided(c2, u2, 2.0))[0, 2] == 0.0


def test_sampling_follows_each_prompts_condition():
    from pipeline.inference.sampling import SamplingParams, sample_sequences

    model = ToyConditioned()
    conds = np.array([[1], [3], [0]])
    rngs = [np.random.default_rng(i) for i in range(3)]
    out = sample_sequences(model, [np.array([], dtype=np.int64)] * 3, max_new_tokens=40,
                           params=SamplingParams(), rngs=rngs, conds=conds)
    assert np.mean(out[0] == 6) > 0.8 and np.mean(out[1] == 8) > 0.8
    assert np.mean(out[2] == 6) < 0.5  # "none": no preference
    strong = sample_sequences(model, [np.array([], dtype=np.int64)], max_new_tokens=40,
                              params=SamplingParams(), rngs=[np.random.default_rng(0)],
                              conds=conds[:1], guidance=3.0, none_ids=np.array([0]))
    assert np.mean(strong[0] == 6) >= np.mean(out[0] == 6)
    with pytest.raises(ValueError, match="none_ids"):
        sample_sequences(model, [np.array([])], max_new_tokens=1, params=SamplingParams(),
                         rngs=[np.random.default_rng(0)], conds=conds[:1], guidance=2.0)


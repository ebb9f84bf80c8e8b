"""Sampling over the SequenceModel protocol: filtering, determinism, batch independence."""

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

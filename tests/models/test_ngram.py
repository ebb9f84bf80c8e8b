"""NGramLM against a plain textbook reference, plus probability-axiom property tests."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.base import SequenceModel
from models.ngram import FALLBACK_DISCOUNTS, NGramLM, kn_discounts
from models.ngram_counts import IdSpace, count_ngrams

SMOOTHINGS = ["kneser_ney", "add_k", "unigram", "uniform"]


# -- a deliberately plain reference: dict-of-counts, Chen & Goodman's formulas ----------------
class ReferenceKN:
    """Interpolated modified Kneser-Ney, written for clarity, not speed (KenLM's BOS convention:
    n-grams starting with BOS keep their raw count; BOS is never a target)."""

    def __init__(self, seqs, order, vocab_size, bos, eos):
        self.order, self.V, self.bos, self.eos = order, vocab_size, bos, eos
        counts = {n: Counter() for n in range(1, order + 1)}
        for s in seqs:
            toks = [bos, *map(int, s), eos]
            for n in range(1, order + 1):
                for i in range(n - 1, len(toks)):
                    counts[n][tuple(toks[i - n + 1 : i + 1])] += 1
        self.adj = {}
        for n in range(1, order + 1):
            adj = {}
            for g, c in counts[n].items():
                if n == order or g[0] == bos:
                    adj[g] = c
                else:
                    adj[g] = len({h[0] for h in counts[n + 1] if h[1:] == g})
            self.adj[n] = adj
        self.adj[1].pop((bos,), None)
        self.D = {}
        for n in range(1, order + 1):
            cc = Counter(self.adj[n].values())
            n1, n2, n3, n4 = (cc[k] for k in (1, 2, 3, 4))
            d = FALLBACK_DISCOUNTS
            if min(n1, n2, n3, n4) > 0:
                y = n1 / (n1 + 2 * n2)
                cand = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
                if 0 < cand[0] < 1 and 0 < cand[1] < 2 and 0 < cand[2] < 3:
                    d = cand
            self.D[n] = d

    def disc(self, n, a):
        return 0.0 if a == 0 else self.D[n][min(a, 3) - 1]

    def prob(self, w, hist):
        n = len(hist) + 1
        lower = (0.0 if w == self.bos else 1.0 / (self.V - 1)) if n == 1 else self.prob(w, hist[1:])
        cont = [a for g, a in self.adj[n].items() if g[:-1] == hist]
        total = sum(cont)
        if total == 0:
            return lower
        a = self.adj[n].get((*hist, w), 0)
        gamma = sum(self.disc(n, c) for c in cont) / total
        return max(a - self.disc(n, a), 0.0) / total + gamma * lower

    def token_nll(self, seq):
        toks = [self.bos, *map(int, seq)]
        out = []
        for i, w in enumerate([*map(int, seq), self.eos]):
            hist = tuple(toks[max(0, i + 1 - (self.order - 1)) : i + 1]) if self.order > 1 else ()
            out.append(-math.log(self.prob(w, hist)))
        return np.array(out)


def reference_add_k(seqs, order, V, bos, eos, k, seq):
    counts = Counter()
    for s in seqs:
        toks = [bos, *map(int, s), eos]
        for n in range(1, order + 1):
            for i in range(n - 1, len(toks)):
                counts[tuple(toks[i - n + 1 : i + 1])] += 1
    counts.pop((bos,), None)
    toks = [bos, *map(int, seq)]
    out = []
    for i, w in enumerate([*map(int, seq), eos]):
        hist = tuple(toks[max(0, i + 1 - (order - 1)) : i + 1]) if order > 1 else ()
        total = sum(c for g, c in counts.items() if len(g) == len(hist) + 1 and g[:-1] == hist)
        out.append(-math.log((counts.get((*hist, w), 0) + k) / (total + k * (V - 1))))
    return np.array(out)


def markov_corpus(seed, n_seqs, vocab, max_len):
    """Small corpus with real structure (so discounts come from data, not the fallback)."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(vocab, 0.3), size=vocab)
    seqs = []
    for _ in range(n_seqs):
        length = int(rng.integers(0, max_len + 1))
        s = np.empty(length, dtype=np.int64)
        state = int(rng.integers(vocab))
        for i in range(length):
            state = int(rng.choice(vocab, p=trans[state]))
            s[i] = state
        seqs.append(s)
    return seqs


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_kneser_ney_matches_reference(order, seed):
    seqs = markov_corpus(seed, n_seqs=40, vocab=7, max_len=25)
    V, bos, eos = 9, 7, 8
    model = NGramLM(order=order, vocab_size=V, bos_id=bos, eos_id=eos).fit(seqs)
    ref = ReferenceKN(seqs, order, V, bos, eos)
    for n in range(1, order + 1):
        np.testing.assert_allclose(model.discounts_[n - 1], ref.D[n], rtol=0, atol=1e-12)
    held = [*markov_corpus(seed + 100, n_seqs=8, vocab=7, max_len=15), np.array([], np.int64)]
    for got, s in zip(model.token_nll(held), held, strict=True):
        np.testing.assert_allclose(got, ref.token_nll(s), rtol=0, atol=1e-9)


def test_reference_agreement_uses_data_discounts():
    """The comparison above must exercise the count-of-counts formula, not only the fallback."""
    seqs = markov_corpus(0, n_seqs=40, vocab=7, max_len=25)
    model = NGramLM(order=3, vocab_size=9, bos_id=7, eos_id=8).fit(seqs)
    assert 3 not in model.discount_fallback_
    assert model.discounts_[2] != list(FALLBACK_DISCOUNTS)


def test_tiny_corpus_falls_back_and_matches_reference():
    seqs = [np.array([0, 1]), np.array([1])]
    model = NGramLM(order=3, vocab_size=4, bos_id=2, eos_id=3).fit(seqs)
    assert model.discount_fallback_ == [1, 2, 3]
    ref = ReferenceKN(seqs, 3, 4, 2, 3)
    np.testing.assert_allclose(model.token_nll([np.array([1, 0, 0])])[0],
                               ref.token_nll([1, 0, 0]), atol=1e-9)


def test_kn_discounts_formula():
    a = np.array([1] * 10 + [2] * 4 + [3] * 2 + [4] * 1)
    (d1, d2, d3), fb = kn_discounts(a)
    y = 10 / 18
    assert not fb
    assert d1 == pytest.approx(1 - 2 * y * 4 / 10)
    assert d2 == pytest.approx(2 - 3 * y * 2 / 4)
    assert d3 == pytest.approx(3 - 4 * y * 1 / 2)
    assert kn_discounts(np.array([1, 1, 2]))[1]


@pytest.mark.parametrize("order", [1, 2, 4])
def test_add_k_matches_reference(order):
    seqs = markov_corpus(3, n_seqs=20, vocab=5, max_len=12)
    model = NGramLM(order=order, smoothing="add_k", k=0.5, vocab_size=7, bos_id=5,
                    eos_id=6).fit(seqs)
    for s in [seqs[0], np.array([4, 4, 0, 1]), np.array([], np.int64)]:
        np.testing.assert_allclose(model.token_nll([s])[0],
                                   reference_add_k(seqs, order, 7, 5, 6, 0.5, s), atol=1e-9)


def test_unigram_and_uniform_ignore_context():
    seqs = markov_corpus(4, n_seqs=20, vocab=5, max_len=12)
    uni = NGramLM(order=5, smoothing="unigram", k=0.5).fit(seqs)
    assert uni.order_ == 1
    lp = uni.next_logprobs([np.array([0]), np.array([3, 2, 1])])
    np.testing.assert_array_equal(lp[0], lp[1])
    flat = NGramLM(smoothing="uniform").fit(seqs)
    assert flat.nll(seqs) == pytest.approx(math.log(flat.vocab_size_ - 1))


# -- property tests --------------------------------------------------------------------------
corpora = st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=corpora, order=st.sampled_from([1, 2, 3, 4, 5, 6, 8]),
       smoothing=st.sampled_from(SMOOTHINGS),
       contexts=st.lists(st.lists(st.integers(0, 7), max_size=8), min_size=1, max_size=5))
def test_distribution_sums_to_one(corpus, order, smoothing, contexts):
    # Ids 6 and 7 are never seen in training: still in the vocabulary, so they need mass.
    seqs = [np.array(s, dtype=np.int64) for s in corpus]
    model = NGramLM(order=order, smoothing=smoothing, vocab_size=10, bos_id=8, eos_id=9).fit(seqs)
    lp = model.next_logprobs([np.array(c, dtype=np.int64) for c in contexts])
    assert lp.shape == (len(contexts), 10)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, rtol=0, atol=1e-9)
    assert np.all(lp[:, 8] == -np.inf)  # BOS is never a target
    assert np.all(np.isfinite(np.delete(lp, 8, axis=1)))  # every other id, seen or not


@settings(max_examples=25, deadline=None)
@given(corpus=corpora, order=st.integers(1, 5), smoothing=st.sampled_from(SMOOTHINGS),
       contexts=st.lists(st.lists(st.integers(1, 7), max_size=8), min_size=1, max_size=5))
def test_pad_is_never_a_target(corpus, order, smoothing, contexts):
    seqs = [np.array(s, dtype=np.int64) + 1 for s in corpus]  # ids 1..6; 0 is PAD
    model = NGramLM(order=order, smoothing=smoothing, vocab_size=10, bos_id=8, eos_id=9,
                    pad_id=0).fit(seqs)
    lp = model.next_logprobs([np.array(c, dtype=np.int64) for c in contexts])
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, rtol=0, atol=1e-9)
    assert np.all(lp[:, [0, 8]] == -np.inf)
    assert np.all(np.isfinite(lp[:, 1:8])) and np.all(np.isfinite(lp[:, 9]))


@settings(max_examples=30, deadline=None)
@given(corpus=corpora, order=st.integers(1, 5), smoothing=st.sampled_from(SMOOTHINGS),
       held=st.lists(st.lists(st.integers(0, 7), max_size=10), min_size=1, max_size=4))
def test_token_nll_agrees_with_next_logprobs(corpus, order, smoothing, held):
    seqs = [np.array(s, dtype=np.int64) for s in corpus]
    model = NGramLM(order=order, smoothing=smoothing, vocab_size=10, bos_id=8, eos_id=9).fit(seqs)
    held = [np.array(s, dtype=np.int64) for s in held]
    for s, nll in zip(held, model.token_nll(held), strict=True):
        assert nll.shape == (len(s) + 1,)
        lp = model.next_logprobs([s[:i] for i in range(len(s) + 1)])
        targets = np.append(s, 9)
        np.testing.assert_allclose(nll, -lp[np.arange(len(targets)), targets], atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(corpus=corpora, order=st.integers(1, 5), smoothing=st.sampled_from(SMOOTHINGS))
def test_save_load_round_trip(tmp_path_factory, corpus, order, smoothing):
    seqs = [np.array(s, dtype=np.int64) for s in corpus]
    model = NGramLM(order=order, smoothing=smoothing, k=0.25).fit(seqs)
    d = tmp_path_factory.mktemp("m")
    model.save(d, metadata={"tokenizer_hash": "abc"})
    loaded = NGramLM.load(d)
    assert loaded.get_params() == model.get_params()
    assert loaded.metadata_ == {"tokenizer_hash": "abc"}
    for a, b in zip(loaded.token_nll(seqs), model.token_nll(seqs), strict=True):
        np.testing.assert_array_equal(a, b)
    ctx = [seqs[0], np.array([], np.int64)]
    np.testing.assert_array_equal(loaded.next_logprobs(ctx), model.next_logprobs(ctx))


def test_save_is_byte_identical(tmp_path):
    seqs = markov_corpus(5, n_seqs=10, vocab=5, max_len=10)
    for name in ("a", "b"):
        NGramLM(order=3).fit(seqs).save(tmp_path / name)
    for f in ("model.npz", "model.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with np.load(tmp_path / "a" / "model.npz", allow_pickle=False) as z:
        assert "keys_3" in z.files


# -- edge cases and the estimator contract -------------------------------------------------------
def test_empty_sequences_score_eos_only():
    model = NGramLM(order=3).fit([np.array([0, 1, 2]), np.array([], np.int64)])
    out = model.token_nll([np.array([], np.int64), np.array([2])])
    assert [len(t) for t in out] == [1, 2]
    assert np.all(np.isfinite(out[0]))
    assert model.nll_per_piece([np.array([], np.int64)])[0] == pytest.approx(out[0][0])
    assert math.isnan(model.nll([]))
    assert model.token_nll([]) == []


def test_unseen_in_vocab_token_gets_mass_and_out_of_vocab_is_rejected():
    model = NGramLM(order=3, vocab_size=20, bos_id=18, eos_id=19).fit([np.array([0, 1, 0, 1])])
    nll = model.token_nll([np.array([0, 7, 1])])[0]  # 7 never seen
    assert np.all(np.isfinite(nll))
    assert nll[1] > nll[2]  # the unseen token costs more than a seen one after backing off
    with pytest.raises(ValueError, match="sequence 1 contains id 20"):
        model.token_nll([np.array([0]), np.array([1, 20])])
    with pytest.raises(ValueError, match="BOS"):
        model.token_nll([np.array([18])])
    with pytest.raises(ValueError, match="PAD"):
        NGramLM(vocab_size=5, bos_id=3, eos_id=4, pad_id=0).fit([np.array([1, 0])])
    with pytest.raises(ValueError, match="must differ"):
        NGramLM(vocab_size=5, bos_id=3, eos_id=4, pad_id=3).fit([np.array([1])])
    with pytest.raises(ValueError, match="outside vocab_size"):
        NGramLM(vocab_size=5, bos_id=3, eos_id=4).fit([np.array([7])])


def test_estimator_contract():
    model = NGramLM(order=2, smoothing="add_k", k=2.0)
    assert model.get_params() == {"order": 2, "smoothing": "add_k", "vocab_size": None,
                                  "bos_id": None, "eos_id": None, "pad_id": None, "k": 2.0}
    assert not hasattr(model, "order_")
    with pytest.raises(RuntimeError, match="not fitted"):
        model.nll([np.array([1])])
    seqs = [np.array([0, 1, 2, 1])]
    assert model.fit(seqs) is model
    assert model.score(seqs) == pytest.approx(-model.nll(seqs))
    assert model.get_params()["order"] == 2
    # Appended specials: EOS then BOS after the largest id.
    assert (model.eos_id_, model.bos_id_, model.vocab_size_) == (3, 4, 5)
    with pytest.raises(ValueError, match="smoothing"):
        NGramLM(smoothing="witten_bell").fit(seqs)
    with pytest.raises(ValueError, match="order"):
        NGramLM(order=0).fit(seqs)


def test_meets_sequence_model_protocol():
    model = NGramLM(order=2, vocab_size=6, bos_id=4, eos_id=5).fit([np.array([0, 1, 2, 3])])
    assert isinstance(model, SequenceModel)
    assert model.vocab_size == 6 and model.eos_id == 5


def test_fit_counts_reuses_one_counting_pass():
    seqs = markov_corpus(6, n_seqs=15, vocab=5, max_len=15)
    space = IdSpace(7, 5, 6)
    counts = count_ngrams(seqs, 4, space)
    for order in (1, 2, 3, 4):
        a = NGramLM(order=order, vocab_size=7, bos_id=5, eos_id=6).fit_counts(counts)
        b = NGramLM(order=order, vocab_size=7, bos_id=5, eos_id=6).fit(seqs)
        assert a.nll(seqs) == b.nll(seqs)
    with pytest.raises(ValueError, match="up to order 4"):
        NGramLM(order=5).fit_counts(counts)
    with pytest.raises(ValueError, match="bos_id=4 but the counts were made with 5"):
        NGramLM(order=2, bos_id=4).fit_counts(counts)


def test_longer_context_helps_on_structured_data():
    rng = np.random.default_rng(0)
    pattern = np.array([0, 1, 2, 0, 3, 2])
    seqs = [np.tile(pattern, 5)[int(rng.integers(6)):][:20] for _ in range(50)]
    nll = {o: NGramLM(order=o).fit(seqs).nll(seqs) for o in (1, 2, 3)}
    assert nll[3] < nll[2] < nll[1]


def test_chunked_scoring_equals_one_pass(monkeypatch):
    import models.ngram as ngram_module

    seqs = markov_corpus(7, n_seqs=30, vocab=6, max_len=40)
    model = NGramLM(order=4).fit(seqs)
    whole = model.token_nll(seqs)
    monkeypatch.setattr(ngram_module, "CHUNK_TOKENS", 50)  # many chunks, some one sequence long
    for a, b in zip(model.token_nll(seqs), whole, strict=True):
        np.testing.assert_array_equal(a, b)

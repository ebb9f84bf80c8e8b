"""The transformer scorer: the scoring protocol's target count, sliding windows, batching,
next-id distributions, conditions, and a saved model loaded as a ``SequenceModel``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.base import SequenceModel
from models.transformer import GPT, TransformerConfig, save_model
from pipeline.inference.scorer import TransformerScorer, load_scorer
from tests.models.test_transformer import BOS, EOS, PAD, T, V, _model, _trained


def _cfg(**kw) -> TransformerConfig:
    return TransformerConfig(vocab_size=16, max_seq_len=16, n_layer=1, n_head=2, n_embd=16, **kw)


def _scorer(stride=None, batch_size=32) -> TransformerScorer:
    return TransformerScorer(_trained(), bos_id=BOS, eos_id=EOS, pad_id=PAD, stride=stride,
                             batch_size=batch_size)


def _brute_nll(sc: TransformerScorer, seq: np.ndarray) -> np.ndarray:
    """Every target with the longest possible left context, one forward per target."""
    full = np.concatenate([[BOS], seq, [EOS]])
    return np.array([-_lp(sc, full[max(0, i - T) : i])[full[i]] for i in range(1, len(full))])


def _lp(sc: TransformerScorer, window: np.ndarray) -> np.ndarray:
    return sc._logprobs([window])[0, len(window) - 1].double().numpy()


def test_token_nll_counts_and_short_sequences():
    sc = _scorer()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, V, n) for n in (0, 1, 5, T - 1)]
    out = sc.token_nll(seqs)
    assert [len(o) for o in out] == [1, 2, 6, T]
    for s, o in zip(seqs, out, strict=True):
        assert np.allclose(o, _brute_nll(sc, s), atol=1e-5)
    assert all(np.all(o > 0) for o in out)


@pytest.mark.parametrize("stride", [1, 4, T], ids=lambda s: f"stride{s}")
def test_sliding_windows_score_each_target_once(stride):
    sc = _scorer(stride=stride, batch_size=3)
    seq = np.random.default_rng(1).integers(3, V, 3 * T + 5)
    nll = sc.token_nll([seq])[0]
    assert nll.shape == (len(seq) + 1,)
    brute = _brute_nll(sc, seq)
    # the first window is exact; with stride 1 every target has the full context
    assert np.allclose(nll[:T], brute[:T], atol=1e-5)
    if stride == 1:
        assert np.allclose(nll, brute, atol=1e-5)
    else:
        assert not np.allclose(nll, brute, atol=1e-5)  # shorter contexts do change values


def test_batching_does_not_change_scores():
    rng = np.random.default_rng(2)
    seqs = [rng.integers(3, V, n) for n in (3, 40, 17, 0, 90)]
    a = _scorer(batch_size=1).token_nll(seqs)
    b = _scorer(batch_size=64).token_nll(seqs)
    assert all(np.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_next_logprobs_is_a_distribution_consistent_with_token_nll():
    sc = _scorer()
    seq = np.random.default_rng(3).integers(3, V, 10)
    lp = sc.next_logprobs([seq[:k] for k in range(6)])
    assert lp.shape == (6, V)
    assert np.allclose(np.exp(lp).sum(axis=1), 1.0)
    assert np.all(np.isneginf(lp[:, BOS])) and np.all(np.isneginf(lp[:, PAD]))
    nll = sc.token_nll([seq])[0]
    assert np.allclose(-lp[np.arange(6), seq[:6]], nll[:6], atol=1e-5)
    # contexts longer than max_seq_len keep their last tokens
    long = np.random.default_rng(4).integers(3, V, 3 * T)
    assert np.allclose(sc.next_logprobs([long])[0], _lp(sc, long[-T:]), atol=1e-6)


def test_load_scorer_reads_a_saved_model_as_a_sequence_model(tmp_path):
    m = _trained()
    condition = {"names": ["key"], "vocab_hash": "h"}
    save_model(tmp_path, m, {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "vocab_size": V,
                             "condition": condition})
    sc = load_scorer(tmp_path, stride=5)
    assert isinstance(sc, SequenceModel) and sc.vocab_size == V and sc.eos_id == EOS
    assert (sc.bos_id, sc.pad_id, sc.stride, sc.condition) == (BOS, PAD, 5, condition)
    assert not sc.model.training
    seq = np.arange(3, 20)
    assert np.allclose(sc.token_nll([seq])[0], TransformerScorer(
        m, bos_id=BOS, eos_id=EOS, pad_id=PAD, stride=5).token_nll([seq])[0], atol=1e-6)
    with pytest.raises(FileNotFoundError, match="train-transformer"):
        load_scorer(tmp_path / "missing")


def test_bad_arguments_are_refused_naming_the_limit():
    m = _model()
    assert TransformerScorer(m, bos_id=BOS, eos_id=EOS, pad_id=PAD).stride == T // 4
    with pytest.raises(ValueError, match=r"stride=17 must be in 1\.\.max_seq_len=16"):
        TransformerScorer(m, bos_id=BOS, eos_id=EOS, pad_id=PAD, stride=T + 1)
    sc = TransformerScorer(m, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match=r"sequence 1: ids outside 0\.\.39"):
        sc.token_nll([np.array([3, 4]), np.array([5, V])])
    with pytest.raises(ValueError, match="ids outside"):
        sc.token_nll([np.array([-1])])
    assert sc.next_logprobs([]).shape == (0, V)


def test_without_pad_only_bos_leaves_the_support():
    sc = TransformerScorer(_trained(), bos_id=BOS, eos_id=EOS, pad_id=None)
    lp = sc.next_logprobs([np.array([5, 6]), np.array([], dtype=np.int64)])
    assert np.all(np.isneginf(lp[:, BOS])) and np.all(np.isfinite(lp[:, PAD]))
    assert np.allclose(np.exp(lp).sum(axis=1), 1.0)


def test_scorer_keeps_the_protocols_target_count_under_conditions():
    model = GPT(_cfg(cond_slot_sizes=(3, 2)), torch.Generator().manual_seed(0))
    with torch.no_grad():  # as if trained: conditions move the predictions
        model.wce.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    scorer = TransformerScorer(model, bos_id=BOS, eos_id=EOS, pad_id=PAD, stride=4)
    seqs = [np.array([5, 6, 7]), np.arange(3, 15) % 13 + 3]  # the second needs windows
    conds = np.array([[1, 4], [2, 3]])
    out = scorer.token_nll(seqs, conds=conds)
    assert [len(o) for o in out] == [4, 13]
    assert not np.allclose(out[0], scorer.token_nll(seqs, conds=np.array([[2, 4], [2, 3]]))[0])
    with pytest.raises(ValueError, match="expected \\(2, 2\\)"):
        scorer.token_nll(seqs, conds=np.array([[1], [2]]))
    plain = TransformerScorer(GPT(_cfg(), torch.Generator().manual_seed(0)), bos_id=BOS,
                              eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError, match="without conditions"):
        plain.token_nll(seqs, conds=conds)


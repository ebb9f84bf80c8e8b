"""Step symbols of compound tokens: exact, dense, deterministic (pipeline.audit.compound)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audit.compound import StepSymbols, SymbolTokenizer
from pipeline.audit.memorisation import SuffixIndex

SIZES = (6, 7, 9)


def _steps(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, k, n) for k in SIZES], axis=1)


def test_symbols_decode_back_to_their_steps_and_never_collide():
    seqs = [_steps(s, 40) for s in range(3)]
    symbols = StepSymbols(SIZES).fit(seqs)
    values = np.unique(np.concatenate([symbols.value(s) for s in seqs]))
    assert len(symbols) == len(values)  # one symbol per distinct step
    for s in seqs:
        np.testing.assert_array_equal(symbols.decode(symbols.encode(s)), s)
    one, other = seqs[0][:1].copy(), seqs[0][:1].copy()
    other[0, 2] = (other[0, 2] + 1) % SIZES[2]  # differs in one codebook only
    assert symbols.encode(one, unknown=-1)[0] != symbols.encode(other, unknown=-1)[0]


def test_symbols_follow_the_steps_not_the_input_order():
    seqs = [_steps(s, 30) for s in range(3)]
    a = StepSymbols(SIZES).fit(seqs)
    b = StepSymbols(SIZES).fit(seqs[::-1])
    assert [a.encode(s).tolist() for s in seqs] == [b.encode(s).tolist() for s in seqs]


def test_an_unseen_step_is_unknown_or_an_error():
    symbols = StepSymbols(SIZES).fit([np.asarray([[1, 2, 3]])])
    assert symbols.encode(np.asarray([[1, 2, 3], [1, 2, 4]]), unknown=-1).tolist() == [0, -1]
    with pytest.raises(ValueError, match="outside the fitted symbols"):
        symbols.encode(np.asarray([[1, 2, 4]]))


def test_a_shared_run_of_steps_is_a_shared_span_of_symbols():
    train = _steps(0, 50)
    query = np.concatenate([_steps(1, 5), train[10:22], _steps(2, 5)])
    symbols = StepSymbols(SIZES).fit([train, query])
    match, _ = SuffixIndex().fit([symbols.encode(train)]).longest_match(symbols.encode(query))
    assert match.length >= 12 and match.seq_offset <= 10


def test_the_symbol_tokenizer_reads_every_step_as_one_whole_token():
    from miditok import TokSequence

    tok = SymbolTokenizer(object(), StepSymbols(SIZES).fit([_steps(0, 5)]))
    seq = TokSequence(ids=[0, 1, 2])
    tok.complete_sequence(seq)
    assert seq.tokens == ["Step"] * 3 and not tok.is_multi_voc and tok.one_token_stream

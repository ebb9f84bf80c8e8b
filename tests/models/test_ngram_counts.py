"""models.ngram_counts: the id space fixed before fitting, sequences validated, and every n-gram
counted, with its left extensions, against a plain Counter over the same sequences."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.ngram_counts import (
    IdSpace,
    as_id_arrays,
    build_stream,
    count_ngrams,
    level_ids,
    lookup,
    resolve_id_space,
    sort_with_order,
)

SPACE = IdSpace(vocab_size=8, bos_id=6, eos_id=7, pad_id=0)


def grams(seqs, space: IdSpace, n: int) -> Counter:
    """Every n-gram of every ``BOS x.. EOS`` stream, none crossing a sequence boundary."""
    out: Counter = Counter()
    for s in seqs:
        stream = [space.bos_id, *map(int, s), space.eos_id]
        out.update(tuple(stream[i:i + n]) for i in range(len(stream) - n + 1))
    return out


def tokens_of(counts, n: int, row: int) -> tuple[int, ...]:
    """The n-gram at ``row`` of level ``n``, read back through its prefix rows."""
    if n == 1:
        return (int(counts.keys[0][row]),)
    return (*tokens_of(counts, n - 1, int(counts.contexts(n)[row])), int(counts.words(n)[row]))


corpora = st.lists(st.lists(st.integers(1, 5), max_size=12), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(corpus=corpora, order=st.integers(1, 5))
def test_counts_equal_a_plain_counter(corpus, order):
    seqs = as_id_arrays(corpus, SPACE)
    counts = count_ngrams(seqs, order, SPACE)
    assert counts.n_sequences == len(seqs)
    assert counts.n_targets == sum(len(s) + 1 for s in seqs)  # each id, then EOS
    assert counts.raw[0].tolist() == [grams(seqs, SPACE, 1)[(t,)] for t in range(8)]
    for n in range(1, order + 1):
        want = grams(seqs, SPACE, n)
        keys = counts.keys[n - 1]
        assert (np.diff(keys) > 0).all()  # sorted, distinct: a context's block is contiguous
        found = {tokens_of(counts, n, r): int(c) for r, c in enumerate(counts.raw[n - 1])
                 if c > 0}
        assert found == dict(want)
        starts = [tokens_of(counts, n, r)[0] == SPACE.bos_id for r in range(len(keys))]
        assert counts.bos_start[n - 1].tolist() == starts
        if n < order:  # N1+(• g): distinct ids seen just before the n-gram
            longer = grams(seqs, SPACE, n + 1)
            left = Counter(g[1:] for g in longer)
            assert {tokens_of(counts, n, r): int(x) for r, x in
                    enumerate(counts.left_ext[n - 1]) if x} == dict(left)
    assert counts.left_ext[-1] is None


def test_level_ids_find_the_n_gram_ending_at_each_position():
    seqs = as_id_arrays([[1, 2, 1, 2], [2, 1]], SPACE)
    counts = count_ngrams(seqs, 3, SPACE)
    tok, pos = build_stream(seqs, SPACE)
    ids = level_ids(counts.keys, tok, pos, SPACE.vocab_size)
    for n, rows in enumerate(ids, start=1):
        for i, row in enumerate(rows.tolist()):
            if pos[i] < n - 1:
                assert row == -1  # too close to its BOS
            else:
                assert tokens_of(counts, n, row) == tuple(tok[i - n + 1:i + 1].tolist())


def test_the_stream_restarts_its_positions_at_each_bos():
    tok, pos = build_stream([np.array([3, 4]), np.array([], np.int64), np.array([5])], SPACE)
    assert tok.tolist() == [6, 3, 4, 7, 6, 7, 6, 5, 7]
    assert pos.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2]
    tok, pos = build_stream([], SPACE)
    assert tok.size == pos.size == 0


def test_the_id_space_keeps_given_ids_and_appends_missing_specials():
    seqs = [np.array([0, 4, 2])]
    assert resolve_id_space(seqs, None, None, None) == IdSpace(7, bos_id=6, eos_id=5)
    assert resolve_id_space(seqs, 10, 8, 9, 1) == IdSpace(10, 8, 9, 1)
    assert resolve_id_space([], None, 3, None) == IdSpace(5, bos_id=3, eos_id=4)
    with pytest.raises(ValueError, match="token id 4 is outside vocab_size=4"):
        resolve_id_space(seqs, 4, None, None)
    with pytest.raises(ValueError, match=r"eos_id=12 is outside the vocabulary \[0, 10\)"):
        resolve_id_space(seqs, 10, 8, 12)
    with pytest.raises(ValueError, match="must differ, got 8, 8, None"):
        resolve_id_space(seqs, 10, 8, 8)
    assert SPACE.n_targetable == 6 and SPACE.never_targets() == [6, 0]
    assert IdSpace(5, 3, 4).n_targetable == 4 and IdSpace(5, 3, 4).never_targets() == [3]


@pytest.mark.parametrize(("seqs", "message"), [
    ([[1, 2], [3, 8]], "sequence 1 contains id 8"),
    ([[1], [], [-1]], "sequence 2 contains id -1"),
    ([[6]], "sequence 0 contains id 6"),  # BOS
    ([[1, 7]], "sequence 0 contains id 7"),  # EOS
    ([[2, 0]], "sequence 0 contains id 0"),  # PAD
])
def test_a_bad_id_names_its_sequence(seqs, message):
    with pytest.raises(ValueError, match=message):
        as_id_arrays(seqs, SPACE)


def test_valid_sequences_become_flat_int64_arrays():
    out = as_id_arrays([[1, 2], (3,), np.array([[4, 5]], np.int8)], SPACE)
    assert [a.tolist() for a in out] == [[1, 2], [3], [4, 5]]
    assert all(a.dtype == np.int64 for a in out)
    assert as_id_arrays([], SPACE) == []


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 2**40), min_size=2, max_size=50), huge=st.booleans())
def test_sort_with_order_packed_or_not(values, huge):
    """Values and their index packed in 63 bits, or, with no room for the index, argsort."""
    a = np.array(values, np.int64) << (20 if huge else 0)
    bound = 2**61 if huge else 2**40 + 1
    got, order = sort_with_order(a, bound)
    np.testing.assert_array_equal(got, np.sort(a))
    np.testing.assert_array_equal(a[order], got)


def test_lookup_gives_rows_or_minus_one():
    keys = np.array([2, 5, 9, 40], np.int64)
    queries = np.array([40, 3, 2, 99, 9, 0], np.int64)
    assert lookup(keys, queries).tolist() == [3, -1, 0, -1, 2, -1]
    assert lookup(keys[:0], queries).tolist() == [-1] * 6
    assert lookup(keys, queries[:0]).tolist() == []

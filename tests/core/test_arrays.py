"""pipeline.core.arrays: the sort-based unique equals numpy's; lex_order equals np.lexsort."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.arrays import isin, lex_order, unique


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
       st.sampled_from(["int64", "uint64", "int8", "bool"]))
def test_unique_equals_numpy(values, dtype):
    a = np.asarray(values, dtype=np.int64 if dtype != "uint64" else object)
    a = (a % 2**64).astype(np.uint64) if dtype == "uint64" else a.astype(dtype)
    got = unique(a)
    want = np.unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_unique_flattens_and_refuses_floats():
    np.testing.assert_array_equal(unique(np.array([[3, 1], [3, 2]])), [1, 2, 3])
    with pytest.raises(TypeError, match="integer or boolean"):
        unique(np.array([1.0, np.nan, np.nan]))


KEY = st.tuples(st.sampled_from(["int64", "uint64", "int16", "bool"]),
                st.sampled_from([1, 3, 2**40, 2**63]))


@settings(max_examples=150, deadline=None)
@given(st.lists(KEY, min_size=1, max_size=5), st.integers(0, 30), st.integers(0, 2**32 - 1))
def test_lex_order_equals_lexsort(kinds, n, seed):
    """Packed when the keys' ranges fit 64 bits together, np.lexsort otherwise: the same stable
    permutation either way (narrow keys make ties; wide and extreme ones the fallback)."""
    rng = np.random.default_rng(seed)
    keys = []
    for dtype, span in kinds:
        if dtype == "bool":
            keys.append(rng.integers(0, 2, n).astype(bool))
        elif dtype == "uint64":
            keys.append(rng.integers(0, min(span, 2**63), n, dtype=np.uint64) * np.uint64(2))
        elif dtype == "int16":
            keys.append(rng.integers(-min(span, 2**15), min(span, 2**15), n).astype(np.int16))
        else:
            keys.append(rng.integers(-span, span - 1, n, dtype=np.int64))
    got = lex_order(*keys)
    assert got.dtype == np.intp
    np.testing.assert_array_equal(got, np.lexsort(keys[::-1]))


def test_lex_order_extremes_and_refusals():
    full = np.array([2**63 - 1, -(2**63), 0, -1, 2**63 - 1], np.int64)  # a 64-bit range
    np.testing.assert_array_equal(lex_order(full), [1, 3, 2, 0, 4])
    np.testing.assert_array_equal(lex_order(np.array([2, 1, 2]), np.array([1, 0, 0])), [1, 2, 0])
    assert lex_order(np.zeros(0, int)).size == 0
    with pytest.raises(TypeError, match="integer or boolean"):
        lex_order(np.array([1.0, 0.5]))
    with pytest.raises(ValueError, match="equal length"):
        lex_order(np.arange(3), np.arange(2))


@given(st.lists(st.sampled_from(["a", "b", "c", "dé", ""]), max_size=20),
       st.lists(st.sampled_from(["a", "c", "dé", "x"]), max_size=6))
@settings(max_examples=50, deadline=None)
def test_isin_equals_pandas(values, allowed):
    want = pd.Series(values, dtype=object).isin(allowed).to_numpy()
    for v in (values, pd.Series(values, dtype="string[pyarrow]"), np.array(values, dtype=object)):
        for a in (allowed, set(allowed), pd.Series(allowed, dtype="string[pyarrow]")):
            got = isin(v, a)
            assert got.dtype == bool and got.tolist() == want.tolist()


def test_list_array_rows_and_chunks():
    import pyarrow as pa

    from pipeline.core.arrays import list_array

    type_ = pa.list_(pa.int32())
    parts = [np.arange(n, dtype=np.int32) + n for n in (3, 0, 5, 2, 7)]
    want = [p.tolist() for p in parts]
    whole = list_array(parts, type_)
    assert isinstance(whole, pa.Array) and whole.type == type_ and whole.to_pylist() == want
    chunked = list_array(parts, type_, limit=6)  # 3+0 | 5 | 2 | 7 (one row above the limit)
    assert [len(c) for c in chunked.chunks] == [2, 1, 1, 1]
    assert chunked.to_pylist() == want
    assert list_array([], type_).to_pylist() == []


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60), st.booleans(),
       st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_unique_inverse_equals_numpy(values, unsigned, repeat):
    from pipeline.core.arrays import unique_inverse

    a = np.array(values * (repeat + 1), np.int64)
    if unsigned:
        a = a.view(np.uint64)
    want = np.unique(a, return_inverse=True)
    got = unique_inverse(a)
    assert got[0].dtype == a.dtype and got[1].dtype == want[1].dtype
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)


def test_unique_inverse_on_many_hashes():
    from pipeline.core.arrays import unique_inverse

    rng = np.random.default_rng(5)
    distinct = rng.integers(0, 2**63, 50_000, dtype=np.uint64) << np.uint64(1)
    a = distinct[rng.integers(0, distinct.size, 200_000)]
    for x, y in zip(unique_inverse(a), np.unique(a, return_inverse=True), strict=True):
        np.testing.assert_array_equal(x, y)
    text = np.array(["b", "a", "b"])  # other dtypes: numpy's own
    assert unique_inverse(text)[1].tolist() == [1, 0, 1]

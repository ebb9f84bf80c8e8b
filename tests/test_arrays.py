"""pipeline.core.arrays: the sort-based unique equals numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.arrays import unique


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

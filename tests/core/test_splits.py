"""pipeline.core.splits: the unit hash that assigns groups, and the hash that names a split."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.splits import (
    SPLIT_NAMES,
    SPLITS_SCHEMA,
    split_hash,
    split_hash_of,
    unit_hash,
    unit_hashes,
)


def test_unit_hash_is_the_documented_digest():
    digest = hashlib.sha256(b"7\x00split\x00group-1").digest()
    assert unit_hash(7, "group-1") == int.from_bytes(digest[:8], "big") / 2.0**64
    assert unit_hash(7, "group-1", salt="audit") != unit_hash(7, "group-1")
    assert unit_hash(8, "group-1") != unit_hash(7, "group-1")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), keys=st.lists(st.text(max_size=12), max_size=20),
       salt=st.sampled_from(["split", "audit", ""]))
def test_unit_hashes_are_each_key_s_unit_hash_in_zero_one(seed, keys, salt):
    got = unit_hashes(seed, keys, salt)
    assert got.dtype == np.float64 and got.shape == (len(keys),)
    assert got.tolist() == [unit_hash(seed, k, salt) for k in keys]
    assert ((got >= 0) & (got < 1)).all()


def test_unit_hash_spreads_keys_evenly():
    u = unit_hashes(1234, (f"g{i}" for i in range(4000)), "split")
    counts = np.histogram(u, bins=4, range=(0, 1))[0]
    assert counts.min() > 900 and counts.max() < 1100  # 1000 each, give or take 3 sd


def test_split_hash_depends_on_content_only():
    t = pd.DataFrame({"sha256": ["b", "a", "c"], "split": ["train", "test", "val"]})
    assert split_hash(t["sha256"], t["split"]) == split_hash(t["sha256"][::-1], t["split"][::-1])
    assert split_hash(t["sha256"], t["split"]) != split_hash(t["sha256"], ["train", "val", "test"])


def test_split_hash_is_the_sha256_of_the_sorted_lines():
    want = hashlib.sha256(b"a\ttest\nb\ttrain\n").hexdigest()
    assert split_hash(["b", "a"], ["train", "test"]) == want
    assert split_hash([], []) == hashlib.sha256(b"").hexdigest()
    with pytest.raises(ValueError):  # a piece without a split is a bug, not a shorter hash
        split_hash(["a", "b"], ["train"])


def test_split_hash_of_reads_a_split_report():
    assert split_hash_of({"split_hash": "ab" * 32, "n": 3}) == "ab" * 32
    for report in ({}, {"split_hash": None}, {"split_hash": 5}, [], None, "ab"):
        assert split_hash_of(report) is None


def test_the_splits_table_schema():
    assert SPLIT_NAMES == ("train", "val", "test")
    assert SPLITS_SCHEMA.names == ["sha256", "group_id", "split", "fold"]
    assert str(SPLITS_SCHEMA.field("fold").type) == "int16"

"""The entry format (pipeline.tokens.entries): pack and unpack, a block of entries parsed at once
as unpack reads each, damaged entries refused, and the F1 of round-trip counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokens.entries import (
    FORMAT,
    HEADER,
    Encoding,
    entry_ok,
    f1_from_counts,
    pack,
    unpack,
)
from tests.tokens._encodings import assert_same, seq


@pytest.mark.parametrize("enc", [
    Encoding(n_notes_input=7, seqs=(seq(-1, 40),)),
    Encoding(n_notes_input=9, seqs=(seq(0, 10), seq(1, 0), seq(2, 33, 1))),
    Encoding(n_notes_input=3, seqs=(), out_of_range=True),
    Encoding(n_notes_input=9, seqs=(seq(-1, 21),), truncated_bars=True),
    Encoding(n_notes_input=3, seqs=(), out_of_range=True, truncated_bars=True),
], ids=["one-stream", "per-track", "out-of-range", "truncated-bars", "both-flags"])
def test_pack_roundtrip(enc):
    arr = pack(enc)
    assert arr.dtype == np.int32
    assert_same(unpack(arr), enc)
    with pytest.raises(ValueError):
        unpack(arr[:-1] if len(arr) > 4 else np.append(arr, 1).astype(np.int32))


def test_f1_from_counts():
    assert f1_from_counts(3, 3, 3) == 1.0
    assert f1_from_counts(0, 0, 0) == 1.0
    assert f1_from_counts(1, 2, 2) == 0.5
    assert np.isnan(f1_from_counts(-1, 3, 3))


def unpacks(a: np.ndarray) -> bool:
    """Whether :func:`unpack` accepts ``a``."""
    try:
        unpack(a)
    except ValueError:
        return False
    return True


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 9), max_size=3), st.booleans(),
                          st.sampled_from(["ok", "short", "long", "magic", "negative", "dtype"])),
                max_size=6))
def test_block_reads_entries_as_unpack_does(entries):
    """A block of packed entries gives back each entry as packed; a damaged entry (truncated,
    extended, wrong magic, a negative length with the same total, wrong dtype) is refused by
    :func:`entries_ok`, :func:`unpack` and :func:`parse_block`, which names it."""
    from pipeline.tokens.entries import BadEntry, entries_ok, parse_block

    arrays, encodings = [], []
    for lengths, out_of_range, damage in entries:
        enc = Encoding(n_notes_input=len(lengths), out_of_range=out_of_range,
                       seqs=tuple(seq(k, n, k) for k, n in enumerate(lengths)))
        arr = pack(enc)
        if damage == "short":
            arr = arr[:-1]
        elif damage == "long":
            arr = np.append(arr, 7).astype(np.int32)
        elif damage == "magic":
            arr = arr.copy()
            arr[0] += 1
        elif damage == "negative" and lengths:  # a negative length, the same total
            arr = arr.copy()
            arr[HEADER + 4] -= lengths[0] + 1
            arr[HEADER + 5] += lengths[0] + 1
        elif damage == "dtype":
            arr = arr.astype(np.int64)
        arrays.append(arr)
        encodings.append(enc)

    ok = [damage == "ok" or (damage == "negative" and not lengths)
          for lengths, _, damage in entries]
    assert entries_ok(arrays).tolist() == ok == [unpacks(a) for a in arrays]
    keys = [(f"{k:064x}", 0) for k in range(len(arrays))]
    if all(ok):
        block = parse_block(keys, arrays)
        for e, (arr, enc) in enumerate(zip(arrays, encodings, strict=True)):
            assert_same(block.encoding(e), unpack(arr))
            assert_same(block.encoding(e), enc)
    else:
        with pytest.raises(BadEntry) as bad:
            parse_block(keys, arrays)
        assert not ok[bad.value.index]


@pytest.mark.parametrize("arr", [
    np.zeros(0, np.int32), np.array([FORMAT, 0, 1], np.int32), np.array([1, 0, 0, 0], np.int32),
    np.array([FORMAT, -1, 0, 0], np.int32), np.array([FORMAT, 5, 0, 0], np.int32),
    np.array([FORMAT, 0, 0, 0], np.int64), np.array([FORMAT, 0, 3, 0], np.int32),
], ids=["empty", "short", "magic", "negative", "too-many", "dtype", "empty-ok"])
def test_entry_ok_agrees_with_unpack(arr):
    valid = arr.dtype == np.int32 and arr.tolist() == [FORMAT, 0, 3, 0]  # only "empty-ok"
    assert entry_ok(arr) == unpacks(arr) == valid
    good = pack(Encoding(n_notes_input=9, seqs=(seq(0, 10), seq(1, 0), seq(2, 33, 1))))
    assert entry_ok(good) and unpacks(good)
    for bad in (good[:-1], np.append(good, 0).astype(np.int32)):
        assert not entry_ok(bad) and not unpacks(bad)
    negative = good.copy()
    negative[HEADER + 4], negative[HEADER + 5] = -1, negative[HEADER + 5] + 1  # same total
    assert not entry_ok(negative) and not unpacks(negative)


def test_a_block_names_the_entry_it_refuses_and_views_the_ids_it_holds():
    from pipeline.tokens.entries import BadEntry, parse_block

    good = pack(Encoding(n_notes_input=4, seqs=(seq(0, 6), seq(1, 3, 1))))
    with pytest.raises(BadEntry, match=r"^entry 2 is not a token cache entry") as bad:
        parse_block([], [good, good, good[:-1], good[:-1]])
    assert bad.value.index == 2
    block = parse_block([("a" * 64, 0), ("b" * 64, 2)], [good, good])
    assert block.first_seq.tolist() == [0, 2, 4]
    assert block.n_input.tolist() == [4, 4] and block.out_of_range.tolist() == [False, False]
    ids = block.ids(3)  # the second sequence of the second entry
    np.testing.assert_array_equal(ids, seq(1, 3, 1).ids)
    assert np.shares_memory(ids, block.flat)
    assert block.sequence(3).roundtrip_f1 == 1.0

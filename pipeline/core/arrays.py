"""Array helpers the data stages share.

:func:`unique` exists because numpy 2.3+ answers ``np.unique(a)`` (no ``return_*`` flags) with a
hash table and then sorts the result: on 10 million uint64 values that took 12 s here against
0.17 s for a sort and a comparison of neighbours. The dedupe stage's winnowing made three such
calls per 20,000 pieces: 6.4 of its 27.7 s there.

:func:`isin` exists because pandas' ``Series.isin`` on Arrow-backed strings (what pandas reads
from Parquet here) builds a pyarrow scalar for every value looked for: 0.48 s for 100,000 sha256
against 0.02 s for Arrow's own hash set, and the split stage made up to eight such calls per run.

:func:`unique_inverse` exists because ``np.unique(..., return_inverse=True)`` sorts indirectly
(``argsort``), about twice the time of a plain sort and a binary search on 64-bit hashes: the
split stage numbers the shingles of every piece this way (8.1 of a 25 s re-run at 100k pieces).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def isin(values: Iterable[str], allowed: Iterable[str]) -> np.ndarray:
    """Whether each of ``values`` (strings: a Series, an array or a list) is one of ``allowed``,
    as a numpy bool array (``pd.Series.isin``, without its cost on Arrow-backed strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def strings(x: Iterable[str]) -> pa.Array:
        if isinstance(x, set | frozenset) or not hasattr(x, "__len__"):
            x = list(x)
        return pa.array(x, pa.large_string())

    found = pc.is_in(strings(values), value_set=strings(allowed))
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)


def unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer or boolean array (``np.unique(values)``, by
    sorting)."""
    a = np.asarray(values).ravel()
    if a.dtype.kind not in "biu":
        raise TypeError(f"unique: integer or boolean values only, got dtype {a.dtype}")
    s = np.sort(a)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def lex_order(*keys: np.ndarray) -> np.ndarray:
    """The stable order of rows by integer (or boolean) keys, the first one primary: the same
    permutation as ``np.lexsort(keys[::-1])``.

    When the keys' ranges fit 64 bits together they are packed into one uint64 (each less its
    minimum) and sorted once, stably. ``np.lexsort`` makes one indirect merge sort per key;
    measured here, packing included, it was 2.4-2.6x slower on four random keys (36,000 to 3 M
    rows) and about 7x on the notes of 64 small MIDI files (37,000 notes, four keys: 4.9 ms
    against 0.66-1.09 ms), which arrive almost in time order (a stable sort of one key runs
    through such presorted stretches fast). Keys too wide to pack fall back to ``np.lexsort``."""
    if not keys:
        raise TypeError("lex_order: at least one key")
    arrays = [np.asarray(k) for k in keys]
    n = arrays[0].size
    for a in arrays:
        if a.ndim != 1 or a.size != n:
            raise ValueError("lex_order: keys must be 1-D and of equal length")
        if a.dtype.kind not in "biu":
            raise TypeError(f"lex_order: integer or boolean keys only, got dtype {a.dtype}")
    if n < 2:
        return np.arange(n, dtype=np.intp)
    lows = [int(a.min()) for a in arrays]
    widths = [(int(a.max()) - lo).bit_length() for a, lo in zip(arrays, lows, strict=True)]
    if sum(widths) > 64:
        return np.lexsort(arrays[::-1])
    packed = np.zeros(n, np.uint64)
    for a, lo, width in zip(arrays, lows, widths, strict=True):
        if width:  # wrapping uint64 arithmetic: a - lo exactly, as it lies in [0, 2**width)
            packed <<= np.uint64(width)
            packed |= a.astype(np.uint64) - np.uint64(lo % 2**64)
    return np.argsort(packed, kind="stable")


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for a 1-D array of 64-bit integers, without
    its indirect sort (on 30 million uint64 hashes here: 7.2 s, against 3.4 s this way): the
    distinct values from a plain sort, and each value's rank by a binary search among them.
    The searches are made in nearly sorted order (each value's top bits packed with its
    position and sorted plainly), which keeps them in cache; the order only changes the speed,
    never a rank. Other arrays go to ``np.unique``."""
    a = np.asarray(values)
    if a.ndim != 1 or a.dtype not in (np.dtype(np.uint64), np.dtype(np.int64)) or a.size < 2:
        return np.unique(a, return_inverse=True)
    uniq = unique(a)
    low = np.uint64((1 << int(a.size - 1).bit_length()) - 1)
    order = (a.view(np.uint64) & ~low) | np.arange(a.size, dtype=np.uint64)
    order.sort()
    at = (order & low).astype(np.intp)
    del order
    inverse = np.empty(a.size, np.intp)
    inverse[at] = np.searchsorted(uniq, a[at])
    return uniq, inverse


def list_array(parts: list[np.ndarray], type_: object,
               limit: int = int(np.iinfo(np.int32).max)) -> object:
    """An Arrow list column (``type_``: ``pa.list_(...)``) with one row per array of ``parts``,
    from one concatenation and its offsets: converting a list of arrays row by row cost seconds
    per 100,000 rows. Chunked so that no chunk holds more than ``limit`` values (the type's
    32-bit offsets) unless one row alone does."""
    import pyarrow as pa

    lengths = np.fromiter((len(p) for p in parts), np.int64, len(parts))
    chunks, start = [], 0
    while start < len(parts) or not chunks:
        ends = np.cumsum(lengths[start:])
        stop = min(len(parts), start + max(1, int(np.searchsorted(ends, limit, side="right"))))
        offsets = np.concatenate([[0], ends[: stop - start]])
        values = np.concatenate(parts[start:stop]) if stop > start else np.zeros(0, np.int64)
        chunks.append(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                               pa.array(values, type_.value_type), type=type_))
        start = stop
    return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, type_)

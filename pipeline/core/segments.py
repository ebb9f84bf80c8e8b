"""Append-only Parquet segment stores: the per-item caches under ``.cache/``.

A store keeps rows keyed by one string column in a folder of ``seg-<hash>.parquet`` files. Each
run that computed something appends one segment (written atomically); once there are more than
``max_segments`` they are merged into one. A segment that cannot be read, or has another
layout, is ignored, so the folder can be deleted, or lose files, at any time: a store only ever
saves time. Nothing in it can hold a pickle. The folder's name is the caller's: it carries a
hash of everything the rows depend on besides their key (settings, code, library versions), so a
store is never read under other conditions.

Used by the ingest stage (per-file results by sha256), the dedupe stage (near-duplicate verdicts
by the note digests of a pair of pieces; per-piece fingerprints by note digest), the split
stage (the leakage audit's per-piece inputs by note digest) and the tokenize stage (per-file
base encodings by sha256 and transposition, :mod:`pipeline.tokens.store`).
:meth:`SegmentStore.lookup` reads the rows of some keys at once (some columns if asked);
:meth:`SegmentStore.take` reads rows a row group at a time as they are needed
(:class:`RowGroups`), for a stage that streams a large store (ingest's cached notes); a segment
gone meanwhile raises :class:`StoreChanged`, and such a stage runs once more
(:func:`rerun_if_store_changed`).

A store too large to merge in memory (the token store: gigabytes at 100,000 pieces, appended a
segment per chunk of files by worker processes) is opened with ``max_segments=None``, adds
segments sorted by key and calls :meth:`SegmentStore.compact` itself, which merges segments of
similar size by streaming them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import math
import os
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core import artifacts
from pipeline.core.row_groups import RowGroups

SEGMENT_OPTIONS = dict(compression="zstd", compression_level=1, use_dictionary=False)
"""zstd 1 without dictionaries: a third of the uncompressed size, fast to read back."""
SEGMENT_ROWS = 1024
"""Rows per row group at most: pyarrow reads row groups in parallel, and a segment written as one
group (671 MB of dedupe's per-piece features at 100,000 pieces) was read on one thread."""


class StoreChanged(Exception):
    """A store's segment no longer reads as it did when the run listed it (deleted, or replaced,
    meanwhile). Stages that read a store as they go run once more when they meet it: the store
    then lists what is there."""


def rerun_if_store_changed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a stage's ``run``: run it once more when it meets :class:`StoreChanged` (its
    outputs are written atomically, so the first attempt leaves none)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StoreChanged:
            return fn(*args, **kwargs)

    return run


class SegmentStore:
    """Rows of ``schema`` keyed by its string column ``key``, in Parquet segments under
    ``folder``, in row groups of ``group_rows`` rows (``SEGMENT_ROWS`` when None). Rows stored
    under one key must be equal (they are results of the same pure function); merging keeps one.
    Segments are merged into one when an add makes more than ``max_segments``; with None they
    are left for :meth:`compact`. The index of keys (:attr:`keys`, :attr:`rows`) is read when
    first used: a process that only adds segments (a worker) never reads it."""

    def __init__(self, folder: Path, schema: pa.Schema, key: str = "sha256",
                 max_segments: int | None = 16, group_rows: int | None = None) -> None:
        self.dir = Path(folder)
        self.schema = schema
        self.key = key
        self.max_segments = max_segments
        self.group_rows = group_rows
        self.segments = self._list()
        self._keys: dict[str, Path] | None = None  # the segment holding each key ...
        self._rows: dict[str, int] | None = None  # ... and its row there
        self._groups = RowGroups()

    def _list(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.parquet")) if self.dir.is_dir() else []

    @property
    def keys(self) -> dict[str, Path]:
        """The segment holding each stored key."""
        if self._keys is None:
            self._read_index()
        return self._keys

    @property
    def rows(self) -> dict[str, int]:
        """Each stored key's row in its segment (:attr:`keys`)."""
        if self._rows is None:
            self._read_index()
        return self._rows

    def _read_index(self) -> None:
        self._keys, self._rows = {}, {}
        for seg in self.segments:
            if (t := self._read(seg, [self.key])) is not None:
                self._index(seg, t.column(0).to_pylist())

    def _index(self, seg: Path, keys: list[str]) -> None:
        if self._keys is None:  # not read yet: it will be read with this segment
            return
        self._keys.update(dict.fromkeys(keys, seg))
        self._rows.update(zip(keys, range(len(keys)), strict=False))

    def refresh(self) -> list[Path]:
        """List the folder again, with the segments other processes added meanwhile (the index is
        read again when next used), and return the segments."""
        self.segments = self._list()
        self._keys = self._rows = None
        return self.segments

    def row_groups(self, seg: Path, columns: list[str] | None = None
                   ) -> Iterator[tuple[int, int, pa.Table]]:
        """(index, first row, rows) of each row group of segment ``seg`` (``columns`` of it, all
        when None), in stored order: none for a segment that cannot be read or has another
        layout, and none after a row group that cannot be read."""
        try:
            with pq.ParquetFile(seg) as f:
                if f.schema_arrow != self.schema:
                    return
                row = 0
                for g in range(f.num_row_groups):
                    table = f.read_row_group(g, columns=columns)
                    yield g, row, table
                    row += table.num_rows
        except (pa.ArrowException, OSError):
            return

    def lookup(self, keys: set[str], columns: list[str] | None = None) -> pa.Table:
        """The stored rows of ``keys``, all columns or ``columns`` (the key among them); a key
        whose segment vanished is missing, one stored twice may come twice, with equal
        values."""
        want = pa.array(sorted(keys), pa.string())
        names = self.schema.names if columns is None else \
            [self.key, *(c for c in columns if c != self.key)]
        parts = []
        for seg in sorted({self.keys[k] for k in keys if k in self.keys}):
            if (t := self._read(seg, None if columns is None else names)) is None:
                continue
            keep = pc.is_in(t[self.key], want)
            parts.append(t if pc.all(keep).as_py() else t.filter(keep))  # all: no copy
        empty = pa.Table.from_batches([], pa.schema([self.schema.field(c) for c in names]))
        return pa.concat_tables([empty, *parts])

    def take(self, keys: Sequence[str], columns: list[str]) -> pa.Table:
        """``columns`` of the stored rows of ``keys`` (each stored), in that order, read a row
        group at a time (:class:`RowGroups`): taking a store's rows in the order it holds them
        reads each row group once and holds a few, not the store. Raises
        :class:`StoreChanged` when a segment no longer reads as it did."""
        parts: list[pa.Table] = []
        run: tuple[pa.Table, list[int]] | None = None
        for k in keys:
            seg = self.keys[k]
            try:
                group, row = self._groups.row(seg, self.rows[k], columns)
            except (pa.ArrowException, OSError, IndexError) as e:
                raise StoreChanged(f"{seg}: changed during the run ({type(e).__name__})") \
                    from None
            if run is not None and run[0] is group:
                run[1].append(row)
                continue
            if run is not None:
                parts.append(_rows_of(*run))
            run = (group, [row])
        if run is not None:
            parts.append(_rows_of(*run))
        empty = pa.Table.from_batches([], pa.schema([self.schema.field(c) for c in columns]))
        return pa.concat_tables([empty, *parts])

    def fill(self, keys: Sequence[str], measure: Callable[[list[str], np.ndarray], pa.Table]
             ) -> tuple[pa.Table, list[str]]:
        """One row per key of ``keys``, in that order: the stored row where there is one, else a
        row of ``measure(new, first)``, which is called once with the distinct keys not stored
        (``new``) and the position of each in ``keys`` (``first``), and whose rows are stored.
        Returns the rows and ``new``."""
        found = self.lookup(set(keys) & self.keys.keys())
        row_of = {k: i for i, k in enumerate(found[self.key].to_pylist())}
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in row_of:
                first.setdefault(k, i)
        new = pa.Table.from_batches([], self.schema)
        if first:
            new = measure(list(first), np.fromiter(first.values(), np.int64, len(first)))
            self.add(new)
        row_of.update({k: found.num_rows + i for i, k in enumerate(first)})
        rows = pa.array([row_of[k] for k in keys], pa.int64())
        return pa.concat_tables([found, new]).take(rows), list(first)

    def add(self, table: pa.Table) -> Path | None:
        """Store new rows as one more segment and return it (None without rows); merge the
        segments when there are many (the segment returned is then merged away)."""
        with self._segment() as out:
            out.put(table)
        self._merge_if_many()
        return out.path

    @contextlib.contextmanager
    def appending(self) -> Iterator[Callable[[pa.Table], None]]:
        """Store rows as they come (``put(table)``, any number of times): one more segment,
        streamed to a temporary file and renamed into place when the block ends without an
        error (none without rows); then the segments are merged when there are many."""
        with self._segment() as out:
            yield out.put
        self._merge_if_many()

    def _merge_if_many(self) -> None:
        if self.max_segments is not None and len(self.segments) > self.max_segments:
            self._merge()

    @contextlib.contextmanager
    def _segment(self) -> Iterator[_SegmentWriter]:
        """A new segment of the rows put (:meth:`_SegmentWriter.put`), in place when the block
        ends without an error; its ``path`` is then set, or stays None when no row was put."""
        out = _SegmentWriter(self)
        try:
            yield out
            out.close()
        finally:
            out.discard()

    def _merge(self) -> None:
        self._groups.clear()  # row groups of segments about to go
        old = list(self.segments)
        parts = [t for seg in old if (t := self._read(seg)) is not None]
        merged = self._write(self._unique(pa.concat_tables(parts)))
        for seg in old:
            if seg != merged:
                seg.unlink(missing_ok=True)
        self.segments = [merged]
        self._keys = self._rows = None  # read from the merged segment when next used

    def _write(self, table: pa.Table) -> Path:
        name = hashlib.sha256("\n".join(table[self.key].to_pylist()).encode()).hexdigest()[:20]
        path = self.dir / f"seg-{name}.parquet"
        with artifacts.atomic_path(path) as tmp:
            pq.write_table(table, tmp, row_group_size=self._rows_per_group(),
                           **SEGMENT_OPTIONS)
        if path not in self.segments:
            self.segments.append(path)
        return path

    def _read(self, path: Path, columns: list[str] | None = None) -> pa.Table | None:
        """A segment, or None when it is unreadable or of another layout. (``ParquetFile``, not
        ``pq.read_table``, which imports pyarrow.dataset and with it pandas.)"""
        try:
            with pq.ParquetFile(path) as f:
                if f.schema_arrow != self.schema:
                    return None
                return f.read(columns=columns)
        except (pa.ArrowException, OSError):
            return None

    def _unique(self, table: pa.Table) -> pa.Table:
        """Rows sorted by key, one per key."""
        table = table.take(pc.sort_indices(table[self.key])).combine_chunks()
        keys = table[self.key].to_pylist()
        keep = np.ones(len(keys), bool)
        keep[1:] = [a != b for a, b in zip(keys[1:], keys[:-1], strict=True)]
        return table if keep.all() else table.filter(pa.array(keep, pa.bool_()))


    def compact(self, fanout: int) -> int:
        """Merge segments of similar size, for a store that adds segments sorted by key and is
        never merged on add (``max_segments=None``): a segment's tier is
        floor(log_fanout(rows)), and once ``fanout`` segments share a tier they are merged into
        one, so a store holds about ``fanout`` segments per tier and each row is rewritten about
        log_fanout(n) times. Segments written meanwhile by other processes count. A merge
        streams its sorted segments (:func:`_merged`), holding a row group of each segment it
        has open. Unreadable segments are deleted, and a key stored twice is kept once, from
        the segment first in name order. Returns the segments removed."""
        self._groups.clear()  # row groups of segments about to go
        sizes: dict[Path, int] = {}
        removed = 0
        for seg in self._list():
            try:
                sizes[seg] = pq.read_metadata(seg).num_rows
            except (pa.ArrowException, OSError):
                seg.unlink(missing_ok=True)
                removed += 1
        while True:
            tiers: dict[int, list[Path]] = {}
            for seg, n in sizes.items():
                tiers.setdefault(int(math.log(max(n, 1), fanout)), []).append(seg)
            full = sorted(t for t, members in tiers.items() if len(members) >= fanout)
            if not full:
                break
            group = sorted(tiers[full[0]])
            with self._segment() as out:
                _merged([self._cursor(seg) for seg in group], self.key, out.put,
                        self._rows_per_group())
            for seg in group:
                del sizes[seg]
                if seg != out.path:
                    seg.unlink(missing_ok=True)
                    removed += 1
            if out.path is not None:
                sizes[out.path] = out.count
        self.segments = sorted(sizes)
        self._keys = self._rows = None
        return removed

    def retain(self, keep: Collection[str]) -> int:
        """Delete every row whose key is not in ``keep``: each segment holding one is rewritten
        without them, streamed a row group at a time (and deleted when nothing is left);
        unreadable segments are deleted. Returns the rows deleted."""
        self._groups.clear()
        removed = 0
        for seg in self._list():
            if (t := self._read(seg, [self.key])) is None:
                seg.unlink(missing_ok=True)
                continue
            dropped = sum(k not in keep for k in t.column(0).to_pylist())
            if not dropped:
                continue
            removed += dropped
            with self._segment() as out:  # streamed, in the segment's order
                for _, _, rows in self.row_groups(seg):
                    mask = [k in keep for k in rows.column(self.key).to_pylist()]
                    out.put(rows.filter(pa.array(mask, pa.bool_())))
            if out.path != seg:
                seg.unlink(missing_ok=True)
        self.refresh()
        return removed

    def _cursor(self, seg: Path) -> _Cursor:
        """A segment to merge, opened when the merge reaches its first key."""
        first = ""  # unreadable or empty: opened first, and gives nothing
        try:
            with pq.ParquetFile(seg) as f:
                if f.num_row_groups and f.schema_arrow == self.schema:
                    keys = f.read_row_group(0, columns=[self.key]).column(0)
                    first = keys[0].as_py() if len(keys) else ""
        except (pa.ArrowException, OSError):
            pass
        return _Cursor(first, lambda: (rows for _, _, rows in self.row_groups(seg)), self.key)

    def _rows_per_group(self) -> int:
        return SEGMENT_ROWS if self.group_rows is None else self.group_rows


class _SegmentWriter:
    """Rows of one new segment of ``store`` (:meth:`SegmentStore._segment`), streamed to a
    temporary file in row groups of the store's size and named by their keys (the same rows
    always give the same name and bytes)."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self.writer: pq.ParquetWriter | None = None
        self.tmp: str | None = None
        self.name = hashlib.sha256()
        self.keys: list[str] = []
        self.count = 0
        self.path: Path | None = None
        self.groups: artifacts.RowGroupBuffer | None = None  # rows go out in whole row groups:
        # put a chunk at a time, they made a row group per chunk (1,562 of 64 rows for the ingest
        # results at 100k, 0.8 s more to read than 98 groups)

    def put(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        store = self.store
        if self.writer is None:
            store.dir.mkdir(parents=True, exist_ok=True)
            fd, self.tmp = tempfile.mkstemp(prefix=".seg-", suffix=".tmp", dir=store.dir)
            os.close(fd)
            self.writer = writer = pq.ParquetWriter(self.tmp, store.schema, **SEGMENT_OPTIONS)
            size = store._rows_per_group()
            self.groups = artifacts.RowGroupBuffer(
                lambda rows: writer.write_table(rows, row_group_size=size), size)
        new = table[store.key].to_pylist()
        self.name.update((("\n" if self.keys else "") + "\n".join(new)).encode())
        self.keys.extend(new)
        self.count += len(new)
        self.groups.put(table.cast(store.schema))

    def close(self) -> None:
        """Write the last rows and rename the file into place."""
        if self.writer is None:
            return
        if self.groups.count:
            self.groups.write(pa.concat_tables(self.groups.pending))
        self.writer.close()
        self.writer = None
        store = self.store
        self.path = store.dir / f"seg-{self.name.hexdigest()[:20]}.parquet"
        os.replace(self.tmp, self.path)
        self.tmp = None
        if self.path not in store.segments:
            store.segments.append(self.path)
        store._index(self.path, self.keys)

    def discard(self) -> None:
        """Remove what an unfinished segment left (nothing once :meth:`close` is done)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.tmp is not None:
            Path(self.tmp).unlink(missing_ok=True)
            self.tmp = None


class _Cursor:
    """A sorted segment being merged: its first key (before it is opened), then its current row
    group (``rows``, ``keys``) and position ``i``."""

    def __init__(self, first: str, open_groups: Callable[[], Iterator[pa.Table]],
                 key: str) -> None:
        self.first, self.open_groups, self.key = first, open_groups, key
        self.groups: Iterator[pa.Table] | None = None
        self.rows: pa.Table | None = None
        self.keys: list[str] = []
        self.i = 0

    def open(self) -> bool:
        """Start reading; False when the segment gives no row."""
        self.groups = self.open_groups()
        return self._next_group()

    def _next_group(self) -> bool:
        for rows in self.groups:
            if rows.num_rows:
                self.rows, self.keys, self.i = rows, rows.column(self.key).to_pylist(), 0
                return True
        self.rows, self.keys = None, []
        return False

    def advance(self) -> bool:
        """Move to the next row; False at the end of the segment."""
        self.i += 1
        return self.i < len(self.keys) or self._next_group()


def _merged(cursors: list[_Cursor], key: str, put: Callable[[pa.Table], None],
            group_rows: int) -> None:
    """Put the rows of the sorted segments ``cursors`` in key order, each key once: the row of
    the first cursor holding it (ties go to the lower index). A segment is opened only once the
    merge reaches its first key, so segments over separate key ranges (a full run's chunks) are
    read one or two at a time, not all at once: merging a full run's 1,525 token segments at
    once took about 2 GB more. Rows go out ``group_rows`` at a time, each batch one ``take``
    over the row groups it draws from (not a call per row)."""
    waiting = sorted(((c.first, k) for k, c in enumerate(cursors)), reverse=True)  # pop():
    # the smallest first key
    heap: list[tuple[str, int]] = []  # (current key, index) of the open cursors
    sources: dict[int, int] = {}  # id of a row group in this batch -> its first row in the batch
    tables: list[pa.Table] = []
    picked: list[int] = []
    total = 0
    last: str | None = None

    def flush() -> None:
        nonlocal total
        if picked:
            put(pa.concat_tables(tables).take(pa.array(picked, pa.int64())))
        sources.clear()
        tables.clear()
        picked.clear()
        total = 0

    while heap or waiting:
        if waiting and (not heap or waiting[-1][0] <= heap[0][0]):
            k = waiting.pop()[1]
            if cursors[k].open():
                heapq.heappush(heap, (cursors[k].keys[0], k))
            continue
        current, k = heapq.heappop(heap)
        c = cursors[k]
        while True:  # this cursor's rows, until another cursor or segment comes first
            if current != last:
                at = sources.get(id(c.rows))
                if at is None:
                    at = sources[id(c.rows)] = total
                    tables.append(c.rows)
                    total += c.rows.num_rows
                picked.append(at + c.i)
                last = current
                if len(picked) >= group_rows:
                    flush()
            if not c.advance():
                break
            current = c.keys[c.i]
            if (heap and (current, k) > heap[0]) or (waiting and current >= waiting[-1][0]):
                heapq.heappush(heap, (current, k))
                break
    flush()


def _rows_of(group: pa.Table, rows: list[int]) -> pa.Table:
    """Rows ``rows`` of a row group: a slice when they are consecutive (no copy)."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return group.slice(rows[0], len(rows))
    return group.take(pa.array(rows, pa.int64()))


def list_column(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column as numpy: offsets (int64, from 0; row ``i`` is
    ``values[offsets[i]:offsets[i+1]]``) and the flat values."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(pc.list_value_length(arr).to_numpy(zero_copy_only=False), out=offsets[1:])
    return offsets, arr.flatten().to_numpy(zero_copy_only=False)

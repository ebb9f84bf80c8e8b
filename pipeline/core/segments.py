"""Append-only Parquet segment stores: the per-item caches under ``.cache/``.

A store keeps rows keyed by one string column in a folder of ``seg-<hash>.parquet`` files. Each
run that computed something appends one segment (written atomically); once there are more than
``max_segments`` they are merged into one. A segment that cannot be read, or has another
layout, is ignored, so the folder can be deleted, or lose files, at any time: a store only ever
saves time. Nothing in it can hold a pickle. The folder's name is the caller's: it carries a
hash of everything the rows depend on besides their key (settings, code, library versions), so a
store is never read under other conditions.

Used by the ingest stage (per-file results by sha256), the dedupe stage (near-duplicate verdicts
by the note digests of a pair of pieces; per-piece fingerprints by note digest) and the split
stage (the leakage audit's per-piece inputs by note digest). :meth:`SegmentStore.lookup` reads
the rows of some keys at once (some columns if asked); :meth:`SegmentStore.take` reads rows a
row group at a time as they are needed (:class:`RowGroups`), for a stage that streams a large
store (ingest's cached notes); a segment gone meanwhile raises :class:`StoreChanged`, and such a
stage runs once more (:func:`rerun_if_store_changed`).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core import artifacts

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
    ``folder``. Rows stored under one key must be equal (they are results of the same pure
    function); merging keeps one."""

    def __init__(self, folder: Path, schema: pa.Schema, key: str = "sha256",
                 max_segments: int = 16) -> None:
        self.dir = Path(folder)
        self.schema = schema
        self.key = key
        self.max_segments = max_segments
        self.segments = sorted(self.dir.glob("seg-*.parquet")) if self.dir.is_dir() else []
        self.keys: dict[str, Path] = {}  # the segment holding each key ...
        self.rows: dict[str, int] = {}  # ... and its row there
        for seg in self.segments:
            if (t := self._read(seg, [key])) is not None:
                self._index(seg, t.column(0).to_pylist())
        self._groups = RowGroups()

    def _index(self, seg: Path, keys: list[str]) -> None:
        self.keys.update(dict.fromkeys(keys, seg))
        self.rows.update(zip(keys, range(len(keys)), strict=False))

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

    def add(self, table: pa.Table) -> None:
        """Store new rows as one more segment; merge the segments when there are many."""
        with self.appending() as put:
            put(table)

    @contextlib.contextmanager
    def appending(self) -> Iterator[Callable[[pa.Table], None]]:
        """Store rows as they come (``put(table)``, any number of times): one more segment,
        streamed to a temporary file and renamed into place when the block ends without an
        error (none without rows); then the segments are merged when there are many."""
        writer: pq.ParquetWriter | None = None
        tmp: str | None = None
        name = hashlib.sha256()
        keys: list[str] = []
        groups: artifacts.RowGroupBuffer | None = None  # rows go out in row groups of SEGMENT_ROWS:
        # put a chunk at a time, they made a row group per chunk (1,562 of 64 rows for the ingest
        # results at 100k, 0.8 s more to read than 98 groups)

        def put(table: pa.Table) -> None:
            nonlocal writer, tmp, groups
            if not table.num_rows:
                return
            if writer is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".seg-", suffix=".tmp", dir=self.dir)
                os.close(fd)
                writer = pq.ParquetWriter(tmp, self.schema, **SEGMENT_OPTIONS)
                groups = artifacts.RowGroupBuffer(
                    lambda rows: writer.write_table(rows, row_group_size=SEGMENT_ROWS),
                    SEGMENT_ROWS)
            new = table[self.key].to_pylist()
            name.update((("\n" if keys else "") + "\n".join(new)).encode())
            keys.extend(new)
            groups.put(table.cast(self.schema))

        try:
            yield put
            if groups is not None and groups.count:
                groups.write(pa.concat_tables(groups.pending))
            if writer is not None:
                writer.close()
                writer = None
                path = self.dir / f"seg-{name.hexdigest()[:20]}.parquet"
                os.replace(tmp, path)
                tmp = None
                if path not in self.segments:
                    self.segments.append(path)
                self._index(path, keys)
        finally:
            if writer is not None:
                writer.close()
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
        if len(self.segments) > self.max_segments:
            self._merge()

    def _merge(self) -> None:
        self._groups.clear()  # row groups of segments about to go
        old = list(self.segments)
        parts = [t for seg in old if (t := self._read(seg)) is not None]
        merged = self._write(self._unique(pa.concat_tables(parts)))
        for seg in old:
            if seg != merged:
                seg.unlink(missing_ok=True)
        self.segments = [merged]
        self.keys, self.rows = {}, {}
        if (t := self._read(merged, [self.key])) is not None:
            self._index(merged, t.column(0).to_pylist())

    def _write(self, table: pa.Table) -> Path:
        name = hashlib.sha256("\n".join(table[self.key].to_pylist()).encode()).hexdigest()[:20]
        path = self.dir / f"seg-{name}.parquet"
        with artifacts.atomic_path(path) as tmp:
            pq.write_table(table, tmp, row_group_size=SEGMENT_ROWS, **SEGMENT_OPTIONS)
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


def _rows_of(group: pa.Table, rows: list[int]) -> pa.Table:
    """Rows ``rows`` of a row group: a slice when they are consecutive (no copy)."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return group.slice(rows[0], len(rows))
    return group.take(pa.array(rows, pa.int64()))


HELD_BYTES = 256 << 20
"""Most bytes of row groups a :class:`RowGroups` holds at once."""


OPEN_FILES = 32
"""Most files a :class:`RowGroups` keeps open (a file's footer is parsed once while it is)."""


class RowGroups:
    """Row groups of Parquet files read on demand and held, least recently used let go first
    once they pass ``HELD_BYTES``: reading rows in the order a file holds them reads each row
    group once, and memory stays a few row groups whatever the file's size. Files stay open
    (``OPEN_FILES`` at most): a segment appended in small chunks has thousands of row groups,
    and parsing its footer for each of them cost 30 s at 100,000 pieces."""

    def __init__(self) -> None:
        self._files: OrderedDict[Path, tuple[pq.ParquetFile, list[int]]] = OrderedDict()
        self._held: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def _file(self, path: Path) -> tuple[pq.ParquetFile, list[int]]:
        """The open file and the first row of each of its row groups (then its row count)."""
        if path in self._files:
            self._files.move_to_end(path)
        else:
            f = pq.ParquetFile(path)
            meta = f.metadata
            self._files[path] = f, np.cumsum([0] + [meta.row_group(g).num_rows
                                                    for g in range(meta.num_row_groups)]
                                             ).tolist()
            if len(self._files) > OPEN_FILES:
                self._files.popitem(last=False)[1][0].close()
        return self._files[path]

    def row(self, path: Path, row: int, columns: list[str],
            convert: Callable[[pa.Table], Any] | None = None) -> tuple[Any, int]:
        """The row group of ``path`` holding ``row`` (``columns`` of it, passed through
        ``convert`` when given, once per read) and the row's position in it."""
        f, starts = self._file(path)
        g = bisect.bisect_right(starts, row) - 1  # per row: numpy's cost per call was 3 us
        if not 0 <= g < len(starts) - 1:
            raise IndexError(f"row {row} is not in {path.name}")
        key = (path, g, tuple(columns))
        if key in self._held:
            self._held.move_to_end(key)
        else:
            table = f.read_row_group(g, columns=columns)
            self._held[key] = (convert(table) if convert else table), table.nbytes
            self._bytes += table.nbytes
            self._let_go()
        return self._held[key][0], row - starts[g]

    def hold(self, path: Path, group: int, columns: list[str], value: Any, nbytes: int) -> None:
        """Hold ``value``, read elsewhere, as :meth:`row` would hold row group ``group`` of
        ``path`` (``columns`` of it, converted)."""
        key = (path, group, tuple(columns))
        if key in self._held:
            self._bytes -= self._held[key][1]
        self._held[key] = value, nbytes
        self._held.move_to_end(key)
        self._bytes += nbytes
        self._let_go()

    def _let_go(self) -> None:
        while self._bytes > HELD_BYTES and len(self._held) > 1:
            _, (_, n) = self._held.popitem(last=False)
            self._bytes -= n

    def clear(self) -> None:
        """Let go of held row groups and close the files."""
        self._held.clear()
        self._bytes = 0
        for f, _ in self._files.values():
            f.close()
        self._files.clear()


def list_column(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column as numpy: offsets (int64, from 0; row ``i`` is
    ``values[offsets[i]:offsets[i+1]]``) and the flat values."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(pc.list_value_length(arr).to_numpy(zero_copy_only=False), out=offsets[1:])
    return offsets, arr.flatten().to_numpy(zero_copy_only=False)

"""Append-only Parquet segment stores: the per-item caches under ``.cache/``.

A store keeps rows keyed by one string column in a folder of ``seg-<hash>.parquet`` files. Each
run that computed something appends one segment (written atomically); once there are more than
``max_segments`` they are merged into one. A segment that cannot be read, or has another
layout, is ignored, so the folder can be deleted, or lose files, at any time: a store only ever
saves time. Nothing in it can hold a pickle. The folder's name is the caller's: it carries a
hash of everything the rows depend on besides their key (settings, code, library versions), so a
store is never read under other conditions.

Used by the ingest stage (per-file results by sha256) and the dedupe stage (near-duplicate
verdicts by the note digests of a pair of pieces).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core import artifacts


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
        self.keys: dict[str, Path] = {}
        for seg in self.segments:
            if (t := self._read(seg, [key])) is not None:
                self.keys.update(dict.fromkeys(t.column(0).to_pylist(), seg))

    def lookup(self, keys: set[str]) -> pa.Table:
        """The stored rows of ``keys`` (a key whose segment vanished is missing; one stored
        twice may come twice, with equal values)."""
        want = pa.array(sorted(keys), pa.string())
        parts = []
        for seg in sorted({self.keys[k] for k in keys if k in self.keys}):
            if (t := self._read(seg)) is None:
                continue
            keep = pc.is_in(t[self.key], want)
            parts.append(t if pc.all(keep).as_py() else t.filter(keep))  # all: no copy
        return pa.concat_tables([pa.Table.from_batches([], self.schema), *parts])

    def add(self, table: pa.Table) -> None:
        """Store new rows as one more segment; merge the segments when there are many."""
        if table.num_rows:
            self._write(table)
        if len(self.segments) > self.max_segments:
            old = list(self.segments)
            parts = [t for seg in old if (t := self._read(seg)) is not None]
            merged = self._write(self._unique(pa.concat_tables(parts)))
            for seg in old:
                if seg != merged:
                    seg.unlink(missing_ok=True)
            self.segments = [merged]

    def _write(self, table: pa.Table) -> Path:
        name = hashlib.sha256("\n".join(table[self.key].to_pylist()).encode()).hexdigest()[:20]
        path = self.dir / f"seg-{name}.parquet"
        with artifacts.atomic_path(path) as tmp:
            # zstd 1 without dictionaries: a third of the uncompressed size, fast to read back.
            pq.write_table(table, tmp, compression="zstd", compression_level=1,
                           use_dictionary=False)
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

"""The content-addressed store of entries (``.cache/tokens/``).

Entries (:mod:`pipeline.tokens.entries`) are cached under the key of their file's bytes and
transposition, in a folder named for the base tokenizer configuration (:func:`config_key`), and
reused when files are added, the vocabulary is retrained or a run is interrupted. A trained
vocabulary is applied to cached base ids when the output is assembled
(:func:`pipeline.tokens.vocabulary.apply_model`), exactly as ``tokenizer.encode`` would.

Layout: ``<root>/<config_key>/seg-<hash>.parquet``: append-only *segments*, Parquet tables of
(``sha256``, ``transpose``, ``entry``), ``entry`` being one entry packed as little-endian int32
(see :func:`~pipeline.tokens.entries.pack`; it starts with a magic/format number and its length
is checked on load). Each worker writes one segment per chunk of files it encoded, atomically,
so a killed run keeps every finished chunk (one file per segment, not one per piece: a file per
entry cost an fsync of about 4 ms each and an inode per piece, which neither the file system nor
DVC handle well at a million pieces). Segments are sorted by key and written in row groups of
``SEGMENT_ROWS`` entries. A run checks every stored entry it wants once
(:meth:`TokenCache.locate`), then reads them in key order as it trains and assembles
(:class:`Entries`), never holding the whole store; it then merges small segments
(:meth:`TokenCache.compact`: segments of similar size are merged once ``FANOUT`` of them exist,
so a store holds a few dozen segments and each entry is rewritten about log_FANOUT(n) times).
Nothing here can hold a pickle.

Invariants:
- an entry is a pure function of (file bytes, base config, transposition, library versions,
  code); the config key therefore hashes the miditok/symusic versions and the code of
  ``ENTRY_CODE`` too, so an upgrade or a code change never reuses stale ids (the key is a folder
  name, never part of an artifact's content);
- an entry exists only if encoding succeeded; failures are never cached and are retried;
- an unreadable segment or entry is ignored (recomputed), never trusted; the outputs do not
  depend on the store's state, only the run time does.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import math
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.artifacts import atomic_path, code_digest, sha256_bytes, sha256_json
from pipeline.core.segments import SEGMENT_OPTIONS, RowGroups, StoreChanged
from pipeline.tokens.entries import (
    FORMAT,
    BadEntry,
    Block,
    Encoding,
    Key,
    entries_ok,
    pack,
    parse_block,
)

STORE = 2  # storage layout version (1: one file per entry), part of the config key
FANOUT = 8  # segments of one size tier merged once this many exist
SEGMENT_ROWS = 256
"""Entries per row group of a segment (about 3 MB of long pieces): segments are read, merged and
fetched from a row group at a time (a segment written as one row group of 100,000 long pieces
was 1.1 GB to hold and 4-6 s to read)."""
SEGMENT_SCHEMA = pa.schema([("sha256", pa.string()), ("transpose", pa.int32()),
                            ("entry", pa.binary())])
ENTRY_COLUMNS = ["entry"]  # what Entries reads of a segment's row group

ENTRY_CODE = ("pipeline.tokens.entries", "pipeline.tokens.encoding",
              "pipeline.tokens.roundtrip", "pipeline.tokens.remi_keys", __name__,
              "pipeline.tokens.tokenizer", "pipeline.tokens.contract")
"""The modules whose code an entry depends on (encoding, the round-trip check and its REMI
reader, the packing, the store; the tokenizer's construction and special tokens): hashed into
:func:`config_key`."""


def config_key(tokenizer_name: str, config: dict[str, Any]) -> str:
    """Cache key of a base tokenizer: class, serialised TokenizerConfig, library versions and
    the code of ``ENTRY_CODE``.

    ``encode_ids_split`` is left out: it only changes how a trained vocabulary chunks the ids,
    and every entry stores both bar and beat boundaries.
    """
    from importlib import metadata

    cfg = {k: v for k, v in config.items() if k != "encode_ids_split"}
    versions = {p: metadata.version(p) for p in ("miditok", "symusic")}
    return sha256_json({"format": FORMAT, "store": STORE, "tokenizer": tokenizer_name,
                        "config": cfg, "versions": versions,
                        "code": code_digest(ENTRY_CODE)})[:20]


class TokenCache:
    """Content-addressed store of :class:`Encoding` under one base-config key (segments)."""

    def __init__(self, root: Path | str, key: str) -> None:
        self.root = Path(root)
        self.key = key
        self.dir = self.root / key

    def segments(self) -> list[Path]:
        """Segment files of this key, sorted (temp files of a killed write excluded)."""
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.glob("seg-*.parquet") if p.is_file())

    def _keys(self, path: Path) -> list[Key] | None:
        """The (sha256, transpose) of a segment's rows, or None when it cannot be read."""
        columns = ["sha256", "transpose"]
        try:
            table = pq.read_table(path, columns=columns)
        except (pa.ArrowException, OSError):
            return None
        if not table.schema.equals(pa.schema([SEGMENT_SCHEMA.field(c) for c in columns])):
            return None
        return list(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True))

    def present(self) -> set[Key]:
        """(sha256, transpose) of every entry present (no entry is decoded)."""
        found: set[Key] = set()
        for seg in self.segments():
            found.update(self._keys(seg) or ())
        return found

    def locate(self, wanted: set[Key] | None = None, *, check: bool = True,
               segments: list[Path] | None = None,
               groups: RowGroups | None = None) -> dict[Key, tuple[Path, int]]:
        """Where each stored entry of ``wanted`` (all when None) lies: (segment, row), the first
        segment in name order holding it. With ``check`` each entry is read and checked
        (:func:`entry_ok`; one that fails is left out, so it is recomputed), a row group at a
        time, and ``groups`` (the run's :attr:`Entries.groups`) holds what it read, as far as
        its limit allows, so that a small store is not read twice; without, only the keys are
        read (for ``segments`` this run's workers wrote)."""
        found: dict[Key, tuple[Path, int]] = {}
        columns = ["sha256", "transpose", "entry"] if check else ["sha256", "transpose"]
        want = pa.schema([SEGMENT_SCHEMA.field(c) for c in columns])
        for seg in self.segments() if segments is None else sorted(segments):
            try:
                with pq.ParquetFile(seg) as pf:
                    if not pf.schema_arrow.equals(SEGMENT_SCHEMA):
                        continue
                    row = 0
                    for g in range(pf.num_row_groups):
                        t = pf.read_row_group(g, columns=columns)
                        if not t.schema.equals(want):
                            break
                        keys = zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True)
                        good = [True] * t.num_rows
                        if check:
                            arrays = _entry_arrays(t.column(2))
                            good = entries_ok(arrays).tolist()
                            if groups is not None:
                                groups.hold(seg, g, ENTRY_COLUMNS, arrays, t.column(2).nbytes)
                        for i, (key, ok) in enumerate(zip(keys, good, strict=True)):
                            if ok and (wanted is None or key in wanted) and key not in found:
                                found[key] = (seg, row + i)
                        row += t.num_rows
            except (pa.ArrowException, OSError):
                continue
        return found

    def load(self, wanted: set[Key] | None = None) -> dict[Key, Encoding]:
        """Every readable entry (only those in ``wanted`` when given), all in memory; unreadable
        ones are left out, so they are recomputed. A run reads through :class:`Entries`."""
        entries = Entries()
        entries.where = self.locate(wanted, groups=entries.groups)
        try:
            return entries.get(sorted(entries.where))
        finally:
            entries.close()

    def get(self, sha: str, transpose: int) -> Encoding | None:
        """One entry, or None when missing or unreadable (reads the whole store: use
        :meth:`load` for many)."""
        return self.load({(sha, transpose)}).get((sha, transpose))

    def put_many(self, items: list[tuple[str, int, np.ndarray | Encoding]]) -> Path | None:
        """Write entries (packed arrays or Encodings) as one new segment, atomically."""
        if not items:
            return None
        rows = [(sha, int(t), (e if isinstance(e, np.ndarray) else pack(e)).astype("<i4")
                 .tobytes()) for sha, t, e in items]
        return self._write(rows)

    def put(self, sha: str, transpose: int, enc: Encoding) -> None:
        self.put_many([(sha, transpose, enc)])

    def _write(self, rows: list[tuple[str, int, bytes]]) -> Path:
        with self._writing() as out:
            for row in sorted(rows):
                out.put(*row)
        return out.path

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_SegmentWriter]:
        """A new segment from entries put in key order, written a row group at a time and named
        by its content when the block ends (the same entries always give the same name and
        bytes); ``.path`` is then set, or stays None when nothing was put."""
        self.dir.mkdir(parents=True, exist_ok=True)
        staging = self.dir / f".seg-{uuid.uuid4().hex}.parquet"  # not a segment until renamed
        with atomic_path(staging) as tmp, \
                pq.ParquetWriter(tmp, SEGMENT_SCHEMA, **SEGMENT_OPTIONS) as writer:
            out = _SegmentWriter(writer)
            yield out
            out.flush()
        if out.count:
            out.path = self.dir / f"seg-{out.name.hexdigest()[:24]}.parquet"
            os.replace(staging, out.path)
        else:
            staging.unlink()

    def _rows(self, seg: Path, rank: int) -> Iterator[tuple[str, int, int, bytes]]:
        """(sha256, transpose, ``rank``, entry) of each row of ``seg`` in stored order, a row
        group at a time; an unreadable segment, or its unreadable rest, yields nothing more."""
        try:
            with pq.ParquetFile(seg) as pf:
                if not pf.schema_arrow.equals(SEGMENT_SCHEMA):
                    return
                for g in range(pf.num_row_groups):
                    t = pf.read_row_group(g)
                    yield from ((sha, tr, rank, b) for sha, tr, b in
                                zip(*(t.column(i).to_pylist() for i in range(3)), strict=True))
        except (pa.ArrowException, OSError):
            return

    def _first_key(self, seg: Path) -> str:
        """The sha256 of a segment's first row ("" when it has none or cannot be read)."""
        try:
            with pq.ParquetFile(seg) as pf:
                if pf.num_row_groups and pf.schema_arrow.equals(SEGMENT_SCHEMA):
                    keys = pf.read_row_group(0, columns=["sha256"]).column(0)
                    return keys[0].as_py() if len(keys) else ""
        except (pa.ArrowException, OSError):
            pass
        return ""

    def _merged(self, group: list[Path]) -> Iterator[tuple[str, int, int, bytes]]:
        """The rows of the sorted segments ``group`` in (sha256, transpose, rank in ``group``)
        order. A segment is opened only once the merge reaches its first key, so segments that
        cover separate key ranges (a full run's chunks) are read one or two at a time, not all
        at once: merging a full run's 1,525 segments at once took about 2 GB more."""
        waiting = sorted((self._first_key(seg), k) for k, seg in enumerate(group))
        waiting.reverse()  # pop() takes the smallest first key
        heap: list[tuple[tuple[str, int, int], int, bytes, Iterator]] = []
        serial = itertools.count()  # orders equal rows of one segment; never compares iterators

        def push(rows: Iterator) -> None:
            if (row := next(rows, None)) is not None:
                heapq.heappush(heap, (row[:3], next(serial), row[3], rows))

        while heap or waiting:
            if waiting and (not heap or waiting[-1][0] <= heap[0][0][0]):
                k = waiting.pop()[1]
                push(self._rows(group[k], k))
                continue
            key, _, entry, rows = heapq.heappop(heap)
            yield (*key, entry)
            push(rows)

    def compact(self, fanout: int = FANOUT) -> int:
        """Merge segments of similar size (tier = floor(log_fanout(rows))) once ``fanout`` of a
        tier exist; drop unreadable segments and duplicate keys (the segment first in name order
        wins). Segments are sorted by key, so a merge streams them: it holds a row group of each.
        Returns segments removed."""
        segs: dict[Path, int] = {}
        removed = 0
        for seg in self.segments():
            try:
                segs[seg] = pq.read_metadata(seg).num_rows
            except (pa.ArrowException, OSError):
                seg.unlink()
                removed += 1
        while True:
            tiers: dict[int, list[Path]] = {}
            for seg, n in segs.items():
                tiers.setdefault(int(math.log(max(n, 1), fanout)), []).append(seg)
            full = sorted(t for t, members in tiers.items() if len(members) >= fanout)
            if not full:
                return removed
            group = sorted(tiers[full[0]])
            with self._writing() as out:
                last = None
                for sha, tr, _, b in self._merged(group):
                    if (sha, tr) != last:
                        out.put(sha, tr, b)
                        last = (sha, tr)
            for seg in group:
                del segs[seg]
                if seg != out.path:
                    seg.unlink(missing_ok=True)
                    removed += 1
            if out.path is not None:
                segs[out.path] = out.count

    def prune(self, keep: set[Key]) -> int:
        """Delete every entry not in ``keep`` (other config keys included); return how many."""
        removed = 0
        if not self.root.is_dir():
            return 0
        for folder in sorted(self.root.iterdir()):
            if folder == self.dir:
                continue
            if folder.is_dir():
                removed += sum(_count_entries(p) for p in sorted(folder.rglob("*")) if p.is_file())
                shutil.rmtree(folder)
            else:
                folder.unlink()
                removed += 1
        for seg in self.segments():  # rewrite only the segments holding something to drop
            keys = self._keys(seg)
            if keys is None:
                seg.unlink()
                continue
            dropped = sum(key not in keep for key in keys)
            if not dropped:
                continue
            removed += dropped
            with self._writing() as out:  # streamed, in the segment's (sorted) order
                for sha, tr, _, b in self._rows(seg, 0):
                    if (sha, tr) in keep:
                        out.put(sha, tr, b)
            if out.path != seg:
                seg.unlink()
        if self.dir.is_dir() and not any(self.dir.iterdir()):
            self.dir.rmdir()
        return removed


class _SegmentWriter:
    """Rows of one segment being written (:meth:`TokenCache._writing`)."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.rows: list[tuple[str, int, bytes]] = []
        self.name = hashlib.sha256()
        self.count = 0
        self.path: Path | None = None

    def put(self, sha: str, transpose: int, entry: bytes) -> None:
        self.name.update(f"{sha}\t{transpose}\t{sha256_bytes(entry)}\n".encode())
        self.rows.append((sha, transpose, entry))
        self.count += 1
        if len(self.rows) == SEGMENT_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            cols = list(zip(*self.rows, strict=True))
            self.writer.write_table(pa.table(dict(zip(SEGMENT_SCHEMA.names, cols, strict=True)),
                                             schema=SEGMENT_SCHEMA))
            self.rows = []


class Entries:
    """A run's base encodings, read when needed: entries of the store (by :meth:`TokenCache.locate`)
    and entries held in memory (a run without a store). :meth:`get` reads the store a row group
    at a time (:class:`~pipeline.core.segments.RowGroups`, which holds a few): segments are
    sorted by key, so reading every entry in key order reads each row group about once,
    whatever the corpus size."""

    def __init__(self) -> None:
        self.where: dict[Key, tuple[Path, int]] = {}
        self.packed: dict[Key, np.ndarray] = {}
        self.groups = RowGroups()  # row groups read and held for the run

    def __contains__(self, key: Key) -> bool:
        return key in self.where or key in self.packed

    def get(self, keys: list[Key]) -> dict[Key, Encoding]:
        """The encodings of ``keys`` (each must be held: ``key in self``)."""
        block = self.block(keys)
        return {key: block.encoding(e) for e, key in enumerate(block.keys)}

    def block(self, keys: list[Key]) -> Block:
        """The entries of ``keys`` (each must be held: ``key in self``) as one :class:`Block`.
        A stored entry that no longer reads as one raises
        :class:`~pipeline.core.segments.StoreChanged`."""
        arrays: list[np.ndarray] = []
        group: tuple[Path, int, list[np.ndarray]] | None = None  # the row group last read
        for key in keys:
            arr = self.packed.get(key)
            if arr is None:
                seg, row = self.where[key]
                if group is None or group[0] is not seg or not 0 <= row - group[1] < len(group[2]):
                    try:
                        held, i = self.groups.row(seg, row, ENTRY_COLUMNS,
                                                  lambda t: _entry_arrays(t.column(0)))
                    except (ValueError, IndexError, pa.ArrowException, OSError) as e:
                        raise StoreChanged(f"token cache segment {seg.name} changed during the "
                                           f"run ({type(e).__name__})") from None
                    group = (seg, row - i, held)
                arr = group[2][row - group[1]]
            arrays.append(arr)
        try:
            return parse_block(keys, arrays)
        except BadEntry as e:
            key = keys[e.index]
            if key in self.packed:
                raise
            raise StoreChanged(f"token cache segment {self.where[key][0].name} changed during "
                               "the run (BadEntry)") from None

    def close(self) -> None:
        """Let go of held row groups."""
        self.groups.clear()


def _entry_arrays(column: pa.ChunkedArray) -> list[np.ndarray]:
    """Each binary value of ``column`` as an int32 array viewing Arrow's buffer (no copy; a
    value whose length is not a whole number of int32 comes back as an empty array, which
    :func:`unpack` refuses)."""
    out: list[np.ndarray] = []
    for chunk in column.chunks:
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)
        offsets = offsets[chunk.offset : chunk.offset + len(chunk) + 1]
        data = chunk.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        for a, b in itertools.pairwise(offsets.tolist()):
            out.append(raw[a:b].view("<i4") if (b - a) % 4 == 0 else np.zeros(0, np.int32))
    return out


def _count_entries(path: Path) -> int:
    """Entries in a file of an older key or layout: a segment's rows, else 1."""
    if path.name.startswith("seg-") and path.suffix == ".parquet":
        try:
            return pq.read_metadata(path).num_rows
        except (pa.ArrowException, OSError):
            return 1
    return 1


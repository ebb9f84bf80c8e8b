"""Per-file base encodings and their content-addressed store (``.cache/tokens/``).

A *base encoding* is what the tokenizer gives one MIDI file before any trained vocabulary (BPE,
WordPiece) is applied: base token ids per sequence, where each bar and beat starts (the trained
vocabulary never merges across those), note counts and the round-trip check against miditok's
preprocessed score. It depends only on the file's bytes, the base tokenizer configuration and the
transposition, so it is cached under exactly that key and reused when files are added, the
vocabulary is retrained or a run is interrupted. A trained vocabulary is applied to cached base
ids when the output is assembled (:func:`apply_model`), exactly as ``tokenizer.encode`` would.

Layout: ``<root>/<config_key>/seg-<hash>.parquet``: append-only *segments*, Parquet tables of
(``sha256``, ``transpose``, ``entry``), ``entry`` being one entry packed as little-endian int32
(see :func:`pack`; it starts with a magic/format number and its length is checked on load).
Each worker writes one segment per chunk of files it encoded, atomically, so a killed run keeps
every finished chunk (one file per segment, not one per piece: a file per entry cost an fsync of
about 4 ms each and an inode per piece, which neither the file system nor DVC handle well at a
million pieces). Segments are sorted by key and written in row groups of ``SEGMENT_ROWS``
entries. A run checks every stored entry it wants once (:meth:`TokenCache.locate`), then reads
them in key order as it trains and assembles (:class:`Entries`), never holding the whole store;
it then merges small segments (:meth:`TokenCache.compact`: segments of similar size are merged
once ``FANOUT`` of them exist, so a store holds a few dozen segments and each entry is rewritten
about log_FANOUT(n) times). Nothing here can hold a pickle.

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
import operator
import os
import shutil
import threading
import time
import uuid
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from math import lcm
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.artifacts import atomic_path, code_digest, sha256_bytes, sha256_json
from pipeline.core.segments import SEGMENT_OPTIONS, RowGroups, StoreChanged

FORMAT = 0x53540001  # magic "ST" + entry format version 1
STORE = 2  # storage layout version (1: one file per entry), part of the config key
HEADER = 4  # FORMAT, n_seq, n_notes_input, flag bits
SEQ_FIELDS = 9  # track, program, is_drum, n_notes, n_ids, n_bar, n_beat, rt_matched, rt_decoded
OUT_OF_RANGE = 1  # flag bit: transposition would push a pitch out of the tokenizer's range
FANOUT = 8  # segments of one size tier merged once this many exist
MIN_CHUNK, MAX_CHUNK = 32, 64  # files per chunk of work sent to a worker (:func:`chunk_size`)
SEGMENT_ROWS = 256
"""Entries per row group of a segment (about 3 MB of long pieces): segments are read, merged and
fetched from a row group at a time (a segment written as one row group of 100,000 long pieces
was 1.1 GB to hold and 4-6 s to read)."""
SEGMENT_SCHEMA = pa.schema([("sha256", pa.string()), ("transpose", pa.int32()),
                            ("entry", pa.binary())])
Key = tuple[str, int]  # (sha256, transpose)
ENTRY_COLUMNS = ["entry"]  # what Entries reads of a segment's row group
_TIME = operator.attrgetter("time")


@dataclass(frozen=True)
class SeqEncoding:
    """One token sequence of a piece (the whole piece, or one track in per-track mode)."""

    track: int  # index in the preprocessed score; -1 when all tracks share one stream
    program: int  # MIDI program of the track; -1 for one-stream sequences
    is_drum: bool
    n_notes: int  # notes this sequence encodes (after miditok's preprocessing)
    ids: np.ndarray  # int32 base ids
    bar_starts: np.ndarray  # int32 index where each bar's tokens start
    beat_starts: np.ndarray  # int32 index where each beat's tokens start
    rt_matched: int  # notes matched by the decoded sequence (-1: not checked)
    rt_decoded: int  # notes in the decoded sequence (-1: not checked)

    @property
    def roundtrip_f1(self) -> float:
        return f1_from_counts(self.rt_matched, self.n_notes, self.rt_decoded)


@dataclass(frozen=True)
class Encoding:
    """A file's base encoding at one transposition."""

    n_notes_input: int  # notes in the file as parsed, all tracks
    seqs: tuple[SeqEncoding, ...]
    out_of_range: bool = False  # transposition refused: no sequences


def f1_from_counts(matched: int, n_ref: int, n_dec: int) -> float:
    """Multiset F1 from counts; NaN when not checked, 1.0 for two empty multisets."""
    if matched < 0:
        return float("nan")
    if n_ref + n_dec == 0:
        return 1.0
    return 2.0 * matched / (n_ref + n_dec)


def pack(enc: Encoding) -> np.ndarray:
    """Encoding -> one int32 array: header, per-sequence table, then ids, bar and beat starts."""
    table = [[s.track, s.program, int(s.is_drum), s.n_notes, len(s.ids), len(s.bar_starts),
              len(s.beat_starts), s.rt_matched, s.rt_decoded] for s in enc.seqs]
    parts = [np.array([FORMAT, len(enc.seqs), enc.n_notes_input,
                       OUT_OF_RANGE if enc.out_of_range else 0], dtype=np.int32),
             np.array(table, dtype=np.int32).reshape(-1)]
    parts += [s.ids for s in enc.seqs] + [s.bar_starts for s in enc.seqs]
    parts += [s.beat_starts for s in enc.seqs]
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def unpack(arr: np.ndarray) -> Encoding:
    """Inverse of :func:`pack`; raises ValueError (:class:`BadEntry`) on a malformed array."""
    return parse_block([("", 0)], [arr]).encoding(0)


def entry_ok(arr: np.ndarray) -> bool:
    """Whether :func:`unpack` accepts ``arr``."""
    return bool(entries_ok([arr])[0])


@dataclass(frozen=True)
class Block:
    """Packed entries parsed together (:func:`parse_block`), end to end in ``flat``. Per entry
    (in ``keys`` order): its sequences ``first_seq[e]`` to ``first_seq[e + 1]``, the notes of its
    file and whether its transposition was refused. Per sequence: its row of the entry's table
    (``table``, ``SEQ_FIELDS`` columns as :func:`pack` writes them) and where its ids, bar
    starts and beat starts begin in ``flat``."""

    keys: list[Key]
    flat: np.ndarray
    first_seq: np.ndarray
    n_input: np.ndarray
    out_of_range: np.ndarray
    table: np.ndarray
    ids_at: np.ndarray
    bars_at: np.ndarray
    beats_at: np.ndarray

    def ids(self, j: int) -> np.ndarray:
        """Base ids of sequence ``j`` (a view of ``flat``)."""
        return self.flat[self.ids_at[j] : self.ids_at[j] + self.table[j, 4]]

    def sequence(self, j: int) -> SeqEncoding:
        t = self.table[j].tolist()
        return SeqEncoding(track=t[0], program=t[1], is_drum=bool(t[2]), n_notes=t[3],
                           ids=self.ids(j),
                           bar_starts=self.flat[self.bars_at[j] : self.bars_at[j] + t[5]],
                           beat_starts=self.flat[self.beats_at[j] : self.beats_at[j] + t[6]],
                           rt_matched=t[7], rt_decoded=t[8])

    def encoding(self, e: int) -> Encoding:
        """Entry ``e`` as :func:`unpack` gives it."""
        return Encoding(n_notes_input=int(self.n_input[e]),
                        seqs=tuple(self.sequence(j)
                                   for j in range(self.first_seq[e], self.first_seq[e + 1])),
                        out_of_range=bool(self.out_of_range[e]))


class BadEntry(ValueError):
    """Entry ``index`` of a block is not a packed entry :func:`unpack` accepts."""

    def __init__(self, index: int) -> None:
        super().__init__(f"entry {index} is not a token cache entry of this format")
        self.index = index


def entries_ok(arrays: list[np.ndarray]) -> np.ndarray:
    """Whether :func:`unpack` accepts each array: all checked at once (:func:`parse_block`), one
    at a time only when some fail."""
    def ok(group: list[np.ndarray]) -> bool:
        try:
            parse_block([], group)
        except BadEntry:
            return False
        return True

    if ok(arrays):
        return np.ones(len(arrays), dtype=bool)
    return np.fromiter((ok([a]) for a in arrays), bool, count=len(arrays))


def parse_block(keys: list[Key], arrays: list[np.ndarray]) -> Block:
    """The packed entries ``arrays`` (of ``keys``) as one :class:`Block`, checked as
    :func:`unpack` checks each (:class:`BadEntry` names the first it refuses). Array operations
    over all entries at once: unpacking entry by entry cost 10 us each, more than the rest of
    assembling a short piece's row."""
    n = len(arrays)
    try:
        flat = np.concatenate(arrays) if n else np.zeros(0, np.int32)
    except ValueError:  # arrays of different dimensions
        flat = None
    if flat is None or flat.dtype != np.int32 or flat.ndim != 1:
        raise BadEntry(next(e for e, a in enumerate(arrays)
                            if a.dtype != np.int32 or a.ndim != 1))
    lengths = np.fromiter(map(len, arrays), np.int64, count=n)
    ends = np.cumsum(lengths)
    off = ends - lengths

    def refuse(bad: np.ndarray) -> None:
        if bad.any():
            raise BadEntry(int(np.argmax(bad)))

    refuse(lengths < HEADER)
    head = flat[off[:, None] + np.arange(HEADER)].astype(np.int64).reshape(n, HEADER)
    n_seq = head[:, 1]
    refuse((head[:, 0] != FORMAT) | (n_seq < 0))
    data = off + HEADER + n_seq * SEQ_FIELDS  # where each entry's ids begin
    refuse(data > ends)
    first_seq = np.concatenate([[0], np.cumsum(n_seq)])
    entry = np.repeat(np.arange(n), n_seq)
    within = np.arange(int(first_seq[-1])) - first_seq[entry]
    table = flat[(off[entry] + HEADER + within * SEQ_FIELDS)[:, None]
                 + np.arange(SEQ_FIELDS)].astype(np.int64).reshape(-1, SEQ_FIELDS)
    refuse(np.bincount(entry[(table[:, 4:7] < 0).any(axis=1)], minlength=n) > 0)
    at = []
    begin = data
    for col in (4, 5, 6):  # ids, bar starts, beat starts: each kind for all sequences in turn
        counts = table[:, col]
        before = np.cumsum(counts) - counts
        at.append(begin[entry] + before - before[first_seq[entry]])
        begin = begin + np.bincount(entry, weights=counts, minlength=n).astype(np.int64)
    refuse(begin != ends)
    return Block(keys=list(keys), flat=flat, first_seq=first_seq, n_input=head[:, 2],
                 out_of_range=(head[:, 3] & OUT_OF_RANGE) != 0, table=table, ids_at=at[0],
                 bars_at=at[1], beats_at=at[2])


ENTRY_CODE = (__name__, "pipeline.tokens.tokenizer", "pipeline.tokens.contract")
"""The modules whose code an entry depends on (encoding, the round-trip check, the packing; the
tokenizer's construction and special tokens): hashed into :func:`config_key`."""


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


# ---- trained vocabularies on cached base ids --------------------------------------------


def words(tokenizer: Any, byte_table: list[str], seq: SeqEncoding) -> list[str]:
    """A sequence as the per-bar/beat byte strings miditok feeds its trained model."""
    split = tokenizer.config.encode_ids_split
    starts = (seq.bar_starts if split == "bar" else seq.beat_starts if split == "beat"
              else np.zeros(1, np.int32)).tolist()
    text = "".join([byte_table[i] for i in seq.ids.tolist()])  # one character per base id
    bounds = [*starts, len(text)] if starts else [0, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def base_byte_table(tokenizer: Any) -> list[str]:
    """Base id -> the single character miditok's trained models see (private miditok map;
    tests check the result against ``tokenizer.encode``)."""
    return [tokenizer._vocab_base_id_to_byte[i] for i in range(len(tokenizer.vocab))]


def apply_model(tokenizer: Any, block: Block, batch: int = 2048) -> list[np.ndarray] | None:
    """Final ids of each sequence of ``block``: None when the tokenizer has no trained model
    (the base ids are final), else the trained model applied as ``encode`` does."""
    if not tokenizer.is_trained:
        return None
    table = base_byte_table(tokenizer)
    n = len(block.table)
    out: list[np.ndarray] = []
    for lo in range(0, n, batch):
        done = tokenizer._model.encode_batch(
            [words(tokenizer, table, block.sequence(j)) for j in range(lo, min(n, lo + batch))],
            is_pretokenized=True)
        out += [np.asarray(enc.ids, dtype=np.int32) for enc in done]
    return out


def expansion_table(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(flat base ids, offsets) of every final id, via miditok's public ``decode_token_ids``."""
    from miditok import TokSequence

    pieces = []
    for v in range(len(tokenizer)):
        seq = TokSequence(ids=[v], are_ids_encoded=v >= len(tokenizer.vocab))
        tokenizer.decode_token_ids(seq)
        pieces.append(np.asarray(seq.ids, dtype=np.int32))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return np.concatenate(pieces), offsets


def expand(ids: np.ndarray, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Final ids -> base ids, vectorised (``decode_token_ids`` is a Python loop per id)."""
    flat, offsets = table
    starts, lens = offsets[ids], offsets[ids + 1] - offsets[ids]
    pos = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return flat[pos + np.arange(int(lens.sum()))]


# ---- encoding one file (runs in worker processes) ------------------------------------------


def note_keys(score: Any, grid: int, program: int | None = None) -> np.ndarray:
    """(program, onset, pitch, duration) rows of every note, times on a ``grid`` ticks/quarter.

    ``grid`` must be a multiple of the score's time division, so two scores with different
    divisions (miditok decodes at its own) compare exactly. Drums use program -1; ``program``
    overrides every track's program.
    """
    return notes_keys_batch([score], grid, program)[0]


def notes_keys_batch(scores: list[Any], grid: int, program: int | None = None
                     ) -> list[np.ndarray]:
    """:func:`note_keys` of each score (``grid`` a multiple of every score's division):
    :func:`note_columns`, rows split per score."""
    owner, cols = note_columns(scores, grid, program)
    if not scores:
        return []
    return np.split(cols.T, np.cumsum(np.bincount(owner, minlength=len(scores)))[:-1])


def note_columns(scores: list[Any], grid: int, program: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The notes of all ``scores`` as ``(owner, columns)``: ``owner`` the score of each note
    (nondecreasing) and ``columns`` a (4, notes) array of program, onset, pitch and duration,
    times on ``grid`` ticks per quarter (a multiple of every score's division); drums are
    program -1 and ``program`` overrides every track's program. Built with a few array
    operations for all scores together."""
    owners, progs, factors, cols = [], [], [], {"time": [], "pitch": [], "duration": []}
    for k, score in enumerate(scores):
        factor = grid // int(score.ticks_per_quarter)
        for track in score.tracks:
            notes = track.notes.numpy()
            n = len(notes["time"])
            if n == 0:
                continue
            for name, values in cols.items():
                values.append(notes[name])
            prog = program if program is not None else (-1 if track.is_drum
                                                        else int(track.program))
            owners.append(k)
            progs.append(prog)
            factors.append(factor)
    if not progs:
        return np.zeros(0, np.int64), np.zeros((4, 0), np.int64)
    counts = np.fromiter((len(t) for t in cols["time"]), np.int64, count=len(progs))
    factor = np.repeat(np.asarray(factors, np.int64), counts)
    out = np.empty((4, int(counts.sum())), np.int64)
    out[0] = np.repeat(np.asarray(progs, np.int64), counts)
    out[1] = np.concatenate(cols["time"])
    out[1] *= factor
    out[2] = np.concatenate(cols["pitch"])
    out[3] = np.concatenate(cols["duration"])
    out[3] *= factor
    return np.repeat(np.asarray(owners, np.int64), counts), out


def match_counts(reference: Any, decoded: Any, program: int | None = None) -> tuple[int, int]:
    """(matched, decoded) note counts of ``decoded`` against ``reference`` (multisets)."""
    grid = lcm(int(reference.ticks_per_quarter), int(decoded.ticks_per_quarter))
    ref = note_keys(reference, grid, program)
    dec = note_keys(decoded, grid, program)
    return multiset_matches(ref, dec), len(dec)


def multiset_matches(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the multiset intersection of the rows of ``a`` and ``b``.

    Rows are first mapped to one int64 code each (mixed radix over the columns' joint ranges),
    so the common case, equal multisets, is two 1-D sorts; ``np.unique(axis=0)`` on the rows
    cost more than the decode it checks.
    """
    if len(a) == 0 or len(b) == 0:
        return 0
    ka, kb = _row_codes(a, b)
    ka, kb = np.sort(ka), np.sort(kb)
    if len(ka) == len(kb) and np.array_equal(ka, kb):
        return len(ka)
    _, codes = np.unique(np.concatenate([ka, kb]), return_inverse=True)
    codes = codes.reshape(-1)
    n = int(codes.max()) + 1
    return int(np.minimum(np.bincount(codes[: len(ka)], minlength=n),
                          np.bincount(codes[len(ka) :], minlength=n)).sum())


def same_per_owner(n: int, owner_a: np.ndarray, cols_a: np.ndarray, owner_b: np.ndarray,
                   cols_b: np.ndarray) -> np.ndarray:
    """Per owner ``0..n-1``: whether its rows in ``a`` and in ``b`` are the same multiset. Rows
    are given as columns (``cols_a[:, j]`` is row ``j``, owned by ``owner_a[j]``). Every pair
    is settled in one sort: each row becomes one code, with its owner as the most significant
    digit (:func:`_column_codes`), so after sorting both sides position ``p`` holds a row of
    the same owner in both wherever the owners' row counts agree. Cheaper than
    :func:`multiset_matches` per pair on the tens of rows of a short piece."""
    same = np.bincount(owner_a, minlength=n) == np.bincount(owner_b, minlength=n)
    keep_a, keep_b = same[owner_a], same[owner_b]
    if not keep_a.any():
        return same
    rows_a = [owner_a, *cols_a] if keep_a.all() else [c[keep_a] for c in (owner_a, *cols_a)]
    rows_b = [owner_b, *cols_b] if keep_b.all() else [c[keep_b] for c in (owner_b, *cols_b)]
    code_a, code_b = _column_codes(rows_a, rows_b)
    differ = np.sort(code_a) != np.sort(code_b)
    if differ.any():
        same[np.unique(np.sort(rows_a[0])[differ])] = False
    return same


def _row_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_column_codes` of rows ``a`` and ``b``."""
    return _column_codes(list(a.T), list(b.T))


def _column_codes(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One code per row of ``a`` and of ``b``, each given as its columns (row ``j`` of ``a`` is
    ``[col[j] for col in a]``), equal exactly when rows are equal and ordered as the rows are
    (first column most significant): mixed radix when the joint ranges fit in 62 bits, else
    the rank of each distinct row."""
    lo = [min(int(x.min()), int(y.min())) for x, y in zip(a, b, strict=True)]
    spans = [max(int(x.max()), int(y.max())) - v + 1 for x, y, v in zip(a, b, lo, strict=True)]
    if math.prod(spans) < 2**62:
        codes_a, codes_b = np.zeros(len(a[0]), np.int64), np.zeros(len(b[0]), np.int64)
        for col_a, col_b, low, span in zip(a, b, lo, spans, strict=True):
            codes_a *= span
            codes_a += col_a - low
            codes_b *= span
            codes_b += col_b - low
        return codes_a, codes_b
    both = np.concatenate([np.stack(a, axis=1), np.stack(b, axis=1)]).astype(np.int64)
    codes = np.unique(both, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return codes[: len(a[0])], codes[len(a[0]) :]


def nondecreasing(values: list[int]) -> bool:
    return all(map(operator.le, values, itertools.islice(values, 1, None)))


def chunk_starts(times: list[int], ticks: list[int], times_sorted: bool | None = None
                 ) -> np.ndarray:
    """Where each bar/beat sub-sequence starts: ``TokSequence._split_per_ticks`` on plain ints.

    Same walk as miditok's (which copies a sub-sequence per bar, the slowest part of encoding
    here): for each tick after the first, the first index at or after the previous one whose
    time is not before the tick, stopping at the end. Event times are sorted, so that is a
    bisection from the previous index (``times_sorted`` says so when the caller knows;
    unsorted times take the walk itself). Plain Python: a piece has tens of bars, where
    numpy's per-call cost exceeded the work. Tests check the chunks against the walk and
    against ``tokenizer.encode`` with a trained vocabulary.
    """
    n = len(times)
    if times_sorted is None:
        times_sorted = nondecreasing(times)
    idxs, ti = [0], 0
    for tick in ticks[1:]:
        if times_sorted:
            ti = bisect_left(times, tick, ti)
        else:
            while ti < n and times[ti] < tick:
                ti += 1
        if ti == n:
            break
        idxs.append(ti)
    return np.asarray(idxs, dtype=np.int32)


@dataclass(frozen=True)
class RoundTrip:
    """A round-trip check to settle: the base ``ids`` of sequence ``index`` of the encoding of
    file ``file`` (its position in a chunk), against the preprocessed ``reference`` score.
    Holds no ``TokSequence``: a chunk's worth of their events kept alive tripled the garbage
    collector's work."""

    file: int
    index: int  # position of the sequence in the encoding (= its track, per-track mode)
    ids: np.ndarray
    reference: Any
    one_stream: bool
    program: tuple[int, bool]


def encode_score(tokenizer: Any, score: Any, n_notes_input: int, *, check: bool,
                 checks: list[RoundTrip] | None = None, file: int = 0) -> Encoding:
    """Encode a *preprocessed* score with base ids; with ``check``, decode and compare notes.

    With ``checks`` the round-trip checks are appended there, to be settled later for a whole
    chunk of files (:func:`settle`), and the counts are left at -1 meanwhile."""
    from miditok import TokSequence

    tokseqs = tokenizer.encode(score, encode_ids=False, no_preprocess_score=True)
    one_stream = isinstance(tokseqs, TokSequence)
    if one_stream:
        tokseqs = [tokseqs]
    tracks = [] if one_stream else list(score.tracks)
    seqs = []
    mine: list[RoundTrip] = []
    for i, ts in enumerate(tokseqs):
        if one_stream:
            track, program, is_drum = -1, -1, False
            n_notes = int(score.note_num())
        elif i < len(tracks):
            track, program, is_drum = i, int(tracks[i].program), bool(tracks[i].is_drum)
            n_notes = len(tracks[i].notes)
        else:  # miditok gives one (empty) sequence for a score without tracks
            track, program, is_drum, n_notes = i, 0, False, 0
        ids = np.asarray(ts.ids, dtype=np.int32)
        if check:
            mine.append(RoundTrip(file, i, ids, score, one_stream, (program, is_drum)))
        times = list(map(_TIME, ts.events))
        ordered = times == sorted(times)
        seqs.append(SeqEncoding(track, program, is_drum, n_notes, ids,
                                chunk_starts(times, ts._ticks_bars, ordered),
                                chunk_starts(times, ts._ticks_beats, ordered), -1, -1))
    enc = Encoding(n_notes_input=n_notes_input, seqs=tuple(seqs))
    if checks is not None:
        checks.extend(mine)
        return enc
    return settle(tokenizer, mine, [enc])[0] if mine else enc


def settle(tokenizer: Any, checks: list[RoundTrip], encodings: list[Encoding]) -> list[Encoding]:
    """``encodings`` (indexed by each check's ``file``) with the round-trip counts of ``checks``
    filled in (:func:`roundtrip_batch`)."""
    if not checks:
        return encodings
    packed = [pack(enc) for enc in encodings]
    settle_packed(tokenizer, checks, packed)
    return [unpack(arr) for arr in packed]


def settle_packed(tokenizer: Any, checks: list[RoundTrip], packed: list[np.ndarray]) -> None:
    """Write the round-trip counts of ``checks`` (:func:`roundtrip_batch`) into the packed
    entries ``packed`` (indexed by each check's ``file``), in place."""
    if not checks:
        return
    t0 = time.perf_counter()
    for c, (matched, decoded) in zip(checks, roundtrip_batch(tokenizer, checks), strict=True):
        row = HEADER + c.index * SEQ_FIELDS
        packed[c.file][row + 7 : row + 9] = (matched, decoded)
    CLOCK["check"] += time.perf_counter() - t0


def roundtrip_batch(tokenizer: Any, checks: list[RoundTrip]) -> list[tuple[int, int]]:
    """(matched, decoded) note counts of each check's ``decode(seq)`` against its reference.

    One-stream REMI sequences are read together (:func:`remi_note_columns`) and compared with
    their references' notes (:func:`note_columns`) in one sort (:func:`same_per_owner`):
    numpy's per-call cost on a short piece exceeded the work, so a few calls per chunk of
    files replace a dozen per file. A sequence whose notes differ from the reference, or that
    the reader does not cover, is decoded by miditok (:func:`roundtrip_counts`), which gives
    the exact counts."""
    out: list[tuple[int, int] | None] = [None] * len(checks)
    fast_at = [k for k, c in enumerate(checks) if c.one_stream]
    read = remi_note_columns(tokenizer, [checks[k].ids for k in fast_at]) if fast_at \
        else None
    if read is not None:
        owner_d, cols_d, bad = read
        references = [checks[k].reference for k in fast_at]
        division = int(tokenizer.time_division)
        grid = lcm(division, *(int(r.ticks_per_quarter) for r in references))
        if grid != division:
            cols_d[[1, 3]] *= grid // division
        owner_r, cols_r = note_columns(references, grid)
        n = len(fast_at)
        same = same_per_owner(n, owner_r, cols_r, owner_d, cols_d) & ~bad
        n_ref = np.bincount(owner_r, minlength=n).tolist()
        for j in np.flatnonzero(same).tolist():
            out[fast_at[j]] = (n_ref[j], n_ref[j])
    return [o if o is not None else roundtrip_counts(tokenizer, c.ids, c.reference, c.index,
                                                     c.one_stream, c.program)
            for o, c in zip(out, checks, strict=True)]


def roundtrip_counts(tokenizer: Any, ids: np.ndarray, reference: Any, track: int,
                     one_stream: bool, program: tuple[int, bool]) -> tuple[int, int]:
    """(matched, decoded) note counts of miditok's ``decode`` of base ``ids`` against the
    preprocessed reference (miditok maps the ids back to their tokens, a bijection). Per-track
    sequences are compared with their own track, programs ignored (the stream does not encode
    them; they are passed back to the decoder).
    """
    from miditok import TokSequence

    fresh = TokSequence(ids=[int(i) for i in ids])
    if one_stream:
        return match_counts(reference, tokenizer.decode(fresh))
    decoded = tokenizer.decode([fresh], programs=[program])
    ref = reference.copy()
    keep = ref.tracks[track].copy() if track < len(ref.tracks) else None
    ref.tracks.clear()
    if keep is not None:
        ref.tracks.append(keep)
    return match_counts(ref, decoded, program=0)


# Token kinds of the REMI reader below.
_OTHER, _BAR, _POS, _PROG, _PITCH, _VEL, _DUR, _TS = range(8)
_REMI_SPECS: dict[int, Any] = {}


@dataclass(frozen=True)
class _RemiSpec:
    kind: np.ndarray  # per base id: one of the kinds above
    value: np.ndarray  # per base id: position, program, pitch or velocity; index of a duration
    # or of a time signature
    ts_bar: np.ndarray  # per time signature: ticks per bar
    ts_pos: np.ndarray  # per time signature: ticks per position
    dur_ticks: np.ndarray  # (time signature, duration index) -> ticks
    default_ts: int  # the decoder's default time signature
    pitch_range: tuple[int, int]


def _remi_spec(tokenizer: Any) -> _RemiSpec | None:
    """Lookup tables for :func:`remi_note_keys`, or None outside the configurations it reads:
    REMI, all programs in one stream, velocities and durations on every program, and none of
    rests, chords, pitch intervals, pedals, pitch bends, control changes, bar embeddings or
    bar-end tokens (each of those changes how miditok decodes time or notes)."""
    cached = _REMI_SPECS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    c = tokenizer.config
    extra = c.additional_params
    ok = (type(tokenizer).__name__ == "REMI" and c.use_programs
          and c.one_token_stream_for_programs and c.use_velocities
          and not any(getattr(c, k) for k in (
              "use_rests", "use_chords", "use_pitch_intervals", "use_sustain_pedals",
              "use_pitch_bends", "use_control_changes"))
          and extra.get("max_bar_embedding") is None and not extra.get("use_bar_end_tokens")
          and set(range(-1, 128)) <= set(c.use_note_duration_programs)
          and not getattr(tokenizer, "attribute_controls", None))
    spec = _build_remi_spec(tokenizer) if ok else None
    _REMI_SPECS[id(tokenizer)] = (tokenizer, spec)
    return spec


def _build_remi_spec(tokenizer: Any) -> _RemiSpec:
    from miditok.constants import TIME_SIGNATURE
    from miditok.utils import compute_ticks_per_bar
    from symusic import TimeSignature

    tpq = tokenizer.time_division
    kinds = {"Bar": _BAR, "Position": _POS, "Program": _PROG, "Pitch": _PITCH,
             "PitchDrum": _PITCH, "Velocity": _VEL, "Duration": _DUR, "TimeSig": _TS}
    n = len(tokenizer.vocab)
    kind, value = np.zeros(n, np.int64), np.zeros(n, np.int64)
    sigs: list[tuple[int, int]] = [tuple(TIME_SIGNATURE)]
    durs: list[str] = []
    for token, i in tokenizer.vocab.items():
        typ, _, val = token.partition("_")
        k = kinds.get(typ, _OTHER)
        if k == _BAR and val != "None":
            k = _OTHER
        kind[i] = k
        if k == _DUR:
            value[i] = len(durs)
            durs.append(val)
        elif k == _TS:
            sig = tuple(tokenizer._parse_token_time_signature(val))
            if sig not in sigs:
                sigs.append(sig)
            value[i] = sigs.index(sig)
        elif k in (_POS, _PROG, _PITCH, _VEL):
            value[i] = int(val)
    tpbs = [tokenizer._tpb_per_ts[den] for _, den in sigs]
    ts_bar = np.array([compute_ticks_per_bar(TimeSignature(0, num, den), tpq)
                       for num, den in sigs], np.int64)
    ts_pos = np.array([tokenizer._compute_ticks_per_pos(t) for t in tpbs], np.int64)
    dur_ticks = np.array([[int(tokenizer._tpb_tokens_to_ticks[t][d]) for d in durs]
                          for t in tpbs], np.int64).reshape(len(sigs), len(durs))
    lo, hi = tokenizer.config.pitch_range
    return _RemiSpec(kind, value, ts_bar, ts_pos, dur_ticks, 0, (int(lo), int(hi)))


def _back(idx: np.ndarray, values: np.ndarray, query: np.ndarray, start: np.ndarray,
          default: np.ndarray | int) -> np.ndarray:
    """Per index in ``query``: ``values[k]`` for the latest ``idx[k]`` (sorted indices) at or
    before it and no earlier than its ``start`` (where its sequence starts), else ``default``."""
    if idx.size == 0:
        return np.broadcast_to(np.asarray(default, np.int64), query.shape).copy()
    pos = np.searchsorted(idx, query, side="right") - 1
    at = np.maximum(pos, 0)
    return np.where((pos >= 0) & (idx[at] >= start), values[at], default)


def _first(idx: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per sequence (indices ``begin`` to ``end``), the first of the sorted indices ``idx`` in
    it, else its ``end``."""
    if idx.size == 0:
        return end.copy()
    found = idx[np.minimum(np.searchsorted(idx, begin), idx.size - 1)]
    return np.where((found >= begin) & (found < end), found, end)


def remi_note_keys(tokenizer: Any, ids: np.ndarray) -> np.ndarray | None:
    """(program, onset, pitch, duration) rows of the notes miditok's REMI ``decode`` gives for
    base ``ids`` (one stream), on the tokenizer's time division; None for configurations
    :func:`_remi_spec` does not cover or ids outside the vocabulary
    (:func:`remi_note_keys_batch` on one sequence)."""
    keys = remi_note_keys_batch(tokenizer, [ids])
    return None if keys is None else keys[0]


def remi_note_keys_batch(tokenizer: Any, sequences: list[np.ndarray]
                         ) -> list[np.ndarray | None] | None:
    """:func:`remi_note_keys` of each sequence, read together: None for configurations
    :func:`_remi_spec` does not cover, and None in place of a sequence with ids outside the
    vocabulary (:func:`remi_note_columns`, rows split per sequence)."""
    read = remi_note_columns(tokenizer, sequences)
    if read is None:
        return None
    owner, cols, bad = read
    if not sequences:
        return []
    parts = np.split(cols.T, np.cumsum(np.bincount(owner, minlength=len(sequences)))[:-1])
    return [None if b else part for b, part in zip(bad.tolist(), parts, strict=True)]


def remi_note_columns(tokenizer: Any, sequences: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The notes miditok's REMI ``decode`` gives for each sequence of base ids (one stream), read
    together: ``(owner, columns, bad)``, ``owner`` the sequence of each note (nondecreasing),
    ``columns`` a (4, notes) array of program, onset, pitch and duration on the tokenizer's time
    division, and ``bad`` per sequence whether it holds ids outside the vocabulary (its notes
    are then not to be trusted). None for configurations :func:`_remi_spec` does not cover.

    The same reading as ``REMI._tokens_to_score``, with every look-back bounded by its
    sequence's start. The time signature is the first TimeSig token when it comes before any
    note token (else the default), then the latest TimeSig token. The bar counter starts at -1,
    a Position before any Bar sets it to 0 and each Bar adds one, moving the bar's start by a
    bar of the current signature when the counter becomes positive; the current time is set by
    the latest Bar or Position. A Pitch makes a note at the current time and program when its
    next two tokens are a Velocity and a Duration and the pitch is within range; the duration's
    ticks depend on the signature. Drums are program -1, as in :func:`note_keys`.

    Only the tokens that matter are visited: each look-back is a binary search among the
    indices of one kind of token (numpy's cost per element, over every token of a chunk of
    files, was more than the decoding it replaces). Tests compare it with miditok's
    ``decode``.
    """
    spec = _remi_spec(tokenizer)
    if spec is None:
        return None
    n_seq = len(sequences)
    lengths = np.fromiter((len(x) for x in sequences), dtype=np.int64, count=n_seq)
    end = np.cumsum(lengths)
    begin = end - lengths
    bad = np.zeros(n_seq, dtype=bool)
    n = int(end[-1]) if n_seq else 0
    if n == 0:
        return np.zeros(0, np.int64), np.zeros((4, 0), np.int64), bad
    ids = np.concatenate(sequences).astype(np.int64, copy=False)
    invalid = (ids < 0) | (ids >= len(spec.kind))
    if invalid.any():
        bad[np.searchsorted(end, np.flatnonzero(invalid), side="right")] = True
        ids = np.where(invalid, 0, ids)
    kind, value = spec.kind[ids], spec.value[ids]

    def seq_of(idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(end, idx, side="right")

    i_ts = np.flatnonzero(kind == _TS)
    if i_ts.size:
        first_note = _first(np.flatnonzero((kind >= _PITCH) & (kind <= _DUR)), begin, end)
        first_ts = _first(i_ts, begin, end)
        initial = np.where(first_ts < first_note, value[np.minimum(first_ts, n - 1)],
                           spec.default_ts)

    def signature(idx: np.ndarray, seq: np.ndarray) -> np.ndarray:
        if not i_ts.size:
            return np.full(idx.size, spec.default_ts, np.int64)
        return _back(i_ts, value[i_ts], idx, begin[seq], initial[seq])

    i_bar, i_pos = np.flatnonzero(kind == _BAR), np.flatnonzero(kind == _POS)
    bar_seq = seq_of(i_bar)
    step = spec.ts_bar[signature(i_bar, bar_seq)]
    first_bar, first_pos = _first(i_bar, begin, end), _first(i_pos, begin, end)
    step[(i_bar == first_bar[bar_seq]) & (first_bar < first_pos)[bar_seq]] = 0  # sets it to 0
    total = np.cumsum(step)
    seq_first = np.searchsorted(i_bar, begin[bar_seq])  # the first Bar of each Bar's sequence
    bar_tick = total - (total - step)[seq_first]  # the bar's start: steps since its sequence's
    pos_seq = seq_of(i_pos)
    pos_tick = (_back(i_bar, bar_tick, i_pos, begin[pos_seq], 0)
                + value[i_pos] * spec.ts_pos[signature(i_pos, pos_seq)])
    setter = np.zeros(n, np.int64)  # the time each Bar or Position sets
    setter[i_bar] = bar_tick
    setter[i_pos] = pos_tick
    i_set = np.flatnonzero((kind == _BAR) | (kind == _POS))

    lo, hi = spec.pitch_range
    at = np.flatnonzero((kind == _PITCH) & (value >= lo) & (value <= hi))
    at = at[at + 2 < end[seq_of(at)]]
    at = at[(kind[at + 1] == _VEL) & (kind[at + 2] == _DUR)]
    seq = seq_of(at)
    start = begin[seq]
    tick = _back(i_set, setter[i_set], at, start, 0)
    i_prog = np.flatnonzero(kind == _PROG)
    program = _back(i_prog, value[i_prog], at, start, 0)
    dur = spec.dur_ticks[signature(at, seq), value[at + 2]]
    return seq, np.stack([program, tick, value[at], dur]), bad


def transposition_allowed(tokenizer: Any, score: Any, offset: int) -> bool:
    """True when every pitched (non-drum) note stays inside the tokenizer's (inclusive) range."""
    lo, hi = tokenizer.config.pitch_range
    pitches = [t.notes.numpy()["pitch"] for t in score.tracks if not t.is_drum and len(t.notes)]
    if not pitches:
        return True
    allp = np.concatenate(pitches).astype(np.int64) + offset
    return bool(allp.min() >= lo and allp.max() <= hi)


def encode_file(tokenizer: Any, path: Path | str, sha: str, transposes: tuple[int, ...],
                checks: list[RoundTrip] | None = None, file: int = 0) -> dict[int, Encoding]:
    """Read, verify and encode one file at each transposition (0 = the piece itself).

    Raises ``SourceError`` for a missing, changed or unparsable file. Transposition 0 is
    round-trip checked; augmented copies are not (they are training data only). With
    ``checks``, the check is left there to be settled with others (:func:`settle`).
    """
    from symusic import Score

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:  # strerror only: the message must not carry a machine's path
        raise SourceError("read_error", f"{type(e).__name__}: {e.strerror}") from None
    if sha256_bytes(data) != sha:
        raise SourceError("sha_mismatch", "file content changed since ingest")
    try:
        score = Score.from_midi(data)
    except Exception as e:  # symusic raises RuntimeError; anything else is also the file's fault
        raise SourceError("read_error", f"{type(e).__name__}: {e}") from None
    n_input = int(score.note_num())
    pre = tokenizer.preprocess_score(score)
    out = {}
    mine: list[RoundTrip] | None = [] if checks is not None else None
    for offset in transposes:
        if offset == 0:
            out[0] = encode_score(tokenizer, pre, n_input, check=True, checks=mine, file=file)
        elif not transposition_allowed(tokenizer, pre, offset):
            out[offset] = Encoding(n_notes_input=n_input, seqs=(), out_of_range=True)
        else:
            from miditok.data_augmentation import augment_score

            out[offset] = encode_score(tokenizer, augment_score(pre, pitch_offset=offset),
                                       n_input, check=False)
    if checks is not None and mine:  # only a file encoded whole leaves checks to settle
        checks.extend(mine)
    return out


class SourceError(Exception):
    """A source file that cannot be encoded; ``flag`` names the reason for the token table."""

    def __init__(self, flag: str, detail: str) -> None:
        super().__init__(f"{flag}: {detail}")
        self.flag = flag
        self.detail = detail


# ---- filling the cache in worker processes ------------------------------------------------

_WORKER: dict[str, Any] = {}
Job = tuple[str, str, tuple[int, ...]]  # (sha256, path, transpositions to encode)
# Seconds spent in this process: encoding jobs (all of it) and, within that, the round-trip
# check and writing the cache; reported in the timing sidecar, never in an artifact.
CLOCK = {"encode": 0.0, "check": 0.0, "cache_write": 0.0}


def _init_worker(factory: tuple, cache_root: str | None, key: str) -> None:
    """Build the base tokenizer once per worker process (``factory = (fn, *args)``)."""
    fn, *args = factory
    _WORKER["tokenizer"] = fn(*args)
    _WORKER["cache"] = TokenCache(cache_root, key) if cache_root else None


def _encode_chunk(jobs: tuple[Job, ...]) -> tuple[list[Any], dict[str, float]]:
    """Encode each job, settle the chunk's round-trip checks together and write the chunk's
    entries as one cache segment; return per job {transposition: packed array} (None in place
    of the array when the cache holds it: the parent reads it from there) or (flag, detail),
    and the seconds this chunk spent per phase."""
    before = dict(CLOCK)
    t0 = time.perf_counter()
    tokenizer = _WORKER["tokenizer"]
    out: list[Any] = []
    checks: list[RoundTrip] = []
    for k, (sha, path, transposes) in enumerate(jobs):
        try:
            encs = encode_file(tokenizer, path, sha, transposes, checks, file=k)
        except SourceError as e:
            out.append((e.flag, e.detail))
            continue
        except Exception as e:  # a file miditok cannot encode is flagged, never fatal
            out.append(("encode_error", f"{type(e).__name__}: {e}"))
            continue
        out.append(encs)
    out = [{t: pack(enc) for t, enc in r.items()} if isinstance(r, dict) else r for r in out]
    # the checks of base encodings (transposition 0; a job may hold only augmented copies)
    bases = [r.get(0) if isinstance(r, dict) else None for r in out]
    try:
        settle_packed(tokenizer, checks, bases)
    except Exception:  # settle the chunk's checks one file at a time: only a bad one is flagged
        for k in sorted({c.file for c in checks}):
            try:
                settle_packed(tokenizer, [c for c in checks if c.file == k], bases)
            except Exception as e:
                out[k] = ("encode_error", f"{type(e).__name__}: {e}")
    t1 = time.perf_counter()
    CLOCK["encode"] += t1 - t0
    if _WORKER["cache"] is not None:
        _WORKER["cache"].put_many([(sha, t, arr) for (sha, _, _), r in zip(jobs, out, strict=True)
                                   if isinstance(r, dict) for t, arr in r.items()])
        out = [dict.fromkeys(r) if isinstance(r, dict) else r for r in out]
        CLOCK["cache_write"] += time.perf_counter() - t1
    return out, {k: CLOCK[k] - before[k] for k in CLOCK}


def chunk_size(n_jobs: int, workers: int) -> int:
    """Files per chunk: about 8 chunks per worker, between ``MIN_CHUNK`` and ``MAX_CHUNK`` files.

    Each chunk costs a cache segment (a Parquet write and an fsync), one batched round-trip
    check and a round trip to the pool, so a small run (adding 1% of a corpus) uses few
    chunks: chunks of a file or two wrote a segment each and forced a merge."""
    return min(MAX_CHUNK, max(MIN_CHUNK, math.ceil(n_jobs / (workers * 8))))


def chunk_bounds(n_jobs: int, workers: int) -> list[int]:
    """Where each chunk of ``n_jobs`` starts (then ``n_jobs``): chunks of at most
    :func:`chunk_size` files, as many as a multiple of ``workers`` and of sizes that differ by at
    most one, so that the workers finish together (a +1% run of 50 files made chunks of 16, 16,
    16 and 2: one worker encoded 32 files while the other encoded 18)."""
    n = -(-n_jobs // chunk_size(n_jobs, workers))
    n = min(max(1, n_jobs), n + -n % workers)
    return [n_jobs * k // n for k in range(n + 1)]


def encode_missing(jobs: list[Job], factory: tuple, cache: TokenCache | None, *, workers: int,
                   timeout_s: float, show_progress: bool | str = "auto",
                   seconds: dict[str, float] | None = None,
                   closing: list[threading.Thread] | None = None) -> dict[str, Any]:
    """Encode ``jobs`` in isolated worker processes, in chunks; write entries to ``cache``.

    Returns sha256 -> {transpose: packed entry (:func:`pack`), or None when written to
    ``cache``} or (flag, detail). A chunk lost to a crash or a timeout is retried one file at
    a time, so one bad file only costs its own row. Worker
    seconds per phase are added to ``seconds`` when given; ``closing`` is passed on to
    :func:`~pipeline.core.parallel.isolated_map` (the caller joins the pools).
    """
    from pipeline.core.parallel import ItemFailure, isolated_map

    if not jobs:
        return {}
    workers = max(1, min(workers, len(jobs)))
    chunks = [tuple(jobs[a:b]) for a, b in itertools.pairwise(chunk_bounds(len(jobs), workers))]
    initargs = (factory, str(cache.root) if cache else None, cache.key if cache else "")
    clock = seconds if seconds is not None else {}

    def run_chunks(chs: list[tuple[Job, ...]]) -> list[Any]:
        results = isolated_map(_encode_chunk, chs, workers=workers,
                               timeout_s=timeout_s * max(len(c) for c in chs), desc="tokenize",
                               show_progress=show_progress, initializer=_init_worker,
                               initargs=initargs, closing=closing)
        out = []
        for res in results:
            if isinstance(res, ItemFailure):
                out.append(res)
                continue
            for k, v in res[1].items():
                clock[k] = clock.get(k, 0.0) + v
            out.append(res[0])
        return out

    raw: dict[str, Any] = {}
    retry: list[tuple[Job, ...]] = []
    for chunk, res in zip(chunks, run_chunks(chunks), strict=True):
        if isinstance(res, ItemFailure):
            retry += [(job,) for job in chunk]
        else:
            raw.update({job[0]: r for job, r in zip(chunk, res, strict=True)})
    if retry:
        for chunk, res in zip(retry, run_chunks(retry), strict=True):
            raw[chunk[0][0]] = (("worker_" + res.kind, res.message)
                                if isinstance(res, ItemFailure) else res[0])
    return raw

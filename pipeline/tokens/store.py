"""The content-addressed store of entries (``.cache/tokens/``).

Entries (:mod:`pipeline.tokens.entries`) are cached under the key of their file's bytes and
transposition, in a folder named for the base tokenizer configuration (:func:`config_key`), and
reused when files are added, the vocabulary is retrained or a run is interrupted. A trained
vocabulary is applied to cached base ids when the output is assembled
(:func:`pipeline.tokens.vocabulary.apply_model`), exactly as ``tokenizer.encode`` would.

Layout: ``<root>/<config_key>/seg-<hash>.parquet``, the segments of a
:class:`~pipeline.core.segments.SegmentStore`: Parquet tables of (``key``, ``entry``), ``key``
being ``"<sha256>:<transpose>"`` (:func:`entry_key`) and ``entry`` one entry packed as
little-endian int32 (see :func:`~pipeline.tokens.entries.pack`; it starts with a magic/format
number and its length is checked on load). Each worker writes one segment per chunk of files it
encoded, atomically, so a killed run keeps every finished chunk (one file per segment, not one
per piece: a file per entry cost an fsync of about 4 ms each and an inode per piece, which
neither the file system nor DVC handle well at a million pieces). Segments are sorted by key and
written in row groups of ``SEGMENT_ROWS`` entries. A run checks every stored entry it wants once
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

import itertools
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.artifacts import code_digest, sha256_json
from pipeline.core.row_groups import RowGroups
from pipeline.core.segments import SegmentStore, StoreChanged
from pipeline.tokens.entries import (
    FORMAT,
    BadEntry,
    Encoding,
    EntryBlock,
    Key,
    entries_ok,
    pack,
    parse_block,
)

STORE = 3  # storage layout version, part of the config key (1: one file per entry; 2: segments
# of (sha256, transpose, entry) written by the store itself)
FANOUT = 8  # segments of one size tier merged once this many exist
SEGMENT_ROWS = 256
"""Entries per row group of a segment (about 3 MB of long pieces): segments are read, merged and
fetched from a row group at a time (a segment written as one row group of 100,000 long pieces
was 1.1 GB to hold and 4-6 s to read)."""
SEGMENT_SCHEMA = pa.schema([("key", pa.string()), ("entry", pa.binary())])
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


def entry_key(sha: str, transpose: int) -> str:
    """The store's key of the entry of file ``sha`` at ``transpose``: ``"<sha256>:<transpose>"``
    (segments are sorted by it: a file's entries lie together)."""
    return f"{sha}:{transpose}"


def key_of(stored: str) -> Key:
    """Inverse of :func:`entry_key`."""
    sha, _, transpose = stored.rpartition(":")
    return sha, int(transpose)


class TokenCache(SegmentStore):
    """Entries under one base-config key ``root/<key>/``: a
    :class:`~pipeline.core.segments.SegmentStore` of (``key``, ``entry``) rows keyed by
    :func:`entry_key`, sorted by key in each segment, never merged on add (workers add
    segments side by side; the stage calls :meth:`compact` once they are done)."""

    def __init__(self, root: Path | str, key: str) -> None:
        super().__init__(Path(root) / key, SEGMENT_SCHEMA, "key", max_segments=None,
                         group_rows=SEGMENT_ROWS)
        self.root = Path(root)

    def present(self) -> set[Key]:
        """(sha256, transpose) of every entry in the folder now (no entry is decoded)."""
        self.refresh()
        return set(map(key_of, self.keys))

    def locate(self, wanted: set[Key] | None = None, *, check: bool = True,
               segments: list[Path] | None = None,
               groups: RowGroups | None = None) -> dict[Key, tuple[Path, int]]:
        """Where each stored entry of ``wanted`` (all when None) lies: (segment, row), the first
        segment in name order holding it. With ``check`` each entry is read and checked
        (:func:`entries_ok`; one that fails is left out, so it is recomputed), a row group at a
        time, and ``groups`` (the run's :attr:`Entries.groups`) holds what it read, as far as
        its limit allows, so that a small store is not read twice; without, only the keys are
        read (for ``segments`` this run's workers wrote)."""
        found: dict[Key, tuple[Path, int]] = {}
        names = None if wanted is None else {entry_key(*k): k for k in wanted}
        columns = ["key", "entry"] if check else ["key"]
        for seg in self.refresh() if segments is None else sorted(segments):
            for g, row, t in self.row_groups(seg, columns):
                stored = t.column(0).to_pylist()
                good = [True] * t.num_rows
                if check:
                    arrays = _entry_arrays(t.column(1))
                    good = entries_ok(arrays).tolist()
                    if groups is not None:
                        groups.hold(seg, g, ENTRY_COLUMNS, arrays, t.column(1).nbytes)
                for i, (name, ok) in enumerate(zip(stored, good, strict=True)):
                    key = key_of(name) if names is None else names.get(name)
                    if ok and key is not None and key not in found:
                        found[key] = (seg, row + i)
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
        """Write entries (packed arrays or Encodings) as one new segment, sorted by key, and
        return it (None without entries)."""
        rows = sorted((entry_key(sha, int(t)), (e if isinstance(e, np.ndarray) else pack(e))
                       .astype("<i4").tobytes()) for sha, t, e in items)
        return self.add(pa.table([pa.array([k for k, _ in rows], pa.string()),
                                  pa.array([b for _, b in rows], pa.binary())],
                                 schema=SEGMENT_SCHEMA))

    def put(self, sha: str, transpose: int, enc: Encoding) -> None:
        self.put_many([(sha, transpose, enc)])

    def compact(self, fanout: int = FANOUT) -> int:
        """Merge segments of similar size (:meth:`SegmentStore.compact
        <pipeline.core.segments.SegmentStore.compact>`); returns the segments removed."""
        return super().compact(fanout)

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
        removed += self.retain({entry_key(*k) for k in keep})
        if self.dir.is_dir() and not any(self.dir.iterdir()):
            self.dir.rmdir()
        return removed


class Entries:
    """A run's base encodings, read when needed: entries of the store (by :meth:`TokenCache.locate`)
    and entries held in memory (a run without a store). :meth:`get` reads the store a row group
    at a time (:class:`~pipeline.core.row_groups.RowGroups`, which holds a few): segments are
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

    def block(self, keys: list[Key]) -> EntryBlock:
        """The entries of ``keys`` (each must be held: ``key in self``) as one :class:`EntryBlock`.
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


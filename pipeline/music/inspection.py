"""Per-file work of ingest: read, hash and parse MIDI files and judge them against the limits
(:func:`inspect_many`), in isolated worker processes over chunks of files (:func:`inspect_all`),
with the results as columns (:class:`Results`). A file that crashes or hangs its worker costs only
its own row: a chunk that dies is retried one file at a time."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.core import artifacts
from pipeline.core.parallel import ItemFailure, isolated_map
from pipeline.music.manifest import NOTES_SCHEMA, IngestConfig
from pipeline.music.parsing import (
    NOTE_COLUMNS,
    durations_beats,
    looks_like_midi,
    max_gaps_beats,
    note_hashes,
    parse_many,
)


def inspect_many(datas: list[bytes],
                 cfg: IngestConfig) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Parse several files' bytes and apply the limits: one plain dict per file, ``reason`` and
    ``detail`` ('' when the file is ok), the parsed facts when it parsed and ``note_hash`` when
    it is ok; and the notes of the ok files concatenated in order (``n_notes`` each). The files are
    parsed together (:func:`~pipeline.music.parsing.parse_many`: one sort of all their notes) and
    hashed together; a worker's chunk of small files costs about half as much this way as one
    file at a time."""
    rows: list[dict] = [{"reason": "not_midi", "detail": f"starts with {d[:8]!r}"} for d in datas]
    midi_rows = [k for k, d in enumerate(datas) if looks_like_midi(d)]
    parsed = parse_many([datas[k] for k in midi_rows])
    gaps = max_gaps_beats(parsed.notes, parsed.counts)
    ends = durations_beats(parsed.notes, parsed.counts)
    ok = np.zeros(len(midi_rows), bool)
    for j, k in enumerate(midi_rows):
        if parsed.errors[j] is not None:
            rows[k] = {"reason": "corrupt", "detail": parsed.errors[j]}
            continue
        n_notes = int(parsed.counts[j])
        rows[k] = row = {
            "n_notes": n_notes,
            "n_tracks": int(parsed.n_tracks[j]),
            "tpq": int(parsed.tpq[j]),
            "duration_s": float(parsed.duration_s[j]),
            "duration_beats": float(ends[j]),
            "reason": "",
            "detail": "",
        }
        gap, duration_s = float(gaps[j]), row["duration_s"]
        if n_notes < cfg.min_notes:
            row.update(reason="no_notes", detail=f"{n_notes} notes")
        elif n_notes > cfg.max_notes:
            row.update(reason="too_many_notes", detail=f"{n_notes} notes > {cfg.max_notes}")
        elif gap > cfg.max_gap_beats:
            row.update(
                reason="absurd_timing", detail=f"silence of {gap:g} beats > {cfg.max_gap_beats:g}"
            )
        elif duration_s > cfg.max_duration_s:
            row.update(reason="too_long", detail=f"{duration_s:g} s > {cfg.max_duration_s:g}")
        else:
            ok[j] = True
    keep = np.repeat(ok, parsed.counts)
    notes = {c: v[keep] for c, v in parsed.notes.items()}
    for j, h in zip(np.flatnonzero(ok).tolist(), note_hashes(notes, parsed.counts[ok]),
                    strict=True):
        rows[midi_rows[j]]["note_hash"] = h
    return rows, notes


def _no_notes(col: str) -> np.ndarray:
    return np.zeros(0, NOTES_SCHEMA.field(col).type.value_type.to_pandas_dtype())


INT_FACTS = ("n_notes", "n_tracks", "tpq")
FLOAT_FACTS = ("duration_s", "duration_beats")
RESULTS_SCHEMA = pa.schema(
    [
        ("sha256", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("note_hash", pa.string()),
        ("parsed", pa.bool_()),
        *[(c, pa.int64()) for c in INT_FACTS],
        *[(c, pa.float64()) for c in FLOAT_FACTS],
        *[(f.name, f.type) for f in NOTES_SCHEMA if f.name != "sha256"],
    ]
)
"""One row per file as :meth:`Results.table` gives it (the notes of ok files included): what
the result cache stores."""


@dataclass
class Results:
    """Per-file results as columns, in file order: a worker returns one per chunk (a few arrays
    and string lists cross the process boundary, not a dict per file), the parent joins them.
    ``failed`` marks files whose worker crashed, hung or raised (quarantined, never cached);
    ``parsed`` marks rows whose facts (``ints``: INT_FACTS, ``floats``: FLOAT_FACTS) are set;
    ``counts`` is the number of notes kept (0 unless the file is ok); ``chunks`` holds the kept
    notes as (rows, notes of those rows concatenated) for consecutive runs of rows: one per
    worker's chunk, written to the notes table as they are (:func:`_notes_table`)."""

    sha256: list[str]
    failed: np.ndarray
    reason: list[str]
    detail: list[str]
    note_hash: list[str]
    parsed: np.ndarray
    ints: np.ndarray
    floats: np.ndarray
    counts: np.ndarray
    chunks: list[tuple[int, dict[str, np.ndarray]]]

    @classmethod
    def empty(cls, n: int) -> Results:
        return cls([""] * n, np.zeros(n, bool), [""] * n, [""] * n, [""] * n,
                   np.zeros(n, bool), np.zeros((n, len(INT_FACTS)), np.int64),
                   np.zeros((n, len(FLOAT_FACTS)), np.float64), np.zeros(n, np.int64),
                   [(n, {c: _no_notes(c) for c in NOTE_COLUMNS})])

    def set(self, k: int, r: dict) -> None:
        """Row ``k`` from one of :func:`inspect_many`'s dicts (its notes are set by the caller)."""
        self.reason[k], self.detail[k] = r["reason"], r["detail"]
        self.note_hash[k] = r.get("note_hash", "")
        if "n_notes" in r:
            self.parsed[k] = True
            self.ints[k] = [r[c] for c in INT_FACTS]
            self.floats[k] = [r[c] for c in FLOAT_FACTS]

    @classmethod
    def concat(cls, parts: list[Results]) -> Results:
        if not parts:
            return cls.empty(0)
        return cls(
            [h for p in parts for h in p.sha256],
            np.concatenate([p.failed for p in parts]),
            [v for p in parts for v in p.reason],
            [v for p in parts for v in p.detail],
            [v for p in parts for v in p.note_hash],
            np.concatenate([p.parsed for p in parts]),
            np.concatenate([p.ints for p in parts]),
            np.concatenate([p.floats for p in parts]),
            np.concatenate([p.counts for p in parts]),
            [chunk for p in parts for chunk in p.chunks],
        )

    def table(self) -> pa.Table:
        """All rows as a CACHE_SCHEMA table; the note lists are built from each chunk's flat arrays
        and offsets (no copy of the notes, no Python object per note or per row)."""
        cols = {
            "sha256": to_arrow(self.sha256, pa.string()),
            "reason": to_arrow(self.reason, pa.string()),
            "detail": to_arrow(self.detail, pa.string()),
            "note_hash": to_arrow(self.note_hash, pa.string()),
            "parsed": to_arrow(self.parsed, pa.bool_()),
            **{c: to_arrow(self.ints[:, j], pa.int64()) for j, c in enumerate(INT_FACTS)},
            **{c: to_arrow(self.floats[:, j], pa.float64()) for j, c in enumerate(FLOAT_FACTS)},
        }
        starts = np.cumsum([0] + [rows for rows, _ in self.chunks])
        offsets = [to_arrow(np.concatenate([[0], np.cumsum(self.counts[a:b])]), pa.int32())
                   for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)]
        for c, f in zip(NOTE_COLUMNS, NOTES_SCHEMA.types[1:], strict=True):
            cols[c] = pa.chunked_array(
                [pa.ListArray.from_arrays(off, to_arrow(notes[c], f.value_type), type=f)
                 for off, (_, notes) in zip(offsets, self.chunks, strict=True)], type=f)
        return pa.Table.from_pydict(cols, schema=RESULTS_SCHEMA)


def to_arrow(values: np.ndarray | list, type_: pa.DataType,
             mask: np.ndarray | None = None) -> pa.Array:
    """A 1-D numpy array, or a list of str (None for null), as an Arrow array of ``type_``
    (``mask``: True where null), built from its buffers. Not ``pa.array``: its first call imports
    pandas (about 0.3 s, a large share of a small run), which nothing here needs."""
    if type_ == pa.string():
        if None in values:
            mask = np.array([v is None for v in values], bool)
            values = ["" if v is None else v for v in values]
        text = "".join(values)
        data = text.encode("utf-8")
        sizes = map(len, values) if len(data) == len(text) else (  # ASCII: 1 byte a character
            len(v.encode("utf-8")) for v in values)
        offsets = np.zeros(len(values) + 1, np.int64)
        offsets[1:] = np.cumsum(np.fromiter(sizes, np.int64, len(values)))
        buffers = [pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    elif type_ == pa.bool_():
        buffers = [pa.py_buffer(np.packbits(np.asarray(values, bool), bitorder="little"))]
    else:
        buffers = [pa.py_buffer(np.ascontiguousarray(values, dtype=type_.to_pandas_dtype()))]
    valid = None if mask is None or not mask.any() else pa.py_buffer(
        np.packbits(~mask, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [valid, *buffers])


def from_arrow(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric Arrow array without nulls as numpy, from its buffers (``to_numpy`` imports
    pandas, see :func:`to_arrow`)."""
    dtype = np.dtype(values.type.to_pandas_dtype())
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return np.concatenate([np.zeros(0, dtype)] + [
        np.frombuffer(c.buffers()[1], dtype, count=len(c), offset=c.offset * dtype.itemsize)
        for c in chunks
    ])


def _inspect_chunk(task: tuple[str, list[str], IngestConfig]) -> Results:
    """Read each file, sha256 its bytes, then parse and judge the chunk's files together
    (:func:`inspect_many`). Runs in a worker."""
    root, rels, cfg = task
    out = Results.empty(len(rels))
    datas: list[bytes] = []
    for k, rel in enumerate(rels):
        with open(os.path.join(root, rel), "rb") as f:
            datas.append(f.read())
        out.sha256[k] = hashlib.sha256(datas[-1]).hexdigest()
    rows, notes = inspect_many(datas, cfg)
    out.chunks = [(len(rels), notes)]
    for k, r in enumerate(rows):
        out.set(k, r)
        if "note_hash" in r:
            out.counts[k] = r["n_notes"]
    return out


CHUNK_BYTES = 8 << 20
"""At most this many bytes of files per task (a chunk of large files also gets one timeout)."""


def chunk_size(n_files: int, workers: int) -> int:
    """Files per task: 8-64, about 8 tasks per worker on small inputs (so the last tasks
    balance), 64 on large ones (a task's round trip costs about as much as parsing a file)."""
    return int(min(64, max(8, n_files // (8 * max(1, workers)))))


def chunk_spans(sizes: list[int], workers: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` runs of files: at most :func:`chunk_size` files and, unless
    one file alone is larger, CHUNK_BYTES bytes each."""
    limit, spans, lo, total = chunk_size(len(sizes), workers), [], 0, 0
    for i, size in enumerate(sizes):
        if i > lo and (i - lo >= limit or total + size > CHUNK_BYTES):
            spans.append((lo, i))
            lo, total = i, 0
        total += size
    if lo < len(sizes):
        spans.append((lo, len(sizes)))
    return spans


def file_hashes(root: str, rels: list[str], sizes: np.ndarray, index: Path | None,
                workers: int) -> list[str]:
    """Each file's sha256: the one the corpus stage recorded in ``index`` (``raw_index.parquet``)
    where it lists the path with the same size, else read and hashed here (in threads). The files
    parsed are hashed again as they are read, and must match (see :func:`run`)."""
    known: dict[str, tuple[str, int]] = {}
    if index is not None and Path(index).exists():
        t = artifacts.read_table(index, ["path", "sha256", "size_bytes"]).to_pydict()
        known = dict(zip(t["path"], zip(t["sha256"], t["size_bytes"], strict=True), strict=True))
    out = [""] * len(rels)
    todo = []
    for k, (rel, size) in enumerate(zip(rels, sizes.tolist(), strict=True)):
        hit = known.get(rel)
        if hit is not None and hit[1] == size:
            out[k] = hit[0]
        else:
            todo.append(k)
    if todo:
        with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
            hashes = pool.map(lambda k: artifacts.sha256_file(os.path.join(root, rels[k])), todo)
            for k, h in zip(todo, hashes, strict=True):
                out[k] = h
    return out


def inspect_all(root: str, rels: list[str], sizes: list[int], cfg: IngestConfig, workers: int,
                show_progress, on_chunk: Callable[[int, Results], None],
                closing: list[threading.Thread] | None = None) -> None:
    """:func:`_inspect_chunk` over every file, isolating crashes and hangs; each chunk's
    :class:`Results` go to ``on_chunk(first file, results)`` as they come in, in any order.

    A chunk gets ``timeout_s`` in all (its files normally take milliseconds together, and it
    holds at most CHUNK_BYTES); a chunk that times out, crashes or raises is retried one file at
    a time after the others, each with ``timeout_s``, so only the guilty file is quarantined
    (``timeout``, ``crash``, or ``corrupt`` with the error; its ``sha256`` left empty)."""
    import symusic  # noqa: F401  (imported once here: forked workers inherit it)

    spans = chunk_spans(sizes, workers)
    common = dict(workers=workers, timeout_s=cfg.timeout_s, closing=closing)
    failed: list[int] = []

    def done(c: int, r: Results | ItemFailure) -> None:
        if isinstance(r, ItemFailure):
            failed.append(c)
        else:
            on_chunk(spans[c][0], r)

    isolated_map(_inspect_chunk, [(root, rels[a:b], cfg) for a, b in spans], desc="ingest",
                 show_progress=show_progress, on_result=done, **common)
    retry = [i for c in sorted(failed) for i in range(*spans[c])]
    singles = isolated_map(_inspect_chunk, [(root, [rels[i]], cfg) for i in retry],
                           show_progress=False, **common)
    by_file = dict(zip(retry, singles, strict=True))
    for c in sorted(failed):
        parts = []
        for i in range(*spans[c]):
            one = by_file[i]
            if isinstance(one, ItemFailure):
                kind = one.kind if one.kind in {"timeout", "crash"} else "corrupt"
                one = Results.empty(1)
                one.failed[0] = True
                one.reason[0], one.detail[0] = kind, by_file[i].message
            parts.append(one)
        on_chunk(spans[c][0], Results.concat(parts))

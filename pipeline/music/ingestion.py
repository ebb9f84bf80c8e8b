"""Hash, parse and quarantine MIDI files: the ingest stage's work, also used by the
contamination stage on reference corpora (so their bad files are judged the same way).

Outputs of :func:`run` (the ingest stage's paths)
- ``data/manifest.parquet``: one row per file found under ``data/raw/`` (see
  ``MANIFEST_SCHEMA``), sorted by ``path``. ``status`` is ``ok``, ``quarantined`` (with a
  ``reason`` code and the parser's ``detail``) or ``duplicate`` (same bytes as ``duplicate_of``,
  the first such path in sorted order; each duplicate keeps its own metadata and group).
- ``data/notes.parquet``: the note content of every ``ok`` file (see ``NOTES_SCHEMA``).
- ``reports/ingest.json``: counts by status and reason.

Each file's sha256 comes from the corpus stage's index (``data/raw_index.parquet``, where it lists
the path with the same size; otherwise the parent hashes the file). Each distinct content is parsed
once, on its first file in path order, in a worker process (pebble), which reads the file, hashes
it again (a file whose bytes no longer match the index stops the stage with a message) and parses
it, so a file that crashes or hangs the parser costs only its own row (``crash`` / ``timeout``).
Files are sent in chunks, in sha256 order, and come back as columns (a few arrays per chunk); a
chunk that dies is retried one file at a time so that only the guilty file is quarantined. The
notes table, sorted by sha256, is written while the workers work: a chunk's notes as soon as every
chunk before it is in, in row groups of ROW_GROUP_ROWS pieces whatever the chunks were. The parent
judges ``empty_file`` and ``too_large`` from the size, resolves exact duplicates in path order and
writes the manifest. Output does not depend on the number of workers.

With a cache folder (the stage's ``--cache-dir``), each finished result is also stored by the
file's sha256 (:class:`ResultCache`) and a later run parses only files whose bytes it has not seen
under the same settings and code; timeouts and crashes are never stored. Outputs are the same
with a cold, warm or missing cache.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import csv
import hashlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, StageConfig
from pipeline.core.parallel import ItemFailure, isolated_map, join_all
from pipeline.core.segments import SegmentStore, rerun_if_store_changed
from pipeline.music.midi import list_midi_paths
from pipeline.music.parsing import (
    NOTE_COLUMNS,
    durations_beats,
    looks_like_midi,
    max_gaps_beats,
    note_hashes,
    parse_many,
)

REASONS = {
    "empty_file": "the file has zero bytes",
    "not_midi": "the file does not start with a MIDI header (MThd)",
    "too_large": "the file is larger than ingest.max_file_bytes",
    "corrupt": "the MIDI parser rejected the file (its message is in `detail`)",
    "no_notes": "fewer notes than ingest.min_notes",
    "too_many_notes": "more notes than ingest.max_notes",
    "too_long": "longer than ingest.max_duration_s seconds",
    "absurd_timing": "a silence longer than ingest.max_gap_beats beats",
    "timeout": "parsing took longer than ingest.timeout_s seconds",
    "crash": "the parser killed its worker process",
}

MANIFEST_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("duplicate_of", pa.string()),
        ("group", pa.string()),
        ("n_notes", pa.int64()),
        ("n_tracks", pa.int64()),
        ("tpq", pa.int64()),
        ("duration_s", pa.float64()),
        ("duration_beats", pa.float64()),
        ("note_hash", pa.string()),
        ("size_bytes", pa.int64()),
    ]
)
NOTES_SCHEMA = pa.schema(
    [
        ("sha256", pa.string()),
        ("onset", pa.list_(pa.float64())),
        ("duration", pa.list_(pa.float64())),
        ("pitch", pa.list_(pa.int16())),
        ("velocity", pa.list_(pa.int16())),
        ("track", pa.list_(pa.int16())),
        ("program", pa.list_(pa.int16())),
        ("is_drum", pa.list_(pa.bool_())),
    ]
)


class IngestConfig(StageConfig):
    """``ingest`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "ingest"

    max_file_bytes: int = Field(16 * 1024 * 1024, ge=1)
    max_notes: int = Field(100_000, ge=1)
    max_duration_s: float = Field(3600.0, gt=0)
    max_gap_beats: float = Field(1024.0, gt=0)
    min_notes: int = Field(1, ge=1)
    timeout_s: float = Field(60.0, gt=0)


@dataclass(frozen=True)
class IngestSummary:
    n_files: int
    by_status: dict[str, int]
    by_reason: dict[str, int]


# --------------------------------------------------------------------------- per-file work
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
        return pa.Table.from_pydict(cols, schema=CACHE_SCHEMA)


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


# --------------------------------------------------------------------------- result cache
CACHE_FORMAT = 1
"""Bump when the cache's layout changes (the code's own bytes are part of the key anyway)."""
CACHE_SEGMENTS = 16
"""More segments than this are merged into one at the end of a run."""

CACHE_SCHEMA = pa.schema(
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


CACHE_CODE = (__name__, "pipeline.music.parsing", "pipeline.core.arrays")
"""The modules whose code a cached result depends on (:func:`cache_key`)."""


def cache_key(cfg: IngestConfig) -> str:
    """What a file's result depends on besides its bytes: the limits inspect_many applies, the
    code that parses and judges (the bytes of the modules in ``CACHE_CODE``) and the parser's
    and numpy's versions. ``timeout_s`` is left out (a result that finished does not depend on it,
    and timeouts and crashes are never cached), and so is ``max_file_bytes`` (the parent applies
    it before a file is parsed)."""
    return artifacts.sha256_json({
        "format": CACHE_FORMAT,
        "code": artifacts.code_digest(CACHE_CODE),
        "symusic": package_version("symusic"),
        "numpy": np.__version__,
        "limits": cfg.model_dump(exclude={"timeout_s", "max_file_bytes"}),
    })[:20]


class ResultCache(SegmentStore):
    """Per-file results keyed by sha256 under ``root/<cache_key>/`` (a
    :class:`~pipeline.core.segments.SegmentStore`: one segment per run that parsed something,
    merged into one when there are more than CACHE_SEGMENTS)."""

    def __init__(self, root: Path, cfg: IngestConfig):
        super().__init__(Path(root) / cache_key(cfg), CACHE_SCHEMA, "sha256", CACHE_SEGMENTS)


# --------------------------------------------------------------------------- assembly
def read_metadata(path: Path | None) -> tuple[dict[str, dict[str, str]], int]:
    """Metadata rows keyed by path, and the number of listed sources without a file."""
    if path is None or not path.exists():
        return {}, 0
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    unresolved = sum(1 for r in rows if not r.get("path"))
    return {r["path"]: r for r in rows if r.get("path")}, unresolved


def default_group(rel_path: str) -> str:
    """Without metadata every file is its own group (dedupe then merges copies and variants)."""
    return rel_path


@rerun_if_store_changed
def run(
    cfg: IngestConfig,
    runtime: RuntimeConfig,
    *,
    raw_dir: Path,
    metadata: Path | None,
    manifest: Path,
    notes: Path,
    report: Path,
    files: list[str] | None = None,
    cache_dir: Path | None = None,
    index: Path | None = None,
) -> IngestSummary:
    """Ingest every MIDI file under ``raw_dir``, or only ``files`` (POSIX paths relative to it,
    in the order given: the contamination check's file lists).

    Each distinct content is judged once, on its first file. With ``cache_dir``, results are
    read from and added to a :class:`ResultCache` there, so only new contents are parsed; the
    outputs are the same with or without it. With ``index`` (the corpus stage's
    ``raw_index.parquet``) the files' sha256 come from it, so cached files are not read at all.
    Only the cached facts are read up front; cached notes are read as the table is written
    (:meth:`~pipeline.core.segments.SegmentStore.take`), and a cache changed meanwhile makes the
    stage run once more.

    The files to parse are sent to the workers in sha256 order, and the notes table, which is
    sorted by sha256, is written while they work: each chunk's notes as soon as every chunk
    before it is in (:func:`notes_writer`), with the cached notes that fall between."""
    rel_paths = files if files is not None else list_midi_paths(raw_dir)
    meta, unresolved = read_metadata(metadata)
    extra_cols = sorted({k for r in meta.values() for k in r} - {"path", "group", "error"})
    root = str(raw_dir)
    n = len(rel_paths)
    sizes = np.array([os.stat(os.path.join(root, rel)).st_size for rel in rel_paths], np.int64)
    parse = (sizes > 0) & (sizes <= cfg.max_file_bytes)
    workers = runtime.n_workers()

    res = Results.empty(n)
    res.sha256 = file_hashes(root, rel_paths, sizes, index, workers)
    first: dict[str, int] = {}  # each content's first file (in the given order), the one judged
    canon = np.array([first.setdefault(h, i) for i, h in enumerate(res.sha256)], np.int64)
    judged = [i for i in first.values() if parse[i]]

    cache = ResultCache(cache_dir, cfg) if cache_dir is not None else None
    facts = [c for c in CACHE_SCHEMA.names if c not in NOTE_COLUMNS]
    cached = pa.Table.from_batches([], pa.schema([CACHE_SCHEMA.field(c) for c in facts]))
    if cache is not None:  # the facts only: the notes are read as the table is written
        cached = cache.lookup({res.sha256[i] for i in judged} & cache.keys.keys(), facts)
    row_of = {h: j for j, h in enumerate(cached["sha256"].to_pylist())}
    hits = np.array([i for i in judged if res.sha256[i] in row_of], np.int64)
    _fill(res, hits, _from_table(cached, [row_of[res.sha256[i]] for i in hits]))
    # The cached notes to write, in sha256 order: ok files only (only they have notes).
    ok_rows = set(np.flatnonzero(pc.equal(cached["reason"], "").to_numpy(zero_copy_only=False))
                  .tolist())
    cached_shas = sorted(h for h, j in row_of.items() if j in ok_rows)

    todo = sorted((i for i in judged if res.sha256[i] not in row_of), key=res.sha256.__getitem__)
    chunks: dict[int, Results] = {}  # by first position in todo, until written
    written = {"todo": 0, "cached": 0}  # how far the notes table has got in each
    closing: list[threading.Thread] = []  # idle pools shutting down while the tables are built

    def put_cached(lo: int, hi: int) -> None:
        """The cached notes of ``cached_shas[lo:hi]``, a row group's worth at a time."""
        for at in range(lo, hi, ROW_GROUP_ROWS):
            put_notes(cache.take(cached_shas[at : min(hi, at + ROW_GROUP_ROWS)],
                                 NOTES_SCHEMA.names))

    def put_with_cached(table: pa.Table, below: str | None) -> None:
        """``table`` (notes in sha256 order) with the cached notes not yet written whose sha256
        is below ``below`` (all with None), in sha256 order: runs of the cached rows (read from
        the cache a row group at a time) and of ``table``'s rows, as slices."""
        a = written["cached"]
        b = len(cached_shas) if below is None else bisect.bisect_left(cached_shas, below, a)
        written["cached"] = b
        # where each of table's rows falls among the cached rows a..b
        cuts = [bisect.bisect_left(cached_shas, h, a, b) for h in table["sha256"].to_pylist()]
        lo, k = a, 0
        while k < len(cuts):
            j = k
            while j < len(cuts) and cuts[j] == cuts[k]:
                j += 1
            put_cached(lo, cuts[k])
            put_notes(table.slice(k, j - k))
            lo, k = cuts[k], j
        put_cached(lo, b)

    def on_chunk(start: int, r: Results) -> None:
        for k, h in enumerate(r.sha256):
            expected = res.sha256[todo[start + k]]
            if h and h != expected:
                rel = rel_paths[todo[start + k]]
                raise artifacts.ArtifactError(
                    f"{(Path(raw_dir) / rel).as_posix()}: its bytes (sha256 {h[:12]}) are not "
                    f"those listed for it ({expected[:12]}): it changed after it was indexed or "
                    "during this run; run the corpus stage again (`dvc repro`)")
            r.sha256[k] = expected
        chunks[start] = r
        while written["todo"] in chunks:  # every chunk before this one is in: write them
            r = chunks.pop(written["todo"])
            end = written["todo"] + len(r.sha256)
            put_with_cached(_notes_table(r), res.sha256[todo[end]] if end < len(todo) else None)
            put_cache(r.table().filter(to_arrow(~r.failed, pa.bool_())) if r.failed.any()
                      else r.table())
            _fill(res, np.array(todo[written["todo"]:end]), r)
            r.chunks = []
            written["todo"] = end

    with notes_writer(notes) as put_notes, \
            (cache.appending() if cache is not None else _discard()) as put_cache:
        inspect_all(root, [rel_paths[i] for i in todo], sizes[todo].tolist(), cfg, workers,
                    runtime.progress, on_chunk, closing)
        put_with_cached(pa.Table.from_batches([], NOTES_SCHEMA), None)

    rows = _manifest_columns(rel_paths, sizes, res, canon, cfg)
    _add_metadata(rows, rel_paths, meta, extra_cols)
    write_manifest(rows, extra_cols, manifest)
    join_all(closing)
    by_status = Counter(rows["status"])
    by_reason = Counter(r for r in rows["reason"] if r)
    summary = IngestSummary(n, dict(sorted(by_status.items())), dict(sorted(by_reason.items())))
    ok = np.array([s == "ok" for s in rows["status"]], bool)
    artifacts.write_json(
        report,
        {
            "n_files": summary.n_files,
            "by_status": {s: by_status.get(s, 0) for s in ("ok", "quarantined", "duplicate")},
            "by_reason": {r: by_reason.get(r, 0) for r in REASONS},
            "n_unresolved_sources": unresolved,
            "n_notes_ok": int(rows["n_notes"].filled(0)[ok].sum()),  # none ok: 0, not masked
        },
    )
    return summary


@contextlib.contextmanager
def _discard() -> Iterator[Callable[[pa.Table], None]]:
    yield lambda table: None


ROW_GROUP_ROWS = artifacts.ROW_GROUP_ROWS
"""Pieces per row group of the notes table (about 20 MB of notes for pieces of 400 notes)."""


def notes_writer(path: Path) -> contextlib.AbstractContextManager[Callable[[pa.Table], None]]:
    """Write the notes table as a stream (:func:`pipeline.core.artifacts.table_writer`):
    ``put(table)`` rows in their final order; row groups of exactly ROW_GROUP_ROWS rows."""
    return artifacts.table_writer(path, NOTES_SCHEMA, ROW_GROUP_ROWS)


def _notes_table(r: Results) -> pa.Table:
    """The notes of the rows of ``r`` that have some (ok files), as NOTES_SCHEMA rows; the note
    arrays are used as they are (the other rows hold none)."""
    keep = np.flatnonzero(r.counts > 0)
    offsets = to_arrow(np.concatenate([[0], np.cumsum(r.counts[keep])]), pa.int32())
    cols = [to_arrow([r.sha256[k] for k in keep], pa.string())]
    for c, f in zip(NOTE_COLUMNS, NOTES_SCHEMA.types[1:], strict=True):
        values = np.concatenate([notes[c] for _, notes in r.chunks]) if len(r.chunks) > 1 \
            else r.chunks[0][1][c]
        cols.append(pa.ListArray.from_arrays(offsets, to_arrow(values, f.value_type), type=f))
    return pa.Table.from_arrays(cols, schema=NOTES_SCHEMA)


def _from_table(table: pa.Table, rows: list[int]) -> Results:
    """Rows of a CACHE_SCHEMA table as :class:`Results` (without their notes)."""
    out = Results.empty(len(rows))
    if not rows:
        return out
    t = table.select([c for c in CACHE_SCHEMA.names if c not in NOTE_COLUMNS]).take(
        to_arrow(np.array(rows, np.int64), pa.int64()))
    out.reason, out.detail = t["reason"].to_pylist(), t["detail"].to_pylist()
    out.note_hash = t["note_hash"].to_pylist()
    out.parsed = np.array(t["parsed"].to_pylist(), bool)
    out.ints = np.stack([from_arrow(t[c]) for c in INT_FACTS], axis=1)
    out.floats = np.stack([from_arrow(t[c]) for c in FLOAT_FACTS], axis=1)
    return out


def _fill(dst: Results, rows: np.ndarray, src: Results) -> None:
    """Rows ``rows`` of ``dst`` from the rows of ``src``, in order (not their sha256 nor notes)."""
    if not len(rows):
        return
    dst.parsed[rows], dst.ints[rows], dst.floats[rows] = src.parsed, src.ints, src.floats
    for k, i in enumerate(rows.tolist()):
        dst.reason[i], dst.detail[i], dst.note_hash[i] = \
            src.reason[k], src.detail[k], src.note_hash[k]


def _manifest_columns(rel_paths: list[str], sizes: np.ndarray, res: Results, canon: np.ndarray,
                      cfg: IngestConfig) -> dict:
    """The manifest's computed columns. Exact duplicates (same sha256) take every verdict and fact
    of the first such path in the given order, their canonical file (``canon``: its row)."""
    n = len(rel_paths)
    dup = canon != np.arange(n)
    reason = np.array(res.reason, dtype=object)
    detail = np.array(res.detail, dtype=object)
    for i in np.flatnonzero((sizes == 0) | (sizes > cfg.max_file_bytes)):
        reason[i], detail[i] = (("empty_file", "0 bytes") if sizes[i] == 0 else
                                ("too_large", f"{sizes[i]} bytes > {cfg.max_file_bytes}"))
    reason, detail = reason[canon], detail[canon]
    paths = np.array(rel_paths, dtype=object)
    status = np.where(reason != "", "quarantined", np.where(dup, "duplicate", "ok"))
    missing = ~res.parsed[canon]
    cols = {
        "path": rel_paths,
        "sha256": res.sha256,
        "status": status.tolist(),
        "reason": reason.tolist(),
        "detail": detail.tolist(),
        "duplicate_of": np.where(dup, paths[canon], "").tolist(),
        "note_hash": np.array(res.note_hash, dtype=object)[canon].tolist(),
        "size_bytes": sizes,
    }
    for j, c in enumerate(INT_FACTS):
        cols[c] = np.ma.masked_array(res.ints[canon, j], missing)
    for j, c in enumerate(FLOAT_FACTS):
        cols[c] = np.ma.masked_array(res.floats[canon, j], missing)
    return cols


def _add_metadata(cols: dict, rel_paths: list[str], meta: dict[str, dict[str, str]],
                  extra_cols: list[str]) -> None:
    rows = [meta.get(rel, {}) for rel in rel_paths]
    cols["group"] = [m.get("group") or default_group(rel) for m, rel in zip(rows, rel_paths,
                                                                              strict=True)]
    for c in extra_cols:
        if c not in MANIFEST_SCHEMA.names:
            cols[c] = [m.get(c, "") for m in rows]


def write_manifest(cols: dict, extra_cols: list[str], path: Path) -> None:
    schema = MANIFEST_SCHEMA
    for c in extra_cols:
        if c not in schema.names:
            schema = schema.append(pa.field(c, pa.string()))
    arrays = []
    for f in schema:
        v = cols[f.name]
        if isinstance(v, np.ma.MaskedArray):
            arrays.append(to_arrow(v.data, f.type, np.ma.getmaskarray(v)))
        else:
            arrays.append(to_arrow(v, f.type))
    artifacts.write_parquet(path, pa.Table.from_arrays(arrays, schema=schema))

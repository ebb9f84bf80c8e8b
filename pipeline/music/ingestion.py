"""Hash, parse and quarantine MIDI files: the ingest stage's work, also used by the
contamination stage on reference corpora (so their bad files are judged the same way).

Outputs of :func:`run` (the ingest stage's paths)
- ``data/manifest.parquet``: one row per file found under ``data/raw/`` (see
  ``MANIFEST_SCHEMA``), sorted by ``path``. ``status`` is ``ok``, ``quarantined`` (with a
  ``reason`` code and the parser's ``detail``) or ``duplicate`` (same bytes as ``duplicate_of``,
  the first such path in sorted order; each duplicate keeps its own metadata and group).
- ``data/notes.parquet``: the note content of every ``ok`` file (see ``NOTES_SCHEMA``).
- ``reports/ingest.json``: counts by status and reason.

Each file is read once, in a worker process (pebble): the worker hashes its bytes and parses them,
so a file that crashes or hangs the parser costs only its own row (``crash`` / ``timeout``).
Files are sent in chunks and come back as columns (a few arrays per chunk); a chunk that dies is
retried one file at a time so that only the guilty file is quarantined. The parent only lists and
stats the files (``empty_file`` and ``too_large`` are judged from the size), resolves exact
duplicates in path order and writes the tables. Output does not depend on the number of workers.

With a cache folder (the stage's ``--cache-dir``), each finished result is also stored by the
file's sha256 (:class:`ResultCache`) and a later run parses only files whose bytes it has not seen
under the same settings and code; timeouts and crashes are never stored. Outputs are the same
with a cold, warm or missing cache.
"""

from __future__ import annotations

import csv
import hashlib
import os
import threading
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, StageConfig
from pipeline.core.parallel import ItemFailure, isolated_map, join_all
from pipeline.core.segments import SegmentStore
from pipeline.music import parsing
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


# What became of each file in a worker.
HASHED = 0  # hashed only: empty or larger than max_file_bytes (judged by the parent)
CACHED = 1  # its sha256 has a cached result: not parsed
INSPECTED = 2  # parsed and judged by inspect_many
FAILED = 3  # its worker crashed, hung or raised: quarantined, never cached

INT_FACTS = ("n_notes", "n_tracks", "tpq")
FLOAT_FACTS = ("duration_s", "duration_beats")


@dataclass
class Results:
    """Per-file results as columns, in file order: a worker returns one per chunk (a few arrays
    and string lists cross the process boundary, not a dict per file), the parent joins them.
    ``parsed`` marks rows whose facts (``ints``: INT_FACTS, ``floats``: FLOAT_FACTS) are set;
    ``counts`` is the number of notes kept (0 unless the file is ok); ``chunks`` holds the kept
    notes as (rows, notes of those rows concatenated) for consecutive runs of rows: one per
    worker's chunk, kept apart when results are joined (the notes are copied once, when the
    table is sorted for writing, not also here)."""

    sha256: list[str]
    state: np.ndarray
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
        return cls([""] * n, np.zeros(n, np.int8), [""] * n, [""] * n, [""] * n,
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
            np.concatenate([p.state for p in parts]),
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


_KNOWN: frozenset[str] = frozenset()  # in a worker: sha256 keys with a cached result


def _set_known(known: frozenset[str]) -> None:
    """Worker initializer (with the fork start method the set is inherited, not copied)."""
    global _KNOWN
    _KNOWN = known


def _inspect_chunk(task: tuple[str, list[str], list[bool], IngestConfig]) -> Results:
    """Read each file once and sha256 its bytes, then parse and judge together the files not
    only hashed nor already cached (:func:`inspect_many`). Runs in a worker."""
    root, rels, parse, cfg = task
    out = Results.empty(len(rels))
    todo: list[int] = []
    datas: list[bytes] = []
    for k, (rel, want) in enumerate(zip(rels, parse, strict=True)):
        path = os.path.join(root, rel)
        if not want:  # empty or too large: the hash is streamed, the bytes never held
            out.sha256[k] = artifacts.sha256_file(path)
            continue
        with open(path, "rb") as f:
            data = f.read()
        out.sha256[k] = sha = hashlib.sha256(data).hexdigest()
        if sha in _KNOWN:
            out.state[k] = CACHED
            continue
        todo.append(k)
        datas.append(data)
    rows, notes = inspect_many(datas, cfg)
    out.chunks = [(len(rels), notes)]
    for k, r in zip(todo, rows, strict=True):
        out.state[k] = INSPECTED
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


def inspect_all(root: str, rels: list[str], sizes: list[int], parse: list[bool],
                cfg: IngestConfig, workers: int, show_progress,
                known: frozenset[str] = frozenset(),
                closing: list[threading.Thread] | None = None) -> Results:
    """:func:`_inspect_chunk` over every file, in order, isolating crashes and hangs.

    A chunk gets ``timeout_s`` in all (its files normally take milliseconds together, and it
    holds at most CHUNK_BYTES); a chunk that times out, crashes or raises is retried one file at
    a time, each with ``timeout_s``, so only the guilty file is quarantined (``timeout``,
    ``crash``, or ``corrupt`` with the error). ``parse`` false: hash only (the parent judges
    empty and too large files)."""
    import symusic  # noqa: F401  (imported once here: forked workers inherit it)

    spans = chunk_spans(sizes, workers)
    common = dict(workers=workers, timeout_s=cfg.timeout_s, initializer=_set_known,
                  initargs=(known,), closing=closing)
    results = isolated_map(_inspect_chunk, [(root, rels[a:b], parse[a:b], cfg) for a, b in spans],
                           desc="ingest", show_progress=show_progress, **common)
    retry = [i for (a, b), r in zip(spans, results, strict=True) if isinstance(r, ItemFailure)
             for i in range(a, b)]
    singles = isolated_map(_inspect_chunk, [(root, [rels[i]], [parse[i]], cfg) for i in retry],
                           show_progress=False, **common)
    by_file = dict(zip(retry, singles, strict=True))
    parts: list[Results] = []
    for (a, b), r in zip(spans, results, strict=True):
        if not isinstance(r, ItemFailure):
            parts.append(r)
            continue
        for i in range(a, b):
            one = by_file[i]
            if isinstance(one, ItemFailure):
                one_r = Results.empty(1)
                one_r.sha256[0] = artifacts.sha256_file(os.path.join(root, rels[i]))
                one_r.state[0] = FAILED
                kind = one.kind if one.kind in {"timeout", "crash"} else "corrupt"
                one_r.reason[0], one_r.detail[0] = kind, one.message
                one = one_r
            parts.append(one)
    return Results.concat(parts)


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


def cache_key(cfg: IngestConfig) -> str:
    """What a file's result depends on besides its bytes: the limits inspect_many applies, the
    code that parses and judges (this module's and the MIDI module's own bytes) and the parser's
    and numpy's versions. ``timeout_s`` is left out (a result that finished does not depend on it,
    and timeouts and crashes are never cached), and so is ``max_file_bytes`` (the parent applies
    it before a file is parsed)."""
    code = hashlib.sha256()
    for module in (__file__, parsing.__file__):
        code.update(Path(module).read_bytes())
    return artifacts.sha256_json({
        "format": CACHE_FORMAT,
        "code": code.hexdigest(),
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
) -> IngestSummary:
    """Ingest every MIDI file under ``raw_dir``, or only ``files`` (POSIX paths relative to it,
    in the order given: the contamination check's file lists).

    With ``cache_dir``, results are read from and added to a :class:`ResultCache` there, so only
    new or changed files are parsed; the outputs are the same with or without it."""
    rel_paths = files if files is not None else list_midi_paths(raw_dir)
    meta, unresolved = read_metadata(metadata)
    extra_cols = sorted({k for r in meta.values() for k in r} - {"path", "group", "error"})
    root = str(raw_dir)
    n = len(rel_paths)
    sizes = np.array([os.stat(os.path.join(root, rel)).st_size for rel in rel_paths], np.int64)
    parse = (sizes > 0) & (sizes <= cfg.max_file_bytes)

    cache = ResultCache(cache_dir, cfg) if cache_dir is not None else None
    known = frozenset(cache.keys) if cache is not None else frozenset()
    workers = runtime.n_workers()
    closing: list[threading.Thread] = []  # idle pools shutting down while the tables are built
    res = inspect_all(root, rel_paths, sizes.tolist(), parse.tolist(), cfg, workers,
                      runtime.progress, known, closing)
    table = res.table()
    note_parts, new_parts = [table], [(table, res.state == INSPECTED)]  # new: to be cached

    hits = np.flatnonzero(res.state == CACHED)
    if cache is not None and hits.size:
        cached = cache.lookup({res.sha256[i] for i in hits})
        row_of = {h: j for j, h in enumerate(cached["sha256"].to_pylist())}
        lost = [i for i in hits if res.sha256[i] not in row_of]
        if lost:  # a segment vanished since it was listed: parse those files after all
            again = inspect_all(root, [rel_paths[i] for i in lost], sizes[lost].tolist(),
                                [True] * len(lost), cfg, workers, False, closing=closing)
            for j, i in enumerate(lost):
                _copy_row(res, i, again, j)
            note_parts.append(again.table())
            new_parts.append((note_parts[-1], again.state == INSPECTED))
        cols = {c: cached[c].to_pylist() for c in ("reason", "detail", "note_hash", "parsed")}
        ints = np.stack([from_arrow(cached[c]) for c in INT_FACTS], axis=1)
        floats = np.stack([from_arrow(cached[c]) for c in FLOAT_FACTS], axis=1)
        for i in hits:
            j = row_of.get(res.sha256[i])
            if j is None:
                continue
            res.reason[i], res.detail[i] = cols["reason"][j], cols["detail"][j]
            res.note_hash[i], res.parsed[i] = cols["note_hash"][j], cols["parsed"][j]
            res.ints[i], res.floats[i] = ints[j], floats[j]
        note_parts.append(cached)

    rows = _manifest_columns(rel_paths, sizes, res, cfg)
    ok_sha = {h for h, s in zip(rows["sha256"], rows["status"], strict=True) if s == "ok"}
    write_notes(pa.concat_tables([p.select(NOTES_SCHEMA.names) for p in note_parts]), ok_sha,
                notes)
    _add_metadata(rows, rel_paths, meta, extra_cols)
    write_manifest(rows, extra_cols, manifest)
    if cache is not None:  # after the notes are written: the filtered copy does not add up
        cache.add(pa.concat_tables([t if m.all() else t.filter(to_arrow(m, pa.bool_()))
                                    for t, m in new_parts]))

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
            "n_notes_ok": int(rows["n_notes"][ok].sum()),
        },
    )
    return summary


def _copy_row(dst: Results, i: int, src: Results, j: int) -> None:
    """Row ``j`` of ``src`` into row ``i`` of ``dst`` (its notes travel separately)."""
    dst.state[i] = src.state[j]
    dst.reason[i], dst.detail[i], dst.note_hash[i] = src.reason[j], src.detail[j], \
        src.note_hash[j]
    dst.parsed[i], dst.ints[i], dst.floats[i] = src.parsed[j], src.ints[j], src.floats[j]


def _manifest_columns(rel_paths: list[str], sizes: np.ndarray, res: Results,
                      cfg: IngestConfig) -> dict:
    """The manifest's computed columns. Exact duplicates (same sha256) take every verdict and fact
    of the first such path in the given order, their canonical file."""
    n = len(rel_paths)
    first: dict[str, int] = {}
    canon = np.array([first.setdefault(h, i) for i, h in enumerate(res.sha256)], np.int64)
    dup = canon != np.arange(n)
    reason = np.array(res.reason, dtype=object)
    detail = np.array(res.detail, dtype=object)
    for i in np.flatnonzero(res.state == HASHED):
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


def write_notes(table: pa.Table, ok: set[str], path: Path) -> None:
    """The notes of the ``ok`` files, one row each, sorted by sha256. ``table`` may hold other
    rows (empty lists, files that are not ok, several rows of one sha256: equal keys hold equal
    notes); the rows kept are picked in numpy and Python, then taken in one pass."""
    first: dict[str, int] = {}
    has_notes = from_arrow(pc.list_value_length(table["pitch"])) > 0
    for i, h in enumerate(table["sha256"].to_pylist()):
        if has_notes[i] and h in ok:
            first.setdefault(h, i)
    pick = np.array([first[h] for h in sorted(first)], np.int64)
    rows = table.take(to_arrow(pick, pa.int64())).combine_chunks()
    artifacts.write_parquet(path, rows.cast(NOTES_SCHEMA))

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
import contextlib
import csv
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig
from pipeline.core.parallel import join_all
from pipeline.core.segments import rerun_if_store_changed
from pipeline.music.ingest_cache import ResultCache
from pipeline.music.inspection import (
    FLOAT_FACTS,
    INT_FACTS,
    RESULTS_SCHEMA,
    Results,
    file_hashes,
    from_arrow,
    inspect_all,
    to_arrow,
)
from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA, REASONS, IngestConfig
from pipeline.music.midi import list_midi_paths
from pipeline.music.parsing import (
    NOTE_COLUMNS,
)


@dataclass(frozen=True)
class IngestSummary:
    n_files: int
    by_status: dict[str, int]
    by_reason: dict[str, int]


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
    facts = [c for c in RESULTS_SCHEMA.names if c not in NOTE_COLUMNS]
    cached = pa.Table.from_batches([], pa.schema([RESULTS_SCHEMA.field(c) for c in facts]))
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
    """Rows of a RESULTS_SCHEMA table as :class:`Results` (without their notes)."""
    out = Results.empty(len(rows))
    if not rows:
        return out
    t = table.select([c for c in RESULTS_SCHEMA.names if c not in NOTE_COLUMNS]).take(
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

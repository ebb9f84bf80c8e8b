"""Hash, parse and quarantine MIDI files: the ingest stage's work, also used by the
contamination stage on reference corpora (so their bad files are judged the same way).

Outputs of :func:`run` (the ingest stage's paths)
- ``data/manifest.parquet``: one row per file found under ``data/raw/`` (see
  ``MANIFEST_SCHEMA``), sorted by ``path``. ``status`` is ``ok``, ``quarantined`` (with a
  ``reason`` code and the parser's ``detail``) or ``duplicate`` (same bytes as ``duplicate_of``,
  the first such path in sorted order; each duplicate keeps its own metadata and group).
- ``data/notes.parquet``: the note content of every ``ok`` file (see ``NOTES_SCHEMA``).
- ``reports/ingest.json``: counts by status and reason.

Parsing runs in worker processes (pebble): a file that crashes or hangs the parser costs only its
own row (``crash`` / ``timeout``). Files are sent in chunks for speed; a chunk that dies is retried
one file at a time so that only the guilty file is quarantined. Output does not depend on the
number of workers.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, StageConfig
from pipeline.core.parallel import ItemFailure, chunked, isolated_map
from pipeline.music.midi import (
    NOTE_COLUMNS,
    list_midi_files,
    looks_like_midi,
    max_gap_beats,
    note_hash,
    parse_midi,
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
CHUNK = 32  # files per task: amortises process round-trips; failures are retried one by one

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
def inspect_file(path: str, cfg: IngestConfig) -> dict:
    """Parse one file and apply the limits. Runs in a worker; returns a plain dict."""
    data = Path(path).read_bytes()
    if not looks_like_midi(data):
        return {"reason": "not_midi", "detail": f"starts with {data[:8]!r}"}
    try:
        parsed = parse_midi(data)
    except (RuntimeError, ValueError, OverflowError) as e:
        return {"reason": "corrupt", "detail": str(e) or type(e).__name__}
    row = {
        "n_notes": parsed.n_notes,
        "n_tracks": parsed.n_tracks,
        "tpq": parsed.tpq,
        "duration_s": parsed.duration_s,
        "duration_beats": parsed.duration_beats,
        "reason": "",
        "detail": "",
    }
    gap = max_gap_beats(parsed.notes)
    if parsed.n_notes < cfg.min_notes:
        row.update(reason="no_notes", detail=f"{parsed.n_notes} notes")
    elif parsed.n_notes > cfg.max_notes:
        row.update(reason="too_many_notes", detail=f"{parsed.n_notes} notes > {cfg.max_notes}")
    elif gap > cfg.max_gap_beats:
        row.update(
            reason="absurd_timing", detail=f"silence of {gap:g} beats > {cfg.max_gap_beats:g}"
        )
    elif parsed.duration_s > cfg.max_duration_s:
        row.update(reason="too_long", detail=f"{parsed.duration_s:g} s > {cfg.max_duration_s:g}")
    else:
        row["note_hash"] = note_hash(parsed.notes)
        row["notes"] = parsed.notes
    return row


def _inspect_chunk(task: tuple[list[str], IngestConfig]) -> list[dict]:
    paths, cfg = task
    return [inspect_file(p, cfg) for p in paths]


def _inspect_one(task: tuple[str, IngestConfig]) -> dict:
    return inspect_file(*task)


def inspect_all(paths: list[str], cfg: IngestConfig, workers: int, show_progress) -> list[dict]:
    """``inspect_file`` for every path, in order, isolating crashes and hangs."""
    chunks = chunked(paths, CHUNK)
    results = isolated_map(
        _inspect_chunk,
        [(list(c), cfg) for c in chunks],
        workers=workers,
        timeout_s=cfg.timeout_s * CHUNK,
        desc="ingest",
        show_progress=show_progress,
    )
    out: list[dict] = []
    for chunk, res in zip(chunks, results, strict=True):
        if not isinstance(res, ItemFailure):
            out.extend(res)
            continue
        # Retry the chunk one file at a time so only the guilty file is quarantined.
        singles = isolated_map(
            _inspect_one,
            [(p, cfg) for p in chunk],
            workers=workers,
            timeout_s=cfg.timeout_s,
            show_progress=False,
        )
        for r in singles:
            if isinstance(r, ItemFailure):
                kind = r.kind if r.kind in {"timeout", "crash"} else "corrupt"
                r = {"reason": kind, "detail": r.message}
            out.append(r)
    return out


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
) -> IngestSummary:
    """Ingest every MIDI file under ``raw_dir``, or only ``files`` (POSIX paths relative to it,
    in the order given: the contamination check's file lists)."""
    rel_paths = files if files is not None else [p.as_posix() for p in list_midi_files(raw_dir)]
    meta, unresolved = read_metadata(metadata)
    extra_cols = sorted({k for r in meta.values() for k in r} - {"path", "group", "error"})

    rows: list[dict] = []
    canonical: dict[str, int] = {}  # sha256 -> index of its first row
    to_parse: list[int] = []
    for rel in rel_paths:
        path = raw_dir / rel
        size = path.stat().st_size
        row = {
            "path": rel,
            "size_bytes": size,
            "status": "ok",
            "reason": "",
            "detail": "",
            "duplicate_of": "",
            "sha256": artifacts.sha256_file(path),
        }
        m = meta.get(rel, {})
        row["group"] = m.get("group") or default_group(rel)
        row.update({c: m.get(c, "") for c in extra_cols})
        if row["sha256"] in canonical:
            row["duplicate_of"] = rows[canonical[row["sha256"]]]["path"]
        else:
            canonical[row["sha256"]] = len(rows)
            if size == 0:
                row.update(reason="empty_file", detail="0 bytes")
            elif size > cfg.max_file_bytes:
                row.update(reason="too_large", detail=f"{size} bytes > {cfg.max_file_bytes}")
            else:
                to_parse.append(len(rows))
        rows.append(row)

    parsed = inspect_all(
        [str(raw_dir / rows[i]["path"]) for i in to_parse],
        cfg,
        runtime.n_workers(),
        runtime.progress,
    )
    note_rows: list[dict] = []
    for i, result in zip(to_parse, parsed, strict=True):
        notes_i = result.pop("notes", None)
        rows[i].update(result)
        if notes_i is not None:
            note_rows.append({"sha256": rows[i]["sha256"], **notes_i})

    for row in rows:  # statuses last: duplicates inherit the verdict of their canonical file
        if row["duplicate_of"]:
            src = rows[canonical[row["sha256"]]]
            for k in (
                "reason",
                "detail",
                "n_notes",
                "n_tracks",
                "tpq",
                "duration_s",
                "duration_beats",
                "note_hash",
            ):
                row[k] = src.get(k, row.get(k))
            row["status"] = "quarantined" if row["reason"] else "duplicate"
        elif row["reason"]:
            row["status"] = "quarantined"

    write_manifest(rows, extra_cols, manifest)
    write_notes(note_rows, notes)
    by_status = Counter(r["status"] for r in rows)
    by_reason = Counter(r["reason"] for r in rows if r["reason"])
    summary = IngestSummary(
        len(rows), dict(sorted(by_status.items())), dict(sorted(by_reason.items()))
    )
    artifacts.write_json(
        report,
        {
            "n_files": summary.n_files,
            "by_status": {s: by_status.get(s, 0) for s in ("ok", "quarantined", "duplicate")},
            "by_reason": {r: by_reason.get(r, 0) for r in REASONS},
            "n_unresolved_sources": unresolved,
            "n_notes_ok": int(sum(r.get("n_notes") or 0 for r in rows if r["status"] == "ok")),
        },
    )
    return summary


def write_manifest(rows: list[dict], extra_cols: list[str], path: Path) -> None:
    schema = MANIFEST_SCHEMA
    for c in extra_cols:
        if c not in schema.names:
            schema = schema.append(pa.field(c, pa.string()))
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    for c in ("note_hash", "reason", "detail", "duplicate_of"):
        cols[c] = [v or "" for v in cols[c]]
    artifacts.write_parquet(path, pa.table(cols, schema=schema))


def write_notes(note_rows: list[dict], path: Path) -> None:
    note_rows = sorted(note_rows, key=lambda r: r["sha256"])
    cols: dict[str, list] = {"sha256": [r["sha256"] for r in note_rows]}
    for c in NOTE_COLUMNS:
        cols[c] = [np.asarray(r[c]) for r in note_rows]
    artifacts.write_parquet(path, pa.table(cols, schema=NOTES_SCHEMA))

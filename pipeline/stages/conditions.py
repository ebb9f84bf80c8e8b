"""Stage ``conditions``: per-piece conditions (key, mode, meter, density, polyphony, tempo and the
manifest's metadata columns) for every piece of the split.

Inputs: ``data/splits.parquet`` (the pieces, their split and group), ``data/notes.parquet`` (key,
density, polyphony), ``data/manifest.parquet`` (each piece's source path and metadata columns)
and the MIDI files under ``data/raw/`` (meter and tempo; DVC tracks them through the corpus
stage's ``data/raw_index.parquet``).
Outputs: ``data/conditions.parquet`` (:mod:`pipeline.conditions.table`: one row per piece, sorted
by sha256) and ``reports/conditions.json``: per condition, label counts and missing labels per
split, the share of labelled pieces whose label lies in one group only and whether that refuses
it; the metadata columns carried and skipped; the pieces whose MIDI could not be read, by reason.

Every built-in condition and every metadata column is computed whatever ``condition.use`` says,
so the outputs depend only on the data, the bands and ``condition.min_key_correlation``. The stage
then checks ``use`` against them (:func:`pipeline.conditions.table.check_use`): a name that is no
condition of this corpus, or a condition whose labels identify groups, stops it before anything
is written, naming ``condition.use``.

A piece whose MIDI cannot be read for meter and tempo (missing, changed since ingest, rejected
by the parser, or crashing or hanging its worker) gets null meter and tempo and is counted in the
report, never a failed stage. The files are read in worker processes
(:func:`pipeline.core.parallel.isolated_map`), in chunks; a chunk that fails is retried one file
at a time so only the guilty file loses its values. Output does not depend on the workers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.conditions.config import BUILTIN, ConditionConfig
from pipeline.conditions.extract import meter_and_tempo
from pipeline.conditions.table import (
    check_names,
    check_use,
    conditions_schema,
    group_unique_share,
    identifies_groups,
    measure,
    metadata_columns,
)
from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, load_runtime, load_section
from pipeline.core.parallel import ItemFailure, chunked, isolated_map
from pipeline.core.splits import SPLIT_NAMES

HELP = "per-piece key, meter, density, polyphony, tempo and metadata conditions"

CHUNK = 64
"""Files per worker task (each takes well under a millisecond to parse)."""
TIMEOUT_S = 60.0
"""Per task; ingest already parsed these files within its own limits."""
MAX_LABELS_LISTED = 50
"""Labels listed per condition and split in the report: the most frequent (ties by label)."""
MAX_EXAMPLES = 20
"""Unreadable pieces listed in the report (all are counted)."""
NOTE_COLUMNS = ["sha256", "onset", "duration", "pitch", "is_drum"]


@dataclass(frozen=True)
class ConditionsSummary:
    pieces: int
    metadata: list[str]
    midi_unreadable: int


# --------------------------------------------------------------------------- inputs
def source_rows(manifest: pa.Table, shas: list[str]) -> list[int | None]:
    """Each piece's ``ok`` manifest row (the first path in sorted order, if several); None
    without one. Its path locates the MIDI file and its cells give the metadata."""
    rows: dict[str, tuple[str, int]] = {}
    for i, (path, sha, status) in enumerate(zip(
            *(manifest[c].to_pylist() for c in ("path", "sha256", "status")), strict=True)):
        if status == "ok" and (sha not in rows or path < rows[sha][0]):
            rows[sha] = (path, i)
    return [rows[s][1] if s in rows else None for s in shas]


def column_at(manifest: pa.Table, column: str, rows: list[int | None]) -> list[str | None]:
    """The cells of ``column`` at ``rows`` as strings (None for a row of None or an empty
    cell)."""
    values = manifest[column].to_pylist()
    cells = [values[i] if i is not None else None for i in rows]
    return [str(v) if v is not None and v != "" else None for v in cells]


def iter_notes(path: Path) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """(sha256, notes) of every row of the notes table, a row group at a time (the table of a
    100k-piece corpus does not fit memory whole as Python objects)."""
    artifacts.read_table(path, columns=["sha256"])  # a missing or broken file: name its stage
    try:
        with pq.ParquetFile(path) as f:
            missing = [c for c in NOTE_COLUMNS if c not in f.schema_arrow.names]
            if missing:
                raise artifacts.ArtifactError.for_path(path, f"has no column {missing[0]!r}")
            for batch in f.iter_batches(columns=NOTE_COLUMNS):
                # every list column holds the same number of notes a row (ingest writes them so)
                offsets = batch["pitch"].offsets.to_numpy()
                offsets = offsets - offsets[0]
                flat = {c: batch[c].flatten().to_numpy(zero_copy_only=False)
                        for c in NOTE_COLUMNS[1:]}
                for k, sha in enumerate(batch["sha256"].to_pylist()):
                    a, b = offsets[k], offsets[k + 1]
                    yield sha, {c: v[a:b] for c, v in flat.items()}
    except (pa.ArrowException, OSError):
        raise artifacts.ArtifactError.for_path(path, "is not a readable Parquet file") from None


# --------------------------------------------------------------------------- MIDI facts
def _read_chunk(items: list[tuple[str, str]]) -> list[tuple[str | None, float | None, str]]:
    """(meter, tempo_qpm, reason) of each (path, sha256); reason "" when the file was read.
    Runs in a worker."""
    out: list[tuple[str | None, float | None, str]] = []
    for path, sha in items:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            out.append((None, None, "read_error"))
            continue
        if hashlib.sha256(data).hexdigest() != sha:
            out.append((None, None, "sha_mismatch"))
            continue
        try:
            meter, tempo = meter_and_tempo(data)
        except (RuntimeError, ValueError, OverflowError):
            out.append((None, None, "unreadable"))
            continue
        out.append((meter, tempo, ""))
    return out


def midi_facts(items: list[tuple[str | None, str]], workers: int, show_progress: bool | str
               ) -> list[tuple[str | None, float | None, str]]:
    """(meter, tempo_qpm, reason) of each (path or None, sha256), in order; ``no_source`` for a
    piece without a path, ``crash`` or ``timeout`` for a file that killed or hung its worker."""
    todo = [i for i, (path, _) in enumerate(items) if path is not None]
    out: list[tuple[str | None, float | None, str]] = [(None, None, "no_source")] * len(items)
    chunks = chunked(todo, CHUNK)
    common = dict(workers=workers, timeout_s=TIMEOUT_S)
    results = isolated_map(_read_chunk, [[items[i] for i in c] for c in chunks],
                           desc="conditions", show_progress=show_progress, **common)
    retry = [i for c, r in zip(chunks, results, strict=True) if isinstance(r, ItemFailure)
             for i in c]
    for c, r in zip(chunks, results, strict=True):
        if not isinstance(r, ItemFailure):
            for i, facts in zip(c, r, strict=True):
                out[i] = facts
    singles = isolated_map(_read_chunk, [[items[i]] for i in retry], show_progress=False,
                           **common)
    for i, r in zip(retry, singles, strict=True):
        out[i] = (None, None, r.kind if r.kind in {"crash", "timeout"} else "unreadable") \
            if isinstance(r, ItemFailure) else r[0]
    return out


# --------------------------------------------------------------------------- report
def label_counts(labels: list, splits: list[str]) -> dict:
    """Per split: the most frequent labels with their counts, and the pieces without one."""
    out: dict = {"labels": {}, "missing": {}}
    for s in SPLIT_NAMES:
        mine = [x for x, p in zip(labels, splits, strict=True) if p == s]
        counts = Counter(x for x in mine if x is not None)
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_LABELS_LISTED]
        out["labels"][s] = dict(top)
        out["missing"][s] = sum(x is None for x in mine)
    out["n_labels"] = len({x for x in labels if x is not None})
    return out


# --------------------------------------------------------------------------- the stage
def run(cfg: ConditionConfig, runtime: RuntimeConfig, *, manifest: Path, notes: Path,
        splits: Path, raw_dir: Path, conditions: Path, report: Path) -> ConditionsSummary:
    """Measure every piece of ``splits``, check ``cfg.use``, write ``conditions`` and
    ``report`` (module docstring)."""
    t0 = time.perf_counter()
    sp = artifacts.read_table(splits, columns=["sha256", "split", "group_id"])
    sp = sp.sort_by("sha256")
    shas, split_of, group_ids = (sp[c].to_pylist() for c in ("sha256", "split", "group_id"))
    if len(set(shas)) < len(shas):
        raise artifacts.ArtifactError.for_path(splits, "lists a sha256 twice")
    man = artifacts.read_table(manifest)  # one row per file: small beside the notes
    for column in ("path", "sha256", "status"):
        if column not in man.column_names:
            raise artifacts.ArtifactError.for_path(manifest, f"has no column {column!r}")
    metadata, skipped = metadata_columns(man.column_names)
    check_names(cfg.use, metadata)  # a name this corpus lacks stops the stage before the work

    t1 = time.perf_counter()
    rows = source_rows(man, shas)
    paths = column_at(man, "path", rows)
    facts = midi_facts([(os.path.join(str(raw_dir), p) if p is not None else None, s)
                        for p, s in zip(paths, shas, strict=True)],
                       runtime.n_workers(), runtime.progress)
    t2 = time.perf_counter()

    index = {s: i for i, s in enumerate(shas)}
    measured: list[dict | None] = [None] * len(shas)
    for sha, piece in iter_notes(notes):
        if (i := index.get(sha)) is not None:
            measured[i] = measure(piece, facts[i][0], facts[i][1], cfg)
    measured = [m if m is not None else measure(None, f[0], f[1], cfg)  # no notes: null
                for m, f in zip(measured, facts, strict=True)]
    cols: dict[str, list] = {"sha256": shas, "split": split_of,
                             **{c: column_at(man, c, rows) for c in metadata}}
    schema = conditions_schema(metadata)
    table = pa.table([pa.array(cols[f.name] if f.name in cols else [m[f.name] for m in measured],
                               f.type) for f in schema], schema=schema)
    t3 = time.perf_counter()

    check_use(cfg.use, table.to_pandas(), group_ids)
    artifacts.write_parquet(conditions, table)

    unreadable = Counter(reason for _, _, reason in facts if reason)
    out = {
        "pieces": len(shas),
        "pieces_by_split": {s: split_of.count(s) for s in SPLIT_NAMES},
        "groups": len(set(group_ids)),
        "pieces_without_notes": int(sum(v is None for v in table["notes_per_beat"].to_pylist())),
        "metadata_columns": metadata,
        "metadata_columns_skipped": skipped,
        "midi_unreadable": sum(unreadable.values()),
        "midi_unreadable_by_reason": dict(sorted(unreadable.items())),
        "midi_unreadable_examples": [{"sha256": s, "reason": f[2]}
                                     for s, f in zip(shas, facts, strict=True)
                                     if f[2]][:MAX_EXAMPLES],
        "conditions": {},
    }
    for name in (*BUILTIN, *metadata):
        labels = table[name].to_pylist()
        share = group_unique_share(labels, group_ids)
        out["conditions"][name] = {
            "kind": "built-in" if name in BUILTIN else "metadata",
            **label_counts(labels, split_of),
            "group_unique_share": round(share, 6) if share is not None else None,
            "identifies_groups": identifies_groups(labels, group_ids),
        }
    artifacts.write_json(report, out)
    artifacts.write_sidecar(report.with_suffix(".env.json"), {
        "seconds_inputs": round(t1 - t0, 3), "seconds_midi": round(t2 - t1, 3),
        "seconds_notes": round(t3 - t2, 3), "seconds_total": round(time.perf_counter() - t0, 3),
        "workers": runtime.n_workers(),
    })
    return ConditionsSummary(len(shas), metadata, out["midi_unreadable"])


# --------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--manifest", type=Path, default=Path("data/manifest.parquet"))
    a("--notes", type=Path, default=Path("data/notes.parquet"))
    a("--splits", type=Path, default=Path("data/splits.parquet"))
    a("--raw-dir", type=Path, default=Path("data/raw"))
    a("--conditions", type=Path, default=Path("data/conditions.parquet"))
    a("--report", type=Path, default=Path("reports/conditions.json"))
    a("--workers", help="override runtime.workers (does not change results)")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("condition", args.params, ConditionConfig)
    runtime = load_runtime(args.params, args.workers)
    s = run(cfg, runtime, manifest=args.manifest, notes=args.notes, splits=args.splits,
            raw_dir=args.raw_dir, conditions=args.conditions, report=args.report)
    print(f"conditions: {s.pieces} pieces; metadata columns: {', '.join(s.metadata) or 'none'}; "
          f"{s.midi_unreadable} MIDI files unreadable (null meter and tempo)")
    return 0

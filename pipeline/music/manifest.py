"""The ingest stage's contract: the limits a file is judged by (:class:`IngestConfig`, the
``ingest`` section), the quarantine reasons (:data:`REASONS`) and the two tables it writes,
``data/manifest.parquet`` (:data:`MANIFEST_SCHEMA`) and ``data/notes.parquet``
(:data:`NOTES_SCHEMA`). Read by ingest, by contamination (reference corpora are judged the same
way) and by every stage that reads the manifest or the notes."""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from pydantic import Field

from pipeline.core.config import StageConfig

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

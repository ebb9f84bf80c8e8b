"""pipeline.music.manifest: the ingest section's limits, the quarantine reasons and the schemas
of the two tables ingest writes."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from pipeline.core.config import ParamsError, parse_section, sections
from pipeline.music.manifest import MANIFEST_SCHEMA, NOTES_SCHEMA, REASONS, IngestConfig
from pipeline.music.parsing import NOTE_COLUMNS


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"max_notes": 0}, "ingest.max_notes = 0"),
        ({"max_notes": "100"}, "ingest.max_notes = '100'"),
        ({"timeout": 5}, "ingest.timeout = 5: unknown key"),
        ({"max_duration_s": -1.0}, "ingest.max_duration_s = -1.0"),
    ],
)
def test_bad_params_name_the_key(raw, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("'", "'")):
        parse_section("ingest", raw, IngestConfig)


def test_the_ingest_section_lives_here_with_its_defaults():
    assert sections()["ingest"] == "pipeline.music.manifest:IngestConfig"
    cfg = parse_section("ingest", None, IngestConfig)
    assert (cfg.max_file_bytes, cfg.max_notes, cfg.min_notes) == (16 << 20, 100_000, 1)
    assert (cfg.max_duration_s, cfg.max_gap_beats, cfg.timeout_s) == (3600.0, 1024.0, 60.0)
    assert parse_section("ingest", {"max_gap_beats": 8}, IngestConfig).max_gap_beats == 8.0


def test_every_limit_a_reason_names_is_a_key_of_the_section():
    named = {key for text in REASONS.values() for key in re.findall(r"ingest\.(\w+)", text)}
    assert named and named <= set(IngestConfig.model_fields)
    assert all(re.fullmatch(r"[a-z_]+", reason) for reason in REASONS)


def test_each_fixture_verdict_is_a_reason(midi_expected: dict):
    verdicts = {e["expect"] for e in midi_expected["files"].values()} - {"ok"}
    assert verdicts <= set(REASONS)
    assert {"timeout", "crash"} <= set(REASONS) - verdicts  # judged in the parent, never planted


def test_the_tables_are_keyed_by_sha256_and_hold_every_note_column():
    assert MANIFEST_SCHEMA.names[:3] == ["path", "sha256", "status"]
    assert NOTES_SCHEMA.names == ["sha256", *NOTE_COLUMNS]
    assert all(pa.types.is_list(f.type) for f in NOTES_SCHEMA if f.name != "sha256")
    assert NOTES_SCHEMA.field("onset").type.value_type == pa.float64()
    assert MANIFEST_SCHEMA.field("n_notes").type == pa.int64()

"""The conditions table (pipeline.conditions.table): its schema and metadata columns, its reader,
one piece's measured labels, and the refusal of conditions that name groups."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.conditions.config import BUILTIN, MEASURED, ConditionConfig
from pipeline.conditions.table import (
    CONDITIONS_SCHEMA,
    check_names,
    check_use,
    conditions_schema,
    measure,
    measured_labels,
    metadata_columns,
    metadata_of,
    read_conditions,
)
from pipeline.core.artifacts import ArtifactError, write_parquet
from pipeline.core.config import ParamsError
from tests.conditions._planted import scale_notes


def test_measured_labels_of_planted_windows():
    cfg = ConditionConfig()
    assert measured_labels(scale_notes(7), cfg)["key"] == "G major"
    assert measured_labels(scale_notes(9, "minor"), cfg)["mode"] == "minor"
    assert measured_labels(scale_notes(0, per_beat=1), cfg)["density"] == "low"
    assert measured_labels(scale_notes(0, per_beat=8), cfg)["density"] == "high"
    empty = {"onset": np.zeros(0), "duration": np.zeros(0), "pitch": np.zeros(0, dtype=int)}
    assert measured_labels(empty, cfg)["key"] is None


def test_the_schema_puts_the_metadata_labels_between_the_builtin_ones_and_the_values():
    schema = conditions_schema(["composer", "collection"])
    assert schema.names == ["sha256", "split", *BUILTIN, "composer", "collection", *MEASURED]
    assert {schema.field(n).type for n in ["split", *BUILTIN, "composer"]} == {pa.string()}
    assert {schema.field(n).type for n in MEASURED} == {pa.float64()}
    assert conditions_schema() == CONDITIONS_SCHEMA
    assert metadata_of(schema.empty_table()) == ["composer", "collection"]
    assert metadata_of(pd.DataFrame(columns=[*CONDITIONS_SCHEMA.names, "era"])) == ["era"]


def test_metadata_columns_are_the_manifests_other_columns():
    carried, skipped = metadata_columns(["sha256", "path", "group", "status", "n_notes",
                                         "composer", "key", "tempo_qpm", "collection"])
    assert carried == ["collection", "composer"]
    assert skipped == {"key": "named like a column of the conditions table",
                       "tempo_qpm": "named like a column of the conditions table"}


def test_one_pieces_labels_are_banded_from_rounded_values():
    """Four notes in two beats: 2.0 notes per beat, on the density edge, so the band above it;
    one voice; 140 qpm, on the tempo edge: fast. Without notes the note conditions are null."""
    notes = {"onset": np.array([0.0, 0.5, 1.0, 1.5]), "duration": np.full(4, 0.5),
             "pitch": np.array([60, 64, 67, 72]), "is_drum": np.zeros(4, bool)}
    row = measure(notes, "3/4", 140.0, ConditionConfig())
    assert list(row) == [*BUILTIN, *MEASURED]
    assert (row["key"], row["mode"], row["meter"]) == ("C major", "major", "3/4")
    assert (row["notes_per_beat"], row["density"]) == (2.0, "mid")
    assert (row["mean_polyphony"], row["polyphony"]) == (1.0, "mono")
    assert (row["tempo_qpm"], row["tempo"]) == (140.0, "fast")
    assert row["key_correlation"] == round(row["key_correlation"], 6) > 0.7
    bare = measure(None, None, None, ConditionConfig())
    assert bare == dict.fromkeys([*BUILTIN, *MEASURED])


def test_the_reader_sorts_by_piece_and_checks_each_columns_type(tmp_path):
    schema = conditions_schema(["composer"])
    rows = [{"sha256": s, "split": "train", "key": k, "composer": c, "tempo_qpm": q}
            for s, k, c, q in [("b", "C major", None, 90.0), ("a", None, "Bach", None)]]
    write_parquet(tmp_path / "c.parquet", pa.Table.from_pylist(rows, schema=schema))
    df = read_conditions(tmp_path / "c.parquet")
    assert df["sha256"].tolist() == ["a", "b"] and list(df.columns) == schema.names
    assert df["key"].isna().tolist() == [True, False] and df["key"][1] == "C major"
    assert df["composer"][0] == "Bach" and pd.isna(df["composer"][1])
    assert np.isnan(df["tempo_qpm"][0]) and df["tempo_qpm"][1] == 90.0
    assert list(read_conditions(tmp_path / "c.parquet", ["sha256", "key"]).columns) == [
        "sha256", "key"]
    wrong = pa.Table.from_pylist(rows, schema=schema).set_column(
        2, "key", pa.array([1, 2], pa.int64()))
    write_parquet(tmp_path / "w.parquet", wrong)
    with pytest.raises(ArtifactError, match="has column 'key' of type int64, not string"):
        read_conditions(tmp_path / "w.parquet")
    assert read_conditions(tmp_path / "w.parquet", ["sha256", "meter"])["sha256"].tolist() == [
        "a", "b"]  # the columns it is not asked for are not checked


def test_use_is_checked_against_the_tables_metadata_and_its_groups():
    table = pd.DataFrame({"sha256": list("abcd"), "split": "train", "key": "C major",
                          "composer": ["x", "x", "x", "y"], "title": ["t1", "t2", "t3", "t4"]})
    groups = ["g1", "g2", "g3", "g3"]
    check_use(["key", "composer"], table, groups)  # a composer of several works passes
    with pytest.raises(ParamsError, match=re.escape(
            "condition.use = ['key', 'title']: 'title' is refused: its label identifies the "
            "piece's group") + ".*100% of the 4 pieces with a label carry one found in a single "
            "group, of 3 groups; the limit is 50%"):
        check_use(["key", "title"], table, groups)
    with pytest.raises(ParamsError, match=re.escape(
            "'era' is neither a built-in condition nor a metadata column of the manifest; "
            "allowed: key, mode, meter, density, polyphony, tempo, or a metadata column "
            "(composer, title)")):
        check_use(["era"], table, groups)
    with pytest.raises(ParamsError, match="none: the manifest has no metadata"):
        check_names(["composer"], [])
    check_names(list(BUILTIN), [])

"""The conditions table, ``data/conditions.parquet``: its schema, its one reader, how one piece's
row is measured (:func:`measure`; a window of notes alike, :func:`measured_labels`, which the
audit's adherence and the doctor's checks use), and which of its columns a model may be
conditioned on.

Columns (:func:`conditions_schema`): ``sha256``, ``split``; one label column per built-in
condition (:data:`~pipeline.conditions.config.BUILTIN`: ``key``, ``mode``, ``meter``,
``density``, ``polyphony``, ``tempo``); one label column per metadata column of the manifest
(strings, in sorted order); then the measured values ``key_correlation``, ``notes_per_beat``,
``mean_polyphony``, ``tempo_qpm``. A null label is "no condition" (an ambiguous key, a file
without a time signature or a tempo, an empty metadata cell). Rows: one per piece of
``data/splits.parquet``, sorted by ``sha256``. The conditions stage writes it; every other reader
goes through :func:`read_conditions`.

**Conditions that identify groups are refused** (:func:`check_use`). The split keeps every group
(a work, a hymn tune, the copies and variants dedupe found) in one split, so that held-out scores
measure music the model has not seen. A condition whose label names the group undoes that: a
model conditioned on it learns a per-group code, which lets it store and recall each training
group under its label, while a held-out piece's label, never seen in train, carries nothing. The
rule: among the pieces that have a label, the share whose label occurs in exactly one group
(:func:`group_unique_share`); a condition is refused when that share is over
:data:`GROUP_SHARE_LIMIT` (most pieces) and the table holds at least two groups. A composer
shared by many works passes; a title, a catalogue number or a file name does not. Identity columns
(:data:`~pipeline.conditions.config.IDENTITY_COLUMNS`) are refused whatever their labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.conditions.config import (
    BUILTIN,
    GROUP_REASON,
    IDENTITY_COLUMNS,
    MANIFEST_FACTS,
    MEASURED,
    ConditionConfig,
)
from pipeline.conditions.extract import band, density, estimate_key, pitch_class_profile, polyphony
from pipeline.core import artifacts
from pipeline.core.config import ParamsError

GROUP_SHARE_LIMIT = 0.5
"""A condition is refused when more than this share of its labelled pieces carry a label that
occurs in one group only."""

DIGITS = 6
"""Measured values are rounded to this many decimals before the bands are applied, so a label
can be recomputed from the stored value and the table does not move with the last bits of a
floating-point sum."""


def conditions_schema(metadata: Sequence[str] = ()) -> pa.Schema:
    """The schema of ``data/conditions.parquet`` with the metadata label columns ``metadata``."""
    return pa.schema([("sha256", pa.string()), ("split", pa.string()),
                      *[(name, pa.string()) for name in (*BUILTIN, *metadata)],
                      *[(name, pa.float64()) for name in MEASURED]])


CONDITIONS_SCHEMA = conditions_schema()
"""The columns every conditions table has (a corpus's metadata columns come in between)."""


def metadata_columns(columns: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """Of a manifest's ``columns``: the metadata columns the conditions table carries (sorted),
    and those it cannot carry, with why (their name is a built-in condition's, a measured
    value's, or an identity column's)."""
    carried, skipped = [], {}
    for name in sorted(set(columns) - set(IDENTITY_COLUMNS) - set(MANIFEST_FACTS)):
        if name in BUILTIN or name in MEASURED:
            skipped[name] = "named like a column of the conditions table"
        else:
            carried.append(name)
    return carried, skipped


def metadata_of(table: pd.DataFrame | pa.Table) -> list[str]:
    """The metadata label columns of a conditions table."""
    names = table.column_names if isinstance(table, pa.Table) else list(table.columns)
    return [n for n in names if n not in CONDITIONS_SCHEMA.names]


def read_conditions(path: Path | str, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """``data/conditions.parquet`` as a DataFrame (null labels are None, null values NaN),
    sorted by ``sha256``. A missing or unreadable file, or one without a column of
    :data:`CONDITIONS_SCHEMA` of its type, is an :class:`~pipeline.core.artifacts.ArtifactError`
    naming the file and the stage that makes it."""
    table = artifacts.read_table(path, list(columns) if columns is not None else None)
    for field in CONDITIONS_SCHEMA:
        if columns is not None and field.name not in columns:
            continue
        if field.name not in table.column_names:
            raise artifacts.ArtifactError.for_path(path, f"has no column {field.name!r}")
        if table.schema.field(field.name).type != field.type:
            raise artifacts.ArtifactError.for_path(
                path, f"has column {field.name!r} of type {table.schema.field(field.name).type}, "
                      f"not {field.type}")
    df = table.to_pandas()
    if "sha256" in df.columns:
        df = df.sort_values("sha256", kind="stable").reset_index(drop=True)
    return df


def measure(notes: Mapping[str, np.ndarray] | None, meter: str | None, tempo_qpm: float | None,
            cfg: ConditionConfig) -> dict[str, Any]:
    """One piece's built-in labels and measured values (keys: BUILTIN then MEASURED).

    ``notes``: ``onset``, ``duration``, ``pitch`` and ``is_drum`` arrays (None: the piece has no
    notes row, and its note conditions are null). The key is null when no key fits (a flat
    profile) or its correlation is below ``cfg.min_key_correlation``; mode goes with it."""
    row: dict[str, Any] = dict.fromkeys((*BUILTIN, *MEASURED))
    if notes is not None:
        key = estimate_key(pitch_class_profile(notes["pitch"], notes["duration"], notes["is_drum"]))
        if key is not None:
            row["key_correlation"] = round(key.correlation, DIGITS)
            if row["key_correlation"] >= cfg.min_key_correlation:
                row["key"], row["mode"] = key.name, key.mode
        row["notes_per_beat"] = round(density(notes["onset"], notes["duration"]), DIGITS)
        row["mean_polyphony"] = round(polyphony(notes["onset"], notes["duration"]), DIGITS)
        row["density"] = band(row["notes_per_beat"], *cfg.bands("density"))
        row["polyphony"] = band(row["mean_polyphony"], *cfg.bands("polyphony"))
    row["meter"] = meter
    if tempo_qpm is not None:
        row["tempo_qpm"] = float(tempo_qpm)
        row["tempo"] = band(row["tempo_qpm"], *cfg.bands("tempo"))
    return row


FROM_NOTES = ("key", "mode", "density", "polyphony")
"""Conditions a window's notes alone decide."""


def measured_labels(notes: Mapping[str, np.ndarray] | None, cfg: ConditionConfig,
                    meter: str | None = None, tempo_qpm: float | None = None) -> dict[str, Any]:
    """A window's built-in labels (``notes``: onset, duration, pitch in beats; ``is_drum``
    optional), measured as the conditions stage measures a piece."""
    if notes is not None and "is_drum" not in notes:
        notes = {**notes, "is_drum": np.zeros(len(notes["pitch"]), dtype=bool)}
    if notes is not None and len(notes["pitch"]) == 0:
        notes = None
    return measure(notes, meter, tempo_qpm, cfg)


def group_unique_share(labels: Sequence[Any], group_ids: Sequence[str]) -> float | None:
    """Share of the labelled pieces (label not None) whose label occurs in exactly one group;
    None when no piece is labelled."""
    pairs = pd.DataFrame({"label": pd.Series(list(labels), dtype=object),
                          "group": pd.Series(list(group_ids), dtype=object)}).dropna()
    if pairs.empty:
        return None
    groups_per_label = pairs.groupby("label")["group"].nunique()
    return float((pairs["label"].map(groups_per_label) == 1).mean())


def identifies_groups(labels: Sequence[Any], group_ids: Sequence[str]) -> bool:
    """Whether a condition's labels identify the pieces' groups (module docstring): over
    :data:`GROUP_SHARE_LIMIT` of its labelled pieces carry a label held by one group only, in a
    table of at least two groups."""
    share = group_unique_share(labels, group_ids)
    return share is not None and share > GROUP_SHARE_LIMIT and len(set(group_ids)) >= 2


def check_names(use: Sequence[str], metadata: Sequence[str]) -> None:
    """Refuse, with a :class:`~pipeline.core.config.ParamsError` naming ``condition.use``, a
    name that is neither a built-in condition nor one of the corpus's ``metadata`` columns."""
    for name in use:
        if name not in BUILTIN and name not in metadata:
            cols = ", ".join(metadata) if metadata else "none: the manifest has no metadata"
            raise ParamsError(
                f"condition.use = {list(use)}: {name!r} is neither a built-in condition nor a "
                f"metadata column of the manifest; allowed: {', '.join(BUILTIN)}, or a metadata "
                f"column ({cols})")


def check_use(use: Sequence[str], table: pd.DataFrame, group_ids: Sequence[str]) -> None:
    """:func:`check_names` against the metadata columns of ``table`` (a conditions table), then
    refuse, with a :class:`~pipeline.core.config.ParamsError` naming ``condition.use``, a
    condition whose labels identify groups (``group_ids``: each row's group, in the table's
    order, from ``data/splits.parquet``)."""
    check_names(use, metadata_of(table))
    for name in use:
        labels = table[name].tolist()
        if identifies_groups(labels, group_ids):
            share = group_unique_share(labels, group_ids)
            n = int(table[name].notna().sum())
            raise ParamsError(
                f"condition.use = {list(use)}: {name!r} is refused: {GROUP_REASON} ({share:.0%} "
                f"of the {n} pieces with a label carry one found in a single group, of "
                f"{len(set(group_ids))} groups; the limit is {GROUP_SHARE_LIMIT:.0%})")

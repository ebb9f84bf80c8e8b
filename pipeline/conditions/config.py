"""The ``condition`` section of params.yaml: which conditions a model is given, how often they are
dropped in training, and the bands that turn measured values into labels.

Read by the conditions stage (the bands and the key threshold shape its table; it also checks
``use`` against the corpus) and by the training stage (``use`` and ``dropout``). Names in ``use``
are checked here as far as they can be without the corpus: a built-in condition
(:data:`BUILTIN`), or any other name, which must then be a metadata column of the manifest (the
stage checks that). Identity columns (:data:`IDENTITY_COLUMNS`) and the manifest's own facts
(:data:`MANIFEST_FACTS`) are refused here.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator

from pipeline.conditions.vocab import NONE_LABEL
from pipeline.core.config import StageConfig

BUILTIN = ("key", "mode", "meter", "density", "polyphony", "tempo")
"""Conditions measured from every piece's notes (key, mode, density, polyphony) and MIDI file
(meter, tempo); see :mod:`pipeline.conditions.extract`."""

IDENTITY_COLUMNS = ("sha256", "path", "group", "group_id", "note_hash", "duplicate_of", "split",
                    "fold")
"""Columns that name a piece, its file, its group or its split: a condition on one of them tells
a model which group a piece belongs to, so they are never conditions."""

MANIFEST_FACTS = ("status", "reason", "detail", "n_notes", "n_tracks", "tpq", "duration_s",
                  "duration_beats", "size_bytes")
"""The manifest's columns that ingest computes (not metadata, and not identity): never conditions.
With :data:`IDENTITY_COLUMNS` they are every column of ingest's ``MANIFEST_SCHEMA``."""

MEASURED = ("key_correlation", "notes_per_beat", "mean_polyphony", "tempo_qpm")
"""The measured values the conditions table holds beside the labels."""

GROUP_REASON = ("its label identifies the piece's group: a model conditioned on it can learn "
                "which group a piece belongs to, and the split's grouping no longer holds")


class ConditionConfig(StageConfig):
    """``condition`` section of params.yaml; each key is documented there, beside its value."""

    SECTION: ClassVar[str] = "condition"

    use: list[str] = Field(default_factory=list)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    density_edges: list[float] = Field(default_factory=lambda: [2.0, 4.5])
    density_labels: list[str] = Field(default_factory=lambda: ["low", "mid", "high"])
    polyphony_edges: list[float] = Field(default_factory=lambda: [1.5, 3.5])
    polyphony_labels: list[str] = Field(default_factory=lambda: ["mono", "few", "full"])
    tempo_edges: list[float] = Field(default_factory=lambda: [80.0, 140.0])
    tempo_labels: list[str] = Field(default_factory=lambda: ["slow", "moderate", "fast"])
    min_key_correlation: float = Field(0.7, ge=-1.0, le=1.0)

    @field_validator("use")
    @classmethod
    def _known_names(cls, use: list[str]) -> list[str]:
        allowed = (f"allowed: {', '.join(BUILTIN)}, or a metadata column of the manifest (e.g. "
                   "composer)")
        for name in use:
            if name in IDENTITY_COLUMNS:
                raise ValueError(f"{name!r} is refused: {GROUP_REASON}")
            if name in MANIFEST_FACTS or name in MEASURED or not name.strip():
                raise ValueError(f"{name!r} is not a condition; {allowed}")
        if len(set(use)) != len(use):
            raise ValueError(f"{use} names a condition twice")
        return use

    @field_validator("density_edges", "polyphony_edges", "tempo_edges")
    @classmethod
    def _ascending(cls, edges: list[float]) -> list[float]:
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError("edges must be strictly ascending")
        return edges

    @field_validator("density_labels", "polyphony_labels", "tempo_labels")
    @classmethod
    def _one_more_than_edges(cls, labels: list[str], info: ValidationInfo) -> list[str]:
        edges_key = info.field_name.replace("_labels", "_edges")
        edges = info.data.get(edges_key)
        if edges is not None and len(labels) != len(edges) + 1:
            raise ValueError(f"{len(labels)} labels for the {len(edges)} {edges_key} "
                             f"{edges}: needs {len(edges) + 1} (one band below the first edge, "
                             "one between each two, one above the last)")
        if len(set(labels)) != len(labels) or not all(x.strip() for x in labels) \
                or NONE_LABEL in labels:
            raise ValueError(f"labels must be distinct, not empty and not {NONE_LABEL!r}")
        return labels

    def bands(self, name: str) -> tuple[list[float], list[str]]:
        """(edges, labels) of the banded condition ``name``: density, polyphony or tempo."""
        return getattr(self, f"{name}_edges"), getattr(self, f"{name}_labels")

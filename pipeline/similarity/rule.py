"""The near-copy rule: when two pieces count as near copies, one definition for the dedupe, split,
audit and contamination stages.

:class:`NearCopySettings` declares, once and with their defaults, the keys of the ``dedupe``
section that define a near copy: how notes become shingles and token sequences (``shingle_k``,
``ioi_resolution``), the thresholds (``near_jaccard``, ``near_containment``, ``near_alignment``)
and the lengths under which a measure does not apply (``min_shingles``, ``min_melody_notes``,
``min_align_onsets``). :class:`~pipeline.similarity.duplicates.DedupeConfig` extends it with the
keys that find candidates and say what a pair does.

:meth:`NearCopyRule.of` is the one way a rule is built from those settings; a null
``near_alignment`` is derived there (:func:`alignment_threshold`). The dedupe stage writes
:meth:`NearCopyRule.to_json` into ``data/dedupe/fingerprint.json``, and :meth:`NearCopyRule.read`
is the one reader of that file: the split stage's leakage audit and the audit stage's
nearest-neighbour shingles measure similarity exactly as dedupe did. The contamination stage
builds the rule from the ``dedupe`` section itself, as the dedupe stage does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError

from pipeline.core import artifacts
from pipeline.core.config import StageConfig


def alignment_threshold(jaccard: float, shingle_k: int) -> float:
    """The Indel similarity that the edit rate at which shingle Jaccard falls to ``jaccard``
    leaves on a token sequence, so that "near" means the same, measured either way.

    A changed note alters two tokens (its own interval and the next note's), so ``k + 1``
    shingles of each copy; with ``b`` of ``n`` shingles changed Jaccard is (n - b) / (n + b),
    reached at the edit rate ``e = (1 - J) / ((1 + J)(k + 1))``. The same note costs 4
    insertions/deletions out of the 2(n - 1) tokens of both copies, a similarity of 1 - 2e:
    0.867 for Jaccard 0.5 and k = 4 (e = 6.7% of notes changed)."""
    return 1.0 - 2.0 * (1.0 - jaccard) / ((1.0 + jaccard) * (shingle_k + 1))


class NearCopySettings(StageConfig):
    """The keys of the ``dedupe`` section that define a near copy; each is documented in
    params.yaml, beside its value."""

    shingle_k: int = Field(4, ge=2, le=12)
    ioi_resolution: int = Field(4, ge=1, le=12)
    near_jaccard: float = Field(0.5, gt=0.0, le=1.0)
    near_containment: float = Field(0.8, gt=0.0, le=1.0)
    min_shingles: int = Field(16, ge=1)
    min_melody_notes: int = Field(12, ge=2)
    near_alignment: float | None = Field(None, gt=0.0, le=1.0)
    min_align_onsets: int = Field(10, ge=4)


@dataclass(frozen=True)
class NearCopyRule:
    """When two pieces are near copies: exact shingle Jaccard >= ``jaccard`` or containment >=
    ``containment`` (both pieces with at least ``min_shingles`` distinct ``shingle_k``-shingles),
    or normalised Indel similarity >= ``alignment`` of the whole note-token sequences (both
    pieces with at least ``min_align_onsets`` distinct onsets) or of the top-voice interval
    sequences (melodies of at least ``min_melody_notes`` notes). Dedupe adds excerpts and
    containment located by alignment (:func:`pipeline.similarity.duplicates.verify`)."""

    shingle_k: int
    ioi_resolution: int
    jaccard: float
    containment: float
    min_shingles: int
    alignment: float
    """``near_alignment``, or when that is null :func:`alignment_threshold` of ``jaccard`` and
    ``shingle_k``: the similarity left by the edit rate at which shingle Jaccard falls to
    ``jaccard``, one definition of "near" measured either way (0.867 for Jaccard 0.5 and
    k = 4)."""
    min_align_onsets: int
    min_melody_notes: int

    @classmethod
    def of(cls, settings: NearCopySettings) -> NearCopyRule:
        """The rule the ``dedupe`` settings define (a :class:`DedupeConfig` is one)."""
        alignment = settings.near_alignment
        if alignment is None:
            alignment = alignment_threshold(settings.near_jaccard, settings.shingle_k)
        return cls(shingle_k=settings.shingle_k, ioi_resolution=settings.ioi_resolution,
                   jaccard=settings.near_jaccard, containment=settings.near_containment,
                   min_shingles=settings.min_shingles, alignment=alignment,
                   min_align_onsets=settings.min_align_onsets,
                   min_melody_notes=settings.min_melody_notes)

    def to_json(self) -> dict:
        """The serialised rule, ``data/dedupe/fingerprint.json``: the settings under their
        ``dedupe`` names, ``near_alignment`` resolved."""
        return {"shingle_k": self.shingle_k, "ioi_resolution": self.ioi_resolution,
                "near_jaccard": self.jaccard, "near_containment": self.containment,
                "min_shingles": self.min_shingles, "near_alignment": self.alignment,
                "min_align_onsets": self.min_align_onsets,
                "min_melody_notes": self.min_melody_notes}

    @classmethod
    def read(cls, path: Path | str) -> NearCopyRule:
        """The rule dedupe wrote to ``path`` (:meth:`to_json`). A missing, unreadable or
        incomplete file, or a value the ``dedupe`` section would refuse, is an
        :class:`~pipeline.core.artifacts.ArtifactError` naming the file, the key and the stage
        that writes it."""
        raw = artifacts.read_json(path)
        if not isinstance(raw, dict):
            raise artifacts.ArtifactError.for_path(path, "is not a JSON object")
        missing = [k for k in NearCopySettings.model_fields if k not in raw]
        if missing:
            raise artifacts.ArtifactError.for_path(
                path, f"lacks {', '.join(missing)} (written by an older dedupe stage)")
        try:
            settings = NearCopySettings.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(map(str, err["loc"])) or "?"
            raise artifacts.ArtifactError.for_path(
                path, f"has {key} = {err.get('input')!r}: {err['msg']}") from None
        return cls.of(settings)

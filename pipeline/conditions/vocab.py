"""The condition vocabulary: which conditions a model is given, and the id of each label.

A model conditioned on ``K`` conditions (``condition.use``, e.g. ``[key, density]``) receives,
for each piece, ``K`` ids, one per *slot*. Slot ``k`` owns the ids ``offset_k ..
offset_k + len(labels_k)``: the first of them, ``offset_k``, means "no condition" (the label is
missing, was never seen in train, or was dropped for classifier-free guidance); the others are
the slot's labels in sorted order. Labels are learned from the **train** pieces only, so a val or
test piece whose label train never had gets its slot's "none" id rather than a new one.

The vocabulary is plain data (:meth:`ConditionVocab.to_dict`): a model records it in
``model.json`` and its :attr:`ConditionVocab.hash`, so a model is never run with ids that mean
other labels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NONE_LABEL = "<none>"
"""How the "no condition" id of a slot is named in listings."""


@dataclass(frozen=True)
class ConditionVocab:
    names: tuple[str, ...]
    """The conditions, in ``condition.use`` order (one slot each)."""
    labels: tuple[tuple[str, ...], ...]
    """Per slot, its labels in sorted order (``NONE_LABEL`` not included)."""

    def __post_init__(self) -> None:
        if len(self.names) != len(self.labels):
            raise ValueError(f"{len(self.names)} names but {len(self.labels)} label lists")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"condition names repeat: {list(self.names)}")
        for name, labels in zip(self.names, self.labels, strict=True):
            if list(labels) != sorted(set(labels)) or NONE_LABEL in labels:
                raise ValueError(f"condition {name!r}: labels must be sorted, distinct and not "
                                 f"{NONE_LABEL!r}")

    @property
    def n_slots(self) -> int:
        return len(self.names)

    @property
    def slot_sizes(self) -> tuple[int, ...]:
        """Ids per slot: its labels plus the "none" id."""
        return tuple(len(labels) + 1 for labels in self.labels)

    @property
    def size(self) -> int:
        """Total ids over every slot (the model's condition-embedding rows)."""
        return sum(self.slot_sizes)

    @property
    def offsets(self) -> np.ndarray:
        """(K,) first id of each slot, which is also the slot's "none" id."""
        return np.concatenate([[0], np.cumsum(self.slot_sizes)[:-1]]).astype(np.int64)

    def none_ids(self) -> np.ndarray:
        """(K,) the "no condition" id of every slot."""
        return self.offsets.copy()

    def encode(self, row: Mapping[str, Any]) -> np.ndarray:
        """One piece's labels (``row[name]``; missing, None or unseen -> "none") as (K,) ids."""
        out = self.none_ids()
        for k, (name, labels) in enumerate(zip(self.names, self.labels, strict=True)):
            value = row.get(name)
            if value is None or (isinstance(value, float) and np.isnan(value)):
                continue
            i = _index(labels, str(value))
            if i is not None:
                out[k] += 1 + i
        return out

    def encode_many(self, rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """(N, K) ids of ``rows`` (shape (N, 0) when no condition is used)."""
        encoded = [self.encode(r) for r in rows]
        return (np.stack(encoded) if encoded else np.zeros((0, self.n_slots))).astype(np.int64)

    def decode(self, ids: Sequence[int]) -> dict[str, str | None]:
        """(K,) ids -> ``{name: label}``, None for a slot's "none" id."""
        out: dict[str, str | None] = {}
        for k, (name, labels) in enumerate(zip(self.names, self.labels, strict=True)):
            j = int(ids[k]) - int(self.offsets[k])
            if not 0 <= j <= len(labels):
                raise ValueError(f"condition id {int(ids[k])} is outside slot {name!r}")
            out[name] = None if j == 0 else labels[j - 1]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "labels": [list(x) for x in self.labels]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConditionVocab:
        return cls(names=tuple(d["names"]), labels=tuple(tuple(x) for x in d["labels"]))

    @property
    def hash(self) -> str:
        """12 hex digits of the sha256 of the canonical JSON of :meth:`to_dict`."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


EMPTY = ConditionVocab(names=(), labels=())
"""No conditions: an unconditioned model."""


def _index(labels: tuple[str, ...], value: str) -> int | None:
    i = int(np.searchsorted(np.asarray(labels, dtype=object), value))
    return i if i < len(labels) and labels[i] == value else None


def fit_vocab(names: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> ConditionVocab:
    """The vocabulary of ``names`` learned from ``rows`` (the **train** pieces' conditions): every
    label that occurs, sorted; missing values are not labels."""
    seen: list[set[str]] = [set() for _ in names]
    for row in rows:
        for k, name in enumerate(names):
            value = row.get(name)
            if value is None or (isinstance(value, float) and np.isnan(value)):
                continue
            seen[k].add(str(value))
    return ConditionVocab(names=tuple(names), labels=tuple(tuple(sorted(s)) for s in seen))

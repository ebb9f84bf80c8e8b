"""Each piece's condition ids, as training and scoring take them.

:func:`piece_conditions` turns the condition table (``data/conditions.parquet``: ``sha256``,
``split`` and one label column per condition) into a :class:`PieceConditions`: the vocabulary of
the conditions in use, learned from the **train** pieces' labels only, and every piece's ids.
A piece the table does not list, and a label train never had, get the slot's "none" id.

Transposed training copies (``data/tokens/augmented.parquet``) carry their piece's conditions,
with the key moved by the transposition (:func:`transpose_label`): every other condition is the
same under transposition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pipeline.conditions.extract import MODES, PITCH_NAMES
from pipeline.conditions.vocab import ConditionVocab, fit_vocab


@dataclass(frozen=True)
class PieceConditions:
    """The vocabulary in use and every listed piece's ids (``sha256`` -> (K,) int64)."""

    vocab: ConditionVocab
    ids: Mapping[str, np.ndarray] = field(repr=False)

    def of(self, sha256: str) -> np.ndarray:
        """(K,) ids of one piece; every slot's "none" for a piece the table does not list."""
        got = self.ids.get(sha256)
        return self.vocab.none_ids() if got is None else got.copy()

    def many(self, sha256s: Sequence[str]) -> np.ndarray:
        """(N, K) ids of ``sha256s``, in that order."""
        rows = [self.of(s) for s in sha256s]
        return (np.stack(rows) if rows else np.zeros((0, self.vocab.n_slots))).astype(np.int64)

    def digest(self) -> str:
        """sha256 of the vocabulary and every piece's ids, in sha256 order: what a run's identity
        records, so changed conditions never resume another run's checkpoints."""
        h = hashlib.sha256(self.vocab.hash.encode())
        for sha in sorted(self.ids):
            h.update(sha.encode())
            h.update(np.asarray(self.ids[sha], dtype="<i8").tobytes())
        return h.hexdigest()


def piece_conditions(table: pd.DataFrame, names: Sequence[str]) -> PieceConditions:
    """The conditions ``names`` of the table's pieces; labels learned from ``split == "train"``."""
    missing = [n for n in names if n not in table.columns]
    if missing:
        raise ValueError(f"the condition table has no column {missing[0]!r}; it has "
                         f"{sorted(c for c in table.columns if c not in ('sha256', 'split'))}")
    table = table.sort_values("sha256", kind="stable")
    rows = table[["sha256", "split", *names]].to_dict("records")
    vocab = fit_vocab(list(names), [r for r in rows if r["split"] == "train"])
    return PieceConditions(vocab, {r["sha256"]: vocab.encode(r) for r in rows})


def with_vocab(table: pd.DataFrame, vocab: ConditionVocab) -> PieceConditions:
    """The table's pieces in a given vocabulary (a trained model's, from its ``model.json``):
    labels it does not know are "none". How a model is scored and sampled on any pieces."""
    missing = [n for n in vocab.names if n not in table.columns]
    if missing:
        raise ValueError(f"the model is conditioned on {list(vocab.names)}, but the condition "
                         f"table has no column {missing[0]!r}")
    table = table.sort_values("sha256", kind="stable")
    rows = table[["sha256", *vocab.names]].to_dict("records")
    return PieceConditions(vocab, {r["sha256"]: vocab.encode(r) for r in rows})


def model_vocab(condition: Mapping[str, Any] | None) -> ConditionVocab | None:
    """The vocabulary a model's ``model.json`` records under ``condition`` (None: unconditioned)."""
    return None if condition is None else ConditionVocab.from_dict(condition["vocab"])


def transpose_label(name: str, label: Any, semitones: int) -> Any:
    """A condition's label after transposing the piece by ``semitones``: the key's tonic moves,
    every other condition stays."""
    if name != "key" or label is None or (isinstance(label, float) and np.isnan(label)):
        return label
    tonic, _, mode = str(label).partition(" ")
    if tonic not in PITCH_NAMES or mode not in MODES:
        raise ValueError(f"key label {label!r} is not '<tonic> <mode>' "
                         f"(tonic one of {list(PITCH_NAMES)}, mode one of {list(MODES)})")
    return f"{PITCH_NAMES[(PITCH_NAMES.index(tonic) + semitones) % 12]} {mode}"


def transposed_ids(pc: PieceConditions, sha256: str, semitones: int) -> np.ndarray:
    """(K,) ids of piece ``sha256`` transposed by ``semitones`` (see :func:`transpose_label`)."""
    ids = pc.of(sha256)
    if "key" not in pc.vocab.names or semitones % 12 == 0:
        return ids
    k = pc.vocab.names.index("key")
    label = pc.vocab.decode(ids)["key"]
    moved = pc.vocab.encode({"key": transpose_label("key", label, semitones)})
    ids[k] = pc.vocab.none_ids()[k] if label is None else moved[k]
    return ids

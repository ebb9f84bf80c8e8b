"""How much a token sequence overlaps the training set, and its music statistics: the
per-sequence measures of the memorisation audit.

:func:`build_training_index` indexes the training sequences once (token suffix array, pitch-
interval suffix array, shingle sets as the dedupe stage makes them); :func:`measure_all` then
gives each sequence (a sample or a human window) its longest shared token span, n-gram novelty,
nearest training piece by shingle Jaccard and containment, and the music statistics of
:mod:`pipeline.music.descriptors`. A sequence that does not decode keeps its token measures and has
NaN
for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from pipeline.audit.memorisation import ShingleIndex, SuffixIndex, intervals, novelty
from pipeline.music.descriptors import STATS, all_stats
from pipeline.music.midi import score_notes
from pipeline.similarity.fingerprints import NoteArrays, shingles
from pipeline.similarity.rule import NearCopyRule, NearCopySettings
from pipeline.tokens.tokenizer import decode_ids


class MeasurePlan(Protocol):
    """What the measures need of the ``audit`` params (``AuditConfig`` is one)."""

    ngram_sizes: Sequence[int]
    interval_ngram_sizes: Sequence[int]
    beats_per_bar: int
    groove_resolution: int


# --- tokenizer facts --------------------------------------------------------------------------


def bar_tokens_per_id(tokenizer: Any) -> np.ndarray | None:
    """Number of ``Bar`` base tokens each id stands for (BPE ids may hold several); None if the
    tokenizer has no Bar tokens."""
    from miditok import TokSequence

    trained = bool(getattr(tokenizer, "is_trained", False))
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for i in range(len(tokenizer)):
        seq = TokSequence(ids=[i], are_ids_encoded=trained)
        try:
            if trained:
                tokenizer.decode_token_ids(seq)
            tokenizer.complete_sequence(seq)
            counts[i] = sum(str(t).startswith("Bar") for t in seq.tokens)
        except Exception:  # an id the tokenizer cannot expand holds no Bar
            counts[i] = 0
    return counts if counts.any() else None


# --- per-sequence measures --------------------------------------------------------------------


@dataclass
class TrainingIndex:
    """Everything the audit compares against, built once from the training sequences."""

    keys: list[tuple[str, int]]
    tokens: SuffixIndex
    intervals: SuffixIndex
    shingles: ShingleIndex
    shingling: Shingling


_DEDUPE_DEFAULTS = NearCopySettings()


@dataclass(frozen=True)
class Shingling:
    """How notes become shingles: the near-copy rule's, read from dedupe's
    ``data/dedupe/fingerprint.json`` (:meth:`read`) so that the nearest-neighbour similarity is
    measured exactly as the dedupe stage measured it. The defaults are the ``dedupe`` section's."""

    k: int = _DEDUPE_DEFAULTS.shingle_k
    ioi_resolution: int = _DEDUPE_DEFAULTS.ioi_resolution

    @classmethod
    def of(cls, rule: NearCopyRule) -> Shingling:
        return cls(k=rule.shingle_k, ioi_resolution=rule.ioi_resolution)

    @classmethod
    def read(cls, path: Path) -> Shingling:
        """The shingling of the rule in ``path`` (:meth:`~pipeline.similarity.rule.NearCopyRule.
        read`)."""
        return cls.of(NearCopyRule.read(path))


Notes = dict[str, np.ndarray]


def decode_all(tok: Any, seqs: Sequence[np.ndarray]) -> list[Notes | None]:
    """Notes table of every sequence; None where decoding fails."""
    out: list[Notes | None] = []
    for ids in seqs:
        score, err = decode_ids(tok, ids)
        out.append(score_notes(score) if err is None else None)
    return out


def shingle_sets(notes: Sequence[Notes | None], k: int, ioi_resolution: int) -> list[np.ndarray]:
    """The dedupe stage's shingle set of each notes table (empty for None), in one batch."""
    parts = [n if n is not None else {c: np.zeros(0) for c in ("onset", "duration", "pitch")}
             for n in notes]
    lengths = np.asarray([len(p["pitch"]) for p in parts], dtype=np.int64)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])

    def cat(col: str, dtype) -> np.ndarray:
        return np.concatenate([np.asarray(p[col]) for p in parts]).astype(dtype) if parts else \
            np.zeros(0, dtype=dtype)

    arrays = NoteArrays(sha256=np.asarray([f"{i}" for i in range(len(parts))], dtype=object),
                        offsets=offsets, onset=cat("onset", np.float64),
                        duration=cat("duration", np.float64), pitch=cat("pitch", np.int16),
                        is_drum=np.zeros(int(lengths.sum()), dtype=bool),
                        track=np.zeros(int(lengths.sum()), dtype=np.int16))
    off, values = shingles(arrays, k, ioi_resolution)
    return [values[off[i]:off[i + 1]] for i in range(len(parts))]


def _intervals(notes: Notes | None) -> np.ndarray:
    return intervals(notes["pitch"]) if notes is not None else np.zeros(0, dtype=np.int64)


def build_training_index(tok: Any, train: pd.DataFrame, shingling: Shingling) -> TrainingIndex:
    ids = [np.asarray(x, dtype=np.int64) for x in train["ids"]]
    notes = decode_all(tok, ids)
    keys = list(zip(train["sha256"].astype(str), train["track"].astype(int), strict=True))
    return TrainingIndex(keys, SuffixIndex().fit(ids),
                         SuffixIndex().fit([_intervals(n) for n in notes]),
                         ShingleIndex().fit(shingle_sets(notes, shingling.k,
                                                         shingling.ioi_resolution)),
                         shingling)


def measure_all(seqs: Sequence[np.ndarray], index: TrainingIndex, tok: Any, cfg: MeasurePlan,
                bars: np.ndarray | None) -> list[dict[str, Any]]:
    """All memorisation measures and music statistics of each id sequence."""
    notes = decode_all(tok, seqs)
    sets = shingle_sets(notes, index.shingling.k, index.shingling.ioi_resolution)
    return [measure(np.asarray(ids, dtype=np.int64), n, sh, index, cfg, bars)
            for ids, n, sh in zip(seqs, notes, sets, strict=True)]


def measure(ids: np.ndarray, notes: Notes | None, shingle_set: np.ndarray, index: TrainingIndex,
            cfg: MeasurePlan, bars: np.ndarray | None) -> dict[str, Any]:
    """Measures of one sequence given its decoded notes (None = failed to decode)."""
    match, ms = index.tokens.longest_match(ids)
    span = ids[match.query_start: match.query_start + match.length]
    row: dict[str, Any] = {
        "n_tokens": int(ids.size),
        "decode_ok": notes is not None,
        "lcs_tokens": float(match.length),
        "lcs_bars": float(bars[span].sum()) if bars is not None else float("nan"),
        "lcs_train_sha256": index.keys[match.seq_index][0] if match.length else None,
        "lcs_start": int(match.query_start) if match.length else -1,
        "lcs_train_track": int(index.keys[match.seq_index][1]) if match.length else -1,
        "lcs_train_start": int(match.seq_offset) if match.length else -1,
    }
    for n in cfg.ngram_sizes:
        row[f"novelty_tok_{n}"] = novelty(ms, n)
    ims = index.intervals.matching_statistics(_intervals(notes))[0] if notes is not None else None
    for n in cfg.interval_ngram_sizes:
        row[f"novelty_int_{n}"] = novelty(ims, n) if ims is not None else float("nan")
    if notes is not None:
        k, jac, con = index.shingles.nearest(shingle_set)
        row.update(nn_sha256=index.keys[k][0] if k >= 0 else None, nn_jaccard=jac,
                   nn_containment=con)
        row.update(all_stats(notes, cfg.beats_per_bar, cfg.groove_resolution))
    else:
        row.update(nn_sha256=None, nn_jaccard=float("nan"), nn_containment=float("nan"))
        row.update({name: float("nan") for name in [*STATS, "n_notes"]})
    return row

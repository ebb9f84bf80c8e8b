"""Which notes of a decoded id sequence a part of its ids stands for.

A continuation's prompt and the longest span a sample shares with a training piece are both
ranges of ids; a reader sees notes. The ids before a position are decoded alone and their notes
matched to the whole sequence's notes by (onset, pitch, duration) as a multiset, each used once,
so a note that the cut splits (its duration token on the far side) counts as after the cut. A
span's notes are the whole notes inside it: decoded by the ids up to its end, not by those before
its start, and not the note left open at its start (a pitch token before the span, its velocity or
duration inside), whose pitch the span does not hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.music.midi import score_notes
from pipeline.tokens.tokenizer import decode_ids


def prefix_mask(tok: Any, ids: Sequence[int], n: int,
                notes: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """True for each of ``notes`` (the whole of ``ids`` decoded, as :func:`score_notes` gives
    them) that ``ids[:n]`` decodes to; None when that prefix does not decode."""
    mask = np.zeros(len(notes["onset"]), dtype=bool)
    if n <= 0:
        return mask
    score, err = decode_ids(tok, ids[:n])
    if err is not None:
        return None
    given = score_notes(score)
    left = Counter(zip(given["onset"].tolist(), given["pitch"].tolist(),
                       given["duration"].tolist(), strict=True))
    for i, key in enumerate(zip(np.asarray(notes["onset"]).tolist(),
                                np.asarray(notes["pitch"]).tolist(),
                                np.asarray(notes["duration"]).tolist(), strict=True)):
        if left[key] > 0:
            left[key] -= 1
            mask[i] = True
    return mask


def base_tokens(tok: Any, ids: Sequence[int]) -> list[str]:
    """The base tokens ``ids`` stand for (a BPE id may hold several)."""
    from miditok import TokSequence

    trained = bool(getattr(tok, "is_trained", False))
    seq = TokSequence(ids=[int(i) for i in ids], are_ids_encoded=trained)
    if trained:
        tok.decode_token_ids(seq)
    tok.complete_sequence(seq)
    return [str(t) for t in seq.tokens]


NOTE_TAIL = ("Velocity_", "Duration_")
"""Base tokens that follow a note's pitch token and complete it."""


def open_pitch(tok: Any, ids: Sequence[int], start: int, lookback: int = 16) -> int | None:
    """The pitch of a note left open at ``start``: its ``Pitch_`` token before ``start`` with
    only velocity or duration tokens after it there. None when no note is open."""
    for t in reversed(base_tokens(tok, ids[max(0, start - lookback): start])):
        if t.startswith("Pitch_"):
            return int(t.split("_", 1)[1])
        if not t.startswith("Velocity_"):
            return None
    return None


def span_mask(tok: Any, ids: Sequence[int], start: int, stop: int,
              notes: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """True for each of ``notes`` that ``ids[start:stop]`` holds whole: decoded by
    ``ids[:stop]`` and not by ``ids[:start]``, less the note open at ``start`` (the earliest
    such note of its pitch). None when either prefix does not decode."""
    before, upto = prefix_mask(tok, ids, start, notes), prefix_mask(tok, ids, stop, notes)
    if before is None or upto is None:
        return None
    mask = upto & ~before
    head = base_tokens(tok, ids[start: start + 1])
    pitch = open_pitch(tok, ids, start) if head and head[0].startswith(NOTE_TAIL) else None
    if pitch is not None:
        hit = np.flatnonzero(mask & (np.asarray(notes["pitch"]) == pitch))
        if hit.size:
            mask[hit[np.argmin(np.asarray(notes["onset"])[hit])]] = False
    return mask

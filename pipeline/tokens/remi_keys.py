"""The notes miditok's REMI ``decode`` gives for base ids, read straight from the ids.

For the round-trip check (:func:`pipeline.tokens.roundtrip.roundtrip_batch`): the configurations
it covers (:func:`_remi_spec`, the project's default among them) are read for a whole chunk of
sequences with a few array operations, instead of building a ``Score`` per sequence with
miditok's ``decode`` and reading its notes, the path every other configuration takes (and any
sequence whose notes differ from the reference). Tests compare it with ``decode``.

What it buys, measured on a loaded 2-core machine against the same code with
:func:`remi_note_columns` returning None (every check decoded by miditok), on the 2,000 short
two-track files of ``python benchmarks/bench_tokenize.py --files 2000 --workers 2 --repeat 3``:
the check takes 5% of the workers' time instead of 37-39%, the workers' chunk function 1.42-1.46
CPU s instead of 2.19-2.25 (1.5x), and a whole tokenize stage run (one worker, no cache) 1.50-1.66
CPU s instead of 2.27-2.39 (1.4x; wall 2.0-4.4 s against 3.5-6.1 s under that load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Token kinds of the REMI reader below.
_OTHER, _BAR, _POS, _PROG, _PITCH, _VEL, _DUR, _TS = range(8)
_REMI_SPECS: dict[int, Any] = {}


@dataclass(frozen=True)
class _RemiSpec:
    kind: np.ndarray  # per base id: one of the kinds above
    value: np.ndarray  # per base id: position, program, pitch or velocity; index of a duration
    # or of a time signature
    ts_bar: np.ndarray  # per time signature: ticks per bar
    ts_pos: np.ndarray  # per time signature: ticks per position
    dur_ticks: np.ndarray  # (time signature, duration index) -> ticks
    default_ts: int  # the decoder's default time signature
    pitch_range: tuple[int, int]


def _remi_spec(tokenizer: Any) -> _RemiSpec | None:
    """Lookup tables for :func:`remi_note_keys`, or None outside the configurations it reads:
    REMI, all programs in one stream, velocities and durations on every program, and none of
    rests, chords, pitch intervals, pedals, pitch bends, control changes, bar embeddings or
    bar-end tokens (each of those changes how miditok decodes time or notes)."""
    cached = _REMI_SPECS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    c = tokenizer.config
    extra = c.additional_params
    ok = (type(tokenizer).__name__ == "REMI" and c.use_programs
          and c.one_token_stream_for_programs and c.use_velocities
          and not any(getattr(c, k) for k in (
              "use_rests", "use_chords", "use_pitch_intervals", "use_sustain_pedals",
              "use_pitch_bends", "use_control_changes"))
          and extra.get("max_bar_embedding") is None and not extra.get("use_bar_end_tokens")
          and set(range(-1, 128)) <= set(c.use_note_duration_programs)
          and not getattr(tokenizer, "attribute_controls", None))
    spec = _build_remi_spec(tokenizer) if ok else None
    _REMI_SPECS[id(tokenizer)] = (tokenizer, spec)
    return spec


def _build_remi_spec(tokenizer: Any) -> _RemiSpec:
    from miditok.constants import TIME_SIGNATURE
    from miditok.utils import compute_ticks_per_bar
    from symusic import TimeSignature

    tpq = tokenizer.time_division
    kinds = {"Bar": _BAR, "Position": _POS, "Program": _PROG, "Pitch": _PITCH,
             "PitchDrum": _PITCH, "Velocity": _VEL, "Duration": _DUR, "TimeSig": _TS}
    n = len(tokenizer.vocab)
    kind, value = np.zeros(n, np.int64), np.zeros(n, np.int64)
    sigs: list[tuple[int, int]] = [tuple(TIME_SIGNATURE)]
    durs: list[str] = []
    for token, i in tokenizer.vocab.items():
        typ, _, val = token.partition("_")
        k = kinds.get(typ, _OTHER)
        if k == _BAR and val != "None":
            k = _OTHER
        kind[i] = k
        if k == _DUR:
            value[i] = len(durs)
            durs.append(val)
        elif k == _TS:
            sig = tuple(tokenizer._parse_token_time_signature(val))
            if sig not in sigs:
                sigs.append(sig)
            value[i] = sigs.index(sig)
        elif k in (_POS, _PROG, _PITCH, _VEL):
            value[i] = int(val)
    tpbs = [tokenizer._tpb_per_ts[den] for _, den in sigs]
    ts_bar = np.array([compute_ticks_per_bar(TimeSignature(0, num, den), tpq)
                       for num, den in sigs], np.int64)
    ts_pos = np.array([tokenizer._compute_ticks_per_pos(t) for t in tpbs], np.int64)
    dur_ticks = np.array([[int(tokenizer._tpb_tokens_to_ticks[t][d]) for d in durs]
                          for t in tpbs], np.int64).reshape(len(sigs), len(durs))
    lo, hi = tokenizer.config.pitch_range
    return _RemiSpec(kind, value, ts_bar, ts_pos, dur_ticks, 0, (int(lo), int(hi)))


def _back(idx: np.ndarray, values: np.ndarray, query: np.ndarray, start: np.ndarray,
          default: np.ndarray | int) -> np.ndarray:
    """Per index in ``query``: ``values[k]`` for the latest ``idx[k]`` (sorted indices) at or
    before it and no earlier than its ``start`` (where its sequence starts), else ``default``."""
    if idx.size == 0:
        return np.broadcast_to(np.asarray(default, np.int64), query.shape).copy()
    pos = np.searchsorted(idx, query, side="right") - 1
    at = np.maximum(pos, 0)
    return np.where((pos >= 0) & (idx[at] >= start), values[at], default)


def _first(idx: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per sequence (indices ``begin`` to ``end``), the first of the sorted indices ``idx`` in
    it, else its ``end``."""
    if idx.size == 0:
        return end.copy()
    found = idx[np.minimum(np.searchsorted(idx, begin), idx.size - 1)]
    return np.where((found >= begin) & (found < end), found, end)


def remi_note_keys(tokenizer: Any, ids: np.ndarray) -> np.ndarray | None:
    """(program, onset, pitch, duration) rows of the notes miditok's REMI ``decode`` gives for
    base ``ids`` (one stream), on the tokenizer's time division; None for configurations
    :func:`_remi_spec` does not cover or ids outside the vocabulary
    (:func:`remi_note_keys_batch` on one sequence)."""
    keys = remi_note_keys_batch(tokenizer, [ids])
    return None if keys is None else keys[0]


def remi_note_keys_batch(tokenizer: Any, sequences: list[np.ndarray]
                         ) -> list[np.ndarray | None] | None:
    """:func:`remi_note_keys` of each sequence, read together: None for configurations
    :func:`_remi_spec` does not cover, and None in place of a sequence with ids outside the
    vocabulary (:func:`remi_note_columns`, rows split per sequence)."""
    read = remi_note_columns(tokenizer, sequences)
    if read is None:
        return None
    owner, cols, bad = read
    if not sequences:
        return []
    parts = np.split(cols.T, np.cumsum(np.bincount(owner, minlength=len(sequences)))[:-1])
    return [None if b else part for b, part in zip(bad.tolist(), parts, strict=True)]


def remi_note_columns(tokenizer: Any, sequences: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The notes miditok's REMI ``decode`` gives for each sequence of base ids (one stream), read
    together: ``(owner, columns, bad)``, ``owner`` the sequence of each note (nondecreasing),
    ``columns`` a (4, notes) array of program, onset, pitch and duration on the tokenizer's time
    division, and ``bad`` per sequence whether it holds ids outside the vocabulary (its notes
    are then not to be trusted). None for configurations :func:`_remi_spec` does not cover.

    The same reading as ``REMI._tokens_to_score``, with every look-back bounded by its
    sequence's start. The time signature is the first TimeSig token when it comes before any
    note token (else the default), then the latest TimeSig token. The bar counter starts at -1,
    a Position before any Bar sets it to 0 and each Bar adds one, moving the bar's start by a
    bar of the current signature when the counter becomes positive; the current time is set by
    the latest Bar or Position. A Pitch makes a note at the current time and program when its
    next two tokens are a Velocity and a Duration and the pitch is within range; the duration's
    ticks depend on the signature. Drums are program -1, as in :func:`note_keys`.

    Only the tokens that matter are visited: each look-back is a binary search among the
    indices of one kind of token (numpy's cost per element, over every token of a chunk of
    files, was more than the decoding it replaces). Tests compare it with miditok's
    ``decode``.
    """
    spec = _remi_spec(tokenizer)
    if spec is None:
        return None
    n_seq = len(sequences)
    lengths = np.fromiter((len(x) for x in sequences), dtype=np.int64, count=n_seq)
    end = np.cumsum(lengths)
    begin = end - lengths
    bad = np.zeros(n_seq, dtype=bool)
    n = int(end[-1]) if n_seq else 0
    if n == 0:
        return np.zeros(0, np.int64), np.zeros((4, 0), np.int64), bad
    ids = np.concatenate(sequences).astype(np.int64, copy=False)
    invalid = (ids < 0) | (ids >= len(spec.kind))
    if invalid.any():
        bad[np.searchsorted(end, np.flatnonzero(invalid), side="right")] = True
        ids = np.where(invalid, 0, ids)
    kind, value = spec.kind[ids], spec.value[ids]

    def seq_of(idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(end, idx, side="right")

    i_ts = np.flatnonzero(kind == _TS)
    if i_ts.size:
        first_note = _first(np.flatnonzero((kind >= _PITCH) & (kind <= _DUR)), begin, end)
        first_ts = _first(i_ts, begin, end)
        initial = np.where(first_ts < first_note, value[np.minimum(first_ts, n - 1)],
                           spec.default_ts)

    def signature(idx: np.ndarray, seq: np.ndarray) -> np.ndarray:
        if not i_ts.size:
            return np.full(idx.size, spec.default_ts, np.int64)
        return _back(i_ts, value[i_ts], idx, begin[seq], initial[seq])

    i_bar, i_pos = np.flatnonzero(kind == _BAR), np.flatnonzero(kind == _POS)
    bar_seq = seq_of(i_bar)
    step = spec.ts_bar[signature(i_bar, bar_seq)]
    first_bar, first_pos = _first(i_bar, begin, end), _first(i_pos, begin, end)
    step[(i_bar == first_bar[bar_seq]) & (first_bar < first_pos)[bar_seq]] = 0  # sets it to 0
    total = np.cumsum(step)
    seq_first = np.searchsorted(i_bar, begin[bar_seq])  # the first Bar of each Bar's sequence
    bar_tick = total - (total - step)[seq_first]  # the bar's start: steps since its sequence's
    pos_seq = seq_of(i_pos)
    pos_tick = (_back(i_bar, bar_tick, i_pos, begin[pos_seq], 0)
                + value[i_pos] * spec.ts_pos[signature(i_pos, pos_seq)])
    setter = np.zeros(n, np.int64)  # the time each Bar or Position sets
    setter[i_bar] = bar_tick
    setter[i_pos] = pos_tick
    i_set = np.flatnonzero((kind == _BAR) | (kind == _POS))

    lo, hi = spec.pitch_range
    at = np.flatnonzero((kind == _PITCH) & (value >= lo) & (value <= hi))
    at = at[at + 2 < end[seq_of(at)]]
    at = at[(kind[at + 1] == _VEL) & (kind[at + 2] == _DUR)]
    seq = seq_of(at)
    start = begin[seq]
    tick = _back(i_set, setter[i_set], at, start, 0)
    i_prog = np.flatnonzero(kind == _PROG)
    program = _back(i_prog, value[i_prog], at, start, 0)
    dur = spec.dur_ticks[signature(at, seq), value[at + 2]]
    return seq, np.stack([program, tick, value[at], dur]), bad

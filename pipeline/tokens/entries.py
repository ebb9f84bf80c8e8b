"""The entry format: a file's base encoding and how it is packed (:func:`pack`).

A *base encoding* is what the tokenizer gives one MIDI file before any trained vocabulary (BPE,
WordPiece) is applied: base token ids per sequence (a compound tokenizer's steps one after the
other, one id per codebook each: the tokenizer says how many codebooks), where each bar and
beat starts (the trained vocabulary never merges across those), note counts and the round-trip
check against miditok's preprocessed score. It depends only on the file's bytes, the base
tokenizer configuration and the transposition, so the token store (:mod:`pipeline.tokens.store`)
keeps it under exactly that key.

An *entry* is one base encoding packed as one int32 array (:func:`pack`): a header starting with
a magic/format number, a table of the sequences, then their ids, bar starts and beat starts.
:func:`parse_block` reads many entries at once and checks each as :func:`unpack` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMAT = 0x53540001  # magic "ST" + entry format version 1
HEADER = 4  # FORMAT, n_seq, n_notes_input, flag bits
SEQ_FIELDS = 9  # track, program, is_drum, n_notes, n_ids, n_bar, n_beat, rt_matched, rt_decoded
OUT_OF_RANGE = 1  # flag bit: transposition would push a pitch out of the tokenizer's range
TRUNCATED_BARS = 2  # flag bit: the tokenizer clipped the piece at its last bar (Octuple's
# max_bar_embedding)
Key = tuple[str, int]  # (sha256, transpose)


@dataclass(frozen=True)
class SeqEncoding:
    """One token sequence of a piece (the whole piece, or one track in per-track mode)."""

    track: int  # index in the preprocessed score; -1 when all tracks share one stream
    program: int  # MIDI program of the track; -1 for one-stream sequences
    is_drum: bool
    n_notes: int  # notes this sequence encodes (after miditok's preprocessing)
    ids: np.ndarray  # int32 base ids (compound: steps × codebooks, flattened step by step)
    bar_starts: np.ndarray  # int32 index where each bar's tokens start
    beat_starts: np.ndarray  # int32 index where each beat's tokens start
    rt_matched: int  # notes matched by the decoded sequence (-1: not checked)
    rt_decoded: int  # notes in the decoded sequence (-1: not checked)

    @property
    def roundtrip_f1(self) -> float:
        return f1_from_counts(self.rt_matched, self.n_notes, self.rt_decoded)


@dataclass(frozen=True)
class Encoding:
    """A file's base encoding at one transposition."""

    n_notes_input: int  # notes in the file as parsed, all tracks
    seqs: tuple[SeqEncoding, ...]
    out_of_range: bool = False  # transposition refused: no sequences
    truncated_bars: bool = False  # the tokenizer clipped the piece (bars beyond its limit)


def f1_from_counts(matched: int, n_ref: int, n_dec: int) -> float:
    """Multiset F1 from counts; NaN when not checked, 1.0 for two empty multisets."""
    if matched < 0:
        return float("nan")
    if n_ref + n_dec == 0:
        return 1.0
    return 2.0 * matched / (n_ref + n_dec)


def pack(enc: Encoding) -> np.ndarray:
    """Encoding -> one int32 array: header, per-sequence table, then ids, bar and beat starts."""
    table = [[s.track, s.program, int(s.is_drum), s.n_notes, len(s.ids), len(s.bar_starts),
              len(s.beat_starts), s.rt_matched, s.rt_decoded] for s in enc.seqs]
    bits = (OUT_OF_RANGE if enc.out_of_range else 0) | (TRUNCATED_BARS if enc.truncated_bars
                                                        else 0)
    parts = [np.array([FORMAT, len(enc.seqs), enc.n_notes_input, bits], dtype=np.int32),
             np.array(table, dtype=np.int32).reshape(-1)]
    parts += [s.ids for s in enc.seqs] + [s.bar_starts for s in enc.seqs]
    parts += [s.beat_starts for s in enc.seqs]
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def unpack(arr: np.ndarray) -> Encoding:
    """Inverse of :func:`pack`; raises ValueError (:class:`BadEntry`) on a malformed array."""
    return parse_block([("", 0)], [arr]).encoding(0)


def entry_ok(arr: np.ndarray) -> bool:
    """Whether :func:`unpack` accepts ``arr``."""
    return bool(entries_ok([arr])[0])


@dataclass(frozen=True)
class EntryBlock:
    """Packed entries parsed together (:func:`parse_block`), end to end in ``flat``. Per entry
    (in ``keys`` order): its sequences ``first_seq[e]`` to ``first_seq[e + 1]``, the notes of its
    file, whether its transposition was refused and whether the tokenizer clipped it. Per
    sequence: its row of the entry's table (``table``, ``SEQ_FIELDS`` columns as :func:`pack`
    writes them) and where its ids, bar starts and beat starts begin in ``flat``."""

    keys: list[Key]
    flat: np.ndarray
    first_seq: np.ndarray
    n_input: np.ndarray
    out_of_range: np.ndarray
    truncated_bars: np.ndarray
    table: np.ndarray
    ids_at: np.ndarray
    bars_at: np.ndarray
    beats_at: np.ndarray

    def ids(self, j: int) -> np.ndarray:
        """Base ids of sequence ``j`` (a view of ``flat``)."""
        return self.flat[self.ids_at[j] : self.ids_at[j] + self.table[j, 4]]

    def sequence(self, j: int) -> SeqEncoding:
        t = self.table[j].tolist()
        return SeqEncoding(track=t[0], program=t[1], is_drum=bool(t[2]), n_notes=t[3],
                           ids=self.ids(j),
                           bar_starts=self.flat[self.bars_at[j] : self.bars_at[j] + t[5]],
                           beat_starts=self.flat[self.beats_at[j] : self.beats_at[j] + t[6]],
                           rt_matched=t[7], rt_decoded=t[8])

    def encoding(self, e: int) -> Encoding:
        """Entry ``e`` as :func:`unpack` gives it."""
        return Encoding(n_notes_input=int(self.n_input[e]),
                        seqs=tuple(self.sequence(j)
                                   for j in range(self.first_seq[e], self.first_seq[e + 1])),
                        out_of_range=bool(self.out_of_range[e]),
                        truncated_bars=bool(self.truncated_bars[e]))


class BadEntry(ValueError):
    """Entry ``index`` of a block is not a packed entry :func:`unpack` accepts."""

    def __init__(self, index: int) -> None:
        super().__init__(f"entry {index} is not a token cache entry of this format")
        self.index = index


def entries_ok(arrays: list[np.ndarray]) -> np.ndarray:
    """Whether :func:`unpack` accepts each array: all checked at once (:func:`parse_block`), one
    at a time only when some fail."""
    def ok(group: list[np.ndarray]) -> bool:
        try:
            parse_block([], group)
        except BadEntry:
            return False
        return True

    if ok(arrays):
        return np.ones(len(arrays), dtype=bool)
    return np.fromiter((ok([a]) for a in arrays), bool, count=len(arrays))


def parse_block(keys: list[Key], arrays: list[np.ndarray]) -> EntryBlock:
    """The packed entries ``arrays`` (of ``keys``) as one :class:`EntryBlock`, checked as
    :func:`unpack` checks each (:class:`BadEntry` names the first it refuses). Array operations
    over all entries at once: unpacking entry by entry cost 10 us each, more than the rest of
    assembling a short piece's row."""
    n = len(arrays)
    try:
        flat = np.concatenate(arrays) if n else np.zeros(0, np.int32)
    except ValueError:  # arrays of different dimensions
        flat = None
    if flat is None or flat.dtype != np.int32 or flat.ndim != 1:
        raise BadEntry(next(e for e, a in enumerate(arrays)
                            if a.dtype != np.int32 or a.ndim != 1))
    lengths = np.fromiter(map(len, arrays), np.int64, count=n)
    ends = np.cumsum(lengths)
    off = ends - lengths

    def refuse(bad: np.ndarray) -> None:
        if bad.any():
            raise BadEntry(int(np.argmax(bad)))

    refuse(lengths < HEADER)
    head = flat[off[:, None] + np.arange(HEADER)].astype(np.int64).reshape(n, HEADER)
    n_seq = head[:, 1]
    refuse((head[:, 0] != FORMAT) | (n_seq < 0))
    data = off + HEADER + n_seq * SEQ_FIELDS  # where each entry's ids begin
    refuse(data > ends)
    first_seq = np.concatenate([[0], np.cumsum(n_seq)])
    entry = np.repeat(np.arange(n), n_seq)
    within = np.arange(int(first_seq[-1])) - first_seq[entry]
    table = flat[(off[entry] + HEADER + within * SEQ_FIELDS)[:, None]
                 + np.arange(SEQ_FIELDS)].astype(np.int64).reshape(-1, SEQ_FIELDS)
    refuse(np.bincount(entry[(table[:, 4:7] < 0).any(axis=1)], minlength=n) > 0)
    at = []
    begin = data
    for col in (4, 5, 6):  # ids, bar starts, beat starts: each kind for all sequences in turn
        counts = table[:, col]
        before = np.cumsum(counts) - counts
        at.append(begin[entry] + before - before[first_seq[entry]])
        begin = begin + np.bincount(entry, weights=counts, minlength=n).astype(np.int64)
    refuse(begin != ends)
    return EntryBlock(keys=list(keys), flat=flat, first_seq=first_seq, n_input=head[:, 2],
                      out_of_range=(head[:, 3] & OUT_OF_RANGE) != 0,
                      truncated_bars=(head[:, 3] & TRUNCATED_BARS) != 0, table=table, ids_at=at[0],
                      bars_at=at[1], beats_at=at[2])


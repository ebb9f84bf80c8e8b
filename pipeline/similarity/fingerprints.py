"""Content fingerprints of note tables, vectorised over many pieces at once.

Everything here is a pure function of the notes (onset/duration in beats, pitch, is_drum), never
of the tokenizer, so dedupe and the leakage audit do not change when tokenisation does.

Pieces are held as one flat set of note arrays plus ``offsets`` (piece ``i`` owns notes
``offsets[i]:offsets[i+1]``), so a fingerprint of 100k pieces is a few numpy passes instead of 100k
Python calls. Fingerprints:

- :func:`transposed_keys` — a hash of the music up to transposition, time scale and a leading
  rest (exact-copy tier ``transposed``);
- :func:`pipeline.similarity.melody.melody_keys` — a hash of the top voice (skyline of non-drum
notes,
  and the top track) as a transposition-invariant interval sequence (tier ``melody``);
- :func:`shingles` — per-piece sorted sets of k-gram hashes (``SHINGLE_BITS`` bits, as uint64)
  over (pitch interval, inter-onset-ratio class) tokens: invariant to transposition and
  tempo/time scale (tier ``near``);
- :func:`minhash_signatures` — datasketch-compatible MinHash signatures of those sets.

The shingle and signature code is hand-written numpy because datasketch hashes one Python object
at a time (``MinHash.update_batch`` calls the hash function once per element, millions of calls at
corpus scale); the signatures are bit-identical to ``MinHash(scheme="affine32",
hashfunc=identity)`` over the same 32-bit values (a test checks this), so they can be wrapped in
datasketch's ``LeanMinHash`` and banded exactly as its ``MinHashLSH`` would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.artifacts import read_table

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
TIME_QUANTUM = 1_000_000
"""Normalised times are rounded to 1e-6 of the time unit before hashing (float noise)."""
SHINGLE_BITS = 40
"""Bits kept of each shingle hash (the rest of a uint64 holds the piece index while sorting)."""
MAX_IOI_STEPS = 4
"""Inter-onset ratios are clipped to 2**±4 before quantisation."""


@dataclass(frozen=True)
class NoteArrays:
    """Notes of many pieces, flat: piece ``i`` is ``sha256[i]``, notes ``offsets[i]:offsets[i+1]``.

    Within a piece notes are sorted by onset (the ingest contract); fingerprints rely on that.
    """

    sha256: np.ndarray  # (P,) str
    offsets: np.ndarray  # (P+1,) int64
    onset: np.ndarray  # (N,) float64, beats
    duration: np.ndarray  # (N,) float64, beats
    pitch: np.ndarray  # (N,) int16
    is_drum: np.ndarray  # (N,) bool
    track: np.ndarray  # (N,) int16

    @property
    def n_pieces(self) -> int:
        return int(self.sha256.size)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def select(self, mask: np.ndarray) -> NoteArrays:
        """The same pieces keeping only the notes where ``mask`` is true (order kept)."""
        counts = np.bincount(self.segment()[mask], minlength=self.n_pieces)
        offsets = np.zeros(self.n_pieces + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return NoteArrays(self.sha256, offsets, self.onset[mask], self.duration[mask],
                          self.pitch[mask], self.is_drum[mask], self.track[mask])

    def segment(self) -> np.ndarray:
        """Piece index of every note, shape (N,)."""
        return np.repeat(np.arange(self.n_pieces, dtype=np.int64), self.lengths)

    def slice(self, start: int, stop: int) -> NoteArrays:
        """Pieces ``start:stop`` (a view; offsets rebased to 0)."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return NoteArrays(self.sha256[start:stop], self.offsets[start : stop + 1] - lo,
                          self.onset[lo:hi], self.duration[lo:hi], self.pitch[lo:hi],
                          self.is_drum[lo:hi], self.track[lo:hi])

    def chunks(self, max_notes: int = 500_000, max_pieces: int = 4096) -> list[NoteArrays]:
        """Consecutive slices bounded in notes and pieces (bounded memory per worker task)."""
        out, start = [], 0
        while start < self.n_pieces:
            limit = self.offsets[start] + max_notes
            stop = int(np.searchsorted(self.offsets, limit, side="right")) - 1
            stop = min(max(stop, start + 1), start + max_pieces, self.n_pieces)
            out.append(self.slice(start, stop))
            start = stop
        return out


def notes_from_table(table: pa.Table, keep: pa.Array | Sequence[str] | None = None
                     ) -> NoteArrays:
    """A notes table (``sha256`` + list columns) -> :class:`NoteArrays`, pieces sorted by sha256;
    with ``keep``, only the rows whose sha256 is in it. A null list is read as an empty piece.

    Rows are picked and ordered on the flat numpy columns, a run of consecutive rows at a time,
    and a table already sorted and kept whole (``data/notes.parquet`` is written sorted) is not
    copied at all: Arrow's ``filter`` and ``take`` on list columns cost 2.5 s and 4.5 s for the
    45 M notes of 100,000 pieces."""
    shas = np.asarray(table["sha256"].to_pylist(), dtype=object)
    rows = np.arange(shas.size)
    if keep is not None:
        keep = keep if isinstance(keep, pa.Array) else pa.array(list(keep), pa.string())
        rows = rows[np.asarray(pc.is_in(table["sha256"], keep).to_numpy(zero_copy_only=False),
                               bool)]
    if rows.size > 1 and not (shas[rows][1:] >= shas[rows][:-1]).all():
        rows = rows[np.argsort(shas[rows], kind="stable")]
    lengths = np.asarray(pc.fill_null(pc.list_value_length(table["pitch"]), 0)
                         .to_numpy(zero_copy_only=False), np.int64)
    starts = np.cumsum(lengths) - lengths
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths[rows], out=offsets[1:])
    # the notes of consecutive rows are contiguous: copy them run by run (none when the rows are
    # the table's, in order)
    runs: list[tuple[int, int]] = []
    if rows.size:
        cut = np.flatnonzero(np.diff(rows) != 1) + 1
        first, last = rows[np.r_[0, cut]], rows[np.r_[cut - 1, rows.size - 1]]
        runs = list(zip(starts[first].tolist(), (starts[last] + lengths[last]).tolist(),
                        strict=True))
    whole = rows.size == shas.size and len(runs) <= 1

    def flat(name: str, dtype) -> np.ndarray:
        values = np.asarray(pc.list_flatten(table[name].combine_chunks())
                            .to_numpy(zero_copy_only=False), dtype)
        return values if whole else np.concatenate([values[a:b] for a, b in runs] or
                                                   [values[:0]])

    return NoteArrays(
        sha256=shas[rows],
        offsets=offsets,
        onset=flat("onset", np.float64),
        duration=flat("duration", np.float64),
        pitch=flat("pitch", np.int16),
        is_drum=flat("is_drum", bool),
        track=flat("track", np.int16),
    )


def read_notes(path: Path | str) -> NoteArrays:
    """Read ``data/notes.parquet`` (only the columns fingerprints need)."""
    cols = ["sha256", "onset", "duration", "pitch", "is_drum", "track"]
    return notes_from_table(read_table(path, columns=cols))


# ---------------------------------------------------------------------------------------------
# integer hashing helpers


_MIX_STEPS = ((np.uint64(30), np.uint64(0xBF58476D1CE4E5B9)),
              (np.uint64(27), np.uint64(0x94D049BB133111EB)), (np.uint64(31), None))
""":func:`mix64`'s steps: shift, xor, multiply (the last without)."""


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a bijective avalanche on uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _digest(parts: list[np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


def piece_digests(rows: np.ndarray, offsets: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """blake2b of each piece's rows (``rows[offsets[i]:offsets[i+1]]``); "" where not valid."""
    rows = np.ascontiguousarray(rows)
    out = np.full(offsets.size - 1, "", dtype=object)
    for i in np.flatnonzero(valid):
        out[i] = _digest([rows[offsets[i] : offsets[i + 1]]])
    return out


def segment_reduce(ufunc: np.ufunc, values: np.ndarray, offsets: np.ndarray, empty) -> np.ndarray:
    """``ufunc.reduce`` of each piece's slice of ``values`` (``empty`` for empty pieces)."""
    out = np.full(offsets.size - 1, empty, dtype=values.dtype)
    nonempty = np.diff(offsets) > 0
    if values.size:
        out[nonempty] = ufunc.reduceat(values, offsets[:-1][nonempty])
    return out


def _melodic_mask(notes: NoteArrays, seg: np.ndarray) -> np.ndarray:
    """Non-drum notes; a drums-only piece keeps its drums (then pitch is not transposed)."""
    non_drum = np.bincount(seg, weights=~notes.is_drum, minlength=notes.n_pieces)
    return ~notes.is_drum | (non_drum[seg] == 0)


# ---------------------------------------------------------------------------------------------
# tier "transposed": same music up to transposition, time scale and leading rest


def transposed_keys(notes: NoteArrays) -> np.ndarray:
    """Per piece a hex key equal for the same music transposed and/or uniformly time-scaled.

    Non-drum pitches are taken relative to the piece's lowest non-drum pitch (drum pitches name
    instruments and are never transposed); onsets relative to the first onset; times divided by
    the smallest positive inter-onset interval. Empty pieces get "".
    """
    seg = notes.segment()
    p = notes.n_pieces
    n = notes.lengths
    if seg.size == 0:
        return np.full(p, "", dtype=object)
    pitch = notes.pitch.astype(np.int64)
    big = np.int64(1 << 20)
    lowest = segment_reduce(np.minimum, np.where(notes.is_drum, big, pitch), notes.offsets, big)
    rel = np.where(notes.is_drum, pitch, pitch - np.where(lowest[seg] == big, 0, lowest[seg]))
    first = notes.onset[notes.offsets[:-1].clip(max=seg.size - 1)]
    t0 = notes.onset - first[seg]
    d_on = np.diff(notes.onset, prepend=np.nan)
    d_on[notes.offsets[:-1][n > 0]] = np.nan  # no interval across pieces
    pos = np.isfinite(d_on) & (d_on > 0)
    unit = segment_reduce(np.minimum, np.where(pos, d_on, np.inf), notes.offsets, np.inf)
    # a single-chord piece has no interval: scale it by its longest note instead
    longest = segment_reduce(np.maximum, notes.duration, notes.offsets, 0.0)
    unit = np.where(np.isfinite(unit), unit, np.where(longest > 0, longest, 1.0))
    scale = unit[seg]
    on_q = np.rint(t0 / scale * TIME_QUANTUM).astype(np.int64)
    du_q = np.rint(notes.duration / scale * TIME_QUANTUM).astype(np.int64)
    drum = notes.is_drum.astype(np.int64)
    rows = np.stack([drum, on_q, rel, du_q], axis=1)
    if drum.any():  # transposition reorders pitched notes against drums: sort again
        rows = rows[np.lexsort((du_q, rel, on_q, drum, seg))]
    return piece_digests(rows.astype("<i8"), notes.offsets, n > 0)


# ---------------------------------------------------------------------------------------------
# events (shared by the melody fingerprints in pipeline.similarity.melody and the shingles)


@dataclass(frozen=True)
class Events:
    """Distinct onsets of the melodic notes of each piece (flat, piece-major, time-sorted)."""

    piece: np.ndarray  # (E,) piece index
    time: np.ndarray  # (E,) onset in beats
    top: np.ndarray  # (E,) highest pitch starting at the event
    offsets: np.ndarray  # (P+1,) event offsets per piece


def note_events(seg: np.ndarray, onset: np.ndarray, pitch: np.ndarray, n_pieces: int
            ) -> tuple[Events, np.ndarray]:
    """Events of the (piece, onset)-sorted notes given, and each note's event index."""
    new = np.ones(seg.size, dtype=bool)
    new[1:] = (seg[1:] != seg[:-1]) | (onset[1:] != onset[:-1])
    starts = np.flatnonzero(new)
    event_of_note = np.cumsum(new) - 1
    top = np.maximum.reduceat(pitch, starts) if starts.size else pitch[:0]
    piece = seg[starts]
    offsets = np.zeros(n_pieces + 1, dtype=np.int64)
    np.cumsum(np.bincount(piece, minlength=n_pieces), out=offsets[1:])
    return Events(piece, onset[starts], top, offsets), event_of_note


def ioi_classes(time: np.ndarray, first: np.ndarray, resolution: int) -> np.ndarray:
    """Class of log2(IOI / previous IOI) in 1/``resolution`` octave steps, clipped to ±4 octaves.

    ``first`` marks events that start a piece. Returns 0 where there is no previous interval,
    else 1 + step + 4·resolution (so all classes are ≥ 1).
    """
    # an interval belongs to the event that ends it: ioi_in[j] = time[j] - time[j-1]
    ioi_in = np.concatenate([[np.nan], np.diff(time)])
    ioi_in[first] = np.nan
    prev = np.concatenate([[np.nan], ioi_in[:-1]])
    prev[first] = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log2(ioi_in / prev)
    limit = MAX_IOI_STEPS * resolution
    steps = np.clip(np.rint(ratio * resolution), -limit, limit)
    return np.where(np.isfinite(steps), steps + limit + 1, 0).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# tier "near": shingles and MinHash


def note_tokens(notes: NoteArrays, ioi_resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """One integer token per melodic note: (pitch interval from the previous note, onset class).

    Notes are taken in (onset, pitch) order, so a chord reads bottom-up. The onset class is 0 for a
    note sounding with the previous one and otherwise the inter-onset-ratio class of its event.
    A piece's first note gets no token. Returns ``(tokens, piece)`` for the tokens made.
    Drums-only pieces use absolute drum pitches (offset past the interval range).
    """
    tokens, piece, _ = note_tokens_with_onsets(notes, ioi_resolution)
    return tokens, piece


def note_tokens_with_onsets(notes: NoteArrays, ioi_resolution: int
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`note_tokens` and the onset (beats) of the note each token stands for."""
    seg = notes.segment()
    mask = _melodic_mask(notes, seg)
    seg, onset = seg[mask], notes.onset[mask]
    pitch = notes.pitch[mask].astype(np.int64)
    drum = notes.is_drum[mask]
    if not _is_sorted(seg, onset, pitch):  # the ingest contract sorts by (onset, pitch, ...)
        order = np.lexsort((pitch, onset, seg))
        seg, onset, pitch, drum = seg[order], onset[order], pitch[order], drum[order]
    ev, event_of_note = note_events(seg, onset, pitch, notes.n_pieces)
    ev_first = np.zeros(ev.time.size, dtype=bool)
    ev_first[ev.offsets[:-1][np.diff(ev.offsets) > 0]] = True
    ev_class = ioi_classes(ev.time, ev_first, ioi_resolution)
    starts_event = np.ones(seg.size, dtype=bool)
    starts_event[1:] = event_of_note[1:] != event_of_note[:-1]
    onset_class = np.where(starts_event, ev_class[event_of_note], 0)
    interval = np.clip(np.diff(pitch, prepend=0), -127, 127) + 128  # 1..255
    pitch_code = np.where(drum, pitch + 256, interval)  # drums: 256..383
    tokens = pitch_code * 64 + onset_class
    first = np.ones(seg.size, dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    return tokens[~first], seg[~first], onset[~first]


def _is_sorted(seg: np.ndarray, onset: np.ndarray, pitch: np.ndarray) -> bool:
    if seg.size < 2:
        return True
    same_piece = seg[1:] == seg[:-1]
    d_on = np.diff(onset)
    ok = ~same_piece | (d_on > 0) | ((d_on == 0) & (pitch[1:] >= pitch[:-1]))
    return bool(ok.all() and (np.diff(seg) >= 0).all())


def gram_hashes(tokens: np.ndarray, k: int) -> np.ndarray:
    """64-bit hash of every run of ``k`` consecutive tokens (``tokens.size - k + 1`` of them,
    none when fewer than ``k``), chained through :func:`mix64`."""
    n = tokens.size - k + 1
    h = np.zeros(max(n, 0), dtype=np.uint64)
    if n <= 0:
        return h
    t = tokens.astype(np.uint64)
    spare = np.empty_like(h)
    for i in range(k):  # h = mix64((h ^ token i) + _GOLDEN), in place: one pass's temporaries
        h ^= t[i : i + n]
        h += _GOLDEN
        for shift, factor in _MIX_STEPS:
            np.right_shift(h, shift, out=spare)
            h ^= spare
            if factor:
                h *= factor
    return h


def shingles(notes: NoteArrays, k: int, ioi_resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """Per piece the sorted set of k-gram hashes of :func:`note_tokens` (uint64).

    Returns ``(offsets, values)``: piece ``i``'s set is ``values[offsets[i]:offsets[i+1]]``.
    """
    tokens, piece = note_tokens(notes, ioi_resolution)
    return gram_sets(tokens, piece, notes.n_pieces, k)


def gram_sets(tokens: np.ndarray, piece: np.ndarray, n_pieces: int, k: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per piece the sorted set of the ``SHINGLE_BITS``-bit hashes of its runs of ``k``
    consecutive tokens (``tokens`` flat, piece after piece; ``piece`` each token's piece).

    Returns ``(offsets, values)``: piece ``i``'s set is ``values[offsets[i]:offsets[i+1]]``.
    """
    n_grams = tokens.size - k + 1
    p = n_pieces
    if p >= 1 << (64 - SHINGLE_BITS):
        raise ValueError(f"at most {1 << (64 - SHINGLE_BITS)} pieces per call, got {p}")
    if n_grams <= 0:
        return np.zeros(p + 1, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    valid = piece[: n_grams] == piece[k - 1 :]  # the k-gram stays inside one piece
    h = gram_hashes(tokens, k)
    h, piece = h[valid], piece[: n_grams][valid]
    # set per piece: one sort of (piece, hash) packed into a uint64, the piece index in the top
    # bits; a shingle keeps SHINGLE_BITS of its hash (collisions within a piece stay negligible)
    low = np.uint64(SHINGLE_BITS)
    packed = np.sort((piece.astype(np.uint64) << low) | (h >> np.uint64(64 - SHINGLE_BITS)))
    keep = np.ones(packed.size, dtype=bool)
    keep[1:] = packed[1:] != packed[:-1]
    packed = packed[keep]
    piece = (packed >> low).astype(np.int64)
    h = packed & np.uint64((1 << SHINGLE_BITS) - 1)
    offsets = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(np.bincount(piece, minlength=p), out=offsets[1:])
    return offsets, h


def minhash_permutations(num_perm: int, seed: int) -> np.ndarray:
    """datasketch's affine32 permutation parameters ``(2, num_perm)`` for ``seed``."""
    from datasketch import MinHash

    return np.asarray(MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations,
                      dtype=np.uint32)


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, as datasketch's affine32 scheme applies to inputs."""
    h = np.asarray(h, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def to_hash32(values: np.ndarray) -> np.ndarray:
    """The 32-bit input hash fed to MinHash for each 64-bit shingle hash."""
    values = np.asarray(values, dtype=np.uint64)
    return ((values >> np.uint64(32)) ^ (values & np.uint64(0xFFFFFFFF))).astype(np.uint32)


def minhash_signatures(offsets: np.ndarray, values: np.ndarray, permutations: np.ndarray
                       ) -> np.ndarray:
    """MinHash signatures ``(P, num_perm)`` uint32 of the per-piece shingle sets.

    Equal to ``datasketch.MinHash(scheme="affine32", hashfunc=identity).update_batch(to_hash32(s))``
    for each set; an empty set keeps datasketch's initial value (all ones).
    """
    a, b = permutations
    p = offsets.size - 1
    sig = np.full((a.size, p), np.iinfo(np.uint32).max, dtype=np.uint32)
    nonempty = np.diff(offsets) > 0
    if not nonempty.any():
        return sig.T.copy()
    hv = fmix32(to_hash32(values))
    starts = offsets[:-1][nonempty]
    tmp = np.empty_like(hv)
    # one permutation at a time over a reused buffer: contiguous and cache-friendly
    for j in range(a.size):
        np.multiply(hv, a[j], out=tmp)
        tmp += b[j]
        sig[j, nonempty] = np.minimum.reduceat(tmp, starts)
    return np.ascontiguousarray(sig.T)


def jaccard_containment(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Exact Jaccard and containment (|x∩y| / min(|x|,|y|)) of two sorted unique arrays."""
    if x.size == 0 or y.size == 0:
        return 0.0, 0.0
    inter = np.intersect1d(x, y, assume_unique=True).size
    return inter / (x.size + y.size - inter), inter / min(x.size, y.size)

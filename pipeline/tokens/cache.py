"""Per-file base encodings and their content-addressed store (``data/token_cache/``).

A *base encoding* is what the tokenizer gives one MIDI file before any trained vocabulary (BPE,
WordPiece) is applied: base token ids per sequence, where each bar and beat starts (the trained
vocabulary never merges across those), note counts and the round-trip check against miditok's
preprocessed score. It depends only on the file's bytes, the base tokenizer configuration and the
transposition, so it is cached under exactly that key and reused when files are added, the
vocabulary is retrained or a run is interrupted. A trained vocabulary is applied to cached base
ids when the output is assembled (:func:`apply_model`), exactly as ``tokenizer.encode`` would.

Layout: ``<root>/<config_key>/<sha[:2]>/<sha>.<transpose:+d>.i32``: one little-endian int32
array per entry (see :func:`pack`; it starts with a magic/format number and its length is
checked on load), written atomically. Raw int32 loads in about 0.03 ms; ``.npy`` took 0.3 ms
(header parsing) and an ``.npz`` with one member per field 1.2 ms, which dominated incremental
runs. Nothing here can hold a pickle.

Invariants:
- an entry is a pure function of (file bytes, base config, transposition, library versions);
  the config key therefore hashes the miditok/symusic versions too, so an upgrade never reuses
  stale ids (the key is a folder name, never part of an artifact's content);
- an entry exists only if encoding succeeded; failures are never cached and are retried.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from math import lcm
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import sha256_bytes, sha256_json, write_bytes

FORMAT = 0x53540001  # magic "ST" + format version 1
HEADER = 4  # FORMAT, n_seq, n_notes_input, flag bits
SUFFIX = ".i32"
SEQ_FIELDS = 9  # track, program, is_drum, n_notes, n_ids, n_bar, n_beat, rt_matched, rt_decoded
OUT_OF_RANGE = 1  # flag bit: transposition would push a pitch out of the tokenizer's range


@dataclass(frozen=True)
class SeqEncoding:
    """One token sequence of a piece (the whole piece, or one track in per-track mode)."""

    track: int  # index in the preprocessed score; -1 when all tracks share one stream
    program: int  # MIDI program of the track; -1 for one-stream sequences
    is_drum: bool
    n_notes: int  # notes this sequence encodes (after miditok's preprocessing)
    ids: np.ndarray  # int32 base ids
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
    parts = [np.array([FORMAT, len(enc.seqs), enc.n_notes_input,
                       OUT_OF_RANGE if enc.out_of_range else 0], dtype=np.int32),
             np.array(table, dtype=np.int32).reshape(-1)]
    parts += [s.ids for s in enc.seqs] + [s.bar_starts for s in enc.seqs]
    parts += [s.beat_starts for s in enc.seqs]
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def unpack(arr: np.ndarray) -> Encoding:
    """Inverse of :func:`pack`; raises ValueError on a malformed array."""
    if arr.dtype != np.int32 or arr.ndim != 1 or len(arr) < HEADER or arr[0] != FORMAT:
        raise ValueError("not a token cache entry of this format")
    n_seq = int(arr[1])
    table = arr[HEADER : HEADER + n_seq * SEQ_FIELDS].reshape(n_seq, SEQ_FIELDS)
    pos = HEADER + n_seq * SEQ_FIELDS
    blocks: list[list[np.ndarray]] = []
    for col in (4, 5, 6):  # ids, bar starts, beat starts
        out = []
        for n in table[:, col]:
            out.append(arr[pos : pos + n])
            pos += int(n)
        blocks.append(out)
    if pos != len(arr):
        raise ValueError("token cache entry has the wrong length")
    seqs = tuple(
        SeqEncoding(track=int(r[0]), program=int(r[1]), is_drum=bool(r[2]), n_notes=int(r[3]),
                    ids=blocks[0][i], bar_starts=blocks[1][i], beat_starts=blocks[2][i],
                    rt_matched=int(r[7]), rt_decoded=int(r[8]))
        for i, r in enumerate(table))
    return Encoding(n_notes_input=int(arr[2]), seqs=seqs, out_of_range=bool(arr[3] & OUT_OF_RANGE))


def config_key(tokenizer_name: str, config: dict[str, Any]) -> str:
    """Cache key of a base tokenizer: class, serialised TokenizerConfig, library versions.

    ``encode_ids_split`` is left out: it only changes how a trained vocabulary chunks the ids,
    and every entry stores both bar and beat boundaries.
    """
    from importlib import metadata

    cfg = {k: v for k, v in config.items() if k != "encode_ids_split"}
    versions = {p: metadata.version(p) for p in ("miditok", "symusic")}
    return sha256_json({"format": FORMAT, "tokenizer": tokenizer_name, "config": cfg,
                        "versions": versions})[:20]


class TokenCache:
    """Content-addressed store of :class:`Encoding` under one base-config key."""

    def __init__(self, root: Path | str, key: str) -> None:
        self.root = Path(root)
        self.key = key
        self.dir = self.root / key
        self._dir = str(self.dir)

    def path(self, sha: str, transpose: int) -> str:
        return os.path.join(self._dir, sha[:2], f"{sha}.{transpose:+d}{SUFFIX}")

    def keys(self) -> set[tuple[str, int]]:
        """(sha256, transpose) of every entry present (one scan, no file reads)."""
        found = set()
        if not self.dir.is_dir():
            return found
        for shard in os.scandir(self.dir):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                sha, _, rest = entry.name.partition(".")
                if rest.endswith(SUFFIX) and not entry.name.startswith("."):
                    try:
                        found.add((sha, int(rest[: -len(SUFFIX)])))
                    except ValueError:
                        continue
        return found

    def get(self, sha: str, transpose: int) -> Encoding | None:
        """The entry, or None when missing or unreadable (it is then recomputed)."""
        try:
            with open(self.path(sha, transpose), "rb") as f:
                return unpack(np.frombuffer(f.read(), dtype="<i4"))
        except (OSError, ValueError):
            return None

    def put(self, sha: str, transpose: int, enc: Encoding) -> None:
        write_bytes(self.path(sha, transpose), pack(enc).astype("<i4").tobytes())

    def prune(self, keep: set[tuple[str, int]]) -> int:
        """Delete every entry not in ``keep`` (other config keys included); return how many."""
        removed = 0
        if not self.root.is_dir():
            return 0
        for path in sorted(self.root.glob("*/*/*")):
            if path.parent.parent == self.dir:
                sha, _, rest = path.name.partition(".")
                try:
                    if (sha, int(rest.removesuffix(SUFFIX))) in keep:
                        continue
                except ValueError:
                    pass
            path.unlink()
            removed += 1
        for folder in sorted(self.root.glob("*/*"), reverse=True) + sorted(self.root.glob("*")):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return removed


# ---- trained vocabularies on cached base ids --------------------------------------------


def words(tokenizer: Any, byte_table: list[str], seq: SeqEncoding) -> list[str]:
    """A sequence as the per-bar/beat byte strings miditok feeds its trained model."""
    split = tokenizer.config.encode_ids_split
    starts = (seq.bar_starts if split == "bar" else seq.beat_starts if split == "beat"
              else np.zeros(1, np.int32)).tolist()
    text = "".join([byte_table[i] for i in seq.ids.tolist()])  # one character per base id
    bounds = [*starts, len(text)] if starts else [0, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def base_byte_table(tokenizer: Any) -> list[str]:
    """Base id -> the single character miditok's trained models see (private miditok map;
    tests check the result against ``tokenizer.encode``)."""
    return [tokenizer._vocab_base_id_to_byte[i] for i in range(len(tokenizer.vocab))]


def apply_model(tokenizer: Any, encodings: dict[tuple[str, int], Encoding],
                batch: int = 2048) -> dict[tuple[str, int], list[np.ndarray]]:
    """Final ids per sequence: base ids, or the trained model applied as ``encode`` does."""
    if not tokenizer.is_trained:
        return {k: [s.ids for s in e.seqs] for k, e in encodings.items()}
    table = base_byte_table(tokenizer)
    keys = sorted(encodings)
    flat = [(k, s) for k in keys for s in encodings[k].seqs]
    out: dict[tuple[str, int], list[np.ndarray]] = {k: [] for k in keys}
    for i in range(0, len(flat), batch):
        part = flat[i : i + batch]
        done = tokenizer._model.encode_batch([words(tokenizer, table, s) for _, s in part],
                                             is_pretokenized=True)
        for (k, _), enc in zip(part, done, strict=True):
            out[k].append(np.asarray(enc.ids, dtype=np.int32))
    return out


def expansion_table(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(flat base ids, offsets) of every final id, via miditok's public ``decode_token_ids``."""
    from miditok import TokSequence

    pieces = []
    for v in range(len(tokenizer)):
        seq = TokSequence(ids=[v], are_ids_encoded=v >= len(tokenizer.vocab))
        tokenizer.decode_token_ids(seq)
        pieces.append(np.asarray(seq.ids, dtype=np.int32))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return np.concatenate(pieces), offsets


def expand(ids: np.ndarray, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Final ids -> base ids, vectorised (``decode_token_ids`` is a Python loop per id)."""
    flat, offsets = table
    starts, lens = offsets[ids], offsets[ids + 1] - offsets[ids]
    pos = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return flat[pos + np.arange(int(lens.sum()))]


# ---- encoding one file (runs in worker processes) ------------------------------------------


def note_keys(score: Any, grid: int, program: int | None = None) -> np.ndarray:
    """(program, onset, pitch, duration) rows of every note, times on a ``grid`` ticks/quarter.

    ``grid`` must be a multiple of the score's time division, so two scores with different
    divisions (miditok decodes at its own) compare exactly. Drums use program -1; ``program``
    overrides every track's program.
    """
    factor = grid // int(score.ticks_per_quarter)
    rows = []
    for track in score.tracks:
        notes = track.notes.numpy()
        n = len(notes["time"])
        if n == 0:
            continue
        prog = program if program is not None else (-1 if track.is_drum else int(track.program))
        rows.append(np.stack([np.full(n, prog, np.int64),
                              notes["time"].astype(np.int64) * factor,
                              notes["pitch"].astype(np.int64),
                              notes["duration"].astype(np.int64) * factor], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)


def match_counts(reference: Any, decoded: Any, program: int | None = None) -> tuple[int, int]:
    """(matched, decoded) note counts of ``decoded`` against ``reference`` (multisets)."""
    grid = lcm(int(reference.ticks_per_quarter), int(decoded.ticks_per_quarter))
    ref = note_keys(reference, grid, program)
    dec = note_keys(decoded, grid, program)
    return multiset_matches(ref, dec), len(dec)


def multiset_matches(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the multiset intersection of the rows of ``a`` and ``b``."""
    if len(a) == 0 or len(b) == 0:
        return 0
    _, codes = np.unique(np.concatenate([a, b]), axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    n = int(codes.max()) + 1
    return int(np.minimum(np.bincount(codes[: len(a)], minlength=n),
                          np.bincount(codes[len(a) :], minlength=n)).sum())


def chunk_starts(times: list[int], ticks: list[int]) -> np.ndarray:
    """Where each bar/beat sub-sequence starts: ``TokSequence._split_per_ticks`` on plain ints.

    Same walk as miditok's (which copies a sub-sequence per bar, the slowest part of encoding
    here); tests check the chunks against ``tokenizer.encode`` with a trained vocabulary.
    """
    idxs, ti = [0], 0
    for tick in ticks[1:]:
        while ti < len(times) and times[ti] < tick:
            ti += 1
        if ti == len(times):
            break
        idxs.append(ti)
    return np.asarray(idxs, dtype=np.int32)


def encode_score(tokenizer: Any, score: Any, n_notes_input: int, *, check: bool) -> Encoding:
    """Encode a *preprocessed* score with base ids; with ``check``, decode and compare notes."""
    from miditok import TokSequence

    tokseqs = tokenizer.encode(score, encode_ids=False, no_preprocess_score=True)
    one_stream = isinstance(tokseqs, TokSequence)
    if one_stream:
        tokseqs = [tokseqs]
    tracks = list(score.tracks)
    seqs = []
    for i, ts in enumerate(tokseqs):
        if one_stream:
            track, program, is_drum = -1, -1, False
            n_notes = sum(len(t.notes) for t in tracks)
        elif i < len(tracks):
            track, program, is_drum = i, int(tracks[i].program), bool(tracks[i].is_drum)
            n_notes = len(tracks[i].notes)
        else:  # miditok gives one (empty) sequence for a score without tracks
            track, program, is_drum, n_notes = i, 0, False, 0
        ids = np.asarray(ts.ids, dtype=np.int32)
        rt_matched = rt_decoded = -1
        if check:
            rt_matched, rt_decoded = roundtrip_counts(tokenizer, ts, score, i, one_stream,
                                                      (program, is_drum))
        times = [e.time for e in ts.events]
        seqs.append(SeqEncoding(track, program, is_drum, n_notes, ids,
                                chunk_starts(times, ts._ticks_bars),
                                chunk_starts(times, ts._ticks_beats), rt_matched, rt_decoded))
    return Encoding(n_notes_input=n_notes_input, seqs=tuple(seqs))


def roundtrip_counts(tokenizer: Any, seq: Any, reference: Any, track: int, one_stream: bool,
                     program: tuple[int, bool]) -> tuple[int, int]:
    """(matched, decoded) note counts of ``decode(seq)`` against the preprocessed reference.

    A fresh ``TokSequence`` (tokens and ids copied) is decoded because ``decode`` mutates what
    it is given; passing the tokens skips miditok's id -> token lookup, a bijection.
    Per-track sequences are compared with their own track, programs ignored (the stream does
    not encode them; they are passed back to the decoder).
    """
    from miditok import TokSequence

    fresh = TokSequence(tokens=list(seq.tokens), ids=list(seq.ids))
    if one_stream:
        return match_counts(reference, tokenizer.decode(fresh))
    decoded = tokenizer.decode([fresh], programs=[program])
    ref = reference.copy()
    keep = ref.tracks[track].copy() if track < len(ref.tracks) else None
    ref.tracks.clear()
    if keep is not None:
        ref.tracks.append(keep)
    return match_counts(ref, decoded, program=0)


def transposition_allowed(tokenizer: Any, score: Any, offset: int) -> bool:
    """True when every pitched (non-drum) note stays inside the tokenizer's (inclusive) range."""
    lo, hi = tokenizer.config.pitch_range
    pitches = [t.notes.numpy()["pitch"] for t in score.tracks if not t.is_drum and len(t.notes)]
    if not pitches:
        return True
    allp = np.concatenate(pitches).astype(np.int64) + offset
    return bool(allp.min() >= lo and allp.max() <= hi)


def encode_file(tokenizer: Any, path: Path, sha: str, transposes: tuple[int, ...],
                ) -> dict[int, Encoding]:
    """Read, verify and encode one file at each transposition (0 = the piece itself).

    Raises ``SourceError`` for a missing, changed or unparsable file. Transposition 0 is
    round-trip checked; augmented copies are not (they are training data only).
    """
    from miditok.data_augmentation import augment_score
    from symusic import Score

    try:
        data = Path(path).read_bytes()
    except OSError as e:  # strerror only: the message must not carry a machine's path
        raise SourceError("read_error", f"{type(e).__name__}: {e.strerror}") from None
    if sha256_bytes(data) != sha:
        raise SourceError("sha_mismatch", "file content changed since ingest")
    try:
        score = Score.from_midi(data)
    except Exception as e:  # symusic raises RuntimeError; anything else is also the file's fault
        raise SourceError("read_error", f"{type(e).__name__}: {e}") from None
    n_input = sum(len(t.notes) for t in score.tracks)
    pre = tokenizer.preprocess_score(score)
    out = {}
    for offset in transposes:
        if offset == 0:
            out[0] = encode_score(tokenizer, pre, n_input, check=True)
        elif not transposition_allowed(tokenizer, pre, offset):
            out[offset] = Encoding(n_notes_input=n_input, seqs=(), out_of_range=True)
        else:
            out[offset] = encode_score(tokenizer, augment_score(pre, pitch_offset=offset),
                                       n_input, check=False)
    return out


class SourceError(Exception):
    """A source file that cannot be encoded; ``flag`` names the reason for the token table."""

    def __init__(self, flag: str, detail: str) -> None:
        super().__init__(f"{flag}: {detail}")
        self.flag = flag
        self.detail = detail


# ---- filling the cache in worker processes ------------------------------------------------

_WORKER: dict[str, Any] = {}
Job = tuple[str, str, tuple[int, ...]]  # (sha256, path, transpositions to encode)


def _init_worker(factory: tuple, cache_root: str | None, key: str) -> None:
    """Build the base tokenizer once per worker process (``factory = (fn, *args)``)."""
    fn, *args = factory
    _WORKER["tokenizer"] = fn(*args)
    _WORKER["cache"] = TokenCache(cache_root, key) if cache_root else None


def _encode_chunk(jobs: tuple[Job, ...]) -> list[Any]:
    """Encode each job, write its cache entries, return packed arrays or (flag, detail)."""
    out: list[Any] = []
    for sha, path, transposes in jobs:
        try:
            encs = encode_file(_WORKER["tokenizer"], Path(path), sha, transposes)
        except SourceError as e:
            out.append((e.flag, e.detail))
            continue
        except Exception as e:  # a file miditok cannot encode is flagged, never fatal
            out.append(("encode_error", f"{type(e).__name__}: {e}"))
            continue
        if _WORKER["cache"] is not None:
            for t, enc in encs.items():
                _WORKER["cache"].put(sha, t, enc)
        out.append({t: pack(enc) for t, enc in encs.items()})
    return out


def encode_missing(jobs: list[Job], factory: tuple, cache: TokenCache | None, *, workers: int,
                   timeout_s: float, show_progress: bool | str = "auto") -> dict[str, Any]:
    """Encode ``jobs`` in isolated worker processes, in chunks; write entries to ``cache``.

    Returns sha256 -> {transpose: Encoding} or (flag, detail). A chunk lost to a crash or a
    timeout is retried one file at a time, so one bad file only costs its own row.
    """
    from pipeline.core.parallel import ItemFailure, isolated_map

    if not jobs:
        return {}
    workers = max(1, min(workers, len(jobs)))
    size = max(1, min(64, len(jobs) // (workers * 8)))
    chunks = [tuple(jobs[i : i + size]) for i in range(0, len(jobs), size)]
    initargs = (factory, str(cache.root) if cache else None, cache.key if cache else "")

    def run_chunks(chs: list[tuple[Job, ...]]) -> list[Any]:
        return isolated_map(_encode_chunk, chs, workers=workers,
                            timeout_s=timeout_s * max(len(c) for c in chs), desc="tokenize",
                            show_progress=show_progress, initializer=_init_worker,
                            initargs=initargs)

    raw: dict[str, Any] = {}
    retry: list[tuple[Job, ...]] = []
    for chunk, res in zip(chunks, run_chunks(chunks), strict=True):
        if isinstance(res, ItemFailure):
            retry += [(job,) for job in chunk]
        else:
            raw.update({job[0]: r for job, r in zip(chunk, res, strict=True)})
    if retry:
        for chunk, res in zip(retry, run_chunks(retry), strict=True):
            raw[chunk[0][0]] = (("worker_" + res.kind, res.message)
                                if isinstance(res, ItemFailure) else res[0])
    return {sha: ({t: unpack(a) for t, a in r.items()} if isinstance(r, dict) else r)
            for sha, r in raw.items()}

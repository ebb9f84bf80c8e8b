"""Encoding files into entries, in worker processes that fill the token store.

:func:`encode_file` reads, verifies and encodes one file at each transposition
(:func:`encode_score`), leaving its round-trip checks to be settled with a chunk's
(:func:`settle_packed`). :func:`encode_missing` sends chunks of files to isolated worker
processes, each of which writes its chunk's entries to the store as one segment.
"""

from __future__ import annotations

import itertools
import math
import operator
import threading
import time
from bisect import bisect_left
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import sha256_bytes
from pipeline.tokens.entries import HEADER, SEQ_FIELDS, Encoding, SeqEncoding, pack, unpack
from pipeline.tokens.roundtrip import RoundTrip, roundtrip_batch
from pipeline.tokens.store import TokenCache
from pipeline.tokens.tokenizer import codes_from_steps, is_compound, prepare_score

MIN_CHUNK, MAX_CHUNK = 32, 64  # files per chunk of work sent to a worker (:func:`chunk_size`)
_TIME = operator.attrgetter("time")


def nondecreasing(values: list[int]) -> bool:
    return all(map(operator.le, values, itertools.islice(values, 1, None)))


def chunk_starts(times: list[int], ticks: list[int], times_sorted: bool | None = None
                 ) -> np.ndarray:
    """Where each bar/beat sub-sequence starts: ``TokSequence._split_per_ticks`` on plain ints.

    Same walk as miditok's (which copies a sub-sequence per bar, the slowest part of encoding
    here): for each tick after the first, the first index at or after the previous one whose
    time is not before the tick, stopping at the end. Event times are sorted, so that is a
    bisection from the previous index (``times_sorted`` says so when the caller knows;
    unsorted times take the walk itself). Plain Python: a piece has tens of bars, where
    numpy's per-call cost exceeded the work. Tests check the chunks against the walk and
    against ``tokenizer.encode`` with a trained vocabulary.
    """
    n = len(times)
    if times_sorted is None:
        times_sorted = nondecreasing(times)
    idxs, ti = [0], 0
    for tick in ticks[1:]:
        if times_sorted:
            ti = bisect_left(times, tick, ti)
        else:
            while ti < n and times[ti] < tick:
                ti += 1
        if ti == n:
            break
        idxs.append(ti)
    return np.asarray(idxs, dtype=np.int32)


def encode_score(tokenizer: Any, score: Any, n_notes_input: int, *, check: bool,
                 checks: list[RoundTrip] | None = None, file: int = 0) -> Encoding:
    """Encode a *preprocessed* score with base ids; with ``check``, decode and compare notes.

    With ``checks`` the round-trip checks are appended there, to be settled later for a whole
    chunk of files (:func:`settle`), and the counts are left at -1 meanwhile.

    A compound tokenizer's steps are stored one after the other (one id per codebook each;
    bar and beat starts count steps), and a piece it clips (:func:`truncated_bars`) says so."""
    from miditok import TokSequence

    compound = is_compound(tokenizer)
    clipped = compound and truncated_bars(tokenizer, score)
    tokseqs = tokenizer.encode(score, encode_ids=False, no_preprocess_score=True)
    one_stream = isinstance(tokseqs, TokSequence)
    if one_stream:
        tokseqs = [tokseqs]
    tracks = [] if one_stream else list(score.tracks)
    seqs = []
    mine: list[RoundTrip] = []
    for i, ts in enumerate(tokseqs):
        if one_stream:
            track, program, is_drum = -1, -1, False
            n_notes = int(score.note_num())
        elif i < len(tracks):
            track, program, is_drum = i, int(tracks[i].program), bool(tracks[i].is_drum)
            n_notes = len(tracks[i].notes)
        else:  # miditok gives one (empty) sequence for a score without tracks
            track, program, is_drum, n_notes = i, 0, False, 0
        if compound:
            ids = codes_from_steps(ts.ids, len(tokenizer.vocab)).T.reshape(-1)
            times = [step[0].time for step in ts.events]
        else:
            ids = np.asarray(ts.ids, dtype=np.int32)
            times = list(map(_TIME, ts.events))
        if check:
            mine.append(RoundTrip(file, i, ids, score, one_stream, (program, is_drum)))
        ordered = times == sorted(times)
        seqs.append(SeqEncoding(track, program, is_drum, n_notes, ids,
                                chunk_starts(times, ts._ticks_bars, ordered),
                                chunk_starts(times, ts._ticks_beats, ordered), -1, -1))
    enc = Encoding(n_notes_input=n_notes_input, seqs=tuple(seqs), truncated_bars=clipped)
    if checks is not None:
        checks.extend(mine)
        return enc
    return settle(tokenizer, mine, [enc])[0] if mine else enc


def settle(tokenizer: Any, checks: list[RoundTrip], encodings: list[Encoding]) -> list[Encoding]:
    """``encodings`` (indexed by each check's ``file``) with the round-trip counts of ``checks``
    filled in (:func:`roundtrip_batch`)."""
    if not checks:
        return encodings
    packed = [pack(enc) for enc in encodings]
    settle_packed(tokenizer, checks, packed)
    return [unpack(arr) for arr in packed]


def settle_packed(tokenizer: Any, checks: list[RoundTrip], packed: list[np.ndarray]) -> None:
    """Write the round-trip counts of ``checks`` (:func:`roundtrip_batch`) into the packed
    entries ``packed`` (indexed by each check's ``file``), in place."""
    if not checks:
        return
    for c, (matched, decoded) in zip(checks, roundtrip_batch(tokenizer, checks), strict=True):
        row = HEADER + c.index * SEQ_FIELDS
        packed[c.file][row + 7 : row + 9] = (matched, decoded)


def truncated_bars(tokenizer: Any, score: Any) -> bool:
    """Whether ``tokenizer`` clips the preprocessed ``score``: Octuple encodes a note's bar as
    one of ``max_bar_embedding`` Bar tokens and cuts a piece with more bars (counted as miditok
    counts them: up to the last note onset) with only a warning."""
    limit = tokenizer.config.additional_params.get("max_bar_embedding")
    if type(tokenizer).__name__ != "Octuple" or limit is None:
        return False
    from miditok.utils import get_bars_ticks

    return len(get_bars_ticks(score, only_notes_onsets=True)) > int(limit)


def transposition_allowed(tokenizer: Any, score: Any, offset: int) -> bool:
    """True when every pitched (non-drum) note stays inside the tokenizer's (inclusive) range."""
    lo, hi = tokenizer.config.pitch_range
    pitches = [t.notes.numpy()["pitch"] for t in score.tracks if not t.is_drum and len(t.notes)]
    if not pitches:
        return True
    allp = np.concatenate(pitches).astype(np.int64) + offset
    return bool(allp.min() >= lo and allp.max() <= hi)


def encode_file(tokenizer: Any, path: Path | str, sha: str, transposes: tuple[int, ...],
                checks: list[RoundTrip] | None = None, file: int = 0) -> dict[int, Encoding]:
    """Read, verify and encode one file at each transposition (0 = the piece itself).

    Raises ``MidiFileError`` for a missing, changed or unparsable file. Transposition 0 is
    round-trip checked; augmented copies are not (they are training data only). With
    ``checks``, the check is left there to be settled with others (:func:`settle`).
    """
    from symusic import Score

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:  # strerror only: the message must not carry a machine's path
        raise MidiFileError("read_error", f"{type(e).__name__}: {e.strerror}") from None
    if sha256_bytes(data) != sha:
        raise MidiFileError("sha_mismatch", "file content changed since ingest")
    try:
        score = Score.from_midi(data)
    except Exception as e:  # symusic raises RuntimeError; anything else is also the file's fault
        raise MidiFileError("read_error", f"{type(e).__name__}: {e}") from None
    n_input = int(score.note_num())
    pre = prepare_score(tokenizer, score)
    out = {}
    mine: list[RoundTrip] | None = [] if checks is not None else None
    for offset in transposes:
        if offset == 0:
            out[0] = encode_score(tokenizer, pre, n_input, check=True, checks=mine, file=file)
        elif not transposition_allowed(tokenizer, pre, offset):
            out[offset] = Encoding(n_notes_input=n_input, seqs=(), out_of_range=True)
        else:
            from miditok.data_augmentation import augment_score

            out[offset] = encode_score(tokenizer, augment_score(pre, pitch_offset=offset),
                                       n_input, check=False)
    if checks is not None and mine:  # only a file encoded whole leaves checks to settle
        checks.extend(mine)
    return out


class MidiFileError(Exception):
    """The MIDI file behind a piece cannot be encoded (unreadable, changed since ingest, not
    parsable); ``flag`` names the reason for the token table, ``detail`` says more."""

    def __init__(self, flag: str, detail: str) -> None:
        super().__init__(f"{flag}: {detail}")
        self.flag = flag
        self.detail = detail


# ---- filling the cache in worker processes ------------------------------------------------

_WORKER: dict[str, Any] = {}  # this worker process's tokenizer and store (:func:`_init_worker`)
Job = tuple[str, str, tuple[int, ...]]  # (sha256, path, transpositions to encode)
PHASES = ("encode", "check", "cache_write")
"""What a chunk's seconds are counted in: encoding its files (the round-trip check included) and,
of that, the check; then writing its segment. Reported in the timing sidecar, never in an
artifact."""


def _init_worker(factory: tuple, cache_root: str | None, key: str) -> None:
    """Build the base tokenizer once per worker process (``factory = (fn, *args)``)."""
    fn, *args = factory
    _WORKER["tokenizer"] = fn(*args)
    _WORKER["cache"] = TokenCache(cache_root, key) if cache_root else None


def _encode_chunk(jobs: tuple[Job, ...]) -> tuple[list[Any], dict[str, float]]:
    """Encode each job, settle the chunk's round-trip checks together and write the chunk's
    entries as one cache segment; return per job {transposition: packed array} (None in place
    of the array when the cache holds it: the parent reads it from there) or (flag, detail),
    and the seconds this chunk spent in each of ``PHASES``."""
    t0 = time.perf_counter()
    tokenizer = _WORKER["tokenizer"]
    out: list[Any] = []
    checks: list[RoundTrip] = []
    for k, (sha, path, transposes) in enumerate(jobs):
        try:
            encs = encode_file(tokenizer, path, sha, transposes, checks, file=k)
        except MidiFileError as e:
            out.append((e.flag, e.detail))
            continue
        except Exception as e:  # a file miditok cannot encode is flagged, never fatal
            out.append(("encode_error", f"{type(e).__name__}: {e}"))
            continue
        out.append(encs)
    out = [{t: pack(enc) for t, enc in r.items()} if isinstance(r, dict) else r for r in out]
    # the checks of base encodings (transposition 0; a job may hold only augmented copies)
    bases = [r.get(0) if isinstance(r, dict) else None for r in out]
    t_check = time.perf_counter()
    try:
        settle_packed(tokenizer, checks, bases)
    except Exception:  # settle the chunk's checks one file at a time: only a bad one is flagged
        for k in sorted({c.file for c in checks}):
            try:
                settle_packed(tokenizer, [c for c in checks if c.file == k], bases)
            except Exception as e:
                out[k] = ("encode_error", f"{type(e).__name__}: {e}")
    t1 = time.perf_counter()
    seconds = {"encode": t1 - t0, "check": t1 - t_check, "cache_write": 0.0}
    if _WORKER["cache"] is not None:
        _WORKER["cache"].put_many([(sha, t, arr) for (sha, _, _), r in zip(jobs, out, strict=True)
                                   if isinstance(r, dict) for t, arr in r.items()])
        out = [dict.fromkeys(r) if isinstance(r, dict) else r for r in out]
        seconds["cache_write"] = time.perf_counter() - t1
    return out, seconds


def chunk_size(n_jobs: int, workers: int) -> int:
    """Files per chunk: about 8 chunks per worker, between ``MIN_CHUNK`` and ``MAX_CHUNK`` files.

    Each chunk costs a cache segment (a Parquet file), one batched round-trip
    check and a round trip to the pool, so a small run (adding 1% of a corpus) uses few
    chunks: chunks of a file or two wrote a segment each and forced a merge."""
    return min(MAX_CHUNK, max(MIN_CHUNK, math.ceil(n_jobs / (workers * 8))))


def chunk_bounds(n_jobs: int, workers: int) -> list[int]:
    """Where each chunk of ``n_jobs`` starts (then ``n_jobs``): chunks of at most
    :func:`chunk_size` files, as many as a multiple of ``workers`` and of sizes that differ by at
    most one, so that the workers finish together (a +1% run of 50 files made chunks of 16, 16,
    16 and 2: one worker encoded 32 files while the other encoded 18)."""
    n = -(-n_jobs // chunk_size(n_jobs, workers))
    n = min(max(1, n_jobs), n + -n % workers)
    return [n_jobs * k // n for k in range(n + 1)]


def encode_missing(jobs: list[Job], factory: tuple, cache: TokenCache | None, *, workers: int,
                   timeout_s: float, show_progress: bool | str = "auto",
                   closing: list[threading.Thread] | None = None
                   ) -> tuple[dict[str, Any], dict[str, float]]:
    """Encode ``jobs`` in isolated worker processes, in chunks; write entries to ``cache``.

    Returns sha256 -> {transpose: packed entry (:func:`pack`), or None when written to
    ``cache``} or (flag, detail), and the workers' seconds in each of ``PHASES``, summed over
    the chunks. A chunk lost to a crash or a timeout is retried one file at a time, so one bad
    file only costs its own row. ``closing`` is passed on to
    :func:`~pipeline.core.parallel.isolated_map` (the caller joins the pools).
    """
    from pipeline.core.parallel import ItemFailure, isolated_map

    seconds = dict.fromkeys(PHASES, 0.0)
    if not jobs:
        return {}, seconds
    workers = max(1, min(workers, len(jobs)))
    chunks = [tuple(jobs[a:b]) for a, b in itertools.pairwise(chunk_bounds(len(jobs), workers))]
    initargs = (factory, str(cache.root) if cache else None, cache.dir.name if cache else "")

    def run_chunks(chs: list[tuple[Job, ...]]) -> list[Any]:
        results = isolated_map(_encode_chunk, chs, workers=workers,
                               timeout_s=timeout_s * max(len(c) for c in chs), desc="tokenize",
                               show_progress=show_progress, initializer=_init_worker,
                               initargs=initargs, closing=closing)
        out = []
        for res in results:
            if isinstance(res, ItemFailure):
                out.append(res)
                continue
            for phase, s in res[1].items():
                seconds[phase] += s
            out.append(res[0])
        return out

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
    return raw, seconds

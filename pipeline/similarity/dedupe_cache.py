"""Dedupe's per-piece work kept between runs: ``.cache/dedupe/features-<key>/``.

Every dedupe run needs, for every piece, its fingerprints (transposed key, melody keys, shingle
set, MinHash signature, short melody and its signature), its distinct onsets and the winnowed
runs of its note tokens and melodies (the candidates of the near tier come from all pieces at
once). Each of these is a function of the piece's notes alone, so :func:`piece_work` keeps them in a
:class:`~pipeline.core.segments.SegmentStore` keyed by the note digest
(:func:`pipeline.similarity.digests.note_digests`) and measures only the pieces not found there.

The note-token and melody sequences themselves are needed only to align the candidates whose
measures are not in the verdict store (:class:`pipeline.similarity.duplicates.VerdictStore`):
:func:`sequences_for` builds them for those pieces alone.

The folder's name hashes the settings these depend on (``shingle_k``, ``ioi_resolution``,
``num_perm``, ``seed``, ``min_melody_notes``, ``melody_rhythm``, ``min_align_onsets``,
``short_melody_notes``, ``min_shingles``), the bytes of the code that computes them and numpy's
version. Deleting it costs time, never a different result; the tests compare runs with and
without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.core import artifacts
from pipeline.core.segments import SegmentStore, list_column
from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.digests import take_pieces
from pipeline.similarity.duplicates import DedupeConfig, Fingerprints, fingerprint, winnow_views

FEATURES_FORMAT = 2
VIEWS = ("runs_tokens", "runs_skyline", "runs_top_track")
FEATURES_SCHEMA = pa.schema(
    [("digest", pa.string()), ("transposed", pa.string()), ("melody_skyline", pa.string()),
     ("melody_top_track", pa.string()), ("shingles", pa.large_list(pa.uint64())),
     ("signature", pa.list_(pa.uint32())), ("onsets", pa.int64()),
     ("short_melody", pa.string()), ("short_signature", pa.list_(pa.uint32()))]
    + [(v, pa.large_list(pa.uint64())) for v in VIEWS])
"""One piece's fingerprints, distinct onsets and winnowed run keys (per view, without the piece
index :func:`pipeline.similarity.alignment.winnow` packs them with); ``short_signature`` is empty
where ``short_melody`` is ("": not a short melody)."""
_KEY_MASK = np.uint64((1 << similarity.KEY_BITS) - 1)


FEATURES_CODE = (__name__, "pipeline.similarity.duplicates", "pipeline.similarity.alignment",
                 "pipeline.similarity.fingerprints", "pipeline.similarity.melody",
                 "pipeline.similarity.short_melodies", "pipeline.similarity.lsh",
                 "pipeline.similarity.digests", "pipeline.similarity.rule",
                 "pipeline.core.arrays")
"""The modules whose code a piece's features depend on (:func:`features_key`)."""


def features_key(cfg: DedupeConfig) -> str:
    """The folder's name: a hash of what a piece's features depend on besides its notes."""
    return "features-" + artifacts.sha256_json({
        "format": FEATURES_FORMAT, "code": artifacts.code_digest(FEATURES_CODE),
        "numpy": np.__version__,
        "settings": cfg.model_dump(include={"shingle_k", "ioi_resolution", "num_perm", "seed",
                                            "min_melody_notes", "melody_rhythm",
                                            "min_align_onsets", "short_melody_notes",
                                            "min_shingles"}),
    })[:20]


@dataclass(frozen=True)
class PieceWork:
    """What the near tier needs of every piece: fingerprints, distinct onsets and the packed
    winnowed runs of each view (:func:`pipeline.similarity.duplicates.winnow_views`)."""

    fps: Fingerprints
    distinct_onsets: np.ndarray
    views: list[np.ndarray]


def piece_work(notes: fp.NoteArrays, cfg: DedupeConfig, digests: Sequence[str], root: Path,
               workers: int = 1, show_progress: bool | str = False,
               stats: dict | None = None) -> PieceWork:
    """:class:`PieceWork` of every piece of ``notes``, from the store under
    ``root/<features_key>/`` where it has a piece's digest, measured (and stored) otherwise: the
    same arrays as measuring every piece. ``stats`` gets ``features_reused`` (pieces found) and
    ``features_measured`` (distinct digests measured)."""
    store = SegmentStore(Path(root) / features_key(cfg), FEATURES_SCHEMA, "digest")
    table, new = store.fill(digests, lambda keys, idx: _measure(
        take_pieces(notes, idx), keys, cfg, workers, show_progress))
    if stats is not None:
        fresh = set(new)
        stats.update(features_reused=sum(d not in fresh for d in digests),
                     features_measured=len(new))
    offsets, shingles = list_column(table["shingles"])
    n = len(digests)
    short = np.asarray(table["short_melody"].to_pylist(), dtype=object).reshape(n)
    short_sig = np.full((n, cfg.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    short_sig[short != ""] = list_column(table["short_signature"])[1].astype(np.uint32) \
        .reshape(-1, cfg.num_perm)
    fps = Fingerprints(
        np.asarray(table["transposed"].to_pylist(), dtype=object),
        np.stack([np.asarray(table["melody_skyline"].to_pylist(), dtype=object),
                  np.asarray(table["melody_top_track"].to_pylist(), dtype=object)], axis=1)
        .reshape(n, 2),
        offsets, shingles,
        list_column(table["signature"])[1].astype(np.uint32).reshape(n, cfg.num_perm),
        short, short_sig)
    views = []
    for v in VIEWS:
        off, keys = list_column(table[v])
        piece = np.repeat(np.arange(n, dtype=np.uint64), np.diff(off))
        views.append((piece << np.uint64(similarity.KEY_BITS)) | keys)
    return PieceWork(fps, table["onsets"].to_numpy().astype(np.int64), views)


def sequences_for(notes: fp.NoteArrays, needed: np.ndarray, ioi_resolution: int,
                  distinct_onsets: np.ndarray) -> similarity.Sequences:
    """:class:`~pipeline.similarity.alignment.Sequences` of every piece of ``notes`` whose entries
    for the pieces ``needed`` are those a full build gives, and empty for the others (built for
    ``needed`` alone); ``distinct_onsets`` (every piece's) is taken as given."""
    n = notes.n_pieces
    needed = np.unique(needed)
    tokens, onsets = [""] * n, [np.zeros(0)] * n
    skyline, top = [""] * n, [""] * n
    if needed.size:
        built = similarity.Sequences.build(take_pieces(notes, needed), ioi_resolution)
        for k, i in enumerate(needed.tolist()):
            tokens[i], onsets[i] = built.tokens[k], built.onsets[k]
            skyline[i], top[i] = built.melodies[0][k], built.melodies[1][k]
    return similarity.Sequences(tuple(tokens), tuple(onsets), (tuple(skyline), tuple(top)),
                                np.asarray(distinct_onsets, dtype=np.int64))


def _rows(values: np.ndarray, keep: np.ndarray) -> pa.ListArray:
    """One list per row of ``values`` (2-D), empty where ``keep`` is false."""
    offsets = np.zeros(keep.size + 1, dtype=np.int32)
    np.cumsum(np.where(keep, values.shape[1], 0), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                    pa.array(values[keep].reshape(-1), pa.uint32()))


def _measure(notes: fp.NoteArrays, digests: list[str], cfg: DedupeConfig, workers: int,
             show_progress: bool | str) -> pa.Table:
    """The :data:`FEATURES_SCHEMA` rows of ``notes``' pieces."""
    fps = fingerprint(notes, cfg, workers, show_progress)
    seqs = similarity.Sequences.build(notes, cfg.ioi_resolution)
    n = notes.n_pieces
    cols: dict[str, pa.Array] = {
        "digest": pa.array(digests, pa.string()),
        "transposed": pa.array(fps.transposed.tolist(), pa.string()),
        "melody_skyline": pa.array(fps.melody[:, 0].tolist(), pa.string()),
        "melody_top_track": pa.array(fps.melody[:, 1].tolist(), pa.string()),
        "shingles": pa.LargeListArray.from_arrays(pa.array(fps.shingle_offsets, pa.int64()),
                                                  pa.array(fps.shingles, pa.uint64())),
        "signature": pa.ListArray.from_arrays(
            pa.array(np.arange(n + 1, dtype=np.int32) * fps.signatures.shape[1], pa.int32()),
            pa.array(fps.signatures.reshape(-1), pa.uint32())),
        "onsets": pa.array(np.asarray(seqs.distinct_onsets, dtype=np.int64), pa.int64()),
        "short_melody": pa.array(fps.short_melody.tolist(), pa.string()),
        "short_signature": _rows(fps.short_signatures, fps.short_melody != ""),
    }
    for name, packed in zip(VIEWS, winnow_views(seqs, cfg), strict=True):
        piece = (packed >> np.uint64(similarity.KEY_BITS)).astype(np.int64)
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(piece, minlength=n), out=off[1:])
        cols[name] = pa.LargeListArray.from_arrays(pa.array(off, pa.int64()),
                                                   pa.array(packed & _KEY_MASK, pa.uint64()))
    return pa.table(cols, schema=FEATURES_SCHEMA)

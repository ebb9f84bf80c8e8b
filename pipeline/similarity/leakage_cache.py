"""The leakage audit's work kept between runs, under ``.cache/split/``.

The audit (:func:`pipeline.similarity.leakage.audit`) compares every sampled query piece with every
piece of a pool, exhaustively, which costs queries × pool pieces each time the split stage runs.
When files are added, most queries and most pool pieces are the ones the last run compared.
:class:`AuditCache` keeps, per comparison (:class:`~pipeline.similarity.leakage.AuditPass`), each
query's :class:`~pipeline.similarity.neighbours.Neighbours` and which pieces the pool held, and in
the next run:

- a query measured last time is compared only with the pool pieces it has not met (new pieces,
  pieces that joined the pool, pieces no longer excluded from it) and the result merged with the
  stored one; this is exact because each entry is a maximum over pairs, ties broken by the
  smallest sha256, whatever the order the pairs are measured in;
- unless a piece that held one of its bests left the pool (or became excluded): that query is
  measured again in full, as is every query not measured last time.

Pieces are matched by sha256 *and* a digest of their notes (:func:`pipeline.similarity.digests.
note_digests`), so notes re-parsed differently count as a new piece. The folder's name hashes
everything else the results depend on: the near-copy rule (``ioi_resolution`` included), the
audit's length caps, the bytes of the measuring code, the rapidfuzz, numpy and scipy versions,
and the split settings (so alternating between two settings keeps both states). It holds the
last run's state only: two Parquet files, each written atomically, the results naming the digest
of the pieces file they go with (a mismatch, e.g. after a kill between the two writes, reads as
no state).

The audit's inputs, each piece's shingle set, note tokens and melodies, are kept beside it by
note digest (:func:`audit_inputs`, a :class:`~pipeline.core.segments.SegmentStore` under
``.cache/split/features-<key>/``), so a re-run measures only the new pieces' notes.

Deleting either costs time, never a different result; the tests compare runs with and without
them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import scipy

from pipeline.core import artifacts
from pipeline.core.segments import SegmentStore, list_column
from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints
from pipeline.similarity.digests import take_pieces
from pipeline.similarity.leakage import AuditPass, Measure
from pipeline.similarity.neighbours import (
    CAPS,
    MEASURES,
    LengthCaps,
    Melodies,
    Neighbours,
    ShingleMatrix,
    TokenStrings,
    melody_texts,
)
from pipeline.similarity.rule import NearCopyRule

STATE_FORMAT = 1
_M = len(MEASURES)
RESULT_SCHEMA = pa.schema(
    [("pass", pa.string()), ("query", pa.int32())]
    + [(f"value_{m}", pa.float64()) for m in MEASURES]
    + [(f"row_{m}", pa.int32()) for m in MEASURES]
    + [("partner", pa.int32()), ("partner_jaccard", pa.float64()),
       ("partner_containment", pa.float64())])
"""``results.parquet``: one row per (pass, query); ``query`` and the ``row_*``/``partner``
columns are rows of ``pieces.parquet`` (-1: none)."""


AUDIT_CODE = ("pipeline.similarity.leakage", "pipeline.similarity.neighbours", __name__,
              "pipeline.similarity.rule", "pipeline.similarity.alignment",
              "pipeline.similarity.fingerprints", "pipeline.similarity.melody",
              "pipeline.similarity.digests", "pipeline.similarity.splitters",
              "pipeline.core.arrays", "pipeline.core.splits")
"""The modules whose code the stored results and a piece's features depend on
(:func:`cache_key`, :func:`features_key`)."""


def cache_key(rule: NearCopyRule, context: Mapping, caps: LengthCaps = CAPS) -> str:
    """The folder name: a hash of what the stored results depend on besides the pieces."""
    return artifacts.sha256_json({
        "format": STATE_FORMAT, "code": artifacts.code_digest(AUDIT_CODE), "rule": asdict(rule),
        "caps": asdict(caps), "context": dict(context),
        "rapidfuzz": package_version("rapidfuzz"), "numpy": np.__version__,
        "scipy": scipy.__version__,
    })[:20]


@dataclass(frozen=True)
class _State:
    ident: np.ndarray  # (N,) str: sha256 + note digest of each piece
    group_id: np.ndarray  # (N,) str
    pools: dict[str, np.ndarray]  # pass name -> (N,) bool
    results: pd.DataFrame


def _current_rows(ident: np.ndarray, old_ident: np.ndarray) -> np.ndarray:
    """The row in ``ident`` of each of ``old_ident``; -1 where it is gone."""
    return pd.Index(ident).get_indexer(old_ident).astype(np.int64)


class AuditCache:
    """Runs the audit's passes from the last run's results under ``root/<key>/``
    (:func:`cache_key`), and stores this run's. ``digests``: the note digest of each piece, in
    the audit's row order. :attr:`stats` counts, per pass, the queries reused and measured in
    full and the pool pieces the reused ones were compared with."""

    def __init__(self, root: Path, key: str, digests: Sequence[str]) -> None:
        self.dir = Path(root) / key
        self.digests = list(digests)
        self.stats: dict[str, dict[str, int]] = {}

    def run(self, sha256: np.ndarray, group_id: np.ndarray, passes: list[AuditPass],
            measure: Measure) -> dict[str, Neighbours]:
        if len(self.digests) != len(sha256):
            raise ValueError(f"AuditCache: {len(self.digests)} digests for {len(sha256)} pieces")
        ident = np.asarray([s + d for s, d in zip(sha256, self.digests, strict=True)], dtype=str)
        old = self._load()
        cur = _current_rows(ident, old.ident) if old is not None else None  # once for all passes
        found = {p.name: self._run_pass(p, ident, group_id, old, cur, measure) for p in passes}
        self._save(ident, group_id, passes, found)
        return found

    # ------------------------------------------------------------------------ one pass
    def _run_pass(self, p: AuditPass, ident: np.ndarray, group_id: np.ndarray,
                  old: _State | None, cur: np.ndarray | None, measure: Measure) -> Neighbours:
        out = Neighbours.zeros(p.query.size)
        reused = np.zeros(0, dtype=np.int64)
        pairs = 0
        if old is not None and p.name in old.pools and p.query.size:
            reused, pairs = self._reuse(p, ident, group_id, old, cur, measure, out)
        fresh = np.setdiff1d(np.arange(p.query.size), reused)
        if fresh.size:
            out.merge(measure(p, p.query[fresh], p.pool), fresh)
        self.stats[p.name] = {"queries_reused": int(reused.size),
                              "queries_measured": int(fresh.size),
                              "pairs_measured_for_reused": pairs}
        return out

    @staticmethod
    def _reuse(p: AuditPass, ident: np.ndarray, group_id: np.ndarray, old: _State,
               cur: np.ndarray, measure: Measure, out: Neighbours) -> tuple[np.ndarray, int]:
        """Fill ``out`` for the queries whose stored results still hold, comparing them with
        the pool pieces they have not met; returns their positions and the pairs measured.
        ``cur``: each old row's row now (-1: gone)."""
        n = ident.size
        res = old.results[old.results["pass"] == p.name]
        in_pool = np.zeros(n, dtype=bool)
        in_pool[p.pool] = True
        q_cur = cur[res["query"].to_numpy()]
        at = np.minimum(np.searchsorted(p.query, q_cur), p.query.size - 1)
        ok = (q_cur >= 0) & (p.query[at] == q_cur)
        # every best must still be a piece the query is compared with (under "self" a best is
        # never the query itself: it was not last time, and pieces keep their identity)
        args = res[[f"row_{m}" for m in MEASURES] + ["partner"]].to_numpy()
        args_cur = np.where(args >= 0, cur[np.maximum(args, 0)], -1)
        held = np.maximum(args_cur, 0)
        allowed = (args_cur >= 0) & in_pool[held]
        if p.exclude == "group":
            allowed &= group_id[held] != group_id[np.maximum(q_cur, 0)][:, None]
        ok &= ((args < 0) | allowed).all(axis=1)
        res, at, args_cur = res[ok], at[ok], args_cur[ok]
        out.values[at] = res[[f"value_{m}" for m in MEASURES]].to_numpy()
        out.rows[at] = args_cur[:, :_M]
        out.partner[at] = args_cur[:, _M]
        out.partner_sims[at] = res[["partner_jaccard", "partner_containment"]].to_numpy()
        # the pool pieces they have not met: those not in the pool last time ...
        was_in_pool = np.zeros(n, dtype=bool)
        was = cur[old.pools[p.name]]
        was_in_pool[was[was >= 0]] = True
        added = p.pool[~was_in_pool[p.pool]]
        pairs = 0
        if at.size and added.size:
            out.merge(measure(p, p.query[at], added), at)
            pairs += at.size * added.size
        if p.exclude != "group" or not at.size:
            return at, pairs
        # ... and those that shared the query's group last time and no longer do (a group that
        # split): pairs the last run skipped
        old_rows = np.flatnonzero(old.pools[p.name])
        old_rows = old_rows[cur[old_rows] >= 0]
        # the old pool's pieces by old group (a sort and two searches, not a group-by of lists)
        order = np.argsort(old.group_id[old_rows], kind="stable")
        groups, members = old.group_id[old_rows][order], cur[old_rows][order]
        keys = old.group_id[res["query"].to_numpy()]
        lows = np.searchsorted(groups, keys, side="left")
        highs = np.searchsorted(groups, keys, side="right")
        for a, lo, hi in zip(at.tolist(), lows.tolist(), highs.tolist(), strict=True):
            mates = members[lo:hi]
            mates = mates[in_pool[mates] & (group_id[mates] != group_id[p.query[a]])]
            if mates.size:
                out.merge(measure(p, p.query[a : a + 1], mates), np.array([a]))
                pairs += mates.size
        return at, int(pairs)

    # ------------------------------------------------------------------------ storage
    def _load(self) -> _State | None:
        try:
            raw = (self.dir / "pieces.parquet").read_bytes()
            results = pq.read_table(self.dir / "results.parquet")
            meta = results.schema.metadata or {}
            if meta.get(b"pieces") != hashlib.sha256(raw).hexdigest().encode():
                return None
            if results.schema.remove_metadata() != RESULT_SCHEMA:
                return None
            pieces = pq.read_table(pa.BufferReader(raw))
            pools = {c[len("pool_"):]: pieces[c].to_numpy(zero_copy_only=False)
                     for c in pieces.column_names if c.startswith("pool_")}
            return _State(np.asarray(pieces["ident"].to_pylist(), dtype=str),
                          np.asarray(pieces["group_id"].to_pylist(), dtype=str), pools,
                          results.to_pandas())
        except (OSError, KeyError, pa.ArrowException):
            return None

    def _save(self, ident: np.ndarray, group_id: np.ndarray, passes: list[AuditPass],
              found: dict[str, Neighbours]) -> None:
        n = ident.size
        cols = {"ident": pa.array(ident.tolist(), pa.string()),
                "group_id": pa.array(group_id.tolist(), pa.string())}
        for p in passes:
            flag = np.zeros(n, dtype=bool)
            flag[p.pool] = True
            cols[f"pool_{p.name}"] = pa.array(flag)
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table(cols), sink, compression="zstd", compression_level=1)
        raw = sink.getvalue().to_pybytes()
        parts = []
        for p in passes:
            nb = found[p.name]
            parts.append(pd.DataFrame({
                "pass": p.name, "query": p.query.astype(np.int32),
                **{f"value_{m}": nb.values[:, i] for i, m in enumerate(MEASURES)},
                **{f"row_{m}": nb.rows[:, i].astype(np.int32) for i, m in enumerate(MEASURES)},
                "partner": nb.partner.astype(np.int32),
                "partner_jaccard": nb.partner_sims[:, 0],
                "partner_containment": nb.partner_sims[:, 1]}))
        results = pa.Table.from_pandas(pd.concat(parts, ignore_index=True), schema=RESULT_SCHEMA,
                                       preserve_index=False)
        results = results.replace_schema_metadata(
            {"pieces": hashlib.sha256(raw).hexdigest()})
        artifacts.write_bytes(self.dir / "pieces.parquet", raw)
        with artifacts.atomic_path(self.dir / "results.parquet") as tmp:
            pq.write_table(results, tmp, compression="zstd", compression_level=1)


# ---------------------------------------------------------------------------- per-piece inputs
FEATURES_FORMAT = 1
FEATURES_SCHEMA = pa.schema([
    ("digest", pa.string()), ("shingles", pa.large_list(pa.uint64())),
    ("tokens", pa.large_string()), ("onsets", pa.int64()),
    ("skyline", pa.large_string()), ("top_track", pa.large_string())])
"""What the audit measures of one piece, by note digest: its shingle set, its note tokens
(:class:`pipeline.similarity.alignment.Sequences`) and distinct onsets, and its two melodies
(:func:`pipeline.similarity.neighbours.melody_texts`)."""


def features_key(shingle_k: int, ioi_resolution: int) -> str:
    """The features folder's name: a hash of what a piece's features depend on besides its
    notes."""
    return "features-" + artifacts.sha256_json({
        "format": FEATURES_FORMAT, "code": artifacts.code_digest(AUDIT_CODE),
        "shingle_k": shingle_k, "ioi_resolution": ioi_resolution, "numpy": np.__version__})[:20]


def audit_inputs(notes: fingerprints.NoteArrays, shingle_k: int, ioi_resolution: int,
                 digests: Sequence[str], root: Path | None = None, stats: dict | None = None
                 ) -> tuple[ShingleMatrix, Melodies, TokenStrings]:
    """The audit's per-piece inputs: shingle matrix, melodies and token strings of every piece.

    With ``root``, each piece's features are kept in a segment store under
    ``root/<features_key>/`` keyed by its note digest, and only pieces not found there are
    measured: the same arrays either way (a piece's features depend on its notes alone), and
    those of :meth:`ShingleMatrix.build`, :meth:`Melodies.build` and :meth:`TokenStrings.build`
    on all notes at once. ``stats`` gets ``features_reused`` and ``features_measured``."""
    if root is None:
        table = _features(notes, [""] * notes.n_pieces, shingle_k, ioi_resolution)
        if stats is not None:
            stats.update(features_reused=0, features_measured=notes.n_pieces)
    else:
        store = SegmentStore(Path(root) / features_key(shingle_k, ioi_resolution),
                             FEATURES_SCHEMA, "digest")
        table, new = store.fill(digests, lambda keys, idx: _features(
            take_pieces(notes, idx), keys, shingle_k, ioi_resolution))
        if stats is not None:  # pieces found in the store; distinct digests measured here
            fresh = set(new)
            stats.update(features_reused=sum(d not in fresh for d in digests),
                         features_measured=len(new))
    offsets, values = list_column(table["shingles"])
    sm = ShingleMatrix.from_sets(notes.sha256, offsets, values.astype(np.uint64, copy=False))
    mel = Melodies.from_views(notes.sha256, (table["skyline"].to_pylist(),
                                             table["top_track"].to_pylist()))
    tok = TokenStrings.from_tokens(notes.sha256, table["tokens"].to_pylist(),
                                   table["onsets"].to_numpy())
    return sm, mel, tok


FEATURES_CHUNK_NOTES = 2_000_000
"""Pieces are measured this many notes at a time (whole pieces, at most 4,096): measured all at
once, the 45 M notes of a 100k-file corpus held about 4 GB of temporaries (hashes, token and
piece arrays, their sorts), which made the split stage's peak (7.3 GiB)."""


def _features(notes: fingerprints.NoteArrays, digests: list[str], shingle_k: int,
              ioi_resolution: int) -> pa.Table:
    """The :data:`FEATURES_SCHEMA` rows of ``notes``' pieces (each row depends on its piece
    alone), measured :data:`FEATURES_CHUNK_NOTES` notes at a time."""
    parts, start = [], 0
    for chunk in notes.chunks(max_notes=FEATURES_CHUNK_NOTES):
        parts.append(_chunk_features(chunk, digests[start : start + chunk.n_pieces], shingle_k,
                                     ioi_resolution))
        start += chunk.n_pieces
    return pa.concat_tables(parts) if parts else \
        _chunk_features(notes, digests, shingle_k, ioi_resolution)


def _chunk_features(notes: fingerprints.NoteArrays, digests: list[str], shingle_k: int,
                    ioi_resolution: int) -> pa.Table:
    """:func:`_features` of one chunk, measured at once."""
    offsets, values = fingerprints.shingles(notes, shingle_k, ioi_resolution)
    seqs = similarity.Sequences.build(notes, ioi_resolution, melodies=False)
    skyline, top_track = melody_texts(notes)
    return pa.table({
        "digest": pa.array(digests, pa.string()),
        "shingles": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                  pa.array(values, pa.uint64())),
        "tokens": pa.array(seqs.tokens, pa.large_string()),
        "onsets": pa.array(np.asarray(seqs.distinct_onsets, dtype=np.int64), pa.int64()),
        "skyline": pa.array(skyline, pa.large_string()),
        "top_track": pa.array(top_track, pa.large_string()),
    }, schema=FEATURES_SCHEMA)

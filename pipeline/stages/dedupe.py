"""Stage ``dedupe``: exact, transposed, melody and near-duplicate clusters of the ok pieces.

Inputs: ``data/manifest.parquet`` and ``data/notes.parquet`` (see docs/artifacts.md).
Outputs:

- ``data/dedupe/pairs.parquet`` — confirmed pairs ``a`` < ``b`` (sha256), ``tier``, ``similarity``
  (1.0 for the exact tiers ``note``/``transposed``/``melody``; exact shingle Jaccard for ``near``)
  and ``containment`` (exact shingle containment; 1.0 for the exact tiers);
- ``data/dedupe/clusters.parquet`` — every ok piece: ``sha256``, ``cluster_id`` (the smallest
  sha256 of its cluster), ``is_representative`` (one per cluster), ``keep``;
- ``data/dedupe/fingerprint.json`` — the near-copy rule (:class:`~pipeline.similarity.rule.
  NearCopyRule`: shingle settings and thresholds), so the leakage audit in the split stage and
  the audit stage measure similarity exactly as dedupe did;
- ``reports/dedupe.json`` — pieces merged, removed and bound per tier.

Cache: ``.cache/dedupe/`` keeps the measures of every near candidate by the two pieces' notes
(:class:`~pipeline.similarity.duplicates.VerdictStore`) and each piece's fingerprints and winnowed
runs by its notes (:mod:`pipeline.similarity.dedupe_cache`), so a re-run after adding files measures
only the pieces and candidates it has not seen, and builds note-token sequences only for the
pieces of those candidates; ``--no-cache`` measures all. The outputs never depend on it.

Tiers, in order: ``note`` (equal ``note_hash``), ``transposed`` (equal music up to transposition
and time scale), ``melody`` (equal top-voice interval sequence), ``near`` (candidates from MinHash
LSH, shared runs and, for short melodies, LSH over melody intervals, each verified by shingle
Jaccard, containment or alignment). Fingerprints,
candidates and verification live in :mod:`pipeline.similarity.duplicates`, shared with the
contamination stage; this module links and clusters. Each tier's policy is ``drop`` (keep one
piece of those linked by drop-tier pairs), ``bind`` (keep all; the split puts them in one group)
or ``off``.

Invariants: a pair is only recorded when it links pieces not yet linked by earlier tiers of the
same effect (so exact-copy groups appear as stars around their smallest sha256, not as all
pairs); representative = most notes, then smallest sha256; every id and order is derived from
sha256 values, never from file order or worker count.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from pipeline.core import artifacts
from pipeline.core.arrays import unique
from pipeline.core.config import RuntimeConfig, load_runtime, load_section
from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.dedupe_cache import piece_work, sequences_for
from pipeline.similarity.digests import note_digests
from pipeline.similarity.duplicates import (
    NEAR_RULES,
    TIERS,
    DedupeConfig,
    Fingerprints,
    VerdictStore,
    fingerprint,
    near_candidates,
    star_edges,
    verify,
)

HELP = "exact, transposed, melody and near-duplicate clusters"

PAIRS_SCHEMA = pa.schema([("a", pa.string()), ("b", pa.string()), ("tier", pa.string()),
                          ("similarity", pa.float64()), ("containment", pa.float64()),
                          ("rule", pa.string()), ("alignment", pa.float64()),
                          ("part_of", pa.string()), ("part_start", pa.float64()),
                          ("part_end", pa.float64())])
CLUSTERS_SCHEMA = pa.schema([("sha256", pa.string()), ("cluster_id", pa.string()),
                             ("is_representative", pa.bool_()), ("keep", pa.bool_())])


@dataclass(frozen=True)
class DedupeSummary:
    pieces: int
    kept: int
    clusters: int
    pairs: int


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected-component label of each of ``n`` nodes (label = smallest member index)."""
    graph = coo_array((np.ones(a.size, dtype=np.int8), (a, b)), shape=(n, n)).tocsr()
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1 if n else 0, n, dtype=np.int64)
    np.minimum.at(smallest, labels, np.arange(n))
    return smallest[labels]


@dataclass
class _Edges:
    a: list[np.ndarray]
    b: list[np.ndarray]
    tier: list[np.ndarray]
    sim: list[np.ndarray]
    con: list[np.ndarray]
    extra: list[dict[str, np.ndarray]]

    def add(self, a, b, tier: str, sim, con, extra: dict[str, np.ndarray] | None = None) -> None:
        self.a.append(a)
        self.b.append(b)
        self.tier.append(np.full(a.size, tier, dtype=object))
        self.sim.append(np.asarray(sim, dtype=np.float64))
        self.con.append(np.asarray(con, dtype=np.float64))
        self.extra.append(extra or {
            "rule": np.full(a.size, None, dtype=object), "alignment": np.full(a.size, np.nan),
            "part_of": np.full(a.size, None, dtype=object), "part_start": np.full(a.size, np.nan),
            "part_end": np.full(a.size, np.nan)})

    def arrays(self, tiers: set[str] | None = None):
        keep = [k for k, t in enumerate(self.tier) if tiers is None or (t.size and t[0] in tiers)]

        def cat(x, dtype):
            return np.concatenate([x[k] for k in keep]) if keep else np.zeros(0, dtype)

        return (cat(self.a, np.int64), cat(self.b, np.int64), cat(self.tier, object),
                cat(self.sim, np.float64), cat(self.con, np.float64))

    def extras(self) -> dict[str, np.ndarray]:
        """The near tier's columns of every edge, in :meth:`arrays` order (all tiers)."""
        names = ("rule", "alignment", "part_of", "part_start", "part_end")
        if not self.extra:
            return {k: np.zeros(0, object if k in ("rule", "part_of") else np.float64)
                    for k in names}
        return {k: np.concatenate([e[k] for e in self.extra]) for k in names}


def link_tiers(fps: Fingerprints, note_hash: np.ndarray, cfg: DedupeConfig,
               seqs: similarity.Sequences | Callable[[np.ndarray], similarity.Sequences],
               verdicts: VerdictStore | None = None, views: list[np.ndarray] | None = None,
               workers: int = 1) -> tuple[_Edges, dict[str, int]]:
    """Confirmed edges of every tier, skipping pairs already linked by earlier tiers; with
    ``verdicts``, near candidates measured by an earlier run are not measured again. ``seqs``:
    every piece's sequences, or a function giving sequences that hold at least the given
    pieces' (with ``views``, the winnowed runs of every piece; :mod:`pipeline.music.
    dedupe_cache`). ``workers``: threads that align short melodies (results do not change)."""
    n = note_hash.size
    edges = _Edges([], [], [], [], [], [])
    stats: dict[str, int] = {}
    for tier in TIERS:
        policy = getattr(cfg.policy, tier)
        stats[f"{tier}_pairs"] = 0
        if policy == "off":
            continue
        # a drop edge must also be kept when a bind tier already linked the pair (drop differs)
        prev_tiers = {t for t in TIERS if getattr(cfg.policy, t) == "drop"} if policy == "drop" \
            else set(TIERS)
        pa_, pb_, *_ = edges.arrays(prev_tiers)
        label = components(n, pa_, pb_)
        if tier == "note":
            a, b = star_edges(note_hash)
        elif tier == "transposed":
            a, b = star_edges(fps.transposed)
        elif tier == "melody":
            a1, b1 = star_edges(fps.melody[:, 0])
            a2, b2 = star_edges(fps.melody[:, 1])
            a, b = np.concatenate([a1, a2]), np.concatenate([b1, b2])
        else:
            full = isinstance(seqs, similarity.Sequences)
            ca, cb, sa, sb = near_candidates(fps, seqs if full else None, cfg, stats,
                                             views=views, workers=workers)
            fresh = label[ca] != label[cb]
            ca, cb = ca[fresh], cb[fresh]
            if verdicts is not None:
                verdicts.load(ca, cb)
            if not full:  # sequences of the pieces whose pairs are measured here
                seqs = seqs(verdicts.unmeasured(ca, cb) if verdicts is not None
                            else np.unique(np.concatenate([ca, cb])))
            v = verify(fps, seqs, ca, cb, cfg, label, verdicts)
            stats["near_candidates"] = int(ca.size)
            stats["near_rejected"] = int((~v.ok).sum())
            for r in NEAR_RULES:
                stats[f"near_by_{r}"] = int((v.rule == r).sum())
            ok = v.ok
            a, b = np.concatenate([sa, ca[ok]]), np.concatenate([sb, cb[ok]])
            sim = np.concatenate([np.ones(sa.size), v.jaccard[ok]])
            cont = np.concatenate([np.ones(sa.size), v.containment[ok]])
            longer = np.concatenate([np.zeros(sa.size, np.int8), v.longer[ok]])
            excerpt = np.concatenate([np.zeros(sa.size, bool),
                                      np.isin(v.rule[ok], ["containment", "excerpt"])])
            extra = {"rule": np.concatenate([np.full(sa.size, "transposed-key", object),
                                             v.rule[ok]]),
                     "alignment": np.concatenate([np.ones(sa.size), v.alignment[ok]]),
                     "longer": longer, "excerpt": excerpt,
                     "part_start": np.concatenate([np.full(sa.size, np.nan), v.part_start[ok]]),
                     "part_end": np.concatenate([np.full(sa.size, np.nan), v.part_end[ok]])}
        if tier != "near":
            sim = cont = np.ones(a.size)
            extra = None
        # candidates come as i < j, so an excerpt's longer side is a (0) or b (1) after this too
        a, b = np.minimum(a, b), np.maximum(a, b)
        fresh = label[a] != label[b]
        a, b, sim, cont = a[fresh], b[fresh], sim[fresh], cont[fresh]
        # one edge per pair (melody's two keys can name the same pair twice)
        order = np.lexsort((b, a))
        a, b, sim, cont = a[order], b[order], sim[order], cont[order]
        first = np.ones(a.size, dtype=bool)
        first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        near = None
        if extra is not None:
            e = {k: v[fresh][order][first] for k, v in extra.items()}
            a1, b1 = a[first], b[first]
            near = {"rule": e["rule"], "alignment": e["alignment"],
                    "part_of": np.where(e["excerpt"], np.where(e["longer"] == 0, a1, b1), -1),
                    "part_start": np.where(e["excerpt"], e["part_start"], np.nan),
                    "part_end": np.where(e["excerpt"], e["part_end"], np.nan)}
        edges.add(a[first], b[first], tier, sim[first], cont[first], near)
        stats[f"{tier}_pairs"] = int(first.sum())
    return edges, stats


def _best_per_group(label: np.ndarray, n_notes: np.ndarray) -> np.ndarray:
    """Mask of each group's best piece: most notes, then smallest index (= smallest sha256)."""
    idx = np.arange(label.size)
    order = np.lexsort((idx, -n_notes, label))
    first = np.ones(order.size, dtype=bool)
    first[1:] = label[order][1:] != label[order][:-1]
    best = np.zeros(label.size, dtype=bool)
    best[order[first]] = True
    return best


def cluster(edges: _Edges, n_notes: np.ndarray, cfg: DedupeConfig
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Cluster label (smallest member), representative and keep masks, per-tier counts."""
    n = n_notes.size
    drop_tiers = {t for t in TIERS if getattr(cfg.policy, t) == "drop"}
    a, b, *_ = edges.arrays()
    label = components(n, a, b)
    da, db, *_ = edges.arrays(drop_tiers)
    keep = _best_per_group(components(n, da, db), n_notes)
    representative = _best_per_group(label, n_notes)
    counts: dict[str, int] = {}
    done: set[str] = set()
    done_drop: set[str] = set()
    n_all = n_drop = n
    for tier in TIERS:
        done.add(tier)
        xa, xb, *_ = edges.arrays(done)
        now = unique(components(n, xa, xb)).size
        counts[f"{tier}_merged"] = n_all - now
        n_all = now
        removed = bound = 0
        if tier in drop_tiers:
            done_drop.add(tier)
            xa, xb, *_ = edges.arrays(done_drop)
            now_drop = unique(components(n, xa, xb)).size
            removed, n_drop = n_drop - now_drop, now_drop
        elif getattr(cfg.policy, tier) == "bind":
            bound = counts[f"{tier}_merged"]
        counts[f"{tier}_removed"] = removed
        counts[f"{tier}_bound"] = bound
    return label, representative, keep, counts


# ---------------------------------------------------------------------------------------------
# the stage


def load_inputs(manifest: Path, notes: Path) -> tuple[pa.Table, fp.NoteArrays, dict[str, int]]:
    """Ok manifest rows (sorted by sha256) and their notes aligned to them (missing -> empty)."""
    man = artifacts.read_table(manifest, columns=["sha256", "status", "note_hash", "n_notes"])
    counts = {s: int(pc.sum(pc.equal(man["status"], s)).as_py() or 0)
              for s in ("ok", "duplicate", "quarantined")}
    ok = man.filter(pc.equal(man["status"], "ok"))
    ok = ok.take(pc.sort_indices(ok, sort_keys=[("sha256", "ascending")]))
    shas = ok["sha256"]
    if len(pc.unique(shas)) != len(shas):
        raise ValueError(f"{manifest}: sha256 repeats among ok rows; re-run ingest")
    cols = ["sha256", "onset", "duration", "pitch", "is_drum", "track"]
    table = artifacts.read_table(notes, columns=cols)
    counts["notes_not_in_manifest"] = int(pc.sum(pc.invert(pc.is_in(table["sha256"], shas))).as_py()
                                          or 0)
    missing = pc.filter(shas, pc.invert(pc.is_in(shas, table["sha256"])))
    counts["ok_without_notes"] = len(missing)
    if len(missing):
        empty = pa.table({c: (missing if c == "sha256" else
                              pa.array([[]] * len(missing), type=table.schema.field(c).type))
                          for c in cols}, schema=table.schema)
        table = pa.concat_tables([table, empty])
    return ok, fp.notes_from_table(table, keep=shas.combine_chunks()), counts


def run(cfg: DedupeConfig, runtime: RuntimeConfig, *, manifest: Path, notes: Path, out_dir: Path,
        report: Path, cache_dir: Path | None = None) -> DedupeSummary:
    """Dedupe the ok pieces. With ``cache_dir``, the measures of near candidates are kept there
    (:class:`~pipeline.similarity.duplicates.VerdictStore`) and reused by later runs, so adding
    files
    costs about their new candidates; the outputs are the same with or without it."""
    t0 = time.perf_counter()
    ok, note_arrays, counts = load_inputs(manifest, notes)
    shas = note_arrays.sha256  # sorted by sha256, aligned with ``ok``
    note_hash = np.asarray(ok["note_hash"].fill_null("").to_pylist(), dtype=object)
    verdicts, views, features = None, None, {}
    if cache_dir is not None:
        digests = note_digests(note_arrays)
        work = piece_work(note_arrays, cfg, digests, cache_dir, runtime.n_workers(),
                          runtime.progress, features)
        fps, views = work.fps, work.views
        seqs = partial(sequences_for, note_arrays, ioi_resolution=cfg.ioi_resolution,
                       distinct_onsets=work.distinct_onsets)
        verdicts = VerdictStore(cache_dir, cfg, digests)
    else:
        fps = fingerprint(note_arrays, cfg, runtime.n_workers(), runtime.progress)
        seqs = similarity.Sequences.build(note_arrays, cfg.ioi_resolution)
    t1 = time.perf_counter()
    edges, stats = link_tiers(fps, note_hash, cfg, seqs, verdicts, views, runtime.n_workers())
    verdicts_new = verdicts.save() if verdicts is not None else 0
    label, rep, keep, tier_counts = cluster(edges, note_arrays.lengths, cfg)
    t2 = time.perf_counter()

    a, b, tier, sim, con = edges.arrays()
    extra = edges.extras()
    order = np.lexsort((b, a))
    part_of = [shas[int(k)] if isinstance(k, int | np.integer) and k >= 0 else None
               for k in extra["part_of"][order].tolist()]
    artifacts.write_parquet(out_dir / "pairs.parquet", pa.table({
        "a": shas[a[order]].tolist(), "b": shas[b[order]].tolist(), "tier": tier[order].tolist(),
        "similarity": np.round(sim[order], 12), "containment": np.round(con[order], 12),
        "rule": extra["rule"][order].tolist(),
        "alignment": np.round(extra["alignment"][order].astype(np.float64), 12),
        "part_of": part_of, "part_start": extra["part_start"][order].astype(np.float64),
        "part_end": extra["part_end"][order].astype(np.float64),
    }, schema=PAIRS_SCHEMA))
    artifacts.write_parquet(out_dir / "clusters.parquet", pa.table({
        "sha256": shas.tolist(), "cluster_id": shas[label].tolist(),
        "is_representative": rep, "keep": keep,
    }, schema=CLUSTERS_SCHEMA))
    artifacts.write_json(out_dir / "fingerprint.json", cfg.rule.to_json())
    sizes = np.bincount(label, minlength=label.size)
    sizes = sizes[sizes > 0]
    artifacts.write_json(report, {
        "pieces_ok": int(shas.size), "byte_duplicates": counts["duplicate"],
        "quarantined": counts["quarantined"], "ok_without_notes": counts["ok_without_notes"],
        "notes_not_in_manifest": counts["notes_not_in_manifest"],
        "kept": int(keep.sum()), "removed": int((~keep).sum()),
        "clusters": int(sizes.size), "clusters_multi": int((sizes > 1).sum()),
        "pieces_in_multi_clusters": int(sizes[sizes > 1].sum()),
        "largest_cluster": int(sizes.max(initial=0)), "pairs": int(a.size),
        "melody_too_short": int((fps.melody == "").all(axis=1).sum()),
        **stats, **tier_counts,
    })
    artifacts.write_sidecar(report.with_suffix(".env.json"), {
        "seconds_fingerprints": round(t1 - t0, 3), "seconds_linking": round(t2 - t1, 3),
        "workers": runtime.n_workers(),
        # near candidates whose measures came from .cache/dedupe, and those measured here
        "verdicts_reused": verdicts.hits if verdicts is not None else 0,
        "verdicts_measured": verdicts_new,
        # pieces whose fingerprints and winnowed runs came from .cache/dedupe, digests measured
        **features,
    })
    return DedupeSummary(int(shas.size), int(keep.sum()), int(sizes.size), int(a.size))


# --------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("data/manifest.parquet"))
    parser.add_argument("--notes", type=Path, default=Path("data/notes.parquet"))
    parser.add_argument("--out-dir", type=Path, default=Path("data/dedupe"))
    parser.add_argument("--report", type=Path, default=Path("reports/dedupe.json"))
    parser.add_argument("--workers", help="override runtime.workers (does not change results)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/dedupe"),
                        help="measures of near candidates by the pieces' notes (does not change "
                             "results)")
    parser.add_argument("--no-cache", action="store_true", help="measure every candidate")


def main(args: argparse.Namespace) -> int:
    cfg = load_section("dedupe", args.params, DedupeConfig)
    runtime = load_runtime(args.params, args.workers)
    s = run(cfg, runtime, manifest=args.manifest, notes=args.notes, out_dir=args.out_dir,
            report=args.report, cache_dir=None if args.no_cache else args.cache_dir)
    print(f"dedupe: {s.pieces} ok pieces -> {s.kept} kept, {s.clusters} clusters, "
          f"{s.pairs} confirmed pairs")
    return 0

"""Reference corpora and the held-out pieces checked against them: the contamination stage's
work (:mod:`pipeline.stages.contamination` writes what it finds).

A reference corpus is a folder of MIDI files (found as the corpus stage finds them), a file list
(``.txt``: one path per line; ``.csv``: a ``path`` column; paths relative to the list's folder) or
another symkit project's ``manifest.parquet`` with its ``notes.parquet`` beside it
(:func:`resolve` checks it and names it by a :class:`ReferenceSource`). Files are ingested exactly
as the ingest stage does, with the project's ``ingest`` settings: a bad file is quarantined with
its reason and listed, never dropped silently. Ingest and fingerprints are cached under a cache
folder by the reference's content hash (every file's sha256 and the settings), so a corpus is
parsed and fingerprinted once, and read back on later runs (:func:`load_reference`).

:func:`held_out` fingerprints the pieces of the splits checked; :func:`match` links each of them
with the reference pieces that dedupe's tiers link (:mod:`pipeline.similarity.duplicates`, its
near tier with candidates across the two corpora only), at the first tier that links them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.music import ingestion as ingest
from pipeline.music.midi import list_midi_paths
from pipeline.similarity import alignment as similarity
from pipeline.similarity import duplicates as dedupe
from pipeline.similarity import fingerprints as fp

CACHE_FORMAT = 2
"""Bump when the cached tables change meaning: older cache entries are then ignored."""
FP_SCHEMA = pa.schema([("sha256", pa.string()), ("transposed", pa.string()),
                       ("melody_skyline", pa.string()), ("melody_top", pa.string()),
                       ("shingles", pa.large_list(pa.uint64())),
                       ("signature", pa.large_list(pa.uint32())),
                       ("short_melody", pa.string()),
                       ("short_signature", pa.large_list(pa.uint32()))])
"""A reference's fingerprints (:class:`pipeline.similarity.duplicates.Fingerprints`);
``short_signature`` is empty where ``short_melody`` is."""
NOTE_COLUMNS = ["sha256", "onset", "duration", "pitch", "is_drum", "track"]
LIST_SUFFIXES = (".txt", ".csv")


# ---------------------------------------------------------------------------------------------
# reference corpora


@dataclass(frozen=True)
class ReferenceSource:
    """Where a reference corpus is and how to read it."""

    name: str  # as the user wrote it (recorded in the outputs)
    kind: Literal["folder", "list", "manifest"]
    root: Path  # folder the file paths are relative to (the manifest's folder for "manifest")
    files: tuple[str, ...] = ()


def resolve(spec: str, key: str = "contamination.against") -> ReferenceSource:
    """A reference as given in params or ``--against``, checked before any work: a bad one
    stops the stage with a message naming the key, the value and what is allowed."""
    path = Path(spec)
    allowed = ("a folder of MIDI files, a file list (.txt, or .csv with a 'path' column) or a "
               "symkit manifest.parquet with notes.parquet beside it")
    if path.is_dir():
        files = tuple(list_midi_paths(path))
        return ReferenceSource(spec, "folder", path, files)
    if not path.is_file():
        raise ParamsError(f"{key}: {spec!r} does not exist; allowed: {allowed}")
    if path.suffix.lower() == ".parquet":
        if not (path.parent / "notes.parquet").is_file():
            raise ParamsError(f"{key}: {spec!r} has no notes.parquet beside it; allowed: "
                              f"{allowed}")
        return ReferenceSource(spec, "manifest", path.parent)
    if path.suffix.lower() not in LIST_SUFFIXES:
        raise ParamsError(f"{key}: {spec!r} is neither a folder, a .txt/.csv file list nor a "
                          f".parquet manifest; allowed: {allowed}")
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if "path" not in (reader.fieldnames or []):
                raise ParamsError(f"{key}: {spec!r} has no 'path' column; allowed: {allowed}")
            listed = [r["path"].strip() for r in reader if (r["path"] or "").strip()]
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        listed = [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]
    files = tuple(sorted(set(listed)))
    missing = [f for f in files if not (path.parent / f).is_file()]
    if missing:
        raise ParamsError(f"{key}: {spec!r} lists {len(missing)} file(s) that do not exist, "
                          f"e.g. {missing[:3]} (paths are relative to the list's folder)")
    return ReferenceSource(spec, "list", path.parent, files)


@dataclass(frozen=True)
class Side:
    """Pieces of one corpus with their fingerprints, sorted by sha256."""

    sha256: np.ndarray
    path: np.ndarray
    split: np.ndarray  # "" for a reference
    note_hash: np.ndarray
    notes: fp.NoteArrays
    fps: dedupe.Fingerprints

    @property
    def n(self) -> int:
        return int(self.sha256.size)


@dataclass(frozen=True)
class Reference:
    source: ReferenceSource
    content_hash: str
    manifest: pd.DataFrame  # path, sha256, status, reason, detail (every file)
    side: Side
    views: list[np.ndarray]  # duplicates.winnow_views of the reference alone
    cached: bool


def fingerprint_key(cfg: dedupe.DedupeConfig) -> str:
    """Hash of the settings that fingerprints depend on (the cache key's second half)."""
    keys = ("shingle_k", "ioi_resolution", "num_perm", "seed", "min_melody_notes",
            "melody_rhythm", "min_align_onsets", "short_melody_notes", "min_shingles")
    return artifacts.sha256_json({"format": CACHE_FORMAT,
                                  **{k: getattr(cfg, k) for k in keys}})[:16]


def content_hash(src: ReferenceSource, ingest_cfg: ingest.IngestConfig) -> str:
    """The reference's identity: every file's path and sha256 (or a manifest's and its notes'
    bytes) and the ingest settings that judged them."""
    if src.kind == "manifest":
        content: dict = {"manifest": artifacts.sha256_file(Path(src.name)),
                         "notes": artifacts.sha256_file(src.root / "notes.parquet")}
    else:
        content = {"files": [[f, artifacts.sha256_file(src.root / f)] for f in src.files],
                   "ingest": ingest_cfg.model_dump(mode="json")}
    return artifacts.sha256_json({"format": CACHE_FORMAT, **content})[:20]


def _write_fps(path: Path, sha256: np.ndarray, fps: dedupe.Fingerprints) -> None:
    n_perm = fps.signatures.shape[1]
    short = fps.short_melody != ""
    artifacts.write_parquet(path, pa.table({
        "sha256": sha256.tolist(), "transposed": fps.transposed.tolist(),
        "melody_skyline": fps.melody[:, 0].tolist(), "melody_top": fps.melody[:, 1].tolist(),
        "shingles": pa.LargeListArray.from_arrays(
            pa.array(fps.shingle_offsets, pa.int64()), pa.array(fps.shingles, pa.uint64())),
        "signature": pa.LargeListArray.from_arrays(
            pa.array(np.arange(sha256.size + 1, dtype=np.int64) * n_perm, pa.int64()),
            pa.array(fps.signatures.ravel(), pa.uint32())),
        "short_melody": pa.array(fps.short_melody.tolist(), pa.string()),
        "short_signature": pa.LargeListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(np.where(short, n_perm, 0))]), pa.int64()),
            pa.array(fps.short_signatures[short].ravel(), pa.uint32())),
    }, schema=FP_SCHEMA))


def _read_fps(path: Path, num_perm: int) -> tuple[np.ndarray, dedupe.Fingerprints]:
    t = artifacts.read_table(path)
    counts = pc.list_value_length(t["shingles"]).to_numpy(zero_copy_only=False)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    def flat(name: str, dtype) -> np.ndarray:
        col = pc.list_flatten(t[name].combine_chunks())
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=dtype)

    melody = np.stack([np.asarray(t["melody_skyline"].to_pylist(), dtype=object),
                       np.asarray(t["melody_top"].to_pylist(), dtype=object)], axis=1) \
        if len(t) else np.zeros((0, 2), object)
    short = np.asarray(t["short_melody"].to_pylist(), dtype=object).reshape(len(t))
    short_sig = np.full((len(t), num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    short_sig[short != ""] = flat("short_signature", np.uint32).reshape(-1, num_perm)
    fps = dedupe.Fingerprints(np.asarray(t["transposed"].to_pylist(), dtype=object), melody,
                              offsets, flat("shingles", np.uint64),
                              flat("signature", np.uint32).reshape(len(t), num_perm),
                              short, short_sig)
    return np.asarray(t["sha256"].to_pylist(), dtype=object), fps


def _views(path: Path, notes: fp.NoteArrays, cfg: dedupe.DedupeConfig
           ) -> tuple[list[np.ndarray], bool]:
    """The reference's winnowed run hashes, read from ``path`` or computed and written there."""
    if path.is_file():
        t = artifacts.read_table(path)
        view = t["view"].to_numpy()
        packed = t["packed"].to_numpy()
        return [packed[view == k] for k in range(3)], True
    views = dedupe.winnow_views(similarity.Sequences.build(notes, cfg.ioi_resolution), cfg)
    artifacts.write_parquet(path, pa.table({
        "view": pa.array(np.repeat(np.arange(len(views), dtype=np.int8),
                                   [v.size for v in views])),
        "packed": pa.array(np.concatenate(views), pa.uint64())}))
    return views, False


def _ok_side(manifest: pd.DataFrame, notes_path: Path, cfg: dedupe.DedupeConfig,
             runtime: RuntimeConfig, fps_path: Path) -> tuple[Side, bool]:
    """The ok pieces of an ingested reference, fingerprinted (or read from ``fps_path``)."""
    ok = manifest[manifest["status"] == "ok"].sort_values("sha256", kind="stable")
    ok = ok.drop_duplicates("sha256")
    table = artifacts.read_table(notes_path, columns=NOTE_COLUMNS)
    notes = fp.notes_from_table(table, keep=ok["sha256"].tolist())
    if notes.n_pieces != len(ok):
        raise artifacts.ArtifactError(f"{notes_path.as_posix()}: {len(ok)} ok pieces but notes "
                                      f"for {notes.n_pieces}")
    hit = fps_path.is_file()
    if hit:
        shas, fps = _read_fps(fps_path, cfg.num_perm)
        hit = shas.tolist() == notes.sha256.tolist()
    if not hit:
        fps = dedupe.fingerprint(notes, cfg, runtime.n_workers(), runtime.progress)
        _write_fps(fps_path, notes.sha256, fps)
    side = Side(notes.sha256, ok["path"].to_numpy(dtype=object),
                np.full(len(ok), "", dtype=object), ok["note_hash"].to_numpy(dtype=object), notes,
                fps)
    return side, hit


MANIFEST_COLUMNS = ["path", "sha256", "status", "reason", "detail", "note_hash"]


def load_reference(src: ReferenceSource, ingest_cfg: ingest.IngestConfig, cfg: dedupe.DedupeConfig,
                   runtime: RuntimeConfig, cache_dir: Path) -> Reference:
    """Ingest (or read) a reference corpus and fingerprint it, through the cache."""
    key = content_hash(src, ingest_cfg)
    entry = cache_dir / key
    fps_path = entry / f"fingerprints-{fingerprint_key(cfg)}.parquet"
    if src.kind == "manifest":
        manifest_path, notes_path, parsed = Path(src.name), src.root / "notes.parquet", True
    else:
        manifest_path, notes_path = entry / "ingest" / "manifest.parquet", \
            entry / "ingest" / "notes.parquet"
        parsed = manifest_path.is_file() and notes_path.is_file()
        if not parsed:
            with artifacts.atomic_dir(entry / "ingest") as tmp:
                ingest.run(ingest_cfg, runtime, raw_dir=src.root, metadata=None,
                           manifest=tmp / "manifest.parquet", notes=tmp / "notes.parquet",
                           report=tmp / "ingest.json", files=list(src.files))
    manifest = artifacts.read_parquet(manifest_path, columns=MANIFEST_COLUMNS)
    side, fps_hit = _ok_side(manifest, notes_path, cfg, runtime, fps_path)
    views, views_hit = _views(fps_path.with_name(fps_path.name.replace("fingerprints-",
                                                                       "runs-")), side.notes, cfg)
    return Reference(src, key, manifest.sort_values("path", kind="stable").reset_index(drop=True),
                     side, views, parsed and fps_hit and views_hit)


# ---------------------------------------------------------------------------------------------
# the held-out pieces


def held_out(manifest: Path, notes: Path, splits: Path, wanted: list[str],
             cfg: dedupe.DedupeConfig, runtime: RuntimeConfig) -> Side:
    """The pieces of the ``wanted`` splits with their notes and fingerprints."""
    split = artifacts.read_parquet(splits, columns=["sha256", "split"])
    split = split[split["split"].isin(wanted)]
    man = artifacts.read_parquet(manifest, columns=["sha256", "status", "path", "note_hash"])
    man = man[man["status"] == "ok"].drop_duplicates("sha256")
    rows = split.merge(man, on="sha256", how="left").sort_values("sha256", kind="stable")
    lost = rows["path"].isna()
    if lost.any():
        raise artifacts.ArtifactError.for_path(
            splits, f"names {int(lost.sum())} piece(s) that are not ok rows of "
                    f"{manifest.as_posix()}, e.g. {rows['sha256'][lost].iloc[0]}")
    table = artifacts.read_table(notes, columns=NOTE_COLUMNS)
    arrays = fp.notes_from_table(table, keep=rows["sha256"].tolist())
    if arrays.sha256.tolist() != rows["sha256"].tolist():
        raise artifacts.ArtifactError.for_path(notes, "lacks the notes of some held-out pieces")
    fps = dedupe.fingerprint(arrays, cfg, runtime.n_workers(), runtime.progress)
    return Side(arrays.sha256, rows["path"].to_numpy(dtype=object),
                rows["split"].to_numpy(dtype=object), rows["note_hash"].to_numpy(dtype=object),
                arrays, fps)


# ---------------------------------------------------------------------------------------------
# matching


def _concat_notes(a: fp.NoteArrays, b: fp.NoteArrays) -> fp.NoteArrays:
    return fp.NoteArrays(np.concatenate([a.sha256, b.sha256]),
                         np.concatenate([a.offsets, b.offsets[1:] + a.offsets[-1]]),
                         *(np.concatenate([getattr(a, c), getattr(b, c)])
                           for c in ("onset", "duration", "pitch", "is_drum", "track")))


def _concat_fps(a: dedupe.Fingerprints, b: dedupe.Fingerprints) -> dedupe.Fingerprints:
    return dedupe.Fingerprints(
        np.concatenate([a.transposed, b.transposed]), np.concatenate([a.melody, b.melody]),
        np.concatenate([a.shingle_offsets, b.shingle_offsets[1:] + a.shingle_offsets[-1]]),
        np.concatenate([a.shingles, b.shingles]), np.concatenate([a.signatures, b.signatures]),
        np.concatenate([a.short_melody, b.short_melody]),
        np.concatenate([a.short_signatures, b.short_signatures]))


def _note_rows(offsets: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Row numbers of pieces ``idx`` in a flat table with ``offsets``, piece after piece."""
    lengths = offsets[idx + 1] - offsets[idx]
    return np.repeat(offsets[idx], lengths) + np.arange(lengths.sum()) - np.repeat(
        np.cumsum(lengths) - lengths, lengths)


def _take_notes(n: fp.NoteArrays, idx: np.ndarray) -> fp.NoteArrays:
    rows = _note_rows(n.offsets, idx)
    offsets = np.concatenate([[0], np.cumsum(n.offsets[idx + 1] - n.offsets[idx])])
    return fp.NoteArrays(n.sha256[idx], offsets,
                         *(getattr(n, c)[rows]
                           for c in ("onset", "duration", "pitch", "is_drum", "track")))


def _take_fps(f: dedupe.Fingerprints, idx: np.ndarray) -> dedupe.Fingerprints:
    counts = f.shingle_offsets[idx + 1] - f.shingle_offsets[idx]
    return dedupe.Fingerprints(f.transposed[idx], f.melody[idx],
                               np.concatenate([[0], np.cumsum(counts)]),
                               f.shingles[_note_rows(f.shingle_offsets, idx)],
                               f.signatures[idx], f.short_melody[idx], f.short_signatures[idx])


def equal_keys(q: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (query, reference) with equal non-empty keys."""
    left = pd.DataFrame({"k": q, "qi": np.arange(q.size)})
    right = pd.DataFrame({"k": r, "ri": np.arange(r.size)})
    m = left[left["k"] != ""].merge(right[right["k"] != ""], on="k")
    return m["qi"].to_numpy(np.int64), m["ri"].to_numpy(np.int64)


def match(q: Side, r: Side, r_views: list[np.ndarray], cfg: dedupe.DedupeConfig
          ) -> pd.DataFrame:
    """Every (held-out piece, reference piece) pair that some tier links, at its first tier.
    ``r_views``: the reference's :func:`~pipeline.similarity.duplicates.winnow_views`."""
    found: dict[tuple[int, int], dict] = {}

    def add(qi: np.ndarray, ri: np.ndarray, tier: str, **cols: np.ndarray) -> None:
        for k, (i, j) in enumerate(zip(qi.tolist(), ri.tolist(), strict=True)):
            if (i, j) not in found:
                found[(i, j)] = {"qi": i, "ri": j, "tier": tier,
                                 **{c: v[k] for c, v in cols.items()}}

    one = np.ones
    for tier, kq, kr in (("note", q.note_hash, r.note_hash),
                         ("transposed", q.fps.transposed, r.fps.transposed),
                         ("melody", q.fps.melody[:, 0], r.fps.melody[:, 0]),
                         ("melody", q.fps.melody[:, 1], r.fps.melody[:, 1])):
        qi, ri = equal_keys(kq, kr)
        add(qi, ri, tier, similarity=one(qi.size), containment=one(qi.size))

    if q.n and r.n:
        # candidates: the reference's runs come from its cache, shifted past the query pieces
        shift = np.uint64(q.n) << np.uint64(similarity.KEY_BITS)
        q_views = dedupe.winnow_views(similarity.Sequences.build(q.notes, cfg.ioi_resolution),
                                      cfg)
        views = [np.concatenate([qv, rv + shift]) for qv, rv in zip(q_views, r_views,
                                                                    strict=True)]
        side = np.repeat(np.array([0, 1], np.int8), [q.n, r.n])
        ca, cb, _, _ = dedupe.near_candidates(_concat_fps(q.fps, r.fps), None, cfg, {},
                                              side=side, views=views)
        fresh = np.array([(i, j - q.n) not in found
                          for i, j in zip(ca.tolist(), cb.tolist(), strict=True)], dtype=bool)
        ca, cb = ca[fresh], cb[fresh]
        # verification: the query pieces and only the reference pieces proposed
        used = np.unique(cb - q.n)
        fps = _concat_fps(q.fps, _take_fps(r.fps, used))
        seqs = similarity.Sequences.build(_concat_notes(q.notes, _take_notes(r.notes, used)),
                                          cfg.ioi_resolution)
        v = dedupe.verify(fps, seqs, ca, q.n + np.searchsorted(used, cb - q.n), cfg)
        ok = v.ok
        excerpt = np.isin(v.rule[ok], ["containment", "excerpt"])
        longer = v.longer[ok]
        qi, ri = ca[ok], cb[ok] - q.n
        part_of = np.where(~excerpt, None,
                           np.where(longer == 0, q.sha256[qi], r.sha256[ri]).astype(object))
        cols = {"rule": v.rule[ok], "similarity": v.jaccard[ok],
                "containment": v.containment[ok], "alignment": v.alignment[ok],
                "part_of": part_of, "part_start": np.where(excerpt, v.part_start[ok], np.nan),
                "part_end": np.where(excerpt, v.part_end[ok], np.nan)}
        add(qi, ri, "near", **cols)
        # the other reference pieces with the confirmed one's transposed key hold the same music
        # (LSH proposed one of them): the same measures hold for them
        key = np.where(np.diff(r.fps.shingle_offsets) >= cfg.rule.min_shingles, r.fps.transposed,
                       "")
        ri_key = key[ri]
        mates = pd.DataFrame({"k": key, "mate": np.arange(r.n)})
        linked = pd.DataFrame({"k": ri_key, "row": np.arange(ri.size)})
        m = linked[linked["k"] != ""].merge(mates, on="k").sort_values(["row", "mate"])
        rows = m["row"].to_numpy(np.int64)
        add(qi[rows], m["mate"].to_numpy(np.int64), "near",
            **{c: v_[rows] for c, v_ in cols.items()})

    out = pd.DataFrame(list(found.values()),
                       columns=["qi", "ri", "tier", "rule", "similarity", "containment",
                                "alignment", "part_of", "part_start", "part_end"])
    return out

"""Duplicate detection shared by the dedupe and contamination stages: the settings (those that
define a near copy are :class:`~pipeline.similarity.rule.NearCopySettings`), per-piece
fingerprints, the near tier's candidate pairs and their verification, and the store of measured
pairs that dedupe keeps between runs (:class:`VerdictStore`).

Tiers, in order: ``note`` (equal ``note_hash``), ``transposed`` (equal music up to transposition
and time scale), ``melody`` (equal top-voice interval sequence), ``near`` (candidates from MinHash
LSH over transposition/tempo-invariant shingles, from shared runs of note tokens or melody
intervals and, for short melodies, from :mod:`pipeline.similarity.short_melodies`, each verified by
:func:`verify`). The dedupe stage links the pieces of one corpus with them; the contamination
stage links held-out pieces with the pieces of another corpus (``side`` in
:func:`near_candidates`), so "duplicate" means the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipeline.core import artifacts
from pipeline.core.arrays import unique
from pipeline.core.config import StageConfig
from pipeline.core.parallel import ordered_map
from pipeline.core.segments import SegmentStore
from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import lsh, melody, short_melodies
from pipeline.similarity.rule import NearCopyRule, NearCopySettings

TIERS = ("note", "transposed", "melody", "near")
Policy = Literal["drop", "bind", "off"]
LSH_WEIGHTS = lsh.WEIGHTS

NEAR_RULES = ("jaccard", "containment", "alignment", "melody", "excerpt")
"""What confirms a near pair, in the order the ``rule`` column names the first that holds."""


class TierPolicy(StageConfig):
    """What a confirmed pair of each tier does: drop (keep one), bind (same split) or off."""

    note: Policy = "drop"
    transposed: Policy = "drop"
    melody: Policy = "bind"
    near: Policy = "bind"


class DedupeConfig(NearCopySettings):
    """``dedupe`` section of params.yaml; each key is documented there, beside its value. The
    keys that define a near copy are declared in :class:`~pipeline.similarity.rule.
    NearCopySettings`; :attr:`rule` is the rule they make."""

    SECTION: ClassVar[str] = "dedupe"

    policy: TierPolicy = TierPolicy()
    num_perm: int = Field(128, ge=16, le=1024)
    seed: int = Field(1, ge=0, le=4294967295)
    lsh_threshold: float = Field(0.4, gt=0.0, le=1.0)
    melody_rhythm: bool = False
    max_df: int = Field(50, ge=2)
    candidate_share: float = Field(0.1, gt=0.0, le=1.0)
    short_melody_notes: int = Field(128, ge=0)

    @property
    def rule(self) -> NearCopyRule:
        """The near-copy rule of these settings (:meth:`~pipeline.similarity.rule.NearCopyRule.
        of`)."""
        return NearCopyRule.of(self)

    @field_validator("short_melody_notes")
    @classmethod
    def _short_melodies_comparable(cls, v: int, info: ValidationInfo) -> int:
        least = info.data.get("min_melody_notes")
        if v and least is not None and v < least:
            raise ValueError(f"must be 0 (off) or at least min_melody_notes ({least}): shorter "
                             f"melodies are never compared")
        return v

    @model_validator(mode="after")
    def _lsh_below_verification(self) -> DedupeConfig:
        if self.lsh_threshold > self.near_jaccard:
            raise ValueError(f"lsh_threshold ({self.lsh_threshold}) must be <= near_jaccard "
                             f"({self.near_jaccard}), else pairs between them are never found")
        if self.short_melody_notes and self.short_melody_threshold <= 0.0:
            raise ValueError(
                f"short_melody_notes ({self.short_melody_notes}) needs an alignment threshold "
                f"above {1 - 3 / (2 * (self.shingle_k + 1)):.3f} for shingle_k "
                f"{self.shingle_k} (it is {self.rule.alignment:.3f}): below it no melody Jaccard "
                f"marks the edit rate; set near_alignment higher or short_melody_notes to 0")
        return self

    @property
    def short_melody_threshold(self) -> float:
        """The Jaccard the short-melody LSH targets, derived from the alignment threshold
        (:func:`pipeline.similarity.short_melodies.lsh_threshold`)."""
        return short_melodies.lsh_threshold(self.rule.alignment, self.shingle_k)


@dataclass(frozen=True)
class Fingerprints:
    """Fingerprints of pieces ``0..P-1`` (sorted by sha256)."""

    transposed: np.ndarray  # (P,) str, "" for empty pieces
    melody: np.ndarray  # (P, 2) str, "" where too short
    shingle_offsets: np.ndarray  # (P+1,)
    shingles: np.ndarray  # (S,) uint64, sorted within each piece
    signatures: np.ndarray  # (P, num_perm) uint32
    short_melody: np.ndarray  # (P,) str, skyline intervals of a short melody, else ""
    short_signatures: np.ndarray  # (P, num_perm) uint32, of short_melody's k-grams

    def shingle_set(self, i: int) -> np.ndarray:
        return self.shingles[self.shingle_offsets[i] : self.shingle_offsets[i + 1]]


# ---------------------------------------------------------------------------------------------
# fingerprints (parallel over chunks of pieces; output independent of chunking)


def _fingerprint_chunk(item: tuple[fp.NoteArrays, DedupeConfig]) -> tuple:
    notes, cfg = item
    perms = fp.minhash_permutations(cfg.num_perm, cfg.seed)
    off, vals = fp.shingles(notes, cfg.shingle_k, cfg.ioi_resolution)
    sig = fp.minhash_signatures(off, vals, perms)
    mel, (m_off, intervals) = melody.melody_keys_and_skyline(
        notes, min_notes=cfg.min_melody_notes, rhythm=cfg.melody_rhythm,
        ioi_resolution=cfg.ioi_resolution)
    short = short_melodies.texts(m_off, intervals, cfg.min_melody_notes,
                                 cfg.short_melody_notes, cfg.shingle_k, cfg.min_shingles)
    short_sig = short_melodies.signatures(short, cfg.shingle_k, perms)
    return fp.transposed_keys(notes), mel, np.diff(off), vals, sig, short, short_sig


def fingerprint(notes: fp.NoteArrays, cfg: DedupeConfig, workers: int = 1,
                show_progress: bool | str = False) -> Fingerprints:
    """Fingerprints of every piece, computed in chunks (in parallel when ``workers`` > 1)."""
    chunks = notes.chunks()
    parts = ordered_map(_fingerprint_chunk, [(c, cfg) for c in chunks], workers=workers,
                        desc="fingerprints", show_progress=show_progress)
    if not parts:
        empty = np.zeros(0, dtype=object)
        no_sig = np.zeros((0, cfg.num_perm), np.uint32)
        return Fingerprints(empty, np.zeros((0, 2), object), np.zeros(1, np.int64),
                            np.zeros(0, np.uint64), no_sig, empty, no_sig)
    counts = np.concatenate([p[2] for p in parts])
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    def cat(k: int) -> np.ndarray:
        return np.concatenate([p[k] for p in parts])

    return Fingerprints(cat(0), cat(1), offsets, cat(3), cat(4), cat(5), cat(6))


# ---------------------------------------------------------------------------------------------
# candidate pairs per tier


def star_edges(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pieces with equal non-empty key: edges from each group's smallest index to the others."""
    idx = np.flatnonzero(keys != "")
    if idx.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = keys[idx].astype(str)
    order = np.lexsort((idx, k))
    idx, k = idx[order], k[order]
    new = np.ones(idx.size, dtype=bool)
    new[1:] = k[1:] != k[:-1]
    center = idx[np.flatnonzero(new)[np.cumsum(new) - 1]]
    member = ~new
    return center[member], idx[member]


def lsh_bands(cfg: DedupeConfig) -> tuple[int, int]:
    """(bands, rows per band) that datasketch's MinHashLSH chooses for ``lsh_threshold``."""
    return lsh.bands(cfg.lsh_threshold, cfg.num_perm)


def lsh_candidates(signatures: np.ndarray, pieces: np.ndarray, cfg: DedupeConfig
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs ``i < j`` among ``pieces`` whose shingle signatures share all the rows
    of some band (:func:`pipeline.similarity.lsh.pairs_within` at ``lsh_threshold``)."""
    return lsh.pairs_within(signatures, pieces, lsh_bands(cfg))


def cross_lsh_candidates(signatures: np.ndarray, queries: np.ndarray, pool: np.ndarray,
                         cfg: DedupeConfig) -> tuple[np.ndarray, np.ndarray]:
    """The :func:`lsh_candidates` that pair a ``queries`` piece with a ``pool`` piece, without
    forming the pool's own pairs (:func:`pipeline.similarity.lsh.pairs_across`)."""
    return lsh.pairs_across(signatures, queries, pool, lsh_bands(cfg))


@dataclass(frozen=True)
class Verified:
    """Each candidate's measures and the mask of confirmed pairs."""

    ok: np.ndarray
    jaccard: np.ndarray
    containment: np.ndarray
    rule: np.ndarray  # first rule of NEAR_RULES that holds ("" when none)
    alignment: np.ndarray  # the alignment similarity of that rule (NaN for shingle rules)
    longer: np.ndarray  # 0: a is longer, 1: b (an excerpt's location is in the longer piece)
    part_start: np.ndarray
    part_end: np.ndarray


def verify(fps: Fingerprints, seqs: similarity.Sequences, a: np.ndarray, b: np.ndarray,
           cfg: DedupeConfig, label: np.ndarray | None = None,
           verdicts: VerdictStore | None = None) -> Verified:
    """Check each candidate pair against the near rules, in order: exact shingle Jaccard
    >= ``near_jaccard`` or containment >= ``near_containment`` (both pieces with at least
    ``min_shingles`` shingles); alignment similarity >= the alignment threshold of the whole
    note-token sequences, or of the melodies (both of at least ``min_melody_notes`` notes), or
    of the shorter piece with the stretch of the longer where it lies (an excerpt). The whole
    and excerpt alignments need both pieces of at least ``min_align_onsets`` distinct onsets.

    Candidates are taken in the order given (sorted by ``a``, then ``b``). With ``label`` (the
    component of each piece after the earlier tiers), a candidate whose pieces are already
    joined, by those tiers or by pairs confirmed before it, is skipped unmeasured: it would add
    no link, and a family of n variants would otherwise cost all n(n - 1)/2 pairs.

    With ``verdicts``, a pair's measures (Jaccard, containment, alignments) are read from there
    when an earlier run measured the same two pieces' notes under the same settings, and the
    new ones are added to it: the measures are pure functions of those, so the result is the
    same."""
    n = a.size
    jac, con, ali = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    longer = np.zeros(n, dtype=np.int8)
    rule = np.full(n, "", dtype=object)
    sizes = np.diff(fps.shingle_offsets)
    onsets = seqs.distinct_onsets
    near = cfg.rule
    limit = near.alignment
    parent = (label if label is not None else np.arange(sizes.size)).tolist()

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for m, (i, j) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        ri, rj = root(i), root(j)
        if label is not None and ri == rj:
            continue
        known = verdicts.get(i, j) if verdicts is not None else None
        if known is None:
            jac[m], con[m] = fp.jaccard_containment(fps.shingle_set(i), fps.shingle_set(j))
        else:
            jac[m], con[m] = known[0], known[1]
        shingled = min(sizes[i], sizes[j]) >= near.min_shingles
        if shingled and jac[m] >= near.jaccard:
            rule[m] = "jaccard"  # no alignment needed: a Jaccard pair records no location
            if label is not None:
                parent[max(ri, rj)] = min(ri, rj)
            if verdicts is not None and known is None:
                verdicts.put(i, j, jac[m], con[m], None)
            continue
        al = known[2] if known is not None else None
        if al is None:
            al = similarity.align(seqs, i, j, near.min_melody_notes, cutoff=limit)
            if verdicts is not None:
                verdicts.put(i, j, jac[m], con[m], al)
        if not rule[m] and shingled and con[m] >= near.containment and al.part >= limit:
            rule[m] = "containment"
        longer[m], start[m], end[m] = al.longer, al.part_start, al.part_end
        both = min(onsets[i], onsets[j]) >= near.min_align_onsets
        for name, value, holds in (("alignment", al.whole, both), ("melody", al.melody, True),
                                   ("excerpt", al.part, both)):
            if not rule[m] and holds and value >= limit:
                rule[m], ali[m] = name, value
        if rule[m] and label is not None:
            parent[max(ri, rj)] = min(ri, rj)
    return Verified(rule != "", jac, con, rule, ali, longer, start, end)


# ---------------------------------------------------------------------------------------------
# measured pairs kept between runs

VERDICT_FORMAT = 1
VERDICT_SCHEMA = pa.schema([
    ("pair", pa.string()), ("jaccard", pa.float64()), ("containment", pa.float64()),
    ("aligned", pa.bool_()), ("whole", pa.float64()), ("melody", pa.float64()),
    ("part", pa.float64()), ("longer", pa.int8()), ("part_start", pa.float64()),
    ("part_end", pa.float64())])
_MEASURE_COLUMNS = VERDICT_SCHEMA.names[1:]


VERDICT_CODE = (__name__, "pipeline.similarity.alignment", "pipeline.similarity.fingerprints",
                "pipeline.similarity.melody", "pipeline.similarity.lsh",
                "pipeline.similarity.short_melodies", "pipeline.similarity.rule",
                "pipeline.core.arrays")
"""The modules whose code a pair's measures depend on (:func:`verdict_key`)."""


def verdict_key(cfg: DedupeConfig) -> str:
    """What a pair's measures depend on besides its two pieces' notes: the settings that shape
    shingles, token sequences and alignments (``shingle_k``, ``ioi_resolution``,
    ``min_melody_notes``, the alignment cutoff), the code that measures (``VERDICT_CODE``)
    and rapidfuzz's and numpy's versions. Thresholds that only turn measures into a verdict,
    and the candidate settings, are left out: changing them reuses every measure."""
    return artifacts.sha256_json({
        "format": VERDICT_FORMAT, "code": artifacts.code_digest(VERDICT_CODE),
        "rapidfuzz": package_version("rapidfuzz"), "numpy": np.__version__,
        "settings": {"shingle_k": cfg.shingle_k, "ioi_resolution": cfg.ioi_resolution,
                     "min_melody_notes": cfg.min_melody_notes, "cutoff": cfg.rule.alignment},
    })[:20]


class VerdictStore:
    """The measures of candidate pairs from earlier runs (a :class:`SegmentStore` under
    ``root/<verdict_key>/``, keyed by the two pieces'
    :func:`~pipeline.similarity.digests.note_digests`), and those measured in this run, written
    by :meth:`save`."""

    def __init__(self, root: Path, cfg: DedupeConfig, digests: list[str]) -> None:
        self.store = SegmentStore(Path(root) / verdict_key(cfg), VERDICT_SCHEMA, "pair")
        self.digests = digests
        self.known: dict[str, tuple] = {}
        self.new: dict[str, tuple] = {}
        self.hits = 0

    def _key(self, i: int, j: int) -> str:
        return self.digests[i] + self.digests[j]

    def load(self, a: np.ndarray, b: np.ndarray) -> None:
        """Read the stored measures of the candidate pairs ``a``, ``b``."""
        keys = {self._key(i, j) for i, j in zip(a.tolist(), b.tolist(), strict=True)}
        table = self.store.lookup(keys & self.store.keys.keys())
        cols = [table[c].to_pylist() for c in VERDICT_SCHEMA.names]
        self.known = {row[0]: row[1:] for row in zip(*cols, strict=True)}

    def unmeasured(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The pieces of the pairs ``a``, ``b`` whose measures :meth:`load` did not find."""
        miss = [self._key(i, j) not in self.known for i, j in zip(a.tolist(), b.tolist(),
                                                                  strict=True)]
        miss = np.asarray(miss, dtype=bool)
        return np.unique(np.concatenate([a[miss], b[miss]]))

    def get(self, i: int, j: int) -> tuple[float, float, similarity.Alignment | None] | None:
        """(Jaccard, containment, alignment or None when not aligned) of pair ``i``, ``j``."""
        row = self.known.get(self._key(i, j))
        if row is None:
            return None
        self.hits += 1
        jac, con, aligned, whole, mel, part, longer, p_start, p_end = row
        al = similarity.Alignment(whole, mel, part, longer, p_start, p_end) if aligned else None
        return jac, con, al

    def put(self, i: int, j: int, jac: float, con: float,
            al: similarity.Alignment | None) -> None:
        nan = float("nan")
        self.new[self._key(i, j)] = (
            float(jac), float(con), al is not None,
            *((al.whole, al.melody, al.part, al.longer, al.part_start, al.part_end)
              if al is not None else (nan, nan, nan, 0, nan, nan)))

    def save(self) -> int:
        """Add this run's new measures to the store; returns how many."""
        if self.new:
            keys = sorted(self.new)
            cols = list(zip(*(self.new[k] for k in keys), strict=True))
            self.store.add(pa.table([pa.array(keys, pa.string()), *(
                pa.array(c, VERDICT_SCHEMA.field(name).type)
                for name, c in zip(_MEASURE_COLUMNS, cols, strict=True))],
                schema=VERDICT_SCHEMA))
        return len(self.new)


def winnow_views(seqs: similarity.Sequences, cfg: DedupeConfig) -> list[np.ndarray]:
    """The winnowed run hashes (:func:`pipeline.similarity.alignment.winnow_runs`, packed with the
    piece index) of three views of every piece: its note tokens, for runs long enough for an
    excerpt of ``min_align_onsets`` onsets, and its two melodies, for runs of
    ``min_melody_notes`` - 2 intervals."""
    run = cfg.min_align_onsets - 2  # an excerpt's first token differs from the original's
    views = [similarity.winnow_runs(seqs.tokens, seqs.distinct_onsets >= cfg.min_align_onsets,
                                    run, k=max(2, run - 1))]
    m_run = cfg.min_melody_notes - 2
    for view in seqs.melodies:
        lengths = np.fromiter((len(t) for t in view), dtype=np.int64, count=len(view))
        views.append(similarity.winnow_runs(view, lengths + 1 >= cfg.min_melody_notes, m_run,
                                            k=max(2, m_run - 1)))
    return views


def near_candidates(fps: Fingerprints, seqs: similarity.Sequences | None, cfg: DedupeConfig,
                    stats: dict[str, int], side: np.ndarray | None = None,
                    views: list[np.ndarray] | None = None, workers: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate pairs ``i < j`` of the near tier: LSH over the shingle sets of the pieces with
    ``min_shingles`` shingles (one of each set of equal transposed keys, whose shingle sets are
    equal: the star edges returned with it), plus pairs sharing runs of note tokens or melody
    intervals (:func:`winnow_views`, given as ``views`` or computed from ``seqs``; a run held by
    more than ``max_df`` pieces proposes nothing, and a pair needs ``candidate_share`` of the
    smaller piece's runs in common: :func:`pipeline.similarity.alignment.pairs_sharing`), plus the
    pairs of melodies of at most ``short_melody_notes`` notes (with ``min_shingles`` distinct
    interval k-grams) that LSH over those k-grams proposes and that align at the alignment
    threshold
    (:func:`pipeline.similarity.short_melodies.candidates`; ``workers`` threads align them).

    With ``side`` (0 or 1 per piece) only pairs across the two sides are proposed, and LSH never
    forms the pairs within a side (:func:`cross_lsh_candidates`): one corpus checked against
    another."""
    n_shingles = np.diff(fps.shingle_offsets)
    eligible = n_shingles >= cfg.min_shingles
    stats["near_too_short"] = int((~eligible).sum())
    keys = np.where(eligible, fps.transposed, "")
    sa, sb = star_edges(keys)
    reps = np.setdiff1d(np.flatnonzero(eligible), sb)
    if side is None:
        parts = [lsh_candidates(fps.signatures, reps, cfg)]
    else:
        parts = [cross_lsh_candidates(fps.signatures, reps[side[reps] == 0],
                                      reps[side[reps] == 1], cfg)]
    stats["near_candidates_lsh"] = int(parts[0][0].size)
    if views is None:
        if seqs is None:
            raise ValueError("near_candidates needs seqs or views")
        views = winnow_views(seqs, cfg)
    parts += [similarity.pairs_sharing(v, cfg.max_df, cfg.candidate_share) for v in views]
    parts.append(short_melodies.candidates(fps.short_melody, fps.short_signatures,
                                           alignment=cfg.rule.alignment, k=cfg.shingle_k,
                                           side=side, workers=workers, stats=stats))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    if side is not None:
        cross = side[a] != side[b]
        a, b = np.minimum(a[cross], b[cross]), np.maximum(a[cross], b[cross])
    n = max(int(fps.signatures.shape[0]), 1)
    code = unique(a.astype(np.int64) * n + b)
    return code // n, code % n, sa, sb

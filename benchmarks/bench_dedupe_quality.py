"""Dedupe quality: recall of planted variants and precision against unrelated music of the same
style, for ``symkit dedupe`` on generated MIDI files with known ground truth.

    .venv/bin/python benchmarks/bench_dedupe_quality.py [--pieces 64] [--tunes 64] [--seed 0]
                     [--json out.json] [--params params.yaml] [--workers auto]

What is generated (from ``--seed`` alone, through seeded numpy Generators, one per piece, so the
same arguments give the same files, table and JSON, and raising ``--pieces`` keeps earlier pieces):

- a shared *style*: a distribution of melodic steps in scale degrees, rhythm values on a 16th-note
  grid, and a library of shared opening and cadence figures (4-8 notes, with chord roots);
- per length bucket (40-99, 100-299, 300-799, 800-2000 notes; lengths log-uniform within it)
  ``--pieces`` originals, alternately
  monophonic (a melody in phrases: motifs and their sequences, repeated phrases, scale-constrained
  random-walk passages, cadences; rhythms from per-piece bar cells) and polyphonic (that melody as
  the soprano of a four-voice chorale-like setting, one chord per melody note, one track per voice,
  voices led to the nearest chord tone);
- per original 19 planted variants, its *family*: ``re-saved`` (other resolution, tempo and
  velocities), ``transposed`` (±1-6 semitones), ``changed``/``dropped``/``inserted`` p% of the notes
  for p in 1, 2, 5, 10 (at least one note; a changed note moves to a neighbouring scale tone; an
  inserted note splits a note of >= 1/2 beat, its second part moving to a neighbouring scale
  tone), ``excerpt`` f% (a contiguous time window of f% of the piece, cut at a random beat and
  shifted to start at 0) for f in 10, 25, 50, 75, and ``re-orchestrated`` (the same notes on other
  programs and another split of the notes across tracks);
- unrelated pieces, as many per bucket and texture as originals, each its own family: ``walk``
  (random walks with the style's step and rhythm distributions, no phrase structure) and
  ``cadence`` (composed like the originals, but opening with a shared figure and ending every
  later phrase with a shared cadence figure, a figure filling at most half of its phrase).

How it is measured: every piece is written as a MIDI file and passes through the real stages,
``pipeline.music.ingestion.run`` then ``pipeline.stages.dedupe.run``, configured by the ``ingest``
and ``dedupe`` sections of ``--params``.

- A planted variant is *found* when ``clusters.parquet`` gives it the ``cluster_id`` of its
  original (linked directly or through other pieces, by any tier, whatever the tier's policy).
  A variant that ingest does not pass as ``ok`` counts as missed. Recall = found / planted, per
  variant kind, texture and length bucket of the original.
- *linked by*: for a found variant, the first tier (stage order: note, transposed, melody, near)
  whose pairs, with those of the earlier tiers, connect it to its original.
- *missed because*, from the stage's own verification of the pair: ``not proposed`` (the near
  tier's rules would confirm it, but no candidate generator proposed it), ``short`` (a side has
  fewer than ``min_shingles`` shingles and fewer than ``min_align_onsets`` onsets, so no near
  rule applies), ``below`` (every rule measured it under its threshold), ``not ok`` (ingest
  rejected the variant).
- A *false merge* is a pair of pieces of different families in one cluster. Pairwise precision =
  same-family pairs / all pairs sharing a cluster. Per set (originals, variants, walk, cadence) the
  table counts pieces whose cluster holds a piece of another family.
- *Closest unrelated pieces*: exact shingle Jaccard and containment of every pair of family heads
  (originals, walk and cadence pieces), without LSH: how close unrelated music of one style comes
  to the near tier's thresholds, and how many such pairs reach one.

Cells below the reference targets are marked ``!``: recall >= 0.95 for edits of <= 5%, >= 0.90 for
excerpts of >= 25%, >= 0.95 for re-saved, transposed and re-orchestrated copies, no false merges.
Timings are printed, never asserted, and kept out of the JSON so that it is reproducible.

The tune set (``--tunes`` per cell; 0 skips it, as ``--pieces 0`` skips the sets above), a corpus
of its own through the same stages, is harder: short monophonic dance tunes of one style in
AABB form (``benchmarks/dance_tunes.py``: stock openings, endings and bars that many tunes share)
of 40-59, 60-99 and 100-120 notes, each copied once with 2, 5, 8 or 10% of its notes edited by
several kinds of edit at once (the mixes of ``dance_tunes.MIXES``: chromatic as well as diatonic
changes, dropped notes, notes split in two, passing notes), spread over the tune and made in
both repeats of a part. Every cell (band x mix x rate) has its own tunes, so a copy is found
through its own tune only; each tune also has a *sibling*, an unrelated tune with the same tune
type, key, opening, endings and cadence. Per cell it reports recall, what the rules confirm when
the pair is measured directly (``confirmable``: the ceiling of any candidate search), the
melody alignment of the pairs and why a copy was missed; precision against the tunes and
siblings, and the exact melody alignment of the closest unrelated tunes over all their pairs.
Targets: >= 0.90 in every cell, >= 0.95 for edits of <= 5% of tunes of >= 100 notes, no false
merges. In the JSON it is the ``tunes`` key.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel
from scipy.sparse import csr_array

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import dance_tunes as tunes  # noqa: E402
from pipeline.core import artifacts  # noqa: E402
from pipeline.core.config import RuntimeConfig, load_section  # noqa: E402
from pipeline.similarity import alignment as similarity  # noqa: E402
from pipeline.similarity import fingerprints as fp  # noqa: E402
from pipeline.stages import dedupe, ingest  # noqa: E402
from tests.midi_utils import make_midi  # noqa: E402

BUCKETS = ((40, 99), (100, 299), (300, 799), (800, 2000))
TEXTURES = ("mono", "poly")
EDIT_RATES = (0.01, 0.02, 0.05, 0.10)
EXCERPTS = (0.10, 0.25, 0.50, 0.75)
SETS = ("original", "variant", "walk", "cadence")

SCALES = ((0, 2, 4, 5, 7, 9, 11), (0, 2, 3, 5, 7, 8, 10))  # major, natural minor
STEPS = np.array([-7, -4, -3, -2, -1, 0, 1, 2, 3, 4, 7])  # melodic steps in scale degrees
STEP_P = np.array([1, 3, 4, 12, 25, 10, 25, 12, 4, 3, 1]) / 100
RHYTHM = {"mono": ((1, 2, 3, 4, 6, 8), (0.08, 0.34, 0.05, 0.35, 0.08, 0.10)),  # 16ths
          "poly": ((2, 4, 6, 8), (0.15, 0.70, 0.05, 0.10))}
ROOT_WEIGHT = np.array([3.0, 1.2, 0.6, 2.5, 3.0, 1.5, 0.3])  # chord on scale degree 0..6
PROGRAMS = (0, 6, 19, 24, 40, 42, 48, 52, 56, 68, 71, 73)


def bucket_label(b: tuple[int, int]) -> str:
    return f"{b[0]}-{b[1]}"


# ------------------------------------------------------------------------------------ the style
@dataclass(frozen=True)
class Figure:
    """A melodic figure in scale degrees (0 = tonic), durations in 16ths, chord roots (-1 free)."""

    degree: tuple[int, ...]
    dur: tuple[int, ...]
    root: tuple[int, ...]


@dataclass(frozen=True)
class Style:
    """What pieces of one style share beyond the step and rhythm distributions."""

    openings: tuple[Figure, ...]
    endings: tuple[Figure, ...]


def choose_root(rng: np.random.Generator, degree: int) -> int:
    """A chord root (scale degree) whose triad holds ``degree``, weighted towards I, IV and V."""
    cand = np.array([(degree - k) % 7 for k in (0, 2, 4)])
    w = ROOT_WEIGHT[cand]
    return int(cand[rng.choice(3, p=w / w.sum())])


def make_style(seed: int) -> Style:
    rng = np.random.default_rng([seed, 0])
    small = np.abs(STEPS) <= 2
    p = STEP_P[small] / STEP_P[small].sum()

    def figure(ending: bool) -> Figure:
        n = int(rng.integers(4, 9))
        steps = rng.choice(STEPS[small], size=n - 1, p=p)
        while np.ptp(np.cumsum([0, *steps])) > 6:  # keep a figure within an octave
            steps = rng.choice(STEPS[small], size=n - 1, p=p)
        if ending:  # walk backwards from the tonic
            deg = np.concatenate([[0], -np.cumsum(steps)])[::-1]
            dur = [*rng.choice([2, 4], size=n - 2, p=[0.3, 0.7]), 4, 8]
        else:
            deg = int(rng.choice([0, 2, 4])) + np.concatenate([[0], np.cumsum(steps)])
            dur = rng.choice([2, 4, 6], size=n, p=[0.3, 0.6, 0.1])
        root = [choose_root(rng, int(d) % 7) for d in deg]
        if ending:
            root[-1] = 0
        return Figure(tuple(int(d) for d in deg), tuple(int(x) for x in dur), tuple(root))

    return Style(tuple(figure(False) for _ in range(3)), tuple(figure(True) for _ in range(3)))


# ------------------------------------------------------------------------------------ composing
@dataclass(frozen=True)
class Piece:
    """Notes in beats (flat: onset, duration, pitch, velocity, track) and how to save them."""

    notes: dict[str, np.ndarray]
    programs: tuple[int, ...]
    tonic: int  # MIDI pitch class of the tonic
    scale: tuple[int, ...]
    tpq: int = 480
    tempo: float = 100.0

    @property
    def n(self) -> int:
        return int(self.notes["pitch"].size)

    def with_notes(self, **cols: np.ndarray) -> Piece:
        return replace(self, notes={**self.notes, **cols})

    def take(self, mask_or_index: np.ndarray) -> Piece:
        return replace(self, notes={k: v[mask_or_index] for k, v in self.notes.items()})

    def midi(self) -> bytes:
        n = self.notes
        tracks = []
        for t in range(len(self.programs)):
            m = n["track"] == t
            tracks.append(list(zip(n["onset"][m].tolist(), n["duration"][m].tolist(),
                                   n["pitch"][m].tolist(), n["velocity"][m].tolist(),
                                   strict=True)))
        return make_midi(tracks, tpq=self.tpq, tempo=self.tempo, programs=list(self.programs))


def melody(rng: np.random.Generator, style: Style, n: int, texture: str, structured: bool,
           formulas: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exactly ``n`` melody notes: (scale degrees, durations in 16ths, chord roots or -1).

    ``structured``: phrases of 8-16 notes made of a motif (or its sequence), a random walk and a
    cadence, sometimes repeating an earlier phrase; else one plain random walk. ``formulas``: the
    first phrase opens with a shared figure and every later phrase ends with a shared cadence
    figure (each cut to half its phrase where longer).
    """
    lo, hi = (-3, 11) if texture == "mono" else (0, 9)
    values, probs = RHYTHM[texture]
    cells = []
    for _ in range(4):  # per-piece bar rhythms, reused: real melodies repeat rhythm cells
        cell, left = [], 16
        while left > 0:
            v = min(int(rng.choice(values, p=probs)), left)
            cell.append(v)
            left -= v
        cells.append(cell)
    pending: list[int] = []

    def next_dur() -> int:
        if not structured:
            return int(rng.choice(values, p=probs))
        if not pending:
            pending.extend(cells[rng.choice(4, p=[0.4, 0.3, 0.2, 0.1])])
        return pending.pop(0)

    def step(d: int) -> int:
        s = int(rng.choice(STEPS, p=STEP_P))
        if lo <= d + s <= hi:
            return d + s
        return d + abs(s) if 2 * d < lo + hi else d - abs(s)  # head back into range

    d = int(rng.choice([0, 2, 4]))
    if not structured:
        deg, dur = [], []
        for _ in range(n):
            deg.append(d)
            dur.append(next_dur())
            d = step(d)
        return np.array(deg), np.array(dur), np.full(n, -1)

    motifs = []
    for _ in range(int(rng.integers(2, 4))):
        m_len = int(rng.integers(4, 8))
        m_deg = np.concatenate([[0], np.cumsum(rng.choice(STEPS, size=m_len - 1, p=STEP_P))])
        while np.ptp(m_deg) > 7:  # a motif spans at most an octave
            m_deg = np.concatenate([[0], np.cumsum(rng.choice(STEPS, size=m_len - 1, p=STEP_P))])
        motifs.append([(int(x), next_dur()) for x in m_deg])
    out: list[tuple[int, int, int]] = []
    phrases: list[list[tuple[int, int, int]]] = []
    while len(out) < n:
        left = n - len(out)
        size = int(rng.integers(8, 17))
        size = left if left - size < 8 else size
        fits = [p for p in phrases if len(p) == size]
        if fits and rng.random() < 0.3:  # repeat an earlier phrase, sometimes a degree higher/lower
            shift = int(rng.choice([0, 0, -1, 1, 2]))
            ph = [(x + shift, u, r) for x, u, r in fits[rng.integers(len(fits))]]
        else:
            ph = []
            # a shared figure fills at most half a phrase (>= 4 notes), so that pieces sharing
            # figures stay otherwise independent even when they are one phrase long
            room = max(4, size // 2)
            if formulas and not out:
                f = style.openings[rng.integers(len(style.openings))]
                ph += list(zip(f.degree, f.dur, f.root, strict=True))[:room]
            if rng.random() < 0.6:
                m = motifs[rng.integers(len(motifs))]
                start = int(np.clip(d + rng.integers(-2, 3), lo, hi))
                ph += [(start + x, u, -1) for x, u in m]
            if formulas and out:
                f = style.endings[rng.integers(len(style.endings))]
                end = list(zip(f.degree, f.dur, f.root, strict=True))[-room:]
            else:
                shape = [(2, 1, 0), (1, 0), (-1, 0), (4, 2, 1, 0)][rng.integers(4)]
                end = [(x, 4, -1) for x in shape]
                end[-1] = (0, 8, 0)
            ph = ph[: max(0, size - len(end))]
            d = ph[-1][0] if ph else d
            while len(ph) < size - len(end):
                d = step(d)
                ph.append((d, next_dur(), -1))
            octave = 7 * round(d / 7)  # the cadence lands on the tonic nearest the walk
            ph += [(x + octave, u, r) for x, u, r in end][-size:]
            ph = ph[:size]
        low, high, shift = min(x for x, _, _ in ph), max(x for x, _, _ in ph), 0
        while low + shift < lo - 2:  # keep the phrase in range, moving it by octaves
            shift += 7
        while high + shift > hi + 2 and low + shift - 7 >= lo - 2:
            shift -= 7
        ph = [(x + shift, u, r) for x, u, r in ph]
        phrases.append(ph)
        out += ph
        d = int(np.clip(out[-1][0], lo, hi))
    arr = np.array(out[:n])
    return arr[:, 0], arr[:, 1], arr[:, 2]


def compose(rng: np.random.Generator, style: Style, n_notes: int, texture: str,
            kind: str = "original") -> Piece:
    """An original (``kind`` original/cadence) or a plain random walk (``walk``) of ``n_notes``."""
    tonic = int(rng.integers(0, 12))
    scale = SCALES[int(rng.integers(2))]
    voices = 1 if texture == "mono" else 4
    deg, dur16, root = melody(rng, style, n_notes // voices, texture, kind != "walk",
                              kind == "cadence")
    base = (55 if texture == "mono" else 60) + (tonic + 5) % 12 - 5  # tonic near G3/C4

    def pitch(d: np.ndarray) -> np.ndarray:
        return base + 12 * (d // 7) + np.asarray(scale)[d % 7]

    ioi = dur16 / 4.0
    onset = np.concatenate([[0.0], np.cumsum(ioi)[:-1]])
    sop = pitch(deg)
    parts = [sop] if voices == 1 else [sop, *harmonise(rng, deg, root, sop, tonic, scale)]
    k = len(parts)
    notes = {"onset": np.tile(onset, k), "duration": np.tile(ioi, k),
             "pitch": np.concatenate(parts).astype(np.int64),
             "velocity": rng.integers(60, 96, size=k * onset.size),
             "track": np.repeat(np.arange(k), onset.size)}
    program = int(rng.choice(PROGRAMS))
    return Piece(notes, (program,) * k, tonic, scale, tempo=float(rng.integers(60, 140)))


def harmonise(rng: np.random.Generator, deg: np.ndarray, root: np.ndarray, sop: np.ndarray,
              tonic: int, scale: tuple[int, ...]) -> list[np.ndarray]:
    """Alto, tenor and bass under ``sop``: one triad per note, each voice to its nearest chord tone
    (alto within an octave under the soprano, tenor under the alto, bass on the root)."""
    n = deg.size
    alto, tenor, bass = np.zeros(n, int), np.zeros(n, int), np.zeros(n, int)
    prev = [int(sop[0]) - 5, int(sop[0]) - 12, int(sop[0]) - 20]
    allp = np.arange(12, 108)

    def nearest(cand: np.ndarray, below: int, floor: int, target: int) -> int:
        """The candidate under ``below`` nearest ``target``, at least ``floor`` where possible."""
        cand = cand[cand < below]
        cand = cand[cand >= floor] if (cand >= floor).any() else cand[-3:]
        return int(cand[np.argmin(np.abs(cand - target) + 0.5 * rng.random(cand.size))])

    for i in range(n):
        r = int(root[i]) if root[i] >= 0 else choose_root(rng, int(deg[i]) % 7)
        pcs = [(tonic + scale[(r + k) % 7]) % 12 for k in (0, 2, 4)]
        chord = allp[np.isin(allp % 12, pcs)]
        s = int(sop[i])
        a = nearest(chord, s, s - 12, prev[0])
        t = nearest(chord, a, max(a - 12, 43), prev[1])
        b = nearest(allp[allp % 12 == pcs[0]], t, max(t - 19, 33), prev[2])
        alto[i], tenor[i], bass[i] = a, t, b
        prev = [a, t, b]
    return [alto, tenor, bass]


# ------------------------------------------------------------------------------------- variants
def _scale_pitches(p: Piece) -> np.ndarray:
    allp = np.arange(128)
    return allp[np.isin((allp - p.tonic) % 12, p.scale)]


def _neighbour(p: Piece, pitch: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Move each pitch ``steps`` scale tones (the pitches are scale tones of ``p``)."""
    sp = _scale_pitches(p)
    return sp[np.clip(np.searchsorted(sp, pitch) + steps, 0, sp.size - 1)]


def _count(n: int, rate: float) -> int:
    return max(1, round(rate * n))


def resave(rng: np.random.Generator, p: Piece, _: float) -> Piece:
    q = p.with_notes(velocity=rng.integers(40, 120, size=p.n))
    return replace(q, tpq=int(rng.choice([384, 960])), tempo=p.tempo + float(rng.integers(5, 30)))


def transpose(rng: np.random.Generator, p: Piece, _: float) -> Piece:
    return p.with_notes(pitch=p.notes["pitch"] + int(rng.choice([-6, -5, -4, -3, -2, -1,
                                                                  1, 2, 3, 4, 5, 6])))


def change(rng: np.random.Generator, p: Piece, rate: float) -> Piece:
    hit = rng.choice(p.n, size=_count(p.n, rate), replace=False)
    pitch = p.notes["pitch"].copy()
    pitch[hit] = _neighbour(p, pitch[hit], rng.choice([-2, -1, 1, 2], size=hit.size,
                                                      p=[0.15, 0.35, 0.35, 0.15]))
    return p.with_notes(pitch=pitch)


def drop(rng: np.random.Generator, p: Piece, rate: float) -> Piece:
    keep = np.ones(p.n, bool)
    keep[rng.choice(p.n, size=_count(p.n, rate), replace=False)] = False
    return p.take(keep)


def insert(rng: np.random.Generator, p: Piece, rate: float) -> Piece:
    n = p.notes
    long = np.flatnonzero(n["duration"] >= 0.5)
    hit = rng.choice(long, size=min(_count(p.n, rate), long.size), replace=False)
    first = np.floor(n["duration"][hit] / 2 * 4) / 4  # split on the 16th grid
    new = {k: v[hit].copy() for k, v in n.items()}
    new["onset"] = new["onset"] + first
    new["duration"] = new["duration"] - first
    new["pitch"] = _neighbour(p, new["pitch"], rng.choice([-1, 1], size=hit.size))
    dur = n["duration"].copy()
    dur[hit] = first
    return replace(p, notes={k: np.concatenate([(dur if k == "duration" else v), new[k]])
                             for k, v in n.items()})


def excerpt(rng: np.random.Generator, p: Piece, share: float) -> Piece:
    end = float(np.max(p.notes["onset"] + p.notes["duration"]))
    span = share * end
    start = float(np.floor(rng.uniform(0.0, end - span)))
    on = p.notes["onset"]
    q = p.take((on >= start) & (on < start + span))
    stop = start + span
    return q.with_notes(onset=q.notes["onset"] - start,
                        duration=np.minimum(q.notes["duration"], stop - q.notes["onset"]))


def reorchestrate(rng: np.random.Generator, p: Piece, _: float) -> Piece:
    """Same notes, new programs, another layout: a melody alternates between two instruments
    every 4 bars; a 4-voice setting goes to one keyboard track, to two staves (S+A, T+B), or to its
    voices in reverse track order."""
    track = p.notes["track"]
    if len(p.programs) == 1:
        new = ((p.notes["onset"] // 16) % 2).astype(int)
    else:
        layout = int(rng.integers(3))
        new = [np.zeros_like(track), track // 2, 3 - track][layout]
    k = int(new.max()) + 1
    programs = tuple(int(x) for x in rng.choice([x for x in PROGRAMS if x not in p.programs],
                                                 size=k, replace=False))
    return replace(p.with_notes(track=new), programs=programs)


VARIANTS: tuple[tuple[str, Callable[[np.random.Generator, Piece, float], Piece], float], ...] = (
    ("re-saved", resave, 0.0),
    ("transposed", transpose, 0.0),
    *((f"changed {r:.0%}", change, r) for r in EDIT_RATES),
    *((f"dropped {r:.0%}", drop, r) for r in EDIT_RATES),
    *((f"inserted {r:.0%}", insert, r) for r in EDIT_RATES),
    *((f"excerpt {r:.0%}", excerpt, r) for r in EXCERPTS),
    ("re-orchestrated", reorchestrate, 0.0),
)
KINDS = tuple(v[0] for v in VARIANTS)


def target(kind: str) -> float | None:
    """The reference recall for a variant kind (None: no target)."""
    name, _, rate = kind.partition(" ")
    if name in ("changed", "dropped", "inserted"):
        return 0.95 if float(rate.rstrip("%")) <= 5 else None
    if name == "excerpt":
        return 0.90 if float(rate.rstrip("%")) >= 25 else None
    return 0.95


# ------------------------------------------------------------------------------------- corpus
def write_corpus(raw: Path, pieces: int, seed: int) -> list[dict]:
    """Write every MIDI file under ``raw``; one ground-truth row per file."""
    style = make_style(seed)
    rows: list[dict] = []

    def put(piece: Piece, rel: str, **row) -> None:
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(piece.midi())
        rows.append({"path": rel, **row})

    for b, bucket in enumerate(BUCKETS):
        label = bucket_label(bucket)
        for i in range(pieces):
            texture = TEXTURES[i % 2]
            for s, kind in enumerate(("original", "walk", "cadence")):
                rng = np.random.default_rng([seed, 1 + b, i, s])
                n = int(np.exp(rng.uniform(np.log(bucket[0]), np.log(bucket[1] + 1))))
                n = min(max(n, bucket[0]), bucket[1])
                piece = compose(rng, style, n, texture, kind)
                family = f"{kind[0]}{b}-{i}"
                base = {"family": family, "texture": texture, "bucket": label}
                put(piece, f"{label}/{family}/{kind}.mid", set=kind, kind=kind, **base)
                if kind != "original":
                    continue
                for v, (name, fn, rate) in enumerate(VARIANTS):
                    var = fn(np.random.default_rng([seed, 1 + b, i, 10 + v]), piece, rate)
                    put(var, f"{label}/{family}/v{v:02d}.mid", set="variant", kind=name,
                        original=f"{label}/{family}/original.mid", **base)
    return rows


# ------------------------------------------------------------------------------------- measuring
def run_stages(root: Path, params: Path, workers: int | str) -> dict[str, Path]:
    runtime = RuntimeConfig(workers=workers, progress=False)
    out = {"manifest": root / "manifest.parquet", "notes": root / "notes.parquet",
           "dedupe": root / "dedupe"}
    ingest.run(load_section("ingest", params, ingest.IngestConfig), runtime,
               raw_dir=root / "raw", metadata=None, manifest=out["manifest"],
               notes=out["notes"], report=root / "ingest.json")
    dedupe.run(load_section("dedupe", params, dedupe.DedupeConfig), runtime,
               manifest=out["manifest"], notes=out["notes"], out_dir=out["dedupe"],
               report=root / "dedupe.json")
    return out


def evaluate(rows: list[dict], out: dict[str, Path], cfg: dedupe.DedupeConfig,
             target_of: Callable[[str, str], float | None] | None = None,
             reach: bool = False) -> dict:
    """Recall rows, precision rows and false-merge evidence (see the module docstring).
    ``target_of(kind, bucket)``: a cell's reference recall (default :func:`target` of the kind).
    With ``reach``, each recall row also says how many of its pairs the near rules confirm when
    measured directly, proposed or not (``confirmable``: the recall a complete candidate search
    would reach), and the melody alignment similarity of its pairs (``melody_min``,
    ``melody_median``)."""
    target_of = target_of or (lambda kind, _: target(kind))
    man = artifacts.read_parquet(out["manifest"], columns=["path", "sha256", "status"])
    sha = dict(zip(man["path"], man["sha256"], strict=True))
    usable = set(man.loc[man["status"].isin(["ok", "duplicate"]), "path"])
    clusters = artifacts.read_parquet(out["dedupe"] / "clusters.parquet")
    shas = clusters["sha256"].to_numpy()
    index = {s: i for i, s in enumerate(shas)}
    cid = dict(zip(clusters["sha256"], clusters["cluster_id"], strict=True))
    pairs = artifacts.read_parquet(out["dedupe"] / "pairs.parquet")
    pa_ = pairs["a"].map(index).to_numpy(dtype=np.int64)
    pb_ = pairs["b"].map(index).to_numpy(dtype=np.int64)
    # component labels after each tier, cumulative in the stage's order
    labels = [dedupe.components(shas.size, pa_[m], pb_[m]) for m in
              (pairs["tier"].isin(dedupe.TIERS[: t + 1]).to_numpy()
               for t in range(len(dedupe.TIERS)))]
    notes = fp.read_notes(out["notes"])
    s_off, s_val = fp.shingles(notes, cfg.shingle_k, cfg.ioi_resolution)
    # the stage's own view of the ok pieces, to say why a missed pair was missed
    _, stage_notes, _ = dedupe.load_inputs(out["manifest"], out["notes"])
    stage_fps = dedupe.fingerprint(stage_notes, cfg)
    seqs = similarity.Sequences.build(stage_notes, cfg.ioi_resolution)
    onsets = seqs.distinct_onsets
    stage_index = {s: i for i, s in enumerate(stage_notes.sha256)}
    s_index = {s: i for i, s in enumerate(notes.sha256)}

    def shingle_set(path: str) -> np.ndarray:
        i = s_index.get(sha[path])
        return s_val[0:0] if i is None else s_val[s_off[i]:s_off[i + 1]]

    def cluster_of(path: str) -> str | None:
        return cid.get(sha[path]) if path in usable else None

    recall = defaultdict(lambda: {"n": 0, "found": 0, "linked_by": Counter(),
                                  "missed_because": Counter(), "missed_jaccard": [],
                                  "missed_containment": [], "confirmable": 0, "melody": []})
    for r in rows:
        if r["set"] != "variant":
            continue
        cell = recall[(r["kind"], r["texture"], r["bucket"])]
        cell["n"] += 1
        c = cluster_of(r["path"])
        if reach and c is not None:
            i, j = sorted((stage_index[sha[r["path"]]], stage_index[sha[r["original"]]]))
            if i != j:
                pair = (np.asarray([i]), np.asarray([j]))
                cell["confirmable"] += bool(dedupe.verify(stage_fps, seqs, *pair, cfg).ok[0])
                cell["melody"].append(similarity.align(seqs, i, j, cfg.min_melody_notes).melody)
            else:
                cell["confirmable"] += 1
                cell["melody"].append(1.0)
        if c is not None and c == cluster_of(r["original"]):
            cell["found"] += 1
            i, j = index[sha[r["path"]]], index[sha[r["original"]]]
            tier = next(t for t, lab in zip(dedupe.TIERS, labels, strict=True)
                        if lab[i] == lab[j]) if i != j else "byte"
            cell["linked_by"][tier] += 1
            continue
        if c is None:
            cell["missed_because"]["not ok"] += 1
            continue
        x, y = shingle_set(r["path"]), shingle_set(r["original"])
        jac, con = fp.jaccard_containment(x, y)
        i, j = stage_index[sha[r["path"]]], stage_index[sha[r["original"]]]
        pair = (np.asarray([min(i, j)]), np.asarray([max(i, j)]))
        if dedupe.verify(stage_fps, seqs, *pair, cfg).ok[0]:
            why = "not proposed"
        elif min(x.size, y.size) < cfg.min_shingles and \
                min(onsets[i], onsets[j]) < cfg.min_align_onsets:
            why = "short"
        else:
            why = "below"
        cell["missed_because"][why] += 1
        cell["missed_jaccard"].append(jac)
        cell["missed_containment"].append(con)

    # precision: pairs of pieces sharing a cluster
    members = defaultdict(list)
    for r in rows:
        c = cluster_of(r["path"])
        if c is not None:
            members[c].append(r)
    pairs_all = pairs_same = 0
    mixed_clusters = 0
    merged_paths: set[str] = set()
    for group in members.values():
        fam = Counter(r["family"] for r in group)
        pairs_all += len(group) * (len(group) - 1) // 2
        pairs_same += sum(k * (k - 1) // 2 for k in fam.values())
        if len(fam) > 1:
            mixed_clusters += 1
            merged_paths.update(r["path"] for r in group if fam[r["family"]] < len(group))
    merged = defaultdict(lambda: {"n": 0, "merged": 0})
    for r in rows:
        cell = merged[(r["set"], r["kind"], r["texture"], r["bucket"])]
        cell["n"] += 1
        cell["merged"] += r["path"] in merged_paths
    # evidence: confirmed pairs that join two families
    fam_of_sha = defaultdict(set)
    row_of_sha = {}
    for r in rows:
        if r["path"] in usable:
            fam_of_sha[sha[r["path"]]].add(r["family"])
            row_of_sha[sha[r["path"]]] = r
    cross = [t for t in pairs.itertuples(index=False) if fam_of_sha[t.a] != fam_of_sha[t.b]]

    def describe(r: dict) -> str:
        what = r["set"] if r["set"] == r["kind"] else f"{r['set']} {r['kind']}"
        return f"{what} ({r['texture']}, {r['bucket']} notes)"

    examples = [{"a": describe(row_of_sha[t.a]), "b": describe(row_of_sha[t.b]), "tier": t.tier,
                 "jaccard": round(t.similarity, 3), "containment": round(t.containment, 3)}
                for t in cross[:10]]
    return {
        "recall": [{"kind": k, "texture": tx, "bucket": b, "n": c["n"], "found": c["found"],
                    "recall": c["found"] / c["n"], "target": target_of(k, b),
                    "linked_by": dict(sorted(c["linked_by"].items())),
                    "missed_because": dict(sorted(c["missed_because"].items())),
                    "missed_jaccard_max": max(c["missed_jaccard"], default=None),
                    "missed_containment_max": max(c["missed_containment"], default=None),
                    **({"confirmable": c["confirmable"],
                        "melody_min": min(c["melody"], default=None),
                        "melody_median": float(np.median(c["melody"])) if c["melody"] else None}
                       if reach else {})}
                   for (k, tx, b), c in recall.items()],
        "merges": [{"set": s, "kind": k, "texture": tx, "bucket": b, **c}
                   for (s, k, tx, b), c in merged.items()],
        "precision": {"pairs_sharing_a_cluster": pairs_all, "same_family_pairs": pairs_same,
                      "false_merge_pairs": pairs_all - pairs_same,
                      "pairwise_precision": pairs_same / pairs_all if pairs_all else 1.0,
                      "clusters_mixing_families": mixed_clusters,
                      "cross_family_edges_by_tier": dict(sorted(Counter(t.tier for t in cross)
                                                                .items())),
                      "cross_family_examples": examples,
                      "closest_unrelated": closest_unrelated(rows, shingle_set, cfg)},
    }


def closest_unrelated(rows: list[dict], shingle_set, cfg: dedupe.DedupeConfig) -> dict:
    """Exact shingle Jaccard and containment of every pair of family heads (originals, walk and
    cadence pieces: one per family) with >= ``min_shingles`` shingles, without LSH: the margin
    between unrelated music and the near tier's thresholds."""
    heads = [r for r in rows if r["set"] != "variant"]
    sets = [shingle_set(r["path"]) for r in heads]
    keep = [i for i, x in enumerate(sets) if x.size >= cfg.min_shingles]
    heads, sets = [heads[i] for i in keep], [sets[i] for i in keep]
    if len(sets) < 2:
        return {"pairs": 0}
    sizes = np.array([x.size for x in sets])
    _, col = np.unique(np.concatenate(sets), return_inverse=True)
    x = csr_array((np.ones(col.size, np.float32), (np.repeat(np.arange(len(sets)), sizes), col)))
    inter = (x @ x.T).tocoo()
    upper = inter.row < inter.col
    i, j, n = inter.row[upper], inter.col[upper], inter.data[upper].astype(np.int64)
    jac = n / (sizes[i] + sizes[j] - n)
    con = n / np.minimum(sizes[i], sizes[j])
    over = (jac >= cfg.near_jaccard) | (con >= cfg.near_containment)

    def describe(k: int) -> str:
        a, b = heads[i[k]], heads[j[k]]
        return (f"{a['set']} ({a['texture']}, {a['bucket']}) <-> "
                f"{b['set']} ({b['texture']}, {b['bucket']})")

    top_j, top_c = (int(np.argmax(v)) if v.size else None for v in (jac, con))
    return {"pairs": len(sets) * (len(sets) - 1) // 2, "pairs_over_a_threshold": int(over.sum()),
            "jaccard_max": float(jac.max(initial=0.0)),
            "jaccard_max_pair": describe(top_j) if top_j is not None else "",
            "containment_max": float(con.max(initial=0.0)),
            "containment_max_pair": describe(top_c) if top_c is not None else ""}


def generate_and_run(root: Path, write: Callable[[Path], list[dict]], params: Path,
                     workers: int | str) -> tuple[list[dict], dict[str, Path], dict[str, float]]:
    """Write a set's MIDI files under ``root/raw`` (``write``) and run ingest and dedupe on
    them: its rows, the stages' outputs and the seconds each step took."""
    t0 = time.perf_counter()
    rows = write(root / "raw")
    t1 = time.perf_counter()
    out = run_stages(root, params, workers)
    return rows, out, {"generate": t1 - t0, "stages": time.perf_counter() - t1}


def measure(pieces: int, seed: int, params: Path = ROOT / "params.yaml",
            workers: int | str = "auto") -> dict:
    """Generate, run ingest and dedupe, evaluate; ``seconds`` holds the timings."""
    cfg = load_section("dedupe", params, dedupe.DedupeConfig)
    with tempfile.TemporaryDirectory() as tmp:
        rows, out, seconds = generate_and_run(
            Path(tmp), lambda raw: write_corpus(raw, pieces, seed), params, workers)
        t2 = time.perf_counter()
        result = evaluate(rows, out, cfg)
        result["corpus"] = {"files": len(rows), "originals_per_bucket": pieces, "seed": seed,
                            "buckets": [bucket_label(b) for b in BUCKETS],
                            "dedupe": cfg.model_dump(mode="json")}
    result["seconds"] = {**seconds, "evaluate": time.perf_counter() - t2}
    return result


# ----------------------------------------------------------------------------------- tune set
TUNE_BANDS = ((40, 59), (60, 99), (100, 120))
TUNE_RATES = (0.02, 0.05, 0.08, 0.10)
TUNE_SETS = ("original", "variant", "sibling")
TUNE_KINDS = tuple(f"{mix} {rate:.0%}" for mix in tunes.MIXES for rate in TUNE_RATES)


def tune_target(kind: str, bucket: str) -> float:
    """The reference recall of a tune cell: 0.95 for edits of <= 5% of tunes of >= 100 notes,
    else 0.90 (every cell edits at most 10% of tunes of at least 40 notes)."""
    rate = float(kind.rsplit(" ", 1)[1].rstrip("%"))
    return 0.95 if rate <= 5 and int(bucket.split("-")[0]) >= 100 else 0.90


def _length(rng: np.random.Generator, band: tuple[int, int]) -> int:
    n = int(np.exp(rng.uniform(np.log(band[0]), np.log(band[1] + 1))))
    return min(max(n, band[0]), band[1])


@dataclass(frozen=True)
class TuneCase:
    """One tune of the tune set with its sibling and its edited copy (``edits``: notes per kind)."""

    band: str
    kind: str
    home: str  # the case's folder under the corpus root
    family: str  # "band-kind-index": the families t<...> and s<...>
    tune: tunes.Tune
    sibling: tunes.Tune
    copy: tunes.Tune
    edits: dict[str, int]


def tune_cases(per_cell: int, seed: int) -> Iterator[TuneCase]:
    """The tune set (``benchmarks/dance_tunes.py``): per length band and edit kind (mix and
    rate) ``per_cell`` tunes, each with one edited copy and a sibling; a tune's generators
    depend on (seed, band, kind, index) alone."""
    style = tunes.make_style(seed)
    for b, band in enumerate(TUNE_BANDS):
        label = bucket_label(band)
        for v, kind in enumerate(TUNE_KINDS):
            mix, rate = kind.rsplit(" ", 1)
            for i in range(per_cell):
                rng = np.random.default_rng([seed, 50 + b, v, i, 0])
                plan = tunes.make_plan(rng)
                tune = tunes.compose(rng, style, _length(rng, band), plan)
                rng = np.random.default_rng([seed, 50 + b, v, i, 1])
                sibling = tunes.compose(rng, style, _length(rng, band), plan)
                copy, counts = tunes.edit(np.random.default_rng([seed, 50 + b, v, i, 2]), tune,
                                          tunes.MIXES[mix], float(rate.rstrip("%")) / 100)
                yield TuneCase(label, kind, f"tunes/{label}/k{v:02d}/{i:03d}", f"{b}-{v}-{i}",
                               tune, sibling, copy, counts)


def write_tunes(raw: Path, per_cell: int, seed: int) -> list[dict]:
    """Write the tune set (:func:`tune_cases`) under ``raw``, so that a copy can only be linked
    to its tune directly. One ground-truth row per file."""
    rows: list[dict] = []

    def put(tune: tunes.Tune, rel: str, **row) -> None:
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(tune.midi())
        rows.append({"path": rel, "texture": "mono", **row})

    for c in tune_cases(per_cell, seed):
        home, family = c.home, f"t{c.family}"
        put(c.tune, f"{home}/tune.mid", set="original", kind="original", family=family,
            bucket=c.band, notes=c.tune.n)
        put(c.sibling, f"{home}/sibling.mid", set="sibling", kind="sibling",
            family=f"s{c.family}", bucket=c.band, notes=c.sibling.n)
        put(c.copy, f"{home}/copy.mid", set="variant", kind=c.kind, family=family,
            bucket=c.band, original=f"{home}/tune.mid", notes=c.copy.n, edits=c.edits)
    return rows


def closest_melodies(rows: list[dict], out: dict[str, Path], cfg: dedupe.DedupeConfig,
                     workers: int) -> dict:
    """Melody alignment similarity (the near tier's ``melody`` rule) of every pair of family
    heads (tunes and siblings), exactly, without candidates: how close unrelated tunes of one
    style come to the alignment threshold, overall, per length band, and tune to sibling."""
    man = artifacts.read_parquet(out["manifest"], columns=["path", "sha256"])
    sha = dict(zip(man["path"], man["sha256"], strict=True))
    _, notes, _ = dedupe.load_inputs(out["manifest"], out["notes"])
    index = {s: i for i, s in enumerate(notes.sha256)}
    seqs = similarity.Sequences.build(notes, cfg.ioi_resolution)
    heads = [r for r in rows if r["set"] != "variant" and sha.get(r["path"]) in index]
    # one character per interval below 256 (the same similarity, rapidfuzz's faster path)
    mel = [bytes(ord(c) - 0x100 for c in seqs.melodies[0][index[sha[r["path"]]]])
           .decode("latin-1") for r in heads]
    n = len(mel)
    if n < 2:
        return {"pairs": 0}
    band = np.array([r["bucket"] for r in heads])
    labels = [bucket_label(x) for x in TUNE_BANDS]
    top, top_pair, over = -1.0, (0, 1), 0
    band_max = dict.fromkeys(labels, 0.0)
    for lo in range(0, n, 512):  # row blocks: the whole matrix would not fit at larger sizes
        sim = process.cdist(mel[lo: lo + 512], mel, scorer=Indel.normalized_similarity,
                            dtype=np.float64, workers=workers)
        rows_ = np.arange(lo, lo + sim.shape[0])
        sim[np.arange(n)[None, :] <= rows_[:, None]] = -1.0  # each pair once
        over += int((sim >= cfg.rule.alignment).sum())
        k = int(np.argmax(sim))
        if sim.flat[k] > top:
            top, top_pair = float(sim.flat[k]), (lo + k // n, k % n)
        for b in labels:
            part = sim[np.ix_(band[rows_] == b, band == b)]
            band_max[b] = max(band_max[b], float(part.max(initial=0.0)))

    def describe(k: int) -> str:
        return f"{heads[k]['set']} ({heads[k]['bucket']}, {heads[k]['notes']} notes)"

    fam = {r["family"]: k for k, r in enumerate(heads)}
    sibling = [Indel.normalized_similarity(mel[fam[f"t{f[1:]}"]], mel[k])
               for f, k in fam.items() if f.startswith("s") and f"t{f[1:]}" in fam]
    return {"pairs": n * (n - 1) // 2, "threshold": cfg.rule.alignment, "max": top,
            "max_pair": f"{describe(top_pair[0])} <-> {describe(top_pair[1])}",
            "pairs_over_threshold": over, "sibling_max": float(max(sibling, default=0.0)),
            "max_within_band": band_max}


def measure_tunes(per_cell: int, seed: int, params: Path = ROOT / "params.yaml",
                  workers: int | str = "auto") -> dict:
    """The tune set: generate, run ingest and dedupe, evaluate; ``seconds`` holds the timings."""
    cfg = load_section("dedupe", params, dedupe.DedupeConfig)
    with tempfile.TemporaryDirectory() as tmp:
        rows, out, seconds = generate_and_run(
            Path(tmp), lambda raw: write_tunes(raw, per_cell, seed), params, workers)
        t2 = time.perf_counter()
        result = evaluate(rows, out, cfg, tune_target, reach=True)
        threads = RuntimeConfig(workers=workers, progress=False).n_workers()
        result["precision"]["closest_unrelated_melody"] = closest_melodies(rows, out, cfg,
                                                                           threads)
        result["corpus"] = {"files": len(rows), "tunes_per_cell": per_cell, "seed": seed,
                            "bands": [bucket_label(b) for b in TUNE_BANDS],
                            "edits": sum((Counter(r["edits"]) for r in rows if "edits" in r),
                                         Counter()),
                            "dedupe": cfg.model_dump(mode="json")}
    result["seconds"] = {**seconds, "evaluate": time.perf_counter() - t2}
    return result


def _tune_cell(cells: list[dict]) -> str:
    """Recall of ``cells`` together, ``!`` when one is below its target, (confirmable share)."""
    n = sum(c["n"] for c in cells)
    if not n:
        return "-"
    low = any(c["found"] / c["n"] < c["target"] for c in cells)
    found, confirmable = (sum(c[k] for c in cells) / n for k in ("found", "confirmable"))
    return f"{found:.2f}{'!' if low else ' '}({confirmable:.2f})"


def print_tunes(result: dict) -> None:
    labels = result["corpus"]["bands"]
    rec = result["recall"]
    print("tunes: recall (found / planted), and in brackets the share the near rules confirm "
          "when the pair is measured directly (proposed or not); ! = below target (0.90; 0.95 "
          "for <= 5% of >= 100 notes)")
    print(f"{'edit mix':<26}{'rate':>5}{'n':>4}  " + "".join(f"{b:>14}" for b in labels)
          + f"{'all':>14}  {'melody sim min/median':<22}missed because")
    for mix in tunes.MIXES:
        for rate in TUNE_RATES:
            kind = f"{mix} {rate:.0%}"
            cells = [c for c in rec if c["kind"] == kind]
            by_b = [[c for c in cells if c["bucket"] == b] for b in labels]

            missed = sum((Counter(c["missed_because"]) for c in cells), Counter())
            mins = [c["melody_min"] for c in cells if c["melody_min"] is not None]
            meds = [c["melody_median"] for c in cells if c["melody_median"] is not None]
            sims = f"{min(mins):.3f}/{float(np.median(meds)):.3f}" if mins else "-"
            print(f"{mix:<26}{rate:>5.0%}{max(c['n'] for c in cells):>4}  "
                  + "".join(f"{_tune_cell(c):>14}" for c in by_b)
                  + f"{_tune_cell(cells):>14}  {sims:<22}"
                  + " ".join(f"{t} {v}" for t, v in missed.most_common()))
    print("\ntunes: false merges (pieces whose cluster holds another family; target 0)")
    print(f"{'set':<16}" + "".join(f"{b:>10}" for b in labels) + f"{'all':>8}")
    for s in TUNE_SETS:
        cells = [c for c in result["merges"] if c["set"] == s]
        print(f"{s:<16}" + "".join(f"{sum(c['merged'] for c in cells if c['bucket'] == b):>10}"
                                   for b in labels) + f"{sum(c['merged'] for c in cells):>8}")
    p = result["precision"]
    print(f"\ntunes: pairwise precision {p['pairwise_precision']:.4f}: {p['false_merge_pairs']} "
          f"false of {p['pairs_sharing_a_cluster']} pairs sharing a cluster; "
          f"{p['clusters_mixing_families']} clusters mix families; confirmed pairs across "
          f"families by tier: {p['cross_family_edges_by_tier'] or 'none'}")
    m = p["closest_unrelated_melody"]
    if m["pairs"]:
        bands = ", ".join(f"{b} {v:.3f}" for b, v in m["max_within_band"].items())
        print(f"closest unrelated tunes by melody alignment, exact over all {m['pairs']} pairs "
              f"of tunes and siblings: max {m['max']:.3f} ({m['max_pair']}); within a band "
              f"{bands}; tune with its own sibling {m['sibling_max']:.3f}; "
              f"{m['pairs_over_threshold']} pairs reach the threshold {m['threshold']:.3f}")
    for e in p["cross_family_examples"][:5]:
        print(f"  {e['tier']}: {e['a']}  <->  {e['b']}  (Jaccard {e['jaccard']}, "
              f"containment {e['containment']})")


# ------------------------------------------------------------------------------------- report
def _fmt(cells: list[dict], key: str, goal: float | None) -> str:
    n = sum(c["n"] for c in cells)
    if not n:
        return "-"
    value = sum(c[key] for c in cells) / n
    return f"{value:.2f}{'!' if goal is not None and value < goal else ' '}"


def print_table(result: dict) -> None:
    labels = result["corpus"]["buckets"]
    rec = result["recall"]
    head = f"{'variant kind':<16}{'texture':<8}{'n':>3}  " + "".join(f"{b:>10}" for b in labels)
    print(f"recall (found / planted; n = originals per cell; ! = below target; false = variants "
          f"merged with another family)\n{head}{'all':>8}{'false':>6}  linked by (first tier)"
          f"      missed because")
    for kind in KINDS:
        for tx in TEXTURES:
            cells = [c for c in rec if c["kind"] == kind and c["texture"] == tx]
            if not cells:
                continue
            goal = target(kind)
            by_b = [[c for c in cells if c["bucket"] == b] for b in labels]
            linked = sum((Counter(c["linked_by"]) for c in cells), Counter())
            missed = sum((Counter(c["missed_because"]) for c in cells), Counter())
            total = sum(linked.values()) or 1
            link_s = " ".join(f"{t} {v / total:.0%}" for t, v in linked.most_common())
            miss_s = " ".join(f"{t} {v}" for t, v in missed.most_common())
            n_b = max(c["n"] for c in cells)
            false = sum(c["merged"] for c in result["merges"]
                        if c["kind"] == kind and c["texture"] == tx)
            print(f"{kind:<16}{tx:<8}{n_b:>3}  " + "".join(f"{_fmt(c, 'found', goal):>10}"
                                                         for c in by_b)
                  + f"{_fmt(cells, 'found', goal):>8}{false:>5}{'!' if false else ' '} "
                  f"{link_s:<28} {miss_s}")
    print("\nfalse merges (pieces whose cluster holds another family; target 0)")
    print(f"{'set':<16}{'texture':<8}{'n':>3}  " + "".join(f"{b:>10}" for b in labels)
          + f"{'all':>8}")
    for s in SETS:
        for tx in TEXTURES:
            cells = [c for c in result["merges"] if c["set"] == s and c["texture"] == tx]
            by_b = [[c for c in cells if c["bucket"] == b] for b in labels]
            n_b = max(sum(c["n"] for c in b) for b in by_b)
            print(f"{s:<16}{tx:<8}{n_b:>3}  "
                  + "".join(f"{sum(c['merged'] for c in b):>10}" for b in by_b)
                  + f"{sum(c['merged'] for c in cells):>8}")
    p = result["precision"]
    print(f"\npairwise precision {p['pairwise_precision']:.4f}: {p['false_merge_pairs']} false "
          f"of {p['pairs_sharing_a_cluster']} pairs sharing a cluster; "
          f"{p['clusters_mixing_families']} clusters mix families; confirmed pairs across "
          f"families by tier: {p['cross_family_edges_by_tier'] or 'none'}")
    c = p["closest_unrelated"]
    if c["pairs"]:
        print(f"closest unrelated pieces, exact over all {c['pairs']} pairs of family heads "
              f"(no LSH): Jaccard max {c['jaccard_max']:.3f} ({c['jaccard_max_pair']}), "
              f"containment max {c['containment_max']:.3f} ({c['containment_max_pair']}); "
              f"{c['pairs_over_a_threshold']} pairs reach a near threshold")
    for e in p["cross_family_examples"][:5]:
        print(f"  {e['tier']}: {e['a']}  <->  {e['b']}  (Jaccard {e['jaccard']}, "
              f"containment {e['containment']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pieces", type=int, default=64,
                    help="originals per length bucket (0 = skip the style sets)")
    ap.add_argument("--tunes", type=int, default=64,
                    help="tunes per cell (length band x edit kind) of the tune set (0 = skip it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the tables here (no timings)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml",
                    help="ingest and dedupe settings are read from this file")
    ap.add_argument("--workers", default="auto", help="'auto' or a number (results do not change)")
    args = ap.parse_args()
    workers = int(args.workers) if args.workers.isdigit() else args.workers
    t0 = time.perf_counter()
    result: dict = {}
    if args.pieces > 0:
        result = measure(args.pieces, args.seed, args.params, workers)
        c = result["corpus"]
        print(f"{c['files']} files: {args.pieces} originals per bucket x {len(KINDS)} variants, "
              f"plus as many walk and cadence pieces; seed {args.seed}\n")
        print_table(result)
        s = result.pop("seconds")
        print(f"\ntime: generate {s['generate']:.1f} s, ingest + dedupe {s['stages']:.1f} s, "
              f"evaluate {s['evaluate']:.1f} s")
    if args.tunes > 0:
        result["tunes"] = measure_tunes(args.tunes, args.seed, args.params, workers)
        c = result["tunes"]["corpus"]
        print(f"\n{c['files']} files of the tune set: {args.tunes} tunes per band and edit "
              f"kind ({len(TUNE_BANDS)} x {len(TUNE_KINDS)}), each with an edited copy and a "
              f"sibling; seed {args.seed}\n")
        print_tunes(result["tunes"])
        s = result["tunes"].pop("seconds")
        print(f"\ntime (tunes): generate {s['generate']:.1f} s, ingest + dedupe "
              f"{s['stages']:.1f} s, evaluate {s['evaluate']:.1f} s")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    if args.json:
        artifacts.write_json(args.json, result)


if __name__ == "__main__":
    main()

"""Exhaustive near-copy search (:mod:`pipeline.similarity.neighbours`): exact nearest
neighbours, planted edited copies that shingles miss caught by the melody alignment or by the
alignment of the whole note tokens, unrelated pieces of one style never matched, dedupe's
alignment threshold as the edit tolerance, and every measure equal to brute force."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.music.manifest import NOTES_SCHEMA
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.duplicates import DedupeConfig
from pipeline.similarity.neighbours import (
    MEASURES,
    LengthCaps,
    Melodies,
    ShingleMatrix,
    TokenStrings,
    near_copies,
    neighbours,
)
from pipeline.similarity.rule import alignment_threshold
from tests.stages.test_dedupe import base_piece, planted_corpus, variant

RULE = DedupeConfig().rule


def _matrix(pieces: dict) -> ShingleMatrix:
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **v} for k, v in pieces.items()]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    return ShingleMatrix.build(fp.notes_from_table(table), 4, 4)


def test_nearest_equals_brute_force():
    pieces, _ = planted_corpus(seed=1, families=3, singles=6)
    sm = _matrix(pieces)
    off, vals = sm.matrix.indptr, sm.matrix.indices
    sets = [np.sort(vals[off[i] : off[i + 1]]) for i in range(len(sm.sha256))]
    query, pool = np.arange(0, len(sets), 2), np.arange(1, len(sets), 2)
    for exclude_self, pool_ in ((False, pool), (True, np.arange(len(sets)))):
        found = neighbours(sm, None, None, query, pool_, RULE, align=False,
                           groups=np.arange(len(sets)) if exclude_self else None)
        j = found.values[:, MEASURES.index("nearest_jaccard")]
        c = found.values[:, MEASURES.index("nearest_containment")]
        for n, q in enumerate(query):
            sims = [fp.jaccard_containment(sets[q], sets[p]) for p in pool_ if p != q]
            assert j[n] == pytest.approx(max(s[0] for s in sims))
            assert c[n] == pytest.approx(max(s[1] for s in sims))
    assert j.max() > 0.5  # the planted variants are found


# ------------------------------------------------------- tunes of one style and their copies
STEPS = np.array([-4, -3, -2, -1, 1, 2, 3, 4])
STEP_P = np.array([1, 2, 5, 8, 8, 5, 2, 1]) / 32
CADENCE = (67, 65, 64, 62, 60)  # every tune ends on the same formula (sol fa mi re do)


def _notes(pitch, dur) -> dict:
    size = len(pitch)
    dur = np.asarray(dur, dtype=np.float64)
    return {"onset": np.concatenate([[0.0], np.cumsum(dur)[:-1]]), "duration": dur,
            "pitch": np.asarray(pitch, dtype=np.int16), "velocity": np.full(size, 80, np.int16),
            "track": np.zeros(size, np.int16), "program": np.zeros(size, np.int16),
            "is_drum": np.zeros(size, bool)}


def tune(rng: np.random.Generator, n: int) -> dict:
    """A tune of ``n`` notes in one style: a walk from one interval distribution (reflected at
    the range's edges), ending on the shared cadence."""
    pitch = [67]
    for step in rng.choice(STEPS, size=n - len(CADENCE) - 1, p=STEP_P):
        pitch.append(pitch[-1] + (step if 55 <= pitch[-1] + step <= 84 else -step))
    return _notes(pitch + list(CADENCE), rng.choice([0.5, 1.0, 1.0, 2.0], size=n))


def edited(rng: np.random.Generator, notes: dict, k: int) -> dict:
    """``notes`` with ``k`` non-adjacent notes changed by 1-2 semitones or (every other one)
    dropped; the first note and the cadence are left alone."""
    pitch = notes["pitch"].astype(int).tolist()
    dur = notes["duration"].tolist()
    where = np.sort(rng.choice(np.arange(1, len(pitch) - len(CADENCE) - 1, 2), size=k,
                               replace=False))
    dropped = []
    for n, i in enumerate(where):
        if n % 2:
            dropped.append(i)
            continue
        for delta in rng.permutation([-2, -1, 1, 2]):  # a real change: no new repeated pitch
            if pitch[i] + delta not in (pitch[i - 1], pitch[i + 1]):
                pitch[i] += int(delta)
                break
    keep = [i for i in range(len(pitch)) if i not in dropped]
    return _notes([pitch[i] for i in keep], [dur[i] for i in keep])


def _arrays(pieces: dict, symbols: int = 256
            ) -> tuple[ShingleMatrix, Melodies, TokenStrings, list[str]]:
    names = sorted(pieces)  # the sha256 column is the name here: rows stay in name order
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **pieces[k]} for k in names]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    notes = fp.notes_from_table(table)
    return (ShingleMatrix.build(notes, 4, 4), Melodies.build(notes),
            TokenStrings.build(notes, 4, symbols=symbols), names)


def test_short_edited_copy_is_caught_by_the_melody_alignment():
    rng = np.random.default_rng(11)
    pieces = {f"short{i:02d}": tune(rng, int(rng.integers(12, 20))) for i in range(40)}
    pieces |= {f"long{i:02d}": tune(rng, int(rng.integers(40, 150))) for i in range(10)}
    pieces["original"] = tune(rng, 18)
    pieces["copy"] = edited(rng, pieces["original"], k=1)
    sm, mel, tok, names = _arrays(pieces)
    row = {name: i for i, name in enumerate(names)}
    assert sm.sizes[row["copy"]] < RULE.min_shingles  # too short for the shingle measure
    assert sm.sizes[row["original"]] < RULE.min_shingles
    query = np.array([row["copy"]] + [row[f"short{i:02d}"] for i in range(20)])
    pool = np.array(sorted(set(row.values()) - set(query.tolist())))
    found = near_copies(sm, mel, tok, query, pool, RULE)
    assert found.near.tolist() == [True] + [False] * 20  # unrelated short tunes: no match
    assert found.melody_partner[0] == row["original"] and found.shingle_partner[0] == -1
    assert found.melody[0] >= RULE.alignment > found.melody[1:].max()


def chorale(rng: np.random.Generator, n_chords: int) -> dict:
    """A four-voice piece of ``n_chords`` chords whose soprano holds each pitch for two chords, so
    its melody (repeated pitches merged) has fewer than ``min_melody_notes`` notes: a piece the
    melody rule cannot measure. Voices lie 3-9 semitones apart, leaving room for an inner note."""
    steps = rng.choice([-2, -1, 1, 2], size=(n_chords + 1) // 2)
    soprano = 72 + np.repeat(np.cumsum(steps), 2)[:n_chords]
    alto = soprano - rng.integers(3, 6, size=n_chords)
    tenor = alto - rng.integers(3, 6, size=n_chords)
    bass = tenor - rng.integers(6, 10, size=n_chords)
    dur = rng.choice([0.5, 1.0, 1.0, 2.0], size=n_chords)
    onset = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    pitch = np.stack([bass, tenor, alto, soprano], axis=1)  # a chord reads bottom-up
    return _chords(onset, dur, pitch.ravel(), np.tile([3, 2, 1, 0], n_chords))


def _chords(onset, dur, pitch, track) -> dict:
    size = len(pitch)
    per = size // len(onset)
    return {"onset": np.repeat(onset, per), "duration": np.repeat(dur, per),
            "pitch": np.asarray(pitch, dtype=np.int16), "velocity": np.full(size, 80, np.int16),
            "track": np.asarray(track, dtype=np.int16), "program": np.zeros(size, np.int16),
            "is_drum": np.zeros(size, bool)}


def with_inner_notes(notes: dict, chords: list[int]) -> dict:
    """``notes`` (four voices a chord) with one note added between bass and tenor in each of
    ``chords``: each costs an alignment 3 insertions/deletions (the note, and the tenor's new
    interval) but breaks every shingle through those two tokens."""
    out = {k: [] for k in notes}
    for c in range(notes["pitch"].size // 4):
        rows = slice(4 * c, 4 * c + 4)
        for k, v in notes.items():
            out[k].extend(v[rows][:1])
        if c in chords:
            bass, tenor = int(notes["pitch"][4 * c]), int(notes["pitch"][4 * c + 1])
            for k, v in notes.items():
                out[k].append((bass + tenor) // 2 if k == "pitch" else v[4 * c])
        for k, v in notes.items():
            out[k].extend(v[rows][1:])
    return {k: np.asarray(v, dtype=notes[k].dtype) for k, v in out.items()}


def _chorale_corpus() -> dict:
    rng = np.random.default_rng(13)
    pieces = {f"other{i:02d}": chorale(rng, int(rng.integers(12, 30))) for i in range(30)}
    pieces["original"] = chorale(rng, 15)
    pieces["copy"] = with_inner_notes(pieces["original"], [1, 4, 7, 10, 13])
    return pieces


def test_edited_short_chorale_is_caught_by_the_whole_token_alignment():
    """A 15-chord, four-voice piece with 5 inner notes added: its shingle Jaccard and
    containment fall under dedupe's thresholds and its melody is too short to align, but its
    whole note tokens align at >= 0.867. Unrelated pieces of the same kind match nothing, and
    the result does not depend on ``workers``."""
    sm, mel, tok, names = _arrays(_chorale_corpus())
    row = {name: i for i, name in enumerate(names)}
    others = [row[f"other{i:02d}"] for i in range(30)]
    query = np.array([row["copy"], *others[:15]])
    pool = np.array(sorted([row["original"], *others[15:]]))
    assert min(tok.onsets[row["copy"]], tok.onsets[row["original"]]) >= RULE.min_align_onsets
    found = near_copies(sm, mel, tok, query, pool, RULE)
    assert found.jaccard[0] < RULE.jaccard and found.containment[0] < RULE.containment
    assert found.shingle_partner[0] == found.melody_partner[0] == -1
    assert mel.lengths[:, row["copy"]].max() < RULE.min_melody_notes - 1
    assert found.alignment_partner[0] == row["original"]
    assert found.alignment[0] >= RULE.alignment > found.alignment[1:].max()
    assert found.near.tolist() == [True] + [False] * 15  # unrelated pieces: no match
    again = near_copies(sm, mel, tok, query, pool, RULE, workers=2)
    for field in found.__dataclass_fields__:
        assert np.array_equal(getattr(found, field), getattr(again, field)), field


def test_melody_threshold_is_dedupes_edit_tolerance():
    """Jaccard 0.5 on 4-shingles tolerates 1/15 changed notes; an interval sequence with that
    share changed sits exactly at the alignment threshold, one more change falls below it."""
    assert DedupeConfig().near_alignment is None  # derived from near_jaccard and shingle_k
    assert RULE.alignment == alignment_threshold(0.5, 4) == pytest.approx(13 / 15)
    original = tune(np.random.default_rng(3), 31)  # 30 intervals, steps of 1-4 semitones

    def octave_up(at: tuple[int, ...]) -> dict:  # its two intervals become ones no tune has
        pitch = original["pitch"].copy()
        pitch[list(at)] += 12
        return _notes(pitch, original["duration"])

    pieces = {"original": original, "two": octave_up((5, 15)), "three": octave_up((5, 15, 25))}
    sm, mel, tok, names = _arrays(pieces)
    row = {name: i for i, name in enumerate(names)}
    found = near_copies(sm, mel, tok, np.array([row["two"], row["three"]]),
                        np.array([row["original"]]), RULE)
    assert found.melody.tolist() == pytest.approx([1 - 8 / 60, 1 - 12 / 60])
    assert found.melody_partner.tolist() == [row["original"], -1]


@pytest.mark.parametrize("symbols", [256, 2], ids=["coarse-256", "coarse-2"])
def test_near_copies_equal_brute_force(symbols):
    """Every measure equals a brute-force pass over all pairs. With 2 symbols the one-byte token
    strings bound the similarity loosely, so the exact alignment decides nearly every pair:
    the result does not depend on the bound."""
    from rapidfuzz.distance import Indel

    rng = np.random.default_rng(5)
    pieces = {f"t{i:02d}": tune(rng, int(rng.integers(12, 300))) for i in range(30)}
    for i in range(0, 30, 3):  # planted copies, some of them long (shingles only)
        pieces[f"t{i:02d}_copy"] = edited(rng, pieces[f"t{i:02d}"], k=max(1, len(
            pieces[f"t{i:02d}"]["pitch"]) // 20))
    pieces["chordal"] = base_piece(rng, n_events=50)
    pieces["chordal_copy"] = variant(rng, pieces["chordal"], "edited")
    sm, mel, tok, names = _arrays(pieces, symbols=symbols)
    rule, caps = RULE, LengthCaps(max_melody_notes=200, max_align_tokens=200)
    t = rule.alignment - 1e-9
    query = np.arange(0, len(names), 2)
    pool = np.arange(1, len(names), 2)
    groups = np.arange(len(names)) // 4  # some (query, pool) pairs share a group
    for g in (None, groups):
        found = near_copies(sm, mel, tok, query, pool, rule, caps=caps, groups=g)
        for n, q in enumerate(query):
            others = [p for p in pool if g is None or g[p] != g[q]]
            jc = {p: fp.jaccard_containment(sm.shingle_set(q), sm.shingle_set(p)) for p in others}
            big = [p for p in others if min(sm.sizes[q], sm.sizes[p]) >= rule.min_shingles]
            assert found.jaccard[n] == pytest.approx(max([jc[p][0] for p in big], default=0))
            assert found.containment[n] == pytest.approx(max([jc[p][1] for p in big], default=0))
            shingle_hit = [p for p in big if jc[p][0] >= rule.jaccard
                           or jc[p][1] >= rule.containment]
            lq = tok.lengths[q]
            aligned = {p: Indel.normalized_similarity(tok.exact[q], tok.exact[p]) for p in others
                       if min(tok.onsets[q], tok.onsets[p]) >= rule.min_align_onsets
                       and lq < caps.max_align_tokens
                       and 2 * min(lq, tok.lengths[p]) / (lq + tok.lengths[p]) >= t}
            assert found.alignment[n] == max(aligned.values(), default=0.0), names[q]  # exact
            alignment_hit = [p for p, s in aligned.items() if s >= t]
            melody_hit = [p for p in others for v in range(2)
                          if rule.min_melody_notes - 1 <= mel.lengths[v, q]
                          < caps.max_melody_notes - 1
                          and mel.lengths[v, p] >= rule.min_melody_notes - 1
                          and Indel.normalized_similarity(mel.views[v][q], mel.views[v][p]) >= t]
            assert (found.shingle_partner[n] >= 0) == bool(shingle_hit), names[q]
            assert (found.alignment_partner[n] >= 0) == bool(alignment_hit), names[q]
            assert (found.melody_partner[n] >= 0) == bool(melody_hit), names[q]
            assert found.near[n] == bool(shingle_hit or alignment_hit or melody_hit)
            if shingle_hit:
                assert found.shingle_partner[n] in shingle_hit
            if alignment_hit:
                assert found.alignment_partner[n] in alignment_hit
            if melody_hit:
                assert found.melody_partner[n] in melody_hit
        if g is None:  # the planted copies were found (by every measure)
            assert (found.shingle_partner >= 0).sum() >= 3
            assert (found.alignment_partner >= 0).sum() >= 3
            assert (found.melody_partner >= 0).sum() >= 3

"""Candidates for short melodies (:mod:`pipeline.similarity.short_melodies`): a short tune copied
with
chromatic changes, a dropped note and another rhythm is linked to it, although its note shingles
and shared runs propose nothing; unrelated short tunes that share an opening and a cadence stay
apart; every pair the path adds aligns at the threshold."""

from __future__ import annotations

import numpy as np
import pytest
from rapidfuzz.distance import Indel

from pipeline.core.config import ParamsError, parse_section
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import short_melodies
from pipeline.stages.dedupe import DedupeConfig
from tests.stages.test_dedupe import _sorted, run_dedupe

STEPS = np.array([-3, -2, -1, 1, 2, 3])


def part(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` pitches of a walk in steps of 1-3 semitones (no repeated pitch)."""
    return (67 + np.cumsum(rng.choice(STEPS, size=n))).clip(55, 84).tolist()


def aabb(a: list[int], b: list[int], ioi: tuple[float, ...] = (0.5,)) -> dict[str, np.ndarray]:
    """A monophonic tune of parts ``a`` and ``b``, each played twice; inter-onset intervals
    cycle through ``ioi``."""
    pitch = np.array(a + a + b + b, dtype=np.int16)
    n = pitch.size
    dur = np.resize(np.array(ioi), n)
    onset = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    return _sorted({"onset": onset, "duration": dur.astype(float), "pitch": pitch,
                    "velocity": np.full(n, 80, np.int16), "track": np.zeros(n, np.int16),
                    "program": np.zeros(n, np.int16), "is_drum": np.zeros(n, bool)})


def melody_of(tune: dict[str, np.ndarray]) -> str:
    """The tune's intervals as :func:`short_melodies.texts` writes them."""
    intervals = np.diff(tune["pitch"].astype(np.int64))
    return short_melodies.texts(np.array([0, intervals.size]), intervals, 2, 10_000, 4, 1)[0]


@pytest.fixture(scope="module")
def tunes():
    rng = np.random.default_rng(11)
    a, b = part(rng, 16), part(rng, 16)
    tune = aabb(a, b)
    # another version: dotted rhythm, a chromatic note in the A part and a note left out of
    # the B part, both times through (4 of 64 notes)
    a2, b2 = list(a), list(b)
    a2[6] += 1
    del b2[9]
    pieces = {"tune": tune, "version": aabb(a2, b2, ioi=(0.75, 0.25))}
    # unrelated tunes of the same rhythm with the tune's opening (5 notes) and cadence (5 notes)
    for s in range(4):
        x, y = part(rng, 16), part(rng, 16)
        x[:5], x[-5:], y[-5:] = a[:5], a[-5:], b[-5:]
        pieces[f"other{s}"] = aabb(x, y)
    return pieces


def test_lsh_threshold_bounds_the_jaccard_of_isolated_edits():
    """At the similarity a few isolated edits leave, the melody k-gram Jaccard is at least the
    derived threshold, for each kind of edit (changed, dropped, added note)."""
    rng = np.random.default_rng(3)
    k = 4
    for kind in ("changed", "dropped", "added"):
        for n_edits in (1, 2, 3, 4):
            base = rng.integers(1, 250, size=80)  # intervals; repeated grams unlikely
            copy = list(base)
            for at in sorted(rng.choice(np.arange(5, 75, 12), n_edits, replace=False))[::-1]:
                if kind == "changed":  # a note moved: its interval and the next change
                    copy[at: at + 2] = [copy[at] + 1, copy[at + 1] - 1]
                elif kind == "dropped":  # two intervals become one
                    copy[at: at + 2] = [copy[at] + copy[at + 1]]
                else:  # one interval becomes two
                    copy[at: at + 1] = [copy[at] - 1, 1]
            x, y = (bytes(np.clip(v, 1, 255).astype(np.uint8)).decode("latin-1")
                    for v in (base, np.array(copy)))
            grams = [{s[i: i + k] for i in range(len(s) - k + 1)} for s in (x, y)]
            jaccard = len(grams[0] & grams[1]) / len(grams[0] | grams[1])
            similar = Indel.normalized_similarity(x, y)
            assert jaccard >= short_melodies.lsh_threshold(similar, k) - 0.02, (kind, n_edits)
    assert short_melodies.lsh_threshold(0.867, 4) == pytest.approx(0.385, abs=1e-3)


def test_only_pairs_that_align_are_kept():
    """The LSH proposes a melody with its halves swapped (nearly the same k-grams), alignment
    rejects it; an edited copy is kept; with sides only cross pairs come back."""
    rng = np.random.default_rng(5)
    x = bytes(rng.integers(1, 250, size=60).astype(np.uint8)).decode("latin-1")
    swapped = x[30:] + x[:30]
    edited = x[:20] + chr(ord(x[20]) % 250 + 1) + x[21:]
    melodies = np.array([x, swapped, edited, ""], dtype=object)
    perms = fp.minhash_permutations(128, 1)
    sigs = short_melodies.signatures(melodies, 4, perms)
    stats: dict[str, int] = {}
    a, b = short_melodies.candidates(melodies, sigs, alignment=0.867, k=4, stats=stats)
    assert (a.tolist(), b.tolist()) == ([0], [2])
    assert stats["near_short_aligned"] >= 2  # the swapped pair was proposed and aligned
    assert stats["near_candidates_short"] == 1
    side = np.array([0, 0, 1, 1], dtype=np.int8)
    a, b = short_melodies.candidates(melodies, sigs, alignment=0.867, k=4, side=side,
                                     workers=2)
    assert (a.tolist(), b.tolist()) == ([0], [2])
    assert sigs[3].tolist() == [np.iinfo(np.uint32).max] * 128  # no melody: no signature


def test_a_short_version_with_other_rhythm_and_pitch_edits_is_linked(tunes, tmp_path):
    similar = Indel.normalized_similarity(melody_of(tunes["tune"]), melody_of(tunes["version"]))
    assert DedupeConfig().rule.alignment <= similar < 0.9  # near by the melody rule, not by much

    def linked(name: str, **raw) -> tuple[bool, dict]:
        shas, clusters, pairs, report = run_dedupe(tmp_path / name, tunes,
                                                   parse_section("dedupe", raw, DedupeConfig))
        same = clusters.loc[shas["tune"], "cluster_id"] == clusters.loc[shas["version"],
                                                                        "cluster_id"]
        if same:
            row = pairs[pairs["a"].isin([shas["tune"], shas["version"]])
                        & pairs["b"].isin([shas["tune"], shas["version"]])].iloc[0]
            assert row["rule"] == "melody" and row["similarity"] < 0.1  # no shingle in common
        return bool(same), report

    found, report = linked("default")
    assert found and report["near_candidates_short"] >= 1
    # where shared runs propose nothing (candidate_share 1.0 stands in for a corpus whose stock
    # figures hold every run past max_df), the short-melody candidates alone find the version,
    # and nothing does without them: the note shingles share nothing
    assert linked("no_runs", candidate_share=1.0)[0]
    assert not linked("neither", candidate_share=1.0, short_melody_notes=0)[0]


def test_short_tunes_sharing_an_opening_and_a_cadence_stay_apart(tunes, tmp_path):
    names = ["tune", *(f"other{s}" for s in range(4))]
    for other in names[1:]:
        similar = Indel.normalized_similarity(melody_of(tunes["tune"]), melody_of(tunes[other]))
        assert similar < DedupeConfig().rule.alignment
    shas, clusters, _, report = run_dedupe(tmp_path, tunes)
    assert len({clusters.loc[shas[n], "cluster_id"] for n in names}) == len(names)
    # the short-melody LSH proposed some of them, and their alignment turned them down
    assert report["near_short_aligned"] > report["near_candidates_short"]


@pytest.mark.parametrize("raw, key", [
    ({"short_melody_notes": 5}, "dedupe.short_melody_notes"),
    ({"short_melody_notes": -1}, "dedupe.short_melody_notes"),
    ({"short_melody_notes": 64, "near_alignment": 0.6}, "dedupe"),
])
def test_bad_short_melody_settings_fail_fast(raw, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_section("dedupe", raw, DedupeConfig)
    assert parse_section("dedupe", {"short_melody_notes": 0, "near_alignment": 0.6},
                         DedupeConfig).short_melody_notes == 0

"""Per-piece conditions (pipeline.conditions.extract): key, density, polyphony and bands on
hand-built notes with known answers and against music21's key finder on real chorales; meter and
tempo on hand-built MIDI files and against music21 on real chorales."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.conditions.extract import (
    band,
    density,
    estimate_key,
    meter_and_tempo,
    pitch_class_profile,
    polyphony,
)

MAJOR_SCALE = [0, 2, 4, 5, 7, 9, 11]


def _scale_key(tonic: int, steps: list[int], weights: list[float]):
    pitch = np.array([60 + tonic + s for s in steps])
    return estimate_key(pitch_class_profile(pitch, np.array(weights, dtype=float)))


@pytest.mark.parametrize("tonic", range(12))
def test_a_major_scale_with_its_triad_held_longer_is_that_major_key(tonic):
    k = _scale_key(tonic, MAJOR_SCALE, [4, 1, 3, 1, 3, 1, 1])
    assert (k.tonic, k.mode) == (tonic, "major") and k.correlation > 0.8


@pytest.mark.parametrize("tonic", [9, 2, 4])
def test_a_natural_minor_scale_with_its_triad_held_longer_is_that_minor_key(tonic):
    k = _scale_key(tonic, [0, 2, 3, 5, 7, 8, 10], [4, 1, 3, 1, 3, 1, 1])
    assert (k.tonic, k.mode) == (tonic, "minor")


def test_a_piece_without_a_profile_has_no_key():
    assert estimate_key(np.zeros(12)) is None
    assert estimate_key(np.ones(12)) is None  # the chromatic scale, evenly: no key
    assert estimate_key(pitch_class_profile(np.array([60]), np.array([1.0]),
                                            np.array([True]))) is None  # drums only


def test_drums_do_not_move_the_key():
    pitch = np.array([60, 64, 67, 61, 61, 61])
    dur = np.array([2.0, 2.0, 2.0, 8.0, 8.0, 8.0])
    drums = np.array([False, False, False, True, True, True])
    assert estimate_key(pitch_class_profile(pitch, dur, drums)).name == "C major"
    assert estimate_key(pitch_class_profile(pitch, dur)).name != "C major"


def test_density_and_polyphony_on_known_textures():
    # eight quarter notes, one after another: one note per beat, one voice
    onset = np.arange(8, dtype=float)
    assert density(onset, np.ones(8)) == 1.0 and polyphony(onset, np.ones(8)) == 1.0
    # four-voice chords on every beat for four beats
    onset4, dur4 = np.repeat(np.arange(4.0), 4), np.ones(16)
    assert density(onset4, dur4) == 4.0 and polyphony(onset4, dur4) == 4.0
    # a held bass under four quarter notes: two voices all the time
    onset2, dur2 = np.array([0.0, 0, 1, 2, 3]), np.array([4.0, 1, 1, 1, 1])
    assert polyphony(onset2, dur2) == 2.0
    # silence between notes does not dilute polyphony, only density
    gap_on, gap_dur = np.array([0.0, 0.0, 10.0, 10.0]), np.ones(4)
    assert polyphony(gap_on, gap_dur) == 2.0 and density(gap_on, gap_dur) == 4 / 11
    assert density(np.zeros(0), np.zeros(0)) == 0.0 == polyphony(np.zeros(0), np.zeros(0))


def test_bands_are_half_open_and_refuse_bad_edges():
    labels = ["sparse", "medium", "dense"]
    assert [band(v, [1.0, 3.0], labels) for v in (0.5, 1.0, 2.9, 3.0, 9)] == \
        ["sparse", "medium", "medium", "dense", "dense"]
    with pytest.raises(ValueError, match="labels"):
        band(1.0, [1.0, 3.0], ["a", "b"])
    with pytest.raises(ValueError, match="ascending"):
        band(1.0, [3.0, 1.0], labels)


@pytest.mark.parametrize("bwv", ["bwv269", "bwv347", "bwv153.1", "bwv40.8", "bwv10.7"])
def test_the_key_agrees_with_music21_on_real_chorales(bwv):
    """music21's Krumhansl-Kessler key finder on its own Stream, and ours on the notes."""
    from music21 import corpus
    from music21.analysis.discrete import KrumhanslKessler

    score = corpus.parse(bwv)
    pitch, dur = [], []
    for n in score.flatten().notes:
        for p in n.pitches:
            pitch.append(p.midi)
            dur.append(float(n.quarterLength))
    ours = estimate_key(pitch_class_profile(np.array(pitch), np.array(dur)))
    theirs = KrumhanslKessler().getSolution(score)
    assert (ours.tonic, ours.mode) == (theirs.tonic.pitchClass, theirs.mode), (ours, theirs)


def test_a_transposed_piece_has_the_transposed_key():
    rng = np.random.default_rng(0)
    pitch = 60 + rng.choice(MAJOR_SCALE, size=200, p=[.3, .05, .2, .1, .2, .1, .05])
    dur = rng.integers(1, 4, size=200).astype(float)
    base = estimate_key(pitch_class_profile(pitch, dur))
    for shift in range(1, 12):
        k = estimate_key(pitch_class_profile(pitch + shift, dur))
        assert (k.tonic, k.mode) == ((base.tonic + shift) % 12, base.mode)
        assert k.correlation == pytest.approx(base.correlation)


def _midi(time_signatures=(), tempos=(), tpq: int = 480) -> bytes:
    """One quarter note under the given (beat, numerator, denominator) and (beat, qpm) events,
    added in the order given."""
    from symusic import Note, Score, Tempo, TimeSignature, Track

    score = Score(tpq)
    for beat, num, den in time_signatures:
        score.time_signatures.append(TimeSignature(round(beat * tpq), num, den))
    for beat, qpm in tempos:
        score.tempos.append(Tempo(round(beat * tpq), float(qpm)))
    track = Track("t", 0, False)
    track.notes.append(Note(0, tpq, 60, 80))
    score.tracks.append(track)
    return score.dumps_midi()


@pytest.mark.parametrize(("num", "den", "qpm"), [(3, 4, 90), (6, 8, 60), (4, 4, 120),
                                                 (5, 4, 132.5), (2, 2, 72), (7, 8, 208)],
                         ids=lambda v: str(v))
def test_meter_and_tempo_of_a_hand_built_file(num, den, qpm):
    assert meter_and_tempo(_midi([(0, num, den)], [(0, qpm)])) == (f"{num}/{den}", qpm)


def test_the_first_meter_and_tempo_win_whatever_the_event_order():
    data = _midi(time_signatures=[(8, 4, 4), (0, 3, 4)], tempos=[(4, 60), (0, 100)])
    assert meter_and_tempo(data) == ("3/4", 100.0)
    # a tempo event that is not at the start still counts: it is the file's first
    assert meter_and_tempo(_midi(tempos=[(4, 66)])) == (None, 66.0)


def test_a_file_without_meter_or_tempo_gives_none():
    assert meter_and_tempo(_midi()) == (None, None)
    assert meter_and_tempo(_midi([(0, 3, 4)])) == ("3/4", None)


def test_bytes_symusic_cannot_read_raise():
    with pytest.raises(RuntimeError):
        meter_and_tempo(b"MThd\x00\x00\x00\x06garbage")


def test_meter_and_tempo_agree_with_music21_on_real_chorales(bach_dir):
    """Chorales written to MIDI by music21: the meter is the score's first time signature, the
    tempo its first metronome mark (music21 writes 120 when there is none)."""
    import csv

    from music21 import corpus, tempo

    rows = list(csv.DictReader((bach_dir / "metadata.csv").open(encoding="utf-8")))
    meters = set()
    for row in rows:
        score = corpus.parse(f"bach/bwv{row['bwv']}")
        ts = score.recurse().getElementsByClass("TimeSignature").first()
        marks = score.recurse().getElementsByClass(tempo.MetronomeMark)
        qpm = marks.first().getQuarterBPM() if marks.first() is not None else 120.0
        meter, ours = meter_and_tempo((bach_dir / row["path"]).read_bytes())
        assert meter == ts.ratioString, row
        assert ours == pytest.approx(qpm, abs=0.01), row
        meters.add(meter)
    assert meters == {"3/4", "4/4"}  # BWV 269 is in 3/4


def test_a_chorale_with_a_metronome_mark_has_its_tempo():
    """BWV 1.6 carries a metronome mark of 76 (music21 writes 120 for the others)."""
    from pipeline.stages.corpus import chorale_midi

    data, error = chorale_midi({"bwv": "1.6"})
    assert data is not None, error
    assert meter_and_tempo(data) == ("4/4", 76.0)

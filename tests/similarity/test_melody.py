"""Melody fingerprints (:mod:`pipeline.similarity.melody`): the top voice as a
transposition-invariant interval sequence, by skyline and by top track."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.music.manifest import NOTES_SCHEMA
from pipeline.similarity import fingerprints as fp
from pipeline.similarity import melody
from tests.stages.test_dedupe import _notes, _sorted

KW = dict(min_notes=4, rhythm=False, ioi_resolution=4)


def _table(pieces: list[dict]) -> fp.NoteArrays:
    rows = [{"sha256": f"{i:04d}", **_sorted(n)} for i, n in enumerate(pieces)]
    return fp.notes_from_table(pa.Table.from_pandas(pd.DataFrame(rows), schema=NOTES_SCHEMA,
                                                    preserve_index=False))


def _tune(pitch, ioi=None, shift=0):
    pitch = np.asarray(pitch) + shift
    ioi = np.ones(pitch.size) if ioi is None else np.asarray(ioi, float)
    onset = np.concatenate([[0.0], np.cumsum(ioi)[:-1]])
    bass = pitch - 12 - (np.arange(pitch.size) % 3)
    return _notes(np.concatenate([onset, onset]), np.concatenate([ioi, ioi]),
                  np.concatenate([pitch, bass]),
                  np.concatenate([np.zeros(pitch.size), np.ones(pitch.size)]))


TUNE = [67, 69, 71, 72, 71, 69, 67, 74]


def test_keys_of_a_transposed_melody_are_equal():
    keys = melody.melody_keys(_table([_tune(TUNE), _tune(TUNE, shift=5), _tune(TUNE[::-1])]),
                              **KW)
    assert keys.shape == (3, 2)
    assert (keys[0] == keys[1]).all() and (keys[0] != "").all()
    assert (keys[0] != keys[2]).all()


def test_repeated_pitches_are_merged_and_short_melodies_get_no_key():
    restruck = [67, 67, 69, 71, 71, 72, 71, 69, 67, 74]
    keys = melody.melody_keys(_table([_tune(TUNE), _tune(restruck), _tune(TUNE[:3])]), **KW)
    assert (keys[0] == keys[1]).all()
    assert (keys[2] == "").all()  # 3 notes < min_notes


def test_rhythm_counts_only_when_asked():
    swung = _tune(TUNE, ioi=[1.5, 0.5] * 4)
    notes = _table([_tune(TUNE), swung])
    plain = melody.melody_keys(notes, **KW)
    timed = melody.melody_keys(notes, **{**KW, "rhythm": True})
    assert (plain[0] == plain[1]).all() and (timed[0] != timed[1]).all()


def test_melody_intervals_are_the_top_voice_steps():
    (sky_off, sky), (top_off, top) = melody.melody_intervals(_table([_tune(TUNE), _tune([60])]))
    want = np.diff(TUNE).tolist()
    assert sky[sky_off[0]:sky_off[1]].tolist() == want == top[top_off[0]:top_off[1]].tolist()
    assert sky_off[2] - sky_off[1] == 0  # one note: no interval
    _, (off, intervals) = melody.melody_keys_and_skyline(_table([_tune(TUNE)]), **KW)
    assert intervals[off[0]:off[1]].tolist() == want


def test_drums_are_not_the_melody():
    tune = _tune(TUNE)
    size = 8
    drums = {"onset": np.arange(size, dtype=float), "duration": np.full(size, 0.5),
             "pitch": np.full(size, 100, np.int16), "velocity": np.full(size, 90, np.int16),
             "track": np.full(size, 9, np.int16), "program": np.zeros(size, np.int16),
             "is_drum": np.ones(size, bool)}
    with_drums = {k: np.concatenate([tune[k], drums[k]]) for k in tune}
    keys = melody.melody_keys(_table([tune, with_drums]), **KW)
    assert (keys[0] == keys[1]).all()


def test_skyline_ignores_inner_voices_under_a_held_top_note():
    # soprano holds 72 for 2 beats while the alto moves 64 -> 65; then the soprano moves to 74
    n = _sorted(_notes([0, 0, 1, 2, 2], [2, 1, 1, 1, 1], [72, 64, 65, 74, 60], [0, 1, 1, 0, 1]))
    na = fp.notes_from_table(pa.Table.from_pandas(pd.DataFrame([{"sha256": "x", **n}]),
                                                  schema=NOTES_SCHEMA, preserve_index=False))
    _, time, pitch = melody.skyline(na)
    assert pitch.tolist() == [72, 74] and time.tolist() == [0.0, 2.0]


def test_top_track_survives_voice_crossing():
    # the alto (track 1) crosses above the soprano at beat 1; the top track stays the soprano
    n = _sorted(_notes([0, 0, 1, 1, 2, 2], [1] * 6, [72, 67, 67, 71, 74, 65], [0, 1, 0, 1, 0, 1]))
    na = fp.notes_from_table(pa.Table.from_pandas(pd.DataFrame([{"sha256": "x", **n}]),
                                                  schema=NOTES_SCHEMA, preserve_index=False))
    mask = melody.top_track_mask(na)
    assert na.pitch[mask].tolist() == [72, 67, 74]

"""pipeline.music.parsing: MIDI bytes to a canonical note table in beats, a chunk of files parsed
at once as one at a time, and the note hash that survives re-saving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.music.parsing import (
    GRID,
    NOTE_COLUMNS,
    durations_beats,
    looks_like_midi,
    max_gaps_beats,
    note_hash,
    note_hashes,
    parse_many,
    parse_midi,
    quantise,
)
from tests.midi_utils import make_midi, random_piece

CORRUPT = ("corrupt", "empty_file", "not_midi")
"""Verdicts of the committed fixtures the parser itself rejects."""


def test_a_good_fixture_parses_to_its_notes_in_canonical_order(good_midi: Path,
                                                              midi_expected: dict):
    parsed = parse_midi(good_midi.read_bytes())
    notes = parsed.notes
    assert set(notes) == set(NOTE_COLUMNS)
    assert {v.size for v in notes.values()} == {midi_expected["files"][good_midi.name]["n_notes"]}
    order = np.lexsort((notes["track"], notes["duration"], notes["pitch"], notes["onset"]))
    np.testing.assert_array_equal(order, np.arange(order.size))
    assert parsed.tpq > 0 and parsed.n_tracks >= 1 and parsed.duration_s > 0
    assert notes["pitch"].dtype == np.int16 and notes["is_drum"].dtype == bool


def test_a_bad_fixture_is_refused_or_parses(bad_midi: Path, midi_expected: dict):
    data = bad_midi.read_bytes()
    expect = midi_expected["files"][bad_midi.name]["expect"]
    assert looks_like_midi(data) == (expect not in ("empty_file", "not_midi"))
    if expect in CORRUPT:
        with pytest.raises(RuntimeError):
            parse_midi(data)
    else:  # judged on its facts by inspection, not refused by the parser
        assert parse_midi(data).tpq > 0


def test_one_bad_file_in_a_chunk_costs_only_its_row():
    a = make_midi([(0, 1, 60, 80), (1, 1, 62, 80)])
    b = make_midi([[(0, 2, 48, 70)], [(0.5, 1, 72, 90)]], tpq=96, programs=[33, 0])
    batch = parse_many([a, b"MThd\x00\x00\x00\x06broken", b])
    assert batch.counts.tolist() == [2, 0, 2] and batch.errors[0] is None
    assert batch.errors[1] and batch.errors[2] is None
    with pytest.raises(RuntimeError, match=batch.errors[1][:20]):
        batch.one(1)
    third = batch.one(2)
    assert third.tpq == 96 and third.n_tracks == 2
    assert third.notes["onset"].tolist() == [0.0, 0.5]  # beats, not ticks
    assert third.notes["program"].tolist() == [33, 0] and third.notes["track"].tolist() == [0, 1]
    for k, data in enumerate([a, b]):  # a chunk gives each file what it gives alone
        alone, together = parse_midi(data), batch.one(2 * k)
        for c in NOTE_COLUMNS:
            np.testing.assert_array_equal(alone.notes[c], together.notes[c])
    empty = parse_many([])
    assert empty.counts.size == 0 and all(v.size == 0 for v in empty.notes.values())


def test_track_order_does_not_change_the_notes_but_it_breaks_ties():
    voices = [[(0, 1, 60, 80), (1, 1, 64, 80)], [(0, 1, 55, 80), (1, 2, 64, 80)]]
    one, other = (parse_midi(make_midi(v)).notes for v in (voices, voices[::-1]))
    assert one["pitch"].tolist() == other["pitch"].tolist() == [55, 60, 64, 64]
    assert one["duration"].tolist() == other["duration"].tolist() == [1, 1, 1, 2]
    tie = parse_midi(make_midi([[(0, 1, 60, 10)], [(0, 1, 60, 99)]])).notes
    assert tie["velocity"].tolist() == [10, 99]  # same onset, pitch, duration: track order


def test_note_hash_quantises_to_the_grid():
    notes = parse_midi(make_midi([(0, 1, 60, 80), (1, 1, 62, 80)], tpq=960)).notes
    h = note_hash(notes)
    nudged = {**notes, "onset": notes["onset"] + 0.4 / GRID}
    moved = {**notes, "onset": notes["onset"] + 0.6 / GRID}
    assert note_hash(nudged) == h and note_hash(moved) != h
    drums = {**notes, "is_drum": np.ones(2, bool)}
    assert note_hash(drums) != h
    assert quantise(np.array([0.5 / GRID, 1.0, -1.0 / GRID])).tolist() == [0, GRID, -1]
    # a zero-length note counts as one grid step, so it still differs from no note
    zero = {c: v[:1] for c, v in notes.items()}
    zero["duration"] = np.zeros(1)
    one_step = {**zero, "duration": np.full(1, 1.0 / GRID)}
    assert note_hash(zero) == note_hash(one_step)


def test_note_hashes_of_concatenated_pieces_are_each_piece_s():
    rng = np.random.default_rng(3)
    pieces = [parse_midi(make_midi(random_piece(rng, n=int(n)))).notes for n in (5, 1, 12)]
    pieces.insert(1, {c: v[:0] for c, v in pieces[0].items()})  # a piece without notes
    joined = {c: np.concatenate([p[c] for p in pieces]) for c in NOTE_COLUMNS}
    counts = [p["pitch"].size for p in pieces]
    assert note_hashes(joined, counts) == [note_hash(p) for p in pieces]
    assert durations_beats(joined, counts)[1] == 0.0


def test_note_hash_survives_resaving():
    rng = np.random.default_rng(1)
    # Voices in separate registers: one MIDI channel cannot hold overlapping notes of one pitch,
    # so merging tracks is only lossless when voices never share a pitch at the same time.
    piece = [
        [(o, d, p % 12 + 36 + 24 * i, vel) for o, d, p, vel in voice]
        for i, voice in enumerate(random_piece(rng, n=40, voices=3))
    ]
    base = parse_midi(make_midi(piece, tpq=480))
    variants = [
        make_midi(piece, tpq=96),
        make_midi(piece, tpq=10080, tempo=77.0, tempo_changes=[(8.0, 140.0)]),
        make_midi([[(o, d, p, 100) for o, d, p, _ in v] for v in piece], tpq=480),  # velocities
        make_midi([[n for voice in piece for n in voice]], tpq=480),
        make_midi(piece[::-1], tpq=480, programs=[40, 41, 42]),  # other track order/programs
    ]
    for v in variants:
        assert note_hash(parse_midi(v).notes) == note_hash(base.notes)
    shifted = [[(o, d, p + 1, vel) for o, d, p, vel in v] for v in piece]
    assert note_hash(parse_midi(make_midi(shifted)).notes) != note_hash(base.notes)


def test_silences_and_ends_of_concatenated_pieces():
    """max_gaps_beats and durations_beats measure each piece alone: a long note covers the short
    ones inside it, a piece's lead-in counts, the gap between two pieces does not, and a piece
    without notes has 0."""
    rng = np.random.default_rng(4)
    pieces = []
    for _ in range(40):
        n = int(rng.integers(0, 12))
        onset = np.sort(rng.choice([0.0, 0.5, 2.0, 9.0], n).cumsum() + rng.choice([0.0, 5.0]))
        pieces.append({"onset": onset, "duration": rng.choice([0.25, 1.0, 30.0], n)})
    counts = [p["onset"].size for p in pieces]
    joined = {c: np.concatenate([p[c] for p in pieces]) for c in ("onset", "duration")}
    gaps, ends = max_gaps_beats(joined, counts), durations_beats(joined, counts)
    for p, gap, end in zip(pieces, gaps, ends, strict=True):
        want, covered = (p["onset"][0] if p["onset"].size else 0.0), None
        for on, du in zip(p["onset"], p["duration"], strict=True):
            want = want if covered is None else max(want, on - covered)
            covered = on + du if covered is None else max(covered, on + du)
        assert gap == want == max_gaps_beats(p, [p["onset"].size])[0]
        assert end == max(p["onset"] + p["duration"], default=0.0)
    assert (gaps > 0).sum() > 10 and (np.array(counts) == 0).sum() > 1

"""pipeline.render.audio: notes and MIDI files as small, deterministic, browser-playable FLAC."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from pipeline.render.audio import (
    LEVEL,
    data_uri,
    duration_seconds,
    midi_to_flac,
    notes_to_flac,
    notes_to_midi,
)
from tests.midi_utils import make_midi

ROOT = Path(__file__).resolve().parents[2]
PEAK = round(LEVEL * 32767)

# A short phrase with two programs, a chord and uneven velocities; ends at 4.25 beats.
PHRASE = {"onset": [0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 3.0],
          "duration": [0.5, 0.5, 0.5, 0.5, 1.0, 1.5, 1.25],
          "pitch": [60, 62, 64, 65, 67, 48, 72],
          "velocity": [90, 80, 70, 60, 100, 64, 80],
          "program": [0, 0, 0, 0, 0, 32, 0]}


def decode(flac: bytes) -> tuple[np.ndarray, Any]:
    samples, _ = soundfile.read(io.BytesIO(flac), dtype="int16", always_2d=True)
    return samples, soundfile.info(io.BytesIO(flac))


def dense(seconds: float, bpm: float = 100.0, step: float = 0.25, seed: int = 0) -> dict:
    """Four voices of sixteenth notes with random pitches and velocities for ``seconds``."""
    rng = np.random.default_rng(seed)
    onset = np.arange(0.0, seconds * bpm / 60.0, step)
    cols: dict[str, list] = {"onset": [], "duration": [], "pitch": [], "velocity": []}
    for lo, hi in ((36, 52), (48, 64), (55, 72), (64, 84)):
        cols["onset"].append(onset)
        cols["duration"].append(np.full(onset.size, step))
        cols["pitch"].append(rng.integers(lo, hi, onset.size))
        cols["velocity"].append(rng.integers(50, 110, onset.size))
    return {k: np.concatenate(v) for k, v in cols.items()}


def test_same_notes_same_bytes_in_this_and_a_fresh_process() -> None:
    flac = notes_to_flac(PHRASE, bpm=120)
    assert flac is not None and flac == notes_to_flac(PHRASE, bpm=120)
    code = ("import hashlib, json, sys\n"
            "from pipeline.render.audio import notes_to_flac\n"
            "notes = json.loads(sys.argv[1])\n"
            "print(hashlib.sha256(notes_to_flac(notes, bpm=120)).hexdigest())\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(PHRASE)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == hashlib.sha256(flac).hexdigest(), out.stderr


def test_row_order_does_not_change_the_bytes() -> None:
    order = np.random.default_rng(1).permutation(len(PHRASE["pitch"]))
    shuffled = {k: np.asarray(v)[order] for k, v in PHRASE.items()}
    assert notes_to_flac(shuffled, bpm=120) == notes_to_flac(PHRASE, bpm=120)
    other = dict(PHRASE, velocity=[80] * 7)
    assert notes_to_flac(other, bpm=120) != notes_to_flac(PHRASE, bpm=120)


def test_decodes_mono_at_the_rate_lasting_to_the_last_note_end_at_the_set_peak() -> None:
    flac = notes_to_flac(PHRASE, bpm=120, sample_rate=16000)
    samples, info = decode(flac)
    assert flac[:4] == b"fLaC"
    assert (info.samplerate, info.channels, info.format, info.subtype) == (16000, 1, "FLAC",
                                                                           "PCM_16")
    assert info.frames == 4.25 * 0.5 * 16000  # last note ends at beat 4.25 = 2.125 s at 120 bpm
    assert duration_seconds(flac) == pytest.approx(2.125)
    assert np.abs(samples.astype(int)).max() == PEAK
    # another rate and tempo: the length follows both
    flac = notes_to_flac(PHRASE, bpm=60, sample_rate=8000)
    assert decode(flac)[1].frames == 4.25 * 8000


def test_ten_dense_seconds_are_small() -> None:
    flac = notes_to_flac(dense(10.0), bpm=100, sample_rate=16000)
    assert duration_seconds(flac) == pytest.approx(10.0, abs=0.2)
    assert len(flac) < 200_000, f"10 s of four voices is {len(flac)} bytes of FLAC"


def test_a_note_past_max_seconds_is_cut_with_a_short_fade() -> None:
    notes = {"onset": [0.0, 0.5], "duration": [8.0, 0.25], "pitch": [57, 64]}
    flac = notes_to_flac(notes, bpm=60, sample_rate=16000, max_seconds=1.0)
    samples, info = decode(flac)
    wave = np.abs(samples[:, 0].astype(int))
    assert info.frames == 16000
    assert wave[-1] == 0 and wave[-8:].max() < 0.01 * PEAK  # faded out at the cut ...
    assert wave[-16000 * 50 // 1000:-16000 * 30 // 1000].max() > 0.2 * PEAK  # ... not earlier
    # notes that start at or after the cut are dropped; none left means no audio
    assert notes_to_flac({"onset": [4.0], "duration": [1.0], "pitch": [60]}, bpm=60,
                         max_seconds=1.0) is None


def test_no_notes_give_none_and_silent_notes_give_silence() -> None:
    assert notes_to_flac({"onset": [], "duration": [], "pitch": []}) is None
    assert notes_to_flac({"onset": [0.0], "duration": [1.0], "pitch": [40],
                          "is_drum": [True]}) is None
    silent = notes_to_flac({"onset": [0.0], "duration": [1.0], "pitch": [60], "velocity": [0]})
    samples, info = decode(silent)
    assert info.frames > 0 and not samples.any()


def test_bad_notes_are_refused() -> None:
    with pytest.raises(ValueError, match="pitch"):
        notes_to_flac({"onset": [0.0], "duration": [1.0], "pitch": [128]})
    with pytest.raises(ValueError, match="'duration' has 2 values"):
        notes_to_flac({"onset": [0.0], "duration": [1.0, 1.0], "pitch": [60]})
    with pytest.raises(ValueError, match="bpm"):
        notes_to_flac(PHRASE, bpm=0)


def test_midi_bytes_written_by_pretty_midi_round_trip() -> None:
    buf = io.BytesIO()
    notes_to_midi(PHRASE, bpm=120).write(buf)
    flac = midi_to_flac(buf.getvalue())
    assert flac == notes_to_flac(PHRASE, bpm=120)
    cut = midi_to_flac(buf.getvalue(), sample_rate=8000, max_seconds=1.0)
    assert decode(cut)[1].frames == 8000


def test_midi_without_pitched_notes_gives_none_and_garbage_is_refused() -> None:
    empty = io.BytesIO()
    notes_to_midi({"onset": [], "duration": [], "pitch": []}).write(empty)
    assert midi_to_flac(empty.getvalue()) is None
    assert midi_to_flac(make_midi([(0.0, 1.0, 36, 100)], drums=[True])) is None
    assert midi_to_flac(make_midi([(0.0, 1.0, 60, 100)], tempo=60.0)) is not None
    for garbage in (b"", b"not a midi file at all", b"MThd\x00\x00\x00\x06\x00\x01"):
        with pytest.raises(ValueError, match="not a readable MIDI file"):
            midi_to_flac(garbage)


def test_data_uri_carries_the_bytes() -> None:
    flac = notes_to_flac(PHRASE)
    uri = data_uri(flac)
    head, _, body = uri.partition(",")
    assert head == "data:audio/flac;base64"
    assert base64.b64decode(body) == flac

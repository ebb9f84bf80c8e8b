"""Deterministic FLAC audio of note tables and MIDI files, for an HTML ``<audio>`` element.

A reader can listen to an excerpt: notes are synthesised with ``pretty_midi``'s sine synthesiser
(``PrettyMIDI.synthesize``: pure numpy, no system library, no soundfont), cut to ``max_seconds``
with a short fade, peak-normalised to ``LEVEL`` of full scale, rounded to 16-bit integers and
written as mono FLAC with ``soundfile`` (libsndfile bundled in its wheel). Browsers play FLAC
in ``<audio>``; embed it with :func:`data_uri`.

Determinism: the synthesis is plain float64 arithmetic in a fixed order (instruments by program,
notes sorted), the float → int16 step is ``np.round`` then clip, and FLAC encoding is lossless
with a fixed compression level and no timestamp, so the same notes give the same bytes in every
run and process. The vendor string written into the file is the bundled libFLAC's, fixed by the
``soundfile`` pin. (OGG Vorbis is not used: its stream serial number is random, so its bytes
differ from run to run.) ``np.sin`` may use CPU-specific SIMD code, so on another CPU a sample
can, rarely, round to a neighbouring integer; on one machine the bytes are identical.

Why hand-written: ``pretty_midi`` returns an unnormalised float waveform (its own normalisation
divides by zero on silence) and ``soundfile`` writes given samples; no library call goes from
notes to compact, deterministic, browser-playable bytes, so these small wrappers do the steps
between (beats → seconds, cut and fade, normalisation, integer rounding, in-memory FLAC).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping

import numpy as np
import pretty_midi
import soundfile

LEVEL = 0.8
"""Peak level after normalisation, as a fraction of full scale (silence stays silence)."""

FADE_SECONDS = 0.02
"""Linear fade-out at a cut, so a note that sounds through ``max_seconds`` does not click."""

_SYNTH_TAIL = 0.15
"""Seconds a cut note is synthesised past the cut: ``pretty_midi`` fades each note out over its
last 100 ms, which this pushes behind the cut, so only the ``FADE_SECONDS`` fade is heard."""

_FLAC_COMPRESSION = 1.0
"""libsndfile's FLAC compression level (0–1, 1 = smallest); fixed rather than the default."""

DEFAULT_VELOCITY = 80


def _column(notes: Mapping, name: str, default: float | None, n: int) -> np.ndarray:
    if name not in notes or notes[name] is None:
        if default is None:
            raise ValueError(f"notes need a {name!r} column")
        return np.full(n, default, dtype=float)
    values = np.asarray(notes[name], dtype=float).reshape(-1)
    if values.size != n:
        raise ValueError(f"notes column {name!r} has {values.size} values, 'pitch' has {n}")
    return values


def _check_range(values: np.ndarray, name: str, lo: float, hi: float) -> None:
    bad = ~((values >= lo) & (values <= hi))
    if bad.any():
        raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}]; got {values[bad][0]!r}")


def notes_to_midi(notes: Mapping, *, bpm: float = 100.0, program_default: int = 0,
                  ) -> pretty_midi.PrettyMIDI:
    """A ``PrettyMIDI`` of a notes table: ``onset`` and ``duration`` in beats, ``pitch`` (0–127),
    optional ``velocity`` (default ``DEFAULT_VELOCITY``), ``program`` (default
    ``program_default``) and ``is_drum`` (drum notes are left out: a sine of a drum's key number
    is not its sound). One instrument per program, in program order; notes sorted by onset,
    pitch, duration and velocity, so the table's row order does not change the audio."""
    if not bpm > 0:
        raise ValueError(f"bpm must be positive; got {bpm!r}")
    if "pitch" not in notes:
        raise ValueError("notes need a 'pitch' column")
    pitch = np.asarray(notes["pitch"], dtype=float).reshape(-1)
    n = pitch.size
    onset = _column(notes, "onset", None, n)
    duration = _column(notes, "duration", None, n)
    velocity = _column(notes, "velocity", DEFAULT_VELOCITY, n)
    program = _column(notes, "program", program_default, n)
    keep = ~_column(notes, "is_drum", 0, n).astype(bool)
    for values, name, lo, hi in ((pitch, "pitch", 0, 127), (velocity, "velocity", 0, 127),
                                 (program, "program", 0, 127), (onset, "onset", 0, np.inf),
                                 (duration, "duration", 0, np.inf)):
        _check_range(values, name, lo, hi)
    pitch, velocity, program = (np.rint(c).astype(np.int64) for c in (pitch, velocity, program))
    order = np.lexsort((velocity[keep], duration[keep], pitch[keep], onset[keep]))
    onset, duration, pitch, velocity, program = (
        c[keep][order] for c in (onset, duration, pitch, velocity, program))
    seconds = 60.0 / float(bpm)
    start, end = onset * seconds, (onset + duration) * seconds
    pm = pretty_midi.PrettyMIDI(initial_tempo=float(bpm))
    for prog in np.unique(program):
        sel = program == prog
        inst = pretty_midi.Instrument(program=int(prog))
        inst.notes = [pretty_midi.Note(velocity=int(v), pitch=int(p), start=float(s), end=float(e))
                      for s, e, p, v in zip(start[sel], end[sel], pitch[sel], velocity[sel],
                                            strict=True)]
        pm.instruments.append(inst)
    return pm


def _pitched(pm: pretty_midi.PrettyMIDI) -> list[pretty_midi.Note]:
    return [note for inst in pm.instruments if not inst.is_drum for note in inst.notes]


def render(pm: pretty_midi.PrettyMIDI, *, sample_rate: int = 16000,
           max_seconds: float = 20.0) -> np.ndarray | None:
    """Mono int16 samples of ``pm``'s pitched notes, up to ``max_seconds``: sine synthesis, a
    ``FADE_SECONDS`` fade where notes are cut, peak at ``LEVEL`` of full scale. The audio ends at
    the last note's end (or the cut); None when no pitched note of positive length starts before
    ``max_seconds``. Cuts ``pm``'s notes in place (control changes are dropped: the sine
    synthesiser ignores them)."""
    if not sample_rate > 0:
        raise ValueError(f"sample_rate must be positive; got {sample_rate!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive; got {max_seconds!r}")
    end = max((note.end for note in _pitched(pm)), default=0.0)
    cut = end > max_seconds
    for inst in pm.instruments:
        inst.notes = [note for note in inst.notes if note.start < max_seconds]
        for note in inst.notes:
            note.end = min(note.end, max_seconds + _SYNTH_TAIL)
        # events past the cut would only lengthen the buffers pretty_midi allocates
        inst.pitch_bends = [bend for bend in inst.pitch_bends if bend.time < max_seconds]
        inst.control_changes = []
    n = int(np.ceil(min(end, max_seconds) * sample_rate))
    if not _pitched(pm) or n == 0:
        return None
    wave = pm.synthesize(fs=sample_rate, normalize=False)[:n]
    wave = np.pad(wave, (0, n - wave.size))
    if cut:
        k = min(n, round(FADE_SECONDS * sample_rate))
        wave[n - k:] *= np.linspace(1.0, 0.0, k)
    return to_int16(wave)


def to_int16(wave: np.ndarray) -> np.ndarray:
    """Peak-normalise to ``LEVEL`` of full scale (all-zero stays zero), round, clip to int16."""
    wave = np.asarray(wave, dtype=np.float64)
    peak = float(np.max(np.abs(wave), initial=0.0))
    scaled = wave * (LEVEL * 32767.0 / peak) if peak > 0 else np.zeros_like(wave)
    return np.clip(np.round(scaled), -32768, 32767).astype(np.int16)


def flac_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """Mono 16-bit FLAC of int16 ``samples``, written in memory."""
    buf = io.BytesIO()
    soundfile.write(buf, np.asarray(samples, dtype=np.int16), int(sample_rate), format="FLAC",
                    subtype="PCM_16", compression_level=_FLAC_COMPRESSION)
    return buf.getvalue()


def notes_to_flac(notes: Mapping, *, bpm: float = 100.0, sample_rate: int = 16000,
                  max_seconds: float = 20.0, program_default: int = 0) -> bytes | None:
    """FLAC of a notes table (columns as for :func:`notes_to_midi`, times in beats at ``bpm``),
    cut to ``max_seconds``; None when there are no notes to play."""
    pm = notes_to_midi(notes, bpm=bpm, program_default=program_default)
    samples = render(pm, sample_rate=sample_rate, max_seconds=max_seconds)
    return None if samples is None else flac_bytes(samples, sample_rate)


def midi_to_flac(data: bytes, *, sample_rate: int = 16000,
                 max_seconds: float = 20.0) -> bytes | None:
    """FLAC of a MIDI file's pitched notes (its own tempo map), cut to ``max_seconds``; None for
    a file without pitched notes. Raises ``ValueError`` when ``data`` is not a readable MIDI
    file."""
    try:
        pm = pretty_midi.PrettyMIDI(io.BytesIO(bytes(data)))
    except Exception as exc:  # mido/pretty_midi raise many types on corrupt input
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ValueError(f"not a readable MIDI file ({len(data)} bytes): {reason}") from exc
    samples = render(pm, sample_rate=sample_rate, max_seconds=max_seconds)
    return None if samples is None else flac_bytes(samples, sample_rate)


def data_uri(flac: bytes) -> str:
    """``data:audio/flac;base64,...`` for an ``<audio src=...>``."""
    return "data:audio/flac;base64," + base64.b64encode(flac).decode("ascii")


def duration_seconds(flac: bytes) -> float:
    """Length of FLAC audio in seconds (frames / sample rate)."""
    info = soundfile.info(io.BytesIO(flac))
    return info.frames / info.samplerate

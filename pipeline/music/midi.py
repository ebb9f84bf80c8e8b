"""MIDI files: which files count as MIDI, bytes -> note table, and the content hash that ingest
and dedupe share.

Times are in quarter-note beats (``tick / ticks_per_quarter``), so the same music saved at another
resolution or under another tempo map gives the same onsets. ``note_hash`` additionally drops
velocity, track layout, programs and meta events, and quantises timing to 1/``GRID`` beat, so it is
identical for the same music saved differently.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

GRID = 48
"""Beat subdivisions for hashing: divisible by 16 (64th notes at 4) and 3 (triplets)."""

NOTE_COLUMNS = ("onset", "duration", "pitch", "velocity", "track", "program", "is_drum")


MIDI_SUFFIXES = (".mid", ".midi", ".kar")
"""File name endings (any case) read as MIDI."""


def scan_midi_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """MIDI files under ``root``: (POSIX path relative to it, ``stat`` result), sorted by path.

    Directory symlinks are not followed and file symlinks whose target lies outside ``root`` are
    skipped, so a source folder can never pull in files from elsewhere. One ``stat`` per file
    (``os.scandir`` gives names and types without one): this walk is on every ``dvc repro``.
    """
    root_real = os.path.realpath(root)
    found: list[tuple[str, os.stat_result]] = []
    stack = [("", os.fspath(root))]
    while stack:
        prefix, folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:  # unreadable folder: skipped, as os.walk does
            continue
        with entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append((f"{prefix}{e.name}/", e.path))
                    continue
                if not e.name.lower().endswith(MIDI_SUFFIXES):
                    continue
                if e.is_symlink():
                    real = os.path.realpath(e.path)
                    if os.path.commonpath([real, root_real]) != root_real:
                        continue
                try:
                    st = e.stat()  # follows a link inside the folder
                except OSError:  # broken link
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((prefix + e.name, st))
    found.sort(key=lambda item: item[0])
    return found


def list_midi_files(root: Path) -> list[Path]:
    """MIDI files under ``root`` (relative paths, sorted by POSIX string); see
    :func:`scan_midi_files` for the rules."""
    return [Path(rel) for rel, _ in scan_midi_files(root)]


def list_midi_paths(root: Path) -> list[str]:
    """MIDI files under ``root`` as relative POSIX strings, sorted; see :func:`scan_midi_files`."""
    return [rel for rel, _ in scan_midi_files(root)]


@dataclass
class ParsedMidi:
    """What ingest keeps of one parsed file. ``notes`` maps NOTE_COLUMNS to equal-length arrays."""

    tpq: int
    n_tracks: int
    duration_s: float
    notes: dict[str, np.ndarray] = field(repr=False)

    @property
    def n_notes(self) -> int:
        return int(self.notes["pitch"].size)

    @property
    def duration_beats(self) -> float:
        if self.n_notes == 0:
            return 0.0
        return float(np.max(self.notes["onset"] + self.notes["duration"]))


def looks_like_midi(head: bytes) -> bool:
    """Standard MIDI files start with an ``MThd`` chunk."""
    return head[:4] == b"MThd"


def parse_midi(data: bytes) -> ParsedMidi:
    """Parse MIDI bytes with symusic (raises ``RuntimeError`` on corrupt input)."""
    import symusic

    score = symusic.Score.from_midi(data)
    tpq = int(score.ticks_per_quarter)
    if tpq <= 0:
        raise ValueError(f"ticks per quarter note is {tpq}")
    cols: dict[str, list[np.ndarray]] = {c: [] for c in NOTE_COLUMNS}
    n_tracks = 0
    for index, track in enumerate(score.tracks):
        arr = track.notes.numpy()
        n = arr["pitch"].size
        if n == 0:
            continue
        n_tracks += 1
        cols["onset"].append(arr["time"].astype(np.float64) / tpq)
        cols["duration"].append(arr["duration"].astype(np.float64) / tpq)
        cols["pitch"].append(arr["pitch"].astype(np.int16))
        cols["velocity"].append(arr["velocity"].astype(np.int16))
        cols["track"].append(np.full(n, index, np.int16))
        cols["program"].append(np.full(n, int(track.program), np.int16))
        cols["is_drum"].append(np.full(n, bool(track.is_drum)))
    notes = {c: (np.concatenate(v) if v else _empty(c)) for c, v in cols.items()}
    notes = sort_notes(notes)
    duration_s = float(score.to("second").end()) if n_tracks else 0.0
    return ParsedMidi(tpq=tpq, n_tracks=n_tracks, duration_s=duration_s, notes=notes)


def _empty(col: str) -> np.ndarray:
    dtype = {"onset": np.float64, "duration": np.float64, "is_drum": bool}.get(col, np.int16)
    return np.zeros(0, dtype=dtype)


def sort_notes(notes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sort by (onset, pitch, duration, track): a canonical order independent of track order."""
    order = np.lexsort((notes["track"], notes["duration"], notes["pitch"], notes["onset"]))
    return {c: v[order] for c, v in notes.items()}


def max_gap_beats(notes: dict[str, np.ndarray]) -> float:
    """Longest stretch without any sounding note, including the lead-in before the first note."""
    if notes["onset"].size == 0:
        return 0.0
    onset, end = notes["onset"], notes["onset"] + notes["duration"]
    covered = np.maximum.accumulate(end)  # notes are sorted by onset
    gaps = onset[1:] - covered[:-1]
    return float(max(onset[0], gaps.max(initial=0.0)))


def quantise(beats: np.ndarray, grid: int = GRID) -> np.ndarray:
    return np.rint(beats * grid).astype(np.int64)


def note_hash(notes: dict[str, np.ndarray], grid: int = GRID) -> str:
    """sha256 of the quantised (onset, pitch, duration, is_drum) multiset.

    Drops velocity, track, program and everything that is not a note, so re-saving at another
    resolution, tempo map or track layout keeps the hash.
    """
    rows = (
        np.stack(
            [
                quantise(notes["onset"], grid),
                notes["pitch"].astype(np.int64),
                np.maximum(quantise(notes["duration"], grid), 1),
                notes["is_drum"].astype(np.int64),
            ],
            axis=1,
        )
        if notes["pitch"].size
        else np.zeros((0, 4), np.int64)
    )
    rows = rows[np.lexsort(rows.T[::-1])]
    return hashlib.sha256(np.ascontiguousarray(rows, dtype="<i8").tobytes()).hexdigest()


def score_notes(score: Any) -> dict[str, np.ndarray]:
    """Non-drum notes of a symusic Score as a notes table in beats, sorted by (onset, pitch)."""
    tpq = float(score.ticks_per_quarter) if score is not None else 1.0
    parts = [t.notes.numpy() for t in (score.tracks if score is not None else []) if not t.is_drum]
    if not parts:
        return {k: np.zeros(0) for k in ("onset", "duration", "pitch")}
    onset = np.concatenate([p["time"] for p in parts]).astype(np.float64) / tpq
    duration = np.concatenate([p["duration"] for p in parts]).astype(np.float64) / tpq
    pitch = np.concatenate([p["pitch"] for p in parts]).astype(np.int64)
    order = np.lexsort((duration, pitch, onset))
    return {"onset": onset[order], "duration": duration[order], "pitch": pitch[order]}

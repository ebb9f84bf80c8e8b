"""MIDI files: which files count as MIDI, where they are, and the notes of a parsed score.

What ingest keeps of a file's bytes (its notes table and content hash) is made in
:mod:`pipeline.music.parsing`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

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

"""pipeline.music.midi: which files under a folder are MIDI (sorted, confined to the folder) and
the non-drum notes of a parsed score in beats."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.music.midi import (
    MIDI_SUFFIXES,
    list_midi_files,
    list_midi_paths,
    scan_midi_files,
    score_notes,
)
from tests.midi_utils import make_midi


def folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a.MID").write_bytes(b"MThd1")
    (root / "b" / "song.Kar").write_bytes(b"MThd22")
    (root / "b" / "deep" / "x y.midi").write_bytes(b"MThd333")
    (root / "b" / "notes.txt").write_text("not a MIDI name")
    (root / "b" / "mid").write_text("no suffix at all")
    (root / "folder.mid").mkdir()  # a folder named like a file: looked into, not listed
    (root / "folder.mid" / "in.mid").write_bytes(b"MThd")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.mid").write_bytes(b"MThd")
    os.symlink(outside / "o.mid", root / "escape.mid")  # a file outside: skipped
    os.symlink(outside, root / "linked_dir")  # a folder link: never followed
    os.symlink(root / "a.MID", root / "b" / "inside.mid")  # inside the folder: kept
    os.symlink(root / "missing.mid", root / "broken.mid")  # broken: skipped
    return root


def test_midi_files_are_listed_sorted_and_confined(tmp_path: Path):
    root = folder(tmp_path)
    want = ["a.MID", "b/deep/x y.midi", "b/inside.mid", "b/song.Kar", "folder.mid/in.mid"]
    assert list_midi_paths(root) == want
    assert list_midi_files(root) == [Path(p) for p in want]
    found = scan_midi_files(root)
    assert [rel for rel, _ in found] == want
    sizes = {rel: st.st_size for rel, st in found}
    assert sizes["b/inside.mid"] == sizes["a.MID"] == 5  # a link's target is what is sized
    assert set(MIDI_SUFFIXES) == {".mid", ".midi", ".kar"}


def test_an_empty_or_missing_folder_has_no_files(tmp_path: Path):
    assert list_midi_paths(tmp_path) == []
    assert scan_midi_files(tmp_path / "nowhere") == []


def test_score_notes_are_the_non_drum_notes_in_beats_sorted():
    import symusic

    data = make_midi([[(1.0, 0.5, 64, 80), (0.0, 1.0, 60, 80)], [(0.0, 0.25, 36, 90)],
                      [(0.0, 2.0, 55, 70)]], tpq=96, drums=[False, True, False])
    notes = score_notes(symusic.Score.from_midi(data))
    assert notes["onset"].tolist() == [0.0, 0.0, 1.0]
    assert notes["pitch"].tolist() == [55, 60, 64]  # the drum track's 36 is left out
    assert notes["duration"].tolist() == [2.0, 1.0, 0.5]
    assert notes["pitch"].dtype == np.int64
    empty = score_notes(None)
    assert set(empty) == {"onset", "duration", "pitch"} and all(v.size == 0 for v in
                                                                  empty.values())

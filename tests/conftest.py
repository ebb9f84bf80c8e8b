"""Shared fixtures: tiny MIDI files generated on the fly, the committed MIDI fixtures of
``tests/fixtures/midi/`` (good and bad files, each with its expected ingest verdict), plus a few
real Bach chorales."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.midi_utils import make_midi


@pytest.fixture
def midi_factory():
    """``midi_factory(tracks, **kw) -> bytes`` (see :func:`make_midi`)."""
    return make_midi


MIDI_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "midi"
"""Small MIDI files written by ``tests/fixtures/make_midi_fixtures.py``; ``expected.json`` says
what ingest makes of each (``ok`` or its quarantine reason) and what it is."""
MIDI_EXPECTED: dict = json.loads((MIDI_FIXTURES / "expected.json").read_text(encoding="utf-8"))
MIDI_FILES = sorted(MIDI_FIXTURES.glob("*.mid"))
GOOD_MIDI = [p for p in MIDI_FILES if MIDI_EXPECTED["files"][p.name]["expect"] == "ok"]
BAD_MIDI = [p for p in MIDI_FILES if MIDI_EXPECTED["files"][p.name]["expect"] != "ok"]


@pytest.fixture(scope="session")
def midi_fixtures() -> Path:
    """The folder of committed MIDI fixtures (read it, never write into it)."""
    return MIDI_FIXTURES


@pytest.fixture(scope="session")
def midi_expected() -> dict:
    """``expected.json``: ``ingest`` (the limits its reasons assume) and ``files`` (per name:
    ``expect``, ``about``; ``n_notes``, ``meter``, ``qpm`` for the files ingest keeps)."""
    return MIDI_EXPECTED


@pytest.fixture(params=MIDI_FILES, ids=lambda p: p.name)
def midi_file(request) -> Path:
    """Each committed MIDI fixture, good or bad."""
    return request.param


@pytest.fixture(params=GOOD_MIDI, ids=lambda p: p.name)
def good_midi(request) -> Path:
    """Each committed MIDI fixture that ingest keeps (``expect: ok``)."""
    return request.param


@pytest.fixture(params=BAD_MIDI, ids=lambda p: p.name)
def bad_midi(request) -> Path:
    """Each committed MIDI fixture that ingest quarantines."""
    return request.param


@pytest.fixture(scope="session")
def bach_dir(tmp_path_factory) -> Path:
    """Six real Bach chorales (music21 corpus) written as MIDI, with a metadata CSV.

    Two of them (BWV 269 and its transposed harmonisation under another title would be ideal) are
    chosen so that the set holds real multitrack files; conversion takes ~0.2 s per chorale.
    """
    from pipeline.stages.corpus import chorale_filename, chorale_list, chorale_midi, write_metadata

    root = tmp_path_factory.mktemp("bach")
    entries = chorale_list()[:6]
    rows = []
    for e in entries:
        data, err = chorale_midi(e)
        assert data is not None, err
        path = chorale_filename(e)
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        rows.append({"path": path, "group": e["title"], "bwv": e["bwv"]})
    write_metadata(rows, root / "metadata.csv")
    return root


@pytest.fixture
def copy_tree():
    def _copy(src: Path, dst: Path) -> Path:
        shutil.copytree(src, dst)
        return dst

    return _copy


@pytest.fixture
def row_group_reads(monkeypatch) -> list[int]:
    """The row groups read through ``pyarrow.parquet.ParquetFile.read_row_group`` while a test
    runs (clear the list before the part being counted)."""
    import pyarrow.parquet as pq

    reads: list[int] = []
    original = pq.ParquetFile.read_row_group

    def counting(self, i, *args, **kwargs):
        reads.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    return reads

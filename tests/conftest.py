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


@pytest.fixture
def compound_tokens(tmp_path) -> dict[str, Path]:
    """Token outputs of a compound tokenizer (CPWord, two codebooks), as ``symkit tokenize``
    writes them: ``info.json``, ``tokens.parquet`` and ``augmented.parquet`` (rows with codes
    and empty ids), under ``tmp_path/tokens``. Every stage that models one id stream must
    refuse them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.tokens.contract import TokenInfo, augmented_schema, tokens_schema

    folder = tmp_path / "tokens"
    folder.mkdir()
    books = [{"name": "Pitch", "size": 10, "pad_id": 0, "bos_id": 1, "eos_id": 2},
             {"name": "Duration", "size": 8, "pad_id": 0, "bos_id": 1, "eos_id": 2}]
    info = TokenInfo(vocab_size=18, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t" * 64,
                     split_hash="s" * 64, tokenizer="CPWord", model="none", base_vocab_size=18,
                     one_token_stream=True, compound=True, codebooks=books)
    info.write(folder / "info.json")
    rows = [{"sha256": f"{i:064x}", "split": split, "track": -1, "program": -1,
             "is_drum": False, "ids": [], "codes": [[4, 5, 6], [4, 4, 5]], "n_tokens": 3,
             "n_notes": 3, "n_notes_input": 3, "roundtrip_f1": 1.0, "flags": []}
            for i, split in enumerate(["train", "train", "val", "test"])]
    pq.write_table(pa.Table.from_pylist(rows, schema=tokens_schema(True)),
                   folder / "tokens.parquet")
    aug = [{"sha256": rows[0]["sha256"], "transpose": 1, "track": -1, "ids": [],
            "codes": [[5, 6, 7], [4, 4, 5]], "n_tokens": 3}]
    pq.write_table(pa.Table.from_pylist(aug, schema=augmented_schema(True)),
                   folder / "augmented.parquet")
    return {"info": folder / "info.json", "tokens": folder / "tokens.parquet",
            "augmented": folder / "augmented.parquet"}

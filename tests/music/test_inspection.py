"""pipeline.music.inspection: each file read, hashed, parsed and judged against the limits, a
chunk of files at once exactly as one at a time, in isolated workers; results as Arrow columns."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.music import inspection
from pipeline.music.inspection import (
    CHUNK_BYTES,
    RESULTS_SCHEMA,
    Results,
    chunk_size,
    chunk_spans,
    file_hashes,
    inspect_all,
    inspect_many,
)
from pipeline.music.manifest import IngestConfig
from pipeline.music.parsing import NOTE_COLUMNS, parse_midi
from tests.midi_utils import make_midi, random_piece

SCALE = [(i * 0.5, 0.5, 60 + i, 80) for i in range(8)]
CFG = IngestConfig(max_notes=400, max_gap_beats=512.0, max_duration_s=600.0, max_file_bytes=6000)


def bad_files() -> dict[str, bytes]:
    """A file for every quarantine reason (under :data:`CFG`), and one good file."""
    good = make_midi(SCALE)
    return {
        "good.mid": good,
        "empty.mid": b"",
        "random.mid": np.random.default_rng(0).bytes(300),
        "truncated.mid": good[: len(good) // 2],
        "text.mid": b"this is a text file, not music\n",
        "header_only.mid": good[:14],
        "no_notes.mid": make_midi([[]]),
        "absurd_gap.mid": make_midi([(0, 1, 60, 80), (2**27 / 480, 1, 62, 80)]),
        "many_notes.mid": make_midi([(i * 0.1, 0.1, 60 + i % 12, 80) for i in range(500)]),
        "long.mid": make_midi([(i * 10.0, 10.0, 60, 80) for i in range(40)], tempo=30.0),
        "big.mid": make_midi([(i * 0.25, 0.25, 40 + i % 40, 80) for i in range(1500)]),
    }


def _judge_plainly(data: bytes, cfg: IngestConfig) -> tuple[dict, list[tuple]]:
    """The per-file rules written plainly, in Python: what inspect_many must find for a file
    (its row's reason and facts, its note hash when ok) and its notes in canonical order."""
    import hashlib

    import symusic

    if data[:4] != b"MThd":
        return {"reason": "not_midi"}, []
    try:
        score = symusic.Score.from_midi(data)
    except RuntimeError:
        return {"reason": "corrupt"}, []
    tpq = score.ticks_per_quarter
    notes = sorted(((n.time / tpq, n.pitch, n.duration / tpq, i, n.velocity, t.program,
                     t.is_drum) for i, t in enumerate(score.tracks) for n in t.notes),
                   key=lambda r: r[:4])  # stable: ties keep track order, then file order
    gap, covered = (notes[0][0] if notes else 0.0), None  # the lead-in, then each silence
    for on, _, du, *_ in notes:
        if covered is not None:
            gap = max(gap, on - covered)
        covered = on + du if covered is None else max(covered, on + du)

    row = {"n_notes": len(notes), "tpq": tpq,
           "n_tracks": sum(1 for t in score.tracks if len(t.notes)),
           "duration_beats": max((on + du for on, _, du, *_ in notes), default=0.0)}
    if not cfg.min_notes <= len(notes) <= cfg.max_notes:
        row["reason"] = "no_notes" if len(notes) < cfg.min_notes else "too_many_notes"
    elif gap > cfg.max_gap_beats:
        row["reason"] = "absurd_timing"
    elif notes and score.to("second").end() > cfg.max_duration_s:
        row["reason"] = "too_long"
    else:
        row["reason"] = ""
        keys = sorted((round(on * 48), p, max(round(du * 48), 1), int(drum))
                      for on, p, du, _, _, _, drum in notes)
        row["note_hash"] = hashlib.sha256(np.array(keys, "<i8").reshape(-1, 4).tobytes()
                                          ).hexdigest()
    return row, notes


def test_files_judged_together_as_one_at_a_time():
    """A worker judges its chunk of files at once (one sort of all their notes, one for all their
    note hashes, their silences from one pass): each file's row and notes must be what the rules
    give for that file alone, whatever else is in the chunk: good and bad files, drums, chords
    whose notes end at different times, lead-in silence, a track order that differs from time
    order, and files that do not parse between them."""
    rng = np.random.default_rng(11)
    datas = [data for _, data in sorted(bad_files().items())]
    for k in range(12):
        piece = random_piece(rng, n=int(rng.integers(1, 60)), voices=int(rng.integers(1, 4)))
        lead = float(rng.choice([0.0, 3.0, 700.0]))
        piece = [[(o + lead, d * float(rng.choice([1, 3])), p, v) for o, d, p, v in voice]
                 for voice in piece]
        drums = [bool(rng.integers(0, 2)) for _ in piece]
        datas.insert(2 * k, make_midi(piece[::-1], tpq=int(rng.choice([96, 480, 1001])),
                                      drums=drums))
    rows, notes = inspection.inspect_many(datas, CFG)
    at = 0
    for data, row in zip(datas, rows, strict=True):
        want, want_notes = _judge_plainly(data, CFG)
        assert {k: row[k] for k in want} == want
        assert inspect_many([data], CFG)[0] == [row]  # a chunk of one: the same row
        if row["reason"]:
            continue
        columns = ("onset", "pitch", "duration", "track", "velocity", "program", "is_drum")
        got = list(zip(*(notes[c][at:at + row["n_notes"]].tolist() for c in columns),
                       strict=True))
        assert got == want_notes
        at += row["n_notes"]
    assert at == notes["pitch"].size
    assert sum(not r["reason"] for r in rows) >= 10  # the good files are most of them
    assert {r["reason"] for r in rows} >= {"not_midi", "corrupt", "absurd_timing", "no_notes"}
    assert inspect_many([], CFG)[0] == []


@pytest.mark.parametrize("values", [["a", "bü", None, "", "xyz"], [], [None], ["é", "e"]])
def test_strings_to_arrow(values):
    arr = inspection.to_arrow(values, pa.string())
    arr.validate(full=True)
    assert arr.to_pylist() == values


def test_numbers_round_trip_through_arrow():
    x = np.arange(10, dtype=np.int64)
    mask = x % 3 == 0
    arr = inspection.to_arrow(x, pa.int64(), mask)
    assert arr.to_pylist() == [None if m else int(v) for v, m in zip(x, mask, strict=True)]
    flags = inspection.to_arrow(x % 2 == 1, pa.bool_())
    assert flags.to_pylist() == [bool(v % 2) for v in x]
    sliced = pa.chunked_array([inspection.to_arrow(x, pa.int64()).slice(2),
                                          inspection.to_arrow(x[:3], pa.int64())])
    assert inspection.from_arrow(sliced).tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]


def test_chunk_size_is_8_to_64_files():
    assert chunk_size(10, 4) == 8 and chunk_size(100_000, 2) == 64
    assert chunk_size(8 * 4 * 20, 4) == 20 and chunk_size(500, 0) == 62


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 100, CHUNK_BYTES // 3, CHUNK_BYTES + 1]),
                      max_size=300),
       workers=st.integers(1, 8))
def test_chunks_cover_the_files_in_order_within_both_limits(sizes, workers):
    spans = chunk_spans(sizes, workers)
    assert [i for a, b in spans for i in range(a, b)] == list(range(len(sizes)))
    for a, b in spans:
        assert 0 < b - a <= chunk_size(len(sizes), workers)
        assert b - a == 1 or sum(sizes[a:b]) <= CHUNK_BYTES  # a large file travels alone


def test_known_hashes_come_from_the_index_when_the_size_matches(tmp_path: Path):
    root = tmp_path / "raw"
    root.mkdir()
    for name, data in {"a.mid": b"aaa", "b.mid": b"bbbb", "c.mid": b"c"}.items():
        (root / name).write_bytes(data)
    rels = ["a.mid", "b.mid", "c.mid"]
    sizes = np.array([3, 4, 1])
    index = tmp_path / "raw_index.parquet"
    pq.write_table(pa.table({"path": ["a.mid", "b.mid"], "sha256": ["x" * 64, "y" * 64],
                                     "size_bytes": [3, 99]}), index)
    got = file_hashes(str(root), rels, sizes, index, workers=2)
    assert got == ["x" * 64,  # listed with its size: not read
                   hashlib.sha256(b"bbbb").hexdigest(),  # listed with another size: hashed
                   hashlib.sha256(b"c").hexdigest()]  # not listed
    assert file_hashes(str(root), rels, sizes, None, 1)[0] == hashlib.sha256(b"aaa").hexdigest()


def test_workers_return_each_chunk_s_results_as_columns(tmp_path: Path):
    """inspect_all over a folder: every file's sha256, verdict and facts, and the notes of the
    ok files as the notes table's list columns, whatever chunk they came in."""
    rng = np.random.default_rng(2)
    root = tmp_path / "raw"
    root.mkdir()
    files = {f"p{i:02d}.mid": make_midi(random_piece(rng, n=5 + i)) for i in range(18)}
    files["bad.mid"], files["text.mid"] = b"MThd broken", b"not music"
    for name, data in files.items():
        (root / name).write_bytes(data)
    rels = sorted(files)
    parts: dict[int, Results] = {}
    inspect_all(str(root), rels, [len(files[r]) for r in rels], IngestConfig(), 2, False,
                lambda start, r: parts.setdefault(start, r))
    assert len(parts) > 1  # several chunks
    res = Results.concat([parts[k] for k in sorted(parts)])
    table = res.table()
    assert table.schema == RESULTS_SCHEMA and table.num_rows == len(rels)
    rows = table.to_pylist()
    for rel, row in zip(rels, rows, strict=True):
        assert row["sha256"] == hashlib.sha256(files[rel]).hexdigest()
        if rel in ("bad.mid", "text.mid"):
            assert row["reason"] in ("corrupt", "not_midi") and not row["parsed"]
            assert row["pitch"] == [] and row["n_notes"] == 0
            continue
        notes = parse_midi(files[rel]).notes
        assert (row["reason"], row["parsed"], row["n_notes"]) == ("", True, notes["pitch"].size)
        for c in NOTE_COLUMNS:
            assert row[c] == notes[c].tolist(), (rel, c)
    assert not res.failed.any()


def test_results_concatenate_in_order():
    a, b = Results.empty(2), Results.empty(1)
    a.set(1, {"reason": "no_notes", "detail": "0 notes", "n_notes": 0, "n_tracks": 0,
              "tpq": 480, "duration_s": 0.0, "duration_beats": 0.0})
    b.set(0, {"reason": "not_midi", "detail": "starts with b'x'"})
    both = Results.concat([a, b])
    assert both.reason == ["", "no_notes", "not_midi"] and both.parsed.tolist() == [0, 1, 0]
    assert both.ints[1].tolist() == [0, 0, 480] and len(both.chunks) == 2
    assert Results.concat([]).table().num_rows == 0

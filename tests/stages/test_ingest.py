"""Ingest: every quarantine reason, odd names, duplicates, note_hash invariance, determinism."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.music import inspection
from pipeline.music.ingestion import run
from pipeline.music.manifest import REASONS, IngestConfig
from pipeline.music.parsing import note_hash, parse_midi
from tests.midi_utils import make_midi, random_piece

SCALE = [(i * 0.5, 0.5, 60 + i, 80) for i in range(8)]


def ingest(
    raw: Path,
    tmp: Path,
    cfg: IngestConfig | None = None,
    workers: int = 1,
    metadata: Path | None = None,
) -> pd.DataFrame:
    out = tmp / f"out{workers}"
    run(
        cfg or IngestConfig(),
        RuntimeConfig(workers=workers, progress=False),
        raw_dir=raw,
        metadata=metadata,
        manifest=out / "manifest.parquet",
        notes=out / "notes.parquet",
        report=out / "ingest.json",
    )
    return pd.read_parquet(out / "manifest.parquet").set_index("path")


@pytest.fixture
def bad_corpus(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    good = make_midi(SCALE)
    files = {
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
    for name, data in files.items():
        (raw / name).write_bytes(data)
    return raw


CFG = IngestConfig(max_notes=400, max_gap_beats=512.0, max_duration_s=600.0, max_file_bytes=6000)


def test_every_quarantine_reason(bad_corpus: Path, tmp_path: Path):
    m = ingest(bad_corpus, tmp_path, CFG)
    expect = {
        "good.mid": "",
        "empty.mid": "empty_file",
        "random.mid": "not_midi",
        "truncated.mid": "corrupt",
        "text.mid": "not_midi",
        # symusic accepts a bare header as an empty score: quarantined as having no notes.
        "header_only.mid": "no_notes",
        "no_notes.mid": "no_notes",
        "absurd_gap.mid": "absurd_timing",
        "many_notes.mid": "too_many_notes",
        "long.mid": "too_long",
        "big.mid": "too_large",
    }
    assert m["reason"].to_dict() == expect
    assert (m.loc[[k for k, v in expect.items() if v], "status"] == "quarantined").all()
    assert m.loc["good.mid", "status"] == "ok" and m.loc["good.mid", "n_notes"] == 8
    assert m.loc["truncated.mid", "detail"]  # the parser's own message is kept
    notes = pd.read_parquet(tmp_path / "out1" / "notes.parquet")
    assert list(notes["sha256"]) == [m.loc["good.mid", "sha256"]]


def test_crash_and_hang_are_quarantined(tmp_path: Path, monkeypatch):
    """A parser that kills or hangs its worker costs only that file (workers are forked)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("a.mid", "crash.mid", "hang.mid", "z.mid"):
        (raw / name).write_bytes(make_midi(SCALE, tempo=100 + len(name)) + name.encode())
    real = inspection.parse_many

    def fragile(datas: list[bytes]):
        if any(d.endswith(b"crash.mid") for d in datas):
            os._exit(11)
        if any(d.endswith(b"hang.mid") for d in datas):
            time.sleep(60)
        return real(datas)

    monkeypatch.setattr(inspection, "parse_many", fragile)
    m = ingest(raw, tmp_path, IngestConfig(timeout_s=1.0), workers=2)
    assert m["reason"].to_dict() == {
        "a.mid": "",
        "crash.mid": "crash",
        "hang.mid": "timeout",
        "z.mid": "",
    }


def test_odd_names_duplicates_and_metadata(tmp_path: Path):
    raw = tmp_path / "raw"
    (raw / "sub dir").mkdir(parents=True)
    a, b = make_midi(SCALE), make_midi(SCALE[:5])
    (raw / "sub dir" / "with space.MID").write_bytes(a)
    (raw / "ünïcødé.midi").write_bytes(b)
    (raw / "copy.kar").write_bytes(a)
    (raw / "notes.txt").write_text("ignored: not a MIDI suffix")
    meta = tmp_path / "meta.csv"
    meta.write_text("path,group,license\nsub dir/with space.MID,g1,cc-by\ncopy.kar,g2,cc0\n")
    m = ingest(raw, tmp_path, metadata=meta)
    assert list(m.index) == ["copy.kar", "sub dir/with space.MID", "ünïcødé.midi"]
    assert m.loc["copy.kar", "status"] == "ok"  # first in sorted order is canonical
    assert m.loc["sub dir/with space.MID", "status"] == "duplicate"
    assert m.loc["sub dir/with space.MID", "duplicate_of"] == "copy.kar"
    assert m.loc["sub dir/with space.MID", "group"] == "g1"  # keeps its own metadata
    assert m.loc["sub dir/with space.MID", "license"] == "cc-by"
    assert m.loc["ünïcødé.midi", "group"] == "ünïcødé.midi"  # default group: its own path


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


def test_files_judged_together_as_one_at_a_time(bad_corpus: Path):
    """A worker judges its chunk of files at once (one sort of all their notes, one for all their
    note hashes, their silences from one pass): each file's row and notes must be what the rules
    give for that file alone, whatever else is in the chunk: good and bad files, drums, chords
    whose notes end at different times, lead-in silence, a track order that differs from time
    order, and files that do not parse between them."""
    from pipeline.music.inspection import inspect_many

    rng = np.random.default_rng(11)
    datas = [f.read_bytes() for f in sorted(bad_corpus.iterdir())]
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


def test_silences_and_ends_of_concatenated_pieces():
    """max_gaps_beats and durations_beats measure each piece alone: a long note covers the short
    ones inside it, a piece's lead-in counts, the gap between two pieces does not, and a piece
    without notes has 0."""
    from pipeline.music.parsing import durations_beats, max_gaps_beats

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


def test_same_output_for_one_and_two_workers(tmp_path: Path):
    rng = np.random.default_rng(2)
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(70):  # > 2 chunks
        (raw / f"p{i:03d}.mid").write_bytes(make_midi(random_piece(rng, n=20)))
    (raw / "bad.mid").write_bytes(b"MThd garbage")
    ingest(raw, tmp_path, workers=1)
    ingest(raw, tmp_path, workers=2)
    for name in ("manifest.parquet", "notes.parquet", "ingest.json"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()


def test_real_chorales(bach_dir: Path, tmp_path: Path):
    m = ingest(bach_dir, tmp_path, metadata=bach_dir / "metadata.csv")
    assert (m["status"] == "ok").all()
    assert (m["tpq"] == 10080).all() and (m["n_tracks"] == 4).all()
    assert m["group"].str.len().min() > 0 and (m["duration_s"] > 10).all()


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"max_notes": 0}, "ingest.max_notes = 0"),
        ({"max_notes": "100"}, "ingest.max_notes = '100'"),
        ({"timeout": 5}, "ingest.timeout = 5: unknown key"),
        ({"max_duration_s": -1.0}, "ingest.max_duration_s = -1.0"),
    ],
)
def test_bad_params_name_the_key(raw, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("'", "'")):
        parse_section("ingest", raw, IngestConfig)


# --------------------------------------------------------------------------- committed fixtures
def test_committed_fixtures_are_what_their_script_writes(midi_fixtures: Path, tmp_path: Path):
    """tests/fixtures/midi/ holds exactly the files make_midi_fixtures.py writes, byte for byte
    (run it again after changing it), and stays small."""
    from tests.fixtures import make_midi_fixtures

    names = make_midi_fixtures.write(tmp_path / "a")
    assert make_midi_fixtures.write(tmp_path / "b") == names
    assert sorted(p.name for p in midi_fixtures.iterdir()) == names
    for name in names:
        assert (midi_fixtures / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert sum((midi_fixtures / n).stat().st_size for n in names) < 50_000


@pytest.fixture(scope="module")
def fixture_manifest(tmp_path_factory, midi_fixtures: Path, midi_expected: dict) -> pd.DataFrame:
    """The ingest stage over the committed fixtures (2 workers), under the limits their table
    assumes."""
    tmp = tmp_path_factory.mktemp("fixtures")
    return ingest(midi_fixtures, tmp, IngestConfig(**midi_expected["ingest"]), workers=2)


def test_each_fixture_gets_its_expected_verdict(midi_file: Path, midi_expected: dict,
                                                 fixture_manifest: pd.DataFrame):
    want = midi_expected["files"][midi_file.name]
    row = fixture_manifest.loc[midi_file.name]
    if want["expect"] == "ok":
        assert (row["status"], row["reason"], row["detail"]) == ("ok", "", "")
        assert row["n_notes"] == want["n_notes"] and row["note_hash"]
    else:
        assert want["expect"] in REASONS
        assert (row["status"], row["reason"]) == ("quarantined", want["expect"])
        assert row["detail"]  # the size, the count or the parser's own message


def test_the_fixture_folder_under_default_limits(midi_fixtures: Path, midi_expected: dict,
                                                 tmp_path: Path):
    """With params.yaml's limits the verdicts that depend on the small limits become ok and the
    others stay; one worker gives the same."""
    m = ingest(midi_fixtures, tmp_path, IngestConfig(), workers=1)
    loose = {"too_large", "too_many_notes"}
    want = {name: "" if e["expect"] in loose | {"ok"} else e["expect"]
            for name, e in midi_expected["files"].items()}
    assert m["reason"].to_dict() == want
    assert set(m["status"]) == {"ok", "quarantined"}

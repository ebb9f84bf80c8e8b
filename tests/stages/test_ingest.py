"""Ingest: every quarantine reason, odd names, duplicates, determinism, the fixtures' verdicts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import RuntimeConfig
from pipeline.music import inspection
from pipeline.music.ingestion import run
from pipeline.music.manifest import REASONS, IngestConfig
from tests.midi_utils import make_midi, random_piece
from tests.music.test_inspection import CFG, SCALE, bad_files


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
    for name, data in bad_files().items():
        (raw / name).write_bytes(data)
    return raw


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


def test_the_stage_command_runs_the_folder_and_prints_its_counts(midi_fixtures, tmp_path,
                                                                   capsys):
    """``symkit ingest`` (pipeline.stages.ingest) on the fixture folder: one manifest row per
    file, the counts printed by status and reason, the same manifest with and without cache."""
    import argparse

    from pipeline.stages import ingest as stage

    params = tmp_path / "params.yaml"
    params.write_text("runtime:\n  workers: 1\n  progress: false\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=Path)
    stage.add_arguments(parser)
    out = {}
    for cache in ("--no-cache", f"--cache-dir={tmp_path / 'cache'}"):
        d = tmp_path / cache.strip("-").split("=")[0]
        args = parser.parse_args([
            "--params", str(params), "--raw", str(midi_fixtures), "--index", str(d / "none"),
            "--metadata", str(d / "none.csv"), "--manifest", str(d / "manifest.parquet"),
            "--notes", str(d / "notes.parquet"), "--report", str(d / "ingest.json"), cache])
        assert stage.main(args) == 0
        out[cache] = (d / "manifest.parquet").read_bytes()
    printed = capsys.readouterr().out
    n_files = len(list(midi_fixtures.glob("*.mid")))
    assert f"ingest: {n_files} files: ok" in printed and "quarantined" in printed
    assert len(set(out.values())) == 1

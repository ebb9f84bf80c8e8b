"""Corpus: folder listing rules, metadata join, incremental sync, Bach conversion."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.core.parallel import ordered_map
from pipeline.stages.corpus import CorpusConfig, chorale_list, chorale_midi, list_midi_files, run
from tests.midi_utils import make_midi

RT = RuntimeConfig(workers=1, progress=False)


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "a.MID").write_bytes(make_midi([(0, 1, 60, 80)]))
    (src / "b" / "x y.midi").write_bytes(make_midi([(0, 1, 62, 80)]))
    (src / "b" / "song.kar").write_bytes(make_midi([(0, 1, 64, 80)]))
    (src / "readme.txt").write_text("not music")
    outside = tmp_path / "outside.mid"
    outside.write_bytes(make_midi([(0, 1, 65, 80)]))
    os.symlink(outside, src / "escape.mid")  # points outside the folder: not followed
    os.symlink(src / "a.MID", src / "b" / "inside_link.mid")  # inside: allowed
    return src


def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_folder_listing_is_sorted_and_confined(tmp_path: Path):
    src = _source(tmp_path)
    assert [p.as_posix() for p in list_midi_files(src)] == [
        "a.MID",
        "b/inside_link.mid",
        "b/song.kar",
        "b/x y.midi",
    ]


def test_folder_source_with_metadata_and_incremental_sync(tmp_path: Path):
    src = _source(tmp_path)
    meta = tmp_path / "meta.csv"
    meta.write_text("path,group,license\na.MID,hymn 1,cc0\nb/song.kar,hymn 2,cc-by\n")
    cfg = CorpusConfig(source=str(src), metadata=str(meta))
    raw, out_csv = tmp_path / "raw", tmp_path / "raw_metadata.csv"
    s = run(cfg, RT, raw_dir=raw, metadata_out=out_csv)
    assert s.n_files == 4
    rows = {r["path"]: r for r in _read(out_csv)}
    assert rows["a.MID"]["group"] == "hymn 1" and rows["b/song.kar"]["license"] == "cc-by"
    assert rows["b/x y.midi"]["group"] == ""  # ingest fills in the default group
    assert (raw / "b" / "x y.midi").read_bytes() == (src / "b" / "x y.midi").read_bytes()

    (src / "b" / "song.kar").unlink()
    (src / "new.mid").write_bytes(make_midi([(0, 2, 67, 80)]))
    run(CorpusConfig(source=str(src)), RT, raw_dir=raw, metadata_out=out_csv)
    assert sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file()) == [
        "a.MID",
        "b/inside_link.mid",
        "b/x y.midi",
        "new.mid",
    ]


def test_metadata_errors_name_the_problem(tmp_path: Path):
    src = _source(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("path,group\nmissing.mid,g\n")
    with pytest.raises(ParamsError, match=r"missing\.mid"):
        run(
            CorpusConfig(source=str(src), metadata=str(bad)),
            RT,
            raw_dir=tmp_path / "r",
            metadata_out=tmp_path / "m.csv",
        )
    nogroup = tmp_path / "nogroup.csv"
    nogroup.write_text("path,title\na.MID,x\n")
    with pytest.raises(ParamsError, match="'path' and 'group'"):
        run(
            CorpusConfig(source=str(src), metadata=str(nogroup)),
            RT,
            raw_dir=tmp_path / "r",
            metadata_out=tmp_path / "m.csv",
        )
    with pytest.raises(ParamsError, match=r"corpus\.source = 'no/such/folder'"):
        run(
            CorpusConfig(source="no/such/folder"),
            RT,
            raw_dir=tmp_path / "r",
            metadata_out=tmp_path / "m.csv",
        )


def test_chorale_conversion_is_byte_identical_across_processes():
    entries = chorale_list()[:2]
    here = [chorale_midi(e) for e in entries]
    there = ordered_map(chorale_midi, entries, workers=2)
    assert here == there and all(data for data, _ in here)
    titles = {e["title"] for e in chorale_list()}
    assert len(chorale_list()) == 371 and len(titles) < 371  # titles repeat: groups matter

"""Corpus: folder listing rules, metadata join, incremental sync, Bach conversion."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.core.parallel import ordered_map
from pipeline.music.midi import list_midi_files
from pipeline.stages.corpus import CorpusConfig, chorale_list, chorale_midi, run
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


def _index(path: Path) -> dict[str, tuple[str, int]]:
    from pipeline.core.artifacts import read_table

    t = read_table(path).to_pydict()
    assert t["path"] == sorted(t["path"])
    return dict(zip(t["path"], zip(t["sha256"], t["size_bytes"], strict=True), strict=True))


def test_index_tracks_content_and_hashes_only_changed_files(tmp_path: Path):
    import hashlib

    src = _source(tmp_path)
    raw, index, cache = tmp_path / "raw", tmp_path / "raw_index.parquet", tmp_path / "cache"

    def sync() -> int:
        return run(CorpusConfig(source=str(src)), RT, raw_dir=raw, metadata_out=tmp_path / "m.csv",
                   index_out=index, cache_dir=cache).n_hashed

    assert sync() == 4
    first = index.read_bytes()
    rows = _index(index)
    assert rows == {rel: (hashlib.sha256((raw / rel).read_bytes()).hexdigest(),
                          (raw / rel).stat().st_size) for rel in rows}
    assert sync() == 0 and index.read_bytes() == first  # nothing changed: nothing hashed

    # An edit inside data/raw that keeps the size is seen (new inode and mtime).
    data = bytearray((raw / "a.MID").read_bytes())
    data[-5] ^= 1
    (raw / "a.MID").unlink()
    (raw / "a.MID").write_bytes(bytes(data))
    assert sync() == 1  # differs from the source in mtime: copied again, so hashed again
    assert index.read_bytes() == first

    (src / "a.MID").write_bytes(bytes(data))  # the source itself edited, same size
    assert sync() == 2  # a.MID and b/inside_link.mid, a link to it
    new = (hashlib.sha256(data).hexdigest(), len(data))
    assert _index(index)["a.MID"] == _index(index)["b/inside_link.mid"] == new != rows["a.MID"]

    (src / "new.mid").write_bytes(make_midi([(0, 2, 67, 80)]))
    assert sync() == 1
    assert set(_index(index)) - set(rows) == {"new.mid"}

    # The index is a function of the files alone: no cache, another folder, same bytes.
    other = tmp_path / "other"
    run(CorpusConfig(source=str(src)), RT, raw_dir=other, metadata_out=tmp_path / "m2.csv",
        index_out=tmp_path / "i2.parquet", cache_dir=None)
    assert (tmp_path / "i2.parquet").read_bytes() == index.read_bytes()

    # An unreadable stat cache is ignored, never trusted.
    for f in cache.iterdir():
        f.write_bytes(b"garbage")
    assert sync() == 5 and (tmp_path / "i2.parquet").read_bytes() == index.read_bytes()


# ------------------------------------------------------------------ music21:<composer>
def test_music21_composer_source_carries_work_and_rights(tmp_path: Path):
    """A music21 composer's scores arrive as MIDI with their parent work as the group (a mass
    movement joins its mass) and the encoding's copyright as the licence; include narrows."""
    cfg = CorpusConfig(source="music21:palestrina",
                       include=["palestrina/Agnus_0[01].krn", "palestrina/Kyrie_02.krn"])
    summary = run(cfg, RuntimeConfig(workers=1, progress=False), raw_dir=tmp_path / "raw",
                  metadata_out=tmp_path / "meta.csv", index_out=tmp_path / "index.parquet")
    assert summary.n_files == 3 and summary.n_unresolved == 0
    with open(tmp_path / "meta.csv", newline="", encoding="utf-8") as f:
        rows = {r["path"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["palestrina/Agnus_00.mid", "palestrina/Agnus_01.mid",
                            "palestrina/Kyrie_02.mid"]
    agnus, kyrie = rows["palestrina/Agnus_01.mid"], rows["palestrina/Kyrie_02.mid"]
    assert agnus["group"].startswith("Missa") and agnus["title"] == "Agnus"
    assert "Copyright" in agnus["license"] and "Palestrina" in agnus["composer"]
    assert kyrie["corpus_path"] == "palestrina/Kyrie_02.krn"
    for rel in rows:
        assert (tmp_path / "raw" / rel).read_bytes()[:4] == b"MThd"
    # a second run converts nothing again and writes the same metadata
    first = (tmp_path / "meta.csv").read_bytes()
    run(cfg, RuntimeConfig(workers=1, progress=False), raw_dir=tmp_path / "raw",
        metadata_out=tmp_path / "meta.csv")
    assert (tmp_path / "meta.csv").read_bytes() == first


@pytest.mark.parametrize(("cfg", "match"), [
    (CorpusConfig(source="music21:nobodyatall"), r"corpus\.source = 'music21:nobodyatall'.*"
                                                  r"lists no score"),
    (CorpusConfig(source="music21:palestrina", include=["palestrina/Nothing*"]),
     r"corpus\.include = \['palestrina/Nothing\*'\]: no score"),
])
def test_music21_composer_source_refusals_name_the_key(tmp_path: Path, cfg, match):
    with pytest.raises(ParamsError, match=match):
        run(cfg, RuntimeConfig(workers=1, progress=False), raw_dir=tmp_path / "raw",
            metadata_out=tmp_path / "meta.csv")


def test_include_needs_a_music21_composer(tmp_path: Path):
    (tmp_path / "src").mkdir()
    cfg = CorpusConfig(source=str(tmp_path / "src"), include=["*"])
    with pytest.raises(ParamsError, match=r"corpus\.include = \['\*'\]: only a music21"):
        run(cfg, RuntimeConfig(workers=1, progress=False), raw_dir=tmp_path / "raw",
            metadata_out=tmp_path / "meta.csv")

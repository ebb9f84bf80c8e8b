"""symkit conditions (pipeline.stages.conditions, pipeline.conditions.table and .config): the table
on a tiny corpus of known meters, tempi, textures and keys run through the real ingest stage;
determinism, metadata columns, the refusals (group-identifying, unknown and identity columns, bad
bands), unreadable MIDI files and the table's one reader."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.conditions.config import IDENTITY_COLUMNS, MANIFEST_FACTS, ConditionConfig
from pipeline.conditions.table import (
    CONDITIONS_SCHEMA,
    group_unique_share,
    identifies_groups,
    measure,
    read_conditions,
)
from pipeline.core.artifacts import ArtifactError, read_json, write_parquet
from pipeline.core.config import ParamsError, RuntimeConfig, parse_section
from pipeline.core.splits import SPLITS_SCHEMA
from pipeline.music import ingestion
from pipeline.stages import conditions as stage

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = RuntimeConfig(workers=1, progress=False)
C_MAJOR = [(0, 2.0), (2, 0.5), (4, 1.5), (5, 0.5), (7, 1.5), (9, 0.5), (11, 0.5), (12, 1.0)]


def _score(notes, time_signature=None, qpm=None) -> bytes:
    """MIDI bytes: ``notes`` as (onset beats, duration beats, pitch), one track."""
    from symusic import Note, Score, Tempo, TimeSignature, Track

    score = Score(480)
    if time_signature is not None:
        score.time_signatures.append(TimeSignature(0, *time_signature))
    if qpm is not None:
        score.tempos.append(Tempo(0, float(qpm)))
    track = Track("t", 0, False)
    for onset, dur, pitch in notes:
        track.notes.append(Note(round(onset * 480), round(dur * 480), pitch, 80))
    score.tracks.append(track)
    return score.dumps_midi()


def _tune(shift: int) -> list[tuple[float, float, int]]:
    """A C major scale (tonic triad held longer), one note after another, moved ``shift``
    octaves: 1 note per beat on average, one voice."""
    out, t = [], 0.0
    for pc, dur in C_MAJOR:
        out.append((t, dur, 60 + 12 * shift + pc))
        t += dur
    return out


def _chords(root: int, beats: int = 4) -> list[tuple[float, float, int]]:
    """A four-voice chord on every beat: 4 notes per beat, 4 sounding."""
    return [(float(b), 1.0, root + iv) for b in range(beats) for iv in (0, 4, 7, 12)]


# path -> (bytes, group, composer, title)
CORPUS = {
    "a1.mid": (_score(_tune(0), (3, 4), 90), "work A", "Anon", "Aria"),
    "a2.mid": (_score(_tune(-1), (3, 4), 90), "work A", "Anon", "Aria"),
    "b1.mid": (_score(_chords(48), (4, 4), 150), "work B", "Anon", "Bourree"),
    "b2.mid": (_score(_chords(50), (4, 4), 150), "work B", "Anon", "Bourree"),
    "c1.mid": (_score(_tune(1)), "work C", "Bach", "Chorale"),
    "d1.mid": (_score(_chords(43, 6), (6, 8), 60), "work D", "", "Dance"),
}
SPLIT_OF = {"work A": "train", "work B": "train", "work C": "val", "work D": "test"}


def _sha(path: str) -> str:
    return hashlib.sha256(CORPUS[path][0]).hexdigest()


def build(root: Path, reverse: bool = False) -> None:
    """data/raw, the real ingest stage's manifest and notes, and a splits table by group."""
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    lines = ["path,group,composer,title"]
    for path, (data, group, composer, title) in CORPUS.items():
        (raw / path).write_bytes(data)
        lines.append(f"{path},{group},{composer},{title}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ingestion.run(ingestion.IngestConfig(), RUNTIME, raw_dir=raw, metadata=root / "metadata.csv",
                  manifest=root / "data/manifest.parquet", notes=root / "data/notes.parquet",
                  report=root / "reports/ingest.json")
    rows = [{"sha256": _sha(p), "group_id": f"group:{g}", "split": SPLIT_OF[g], "fold": -1}
            for p, (_, g, _, _) in CORPUS.items()]
    if reverse:  # the row order of an input must not matter
        rows = rows[::-1]
    write_parquet(root / "data/splits.parquet",
                  pa.Table.from_pylist(rows, schema=SPLITS_SCHEMA))


def run_stage(root: Path, cfg: ConditionConfig | None = None, workers: int = 1):
    return stage.run(cfg or ConditionConfig(), RuntimeConfig(workers=workers, progress=False),
                     manifest=root / "data/manifest.parquet", notes=root / "data/notes.parquet",
                     splits=root / "data/splits.parquet", raw_dir=root / "data/raw",
                     conditions=root / "data/conditions.parquet",
                     report=root / "reports/conditions.json")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conditions")
    build(root)
    run_stage(root)
    return root


def test_conditions_of_pieces_of_known_meter_tempo_texture_and_key(corpus):
    df = read_conditions(corpus / "data/conditions.parquet").set_index("sha256")
    a, b, c, d = (df.loc[_sha(p)] for p in ("a1.mid", "b1.mid", "c1.mid", "d1.mid"))
    assert (a["key"], a["mode"], a["meter"], a["tempo"], a["tempo_qpm"]) == \
        ("C major", "major", "3/4", "moderate", 90.0)
    assert (a["density"], a["polyphony"], a["notes_per_beat"], a["mean_polyphony"]) == \
        ("low", "mono", 1.0, 1.0)
    assert (b["meter"], b["tempo"], b["density"], b["polyphony"]) == ("4/4", "fast", "mid", "full")
    assert (b["notes_per_beat"], b["mean_polyphony"]) == (4.0, 4.0)
    assert (d["meter"], d["tempo"], d["tempo_qpm"]) == ("6/8", "slow", 60.0)
    assert pd.isna([c["meter"], c["tempo"], c["tempo_qpm"]]).all()  # none in the file
    assert c["key"] == "C major" and c["density"] == "low"
    # metadata columns are carried as labels; an empty cell is no label
    assert (a["composer"], c["composer"], a["title"]) == ("Anon", "Bach", "Aria")
    assert pd.isna(d["composer"])
    assert list(df.index) == sorted(df.index)
    assert list(df.columns[:1]) == ["split"] and df.loc[_sha("c1.mid"), "split"] == "val"


def test_the_table_has_its_schema_with_the_metadata_between(corpus):
    schema = pq.read_schema(corpus / "data/conditions.parquet")
    assert schema.names == ["sha256", "split", "key", "mode", "meter", "density", "polyphony",
                            "tempo", "composer", "title", "key_correlation", "notes_per_beat",
                            "mean_polyphony", "tempo_qpm"]
    assert all(schema.field(f.name).type == f.type for f in CONDITIONS_SCHEMA)


def test_report_counts_labels_and_missing_per_split_and_flags_group_columns(corpus):
    rep = read_json(corpus / "reports/conditions.json")
    assert rep["pieces"] == 6 and rep["pieces_by_split"] == {"train": 4, "val": 1, "test": 1}
    assert rep["metadata_columns"] == ["composer", "title"] and rep["midi_unreadable"] == 0
    meter = rep["conditions"]["meter"]
    assert meter["labels"] == {"train": {"3/4": 2, "4/4": 2}, "val": {}, "test": {"6/8": 1}}
    assert meter["missing"] == {"train": 0, "val": 1, "test": 0}
    assert rep["conditions"]["composer"]["missing"]["test"] == 1
    assert rep["conditions"]["title"]["identifies_groups"] is True
    assert rep["conditions"]["composer"]["identifies_groups"] is False
    assert rep["conditions"]["composer"]["group_unique_share"] == 0.2  # Bach: one group of 5


def test_byte_identical_across_runs_workers_and_input_order(corpus, tmp_path):
    outputs = ("data/conditions.parquet", "reports/conditions.json")
    ref = {p: (corpus / p).read_bytes() for p in outputs}
    other = tmp_path / "other"
    build(other, reverse=True)
    run_stage(other, workers=2)
    assert {p: (other / p).read_bytes() for p in outputs} == ref
    run_stage(other, ConditionConfig(use=["key", "composer"]))  # use does not change outputs
    assert {p: (other / p).read_bytes() for p in outputs} == ref


def test_a_group_identifying_condition_is_refused_before_writing(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    (root / "data/conditions.parquet").unlink()
    with pytest.raises(ParamsError) as e:
        run_stage(root, ConditionConfig(use=["composer", "title"]))
    msg = str(e.value)
    assert "condition.use" in msg and "'title'" in msg and "identifies the piece's group" in msg
    assert not (root / "data/conditions.parquet").exists()


def test_an_unknown_condition_is_refused_naming_what_is_allowed(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    with pytest.raises(ParamsError) as e:
        run_stage(root, ConditionConfig(use=["key", "colour"]))
    msg = str(e.value)
    assert "condition.use" in msg and "'colour'" in msg
    assert "key, mode, meter, density, polyphony, tempo" in msg and "composer, title" in msg


def test_unreadable_midi_gives_null_meter_and_tempo_not_a_crash(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    (root / "data/raw/a1.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")  # changed since ingest
    (root / "data/raw/b1.mid").unlink()
    summary = run_stage(root)
    df = read_conditions(root / "data/conditions.parquet").set_index("sha256")
    for p in ("a1.mid", "b1.mid"):
        row = df.loc[_sha(p)]
        assert pd.isna([row["meter"], row["tempo"], row["tempo_qpm"]]).all()
        assert row["key"] == ("C major" if p == "a1.mid" else row["key"])  # notes still count
    assert df.loc[_sha("a2.mid"), "meter"] == "3/4"
    rep = read_json(root / "reports/conditions.json")
    assert summary.midi_unreadable == 2 == rep["midi_unreadable"]
    assert rep["midi_unreadable_by_reason"] == {"read_error": 1, "sha_mismatch": 1}


def test_bytes_the_parser_rejects_are_unreadable(tmp_path):
    garbage = b"MThd\x00\x00\x00\x06garbage"
    (tmp_path / "x.mid").write_bytes(garbage)
    sha = hashlib.sha256(garbage).hexdigest()
    assert stage._read_chunk([(str(tmp_path / "x.mid"), sha)]) == [(None, None, "unreadable")]


def test_a_piece_without_a_source_or_notes_gets_nulls(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus, root)
    splits = pd.read_parquet(root / "data/splits.parquet")
    extra = {"sha256": "f" * 64, "group_id": "group:work E", "split": "train", "fold": -1}
    write_parquet(root / "data/splits.parquet",
                  pa.Table.from_pandas(pd.concat([splits, pd.DataFrame([extra])]),
                                       schema=SPLITS_SCHEMA, preserve_index=False))
    run_stage(root)
    row = read_conditions(root / "data/conditions.parquet").set_index("sha256").loc["f" * 64]
    assert row[["key", "meter", "density", "polyphony", "tempo", "composer"]].isna().all()
    rep = read_json(root / "reports/conditions.json")
    assert rep["midi_unreadable_by_reason"] == {"no_source": 1}
    assert rep["pieces_without_notes"] == 1


# --------------------------------------------------------------------------- the reader
def test_the_reader_names_the_stage_that_makes_the_file(corpus, tmp_path):
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    with pytest.raises(ArtifactError, match=r"re-run `dvc repro conditions`"):
        read_conditions(tmp_path / "data/conditions.parquet")
    table = pq.read_table(corpus / "data/conditions.parquet").drop_columns(["meter"])
    write_parquet(tmp_path / "data/conditions.parquet", table)
    with pytest.raises(ArtifactError, match=r"has no column 'meter'.*dvc repro conditions"):
        read_conditions(tmp_path / "data/conditions.parquet")


# --------------------------------------------------------------------------- rules
def test_group_identification_rule():
    groups = ["g1", "g1", "g2", "g2", "g3"]
    assert group_unique_share(["x", "x", "x", "x", "y"], groups) == 0.2
    assert not identifies_groups(["x", "x", "x", "x", "y"], groups)  # a composer of many works
    assert identifies_groups(["a", "a", "b", "b", "c"], groups)  # a title per work
    assert identifies_groups(["a", "b", "c", "d", "e"], groups)  # a catalogue number per piece
    # most labelled pieces decide; pieces without a label do not dilute it
    assert identifies_groups(["a", "a", None, None, None], groups)
    assert not identifies_groups(["a", "a", "a", "b", "b"], groups)  # 3 of 5 in two groups
    assert not identifies_groups(["a", "a", "b", "b", "b"], ["g"] * 5)  # one group: nothing to tell
    assert group_unique_share([None] * 5, groups) is None


def test_measure_leaves_an_ambiguous_key_null_but_records_its_correlation():
    import numpy as np

    chromatic = {"onset": np.arange(12.0), "duration": np.ones(12), "pitch": np.arange(60, 72),
                 "is_drum": np.zeros(12, bool)}
    row = measure(chromatic, "4/4", 120.0, ConditionConfig())
    assert row["key"] is None and row["mode"] is None and row["key_correlation"] is None
    # pitch classes drawn at random: the best key correlates 0.55, under the 0.7 threshold
    pitch = 60 + np.random.default_rng(0).integers(0, 12, 40)
    weak = {"onset": np.arange(40.0), "duration": np.ones(40), "pitch": pitch,
            "is_drum": np.zeros(40, bool)}
    row = measure(weak, None, None, ConditionConfig())
    assert row["key"] is None and row["mode"] is None and row["key_correlation"] == 0.553948
    assert measure(weak, None, None, ConditionConfig(min_key_correlation=0.0))["key"] is not None
    assert row["tempo"] is None and row["meter"] is None and row["density"] == "low"


# --------------------------------------------------------------------------- config
def _cfg(**raw):
    return parse_section("condition", raw, ConditionConfig)


@pytest.mark.parametrize("name", ["group", "sha256", "path", "note_hash", "group_id", "split"])
def test_identity_columns_are_always_refused(name):
    with pytest.raises(ParamsError, match=rf"condition.use = .*'{name}'.*identifies the piece"):
        _cfg(use=[name])


@pytest.mark.parametrize(("raw", "key"), [
    ({"use": ["n_notes"]}, "condition.use"),
    ({"use": ["key", "key"]}, "condition.use"),
    ({"use": ["key_correlation"]}, "condition.use"),
    ({"dropout": 1.0}, "condition.dropout"),
    ({"density_labels": ["a", "b"]}, "condition.density_labels"),
    ({"tempo_edges": [120.0, 80.0], "tempo_labels": ["a", "b", "c"]}, "condition.tempo_edges"),
    ({"polyphony_edges": [1.5], "polyphony_labels": ["mono", "mono"]},
     "condition.polyphony_labels"),
    ({"min_key_correlation": 1.5}, "condition.min_key_correlation"),
], ids=lambda v: str(v))
def test_bad_parameters_are_refused_naming_the_key(raw, key):
    with pytest.raises(ParamsError, match=rf"^params.yaml: {key} ="):
        _cfg(**raw)


def test_the_refused_manifest_columns_are_exactly_the_manifest_schema():
    assert set(IDENTITY_COLUMNS) | set(MANIFEST_FACTS) == \
        set(ingestion.MANIFEST_SCHEMA.names) | {"group_id", "split", "fold"}


def test_the_defaults_are_unconditioned():
    cfg = ConditionConfig()
    assert cfg.use == [] and cfg.bands("tempo") == ([80.0, 140.0], ["slow", "moderate", "fast"])
    assert _cfg(use=["key", "composer"]).use == ["key", "composer"]


# --------------------------------------------------------------------------- committed fixtures
@pytest.fixture(scope="module")
def fixture_corpus(tmp_path_factory, midi_fixtures: Path, midi_expected: dict) -> Path:
    """The committed MIDI fixtures through the real ingest stage, every kept piece its own group
    (train, val and test in turn by sha256), then the conditions stage."""
    root = tmp_path_factory.mktemp("fixture_conditions")
    raw = root / "data" / "raw"
    shutil.copytree(midi_fixtures, raw)
    ingestion.run(ingestion.IngestConfig(**midi_expected["ingest"]), RUNTIME, raw_dir=raw,
                  metadata=None, manifest=root / "data/manifest.parquet",
                  notes=root / "data/notes.parquet", report=root / "reports/ingest.json")
    manifest = pd.read_parquet(root / "data/manifest.parquet")
    shas = sorted(manifest.loc[manifest["status"] == "ok", "sha256"])
    rows = [{"sha256": s, "group_id": f"group:{s[:8]}", "split": ("train", "val", "test")[i % 3],
             "fold": -1} for i, s in enumerate(shas)]
    write_parquet(root / "data/splits.parquet", pa.Table.from_pylist(rows, schema=SPLITS_SCHEMA))
    run_stage(root)
    return root


def test_every_kept_fixture_gets_a_conditions_row(good_midi: Path, midi_expected: dict,
                                                  fixture_corpus: Path):
    want = midi_expected["files"][good_midi.name]
    df = read_conditions(fixture_corpus / "data/conditions.parquet").set_index("sha256")
    row = df.loc[hashlib.sha256(good_midi.read_bytes()).hexdigest()]
    meter = None if pd.isna(row["meter"]) else row["meter"]
    qpm = None if pd.isna(row["tempo_qpm"]) else float(row["tempo_qpm"])
    assert (meter, qpm) == (want["meter"], want["qpm"])
    assert row["density"] is not None and row["polyphony"] is not None
    rep = read_json(fixture_corpus / "reports/conditions.json")
    assert rep["midi_unreadable"] == 0 and rep["pieces"] == len(df)


def test_reading_meter_and_tempo_never_raises(midi_file: Path, midi_expected: dict):
    """Every fixture, bad ones included, gives the conditions reader a value or a reason."""
    want = midi_expected["files"][midi_file.name]
    data = midi_file.read_bytes()
    [(meter, qpm, reason)] = stage._read_chunk([(str(midi_file), hashlib.sha256(data).hexdigest())])
    assert reason in ("", "unreadable")
    if want["expect"] == "ok":
        assert (meter, qpm, reason) == (want["meter"], want["qpm"], "")
    if reason:
        assert (meter, qpm) == (None, None)

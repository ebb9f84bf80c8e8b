"""Contamination: a reference corpus with planted overlaps yields exactly those matches.

The project corpus and the reference are MIDI files, ingested as the pipeline ingests them; the
split table is written by hand (which piece is held out is the test's choice). Planted in the
reference: a re-saved copy, a transposed copy, the same melody under new harmony, an edited copy
and a long piece holding a held-out piece as an excerpt, plus a copy of a *train* piece (not
reported: only val and test are checked), unrelated pieces and bad files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.core.splits import SPLITS_SCHEMA
from pipeline.decision.criteria import Criterion, evaluate
from pipeline.decision.metrics import build_metrics
from pipeline.music import ingestion
from pipeline.similarity.duplicates import DedupeConfig
from pipeline.stages.contamination import ContaminationConfig, run
from tests.midi_utils import make_midi
from tests.stages.test_dedupe import base_piece

Notes = dict[str, np.ndarray]


def to_midi(n: Notes, velocity: int | None = None, tempo: float = 120.0) -> bytes:
    tracks = []
    for t in np.unique(n["track"]).tolist():
        m = n["track"] == t
        tracks.append([(float(o), float(d), int(p), velocity or int(v)) for o, d, p, v in
                       zip(n["onset"][m], n["duration"][m], n["pitch"][m], n["velocity"][m],
                           strict=True)])
    return make_midi(tracks, tempo=tempo)


def shifted(n: Notes, beats: float) -> Notes:
    return {**n, "onset": n["onset"] + beats}


def joined(*parts: Notes) -> Notes:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def reharmonised(rng: np.random.Generator, n: Notes) -> Notes:
    """The same top voice (track 0) over new lower voices, all below it."""
    out = {k: v.copy() for k, v in n.items()}
    low = out["track"] > 0
    out["pitch"] = np.where(low, out["pitch"] - rng.integers(1, 4, size=low.size),
                            out["pitch"]).astype(np.int16)
    return out


def edited(n: Notes) -> Notes:
    """Two melody notes changed and one note inserted (the melody differs, so tier near)."""
    out = {k: v.copy() for k, v in n.items()}
    top = np.flatnonzero(out["track"] == 0)
    out["pitch"][top[[5, 20]]] += 2
    extra = {k: v[top[[10]]].copy() for k, v in out.items()}
    extra["onset"] = extra["onset"] + 0.25
    extra["duration"] = np.full(1, 0.25)
    return joined(out, extra)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """The project (ingested, split by hand) and a reference folder with planted overlaps."""
    root = tmp_path_factory.mktemp("contamination")
    rng = np.random.default_rng(7)
    project = {f"p{i:02d}": base_piece(rng, n_events=int(rng.integers(40, 70))) for i in range(12)}
    raw = root / "raw"
    raw.mkdir()
    for name, n in project.items():
        (raw / f"{name}.mid").write_bytes(to_midi(n))
    data = root / "data"
    ingestion.run(ingestion.IngestConfig(), RuntimeConfig(workers=1, progress=False),
                  raw_dir=raw, metadata=None, manifest=data / "manifest.parquet",
                  notes=data / "notes.parquet", report=data / "ingest.json")
    manifest = artifacts.read_parquet(data / "manifest.parquet")
    split_of = {"p00": "test", "p01": "test", "p02": "test", "p03": "test", "p04": "val",
                "p05": "val"}
    sha = dict(zip(manifest["path"].str.removesuffix(".mid"), manifest["sha256"], strict=True))
    artifacts.write_parquet(data / "splits.parquet", pa.table({
        "sha256": [sha[k] for k in project], "group_id": [f"group:{k}" for k in project],
        "split": [split_of.get(k, "train") for k in project], "fold": [-1] * len(project)},
        schema=SPLITS_SCHEMA))

    ref = root / "reference"
    (ref / "sub").mkdir(parents=True)
    plant = {
        "resaved.mid": to_midi(project["p00"], velocity=50, tempo=90.0),
        "sub/up3.mid": to_midi({**project["p01"], "pitch": project["p01"]["pitch"] + 3}),
        "new_harmony.mid": to_midi(reharmonised(rng, project["p04"])),
        "edited.mid": to_midi(edited(project["p02"])),
        "long.mid": to_midi(joined(base_piece(rng, n_events=70),
                                   shifted(project["p03"], 200.0),
                                   shifted(base_piece(rng, n_events=60), 400.0))),
        "train_copy.mid": to_midi(project["p08"]),
    }
    for k in range(6):
        plant[f"other{k}.mid"] = to_midi(base_piece(rng, n_events=int(rng.integers(40, 90))))
    plant["broken.mid"] = b"MThd\x00\x00\x00\x06garbage"
    plant["empty.mid"] = b""
    plant["notes.mid"] = b"these are not MIDI bytes"
    for name, data_ in plant.items():
        (ref / name).write_bytes(data_)
    expected = {("p00", "resaved.mid", "note"), ("p01", "sub/up3.mid", "transposed"),
                ("p04", "new_harmony.mid", "melody"), ("p02", "edited.mid", "near"),
                ("p03", "long.mid", "near")}
    return {"root": root, "data": data, "ref": ref, "sha": sha, "expected": expected,
            "project": project}


def check(world: dict, out: Path, against: list[str], workers: int = 1,
          cache: Path | None = None) -> tuple[pd.DataFrame, dict]:
    data = world["data"]
    run(ContaminationConfig(against=against), DedupeConfig(), ingestion.IngestConfig(),
        RuntimeConfig(workers=workers, progress=False), manifest=data / "manifest.parquet",
        notes=data / "notes.parquet", splits=data / "splits.parquet", out_dir=out,
        report=out / "summary.json", cache_dir=cache or world["root"] / "cache")
    return artifacts.read_parquet(out / "matches.parquet"), artifacts.read_json(
        out / "summary.json")


def found(world: dict, matches: pd.DataFrame) -> set[tuple[str, str, str]]:
    name = {v: k for k, v in world["sha"].items()}
    return {(name[r.sha256], r.ref_path, r.tier) for r in matches.itertuples()}


def test_finds_exactly_the_planted_overlaps(world):
    matches, summary = check(world, world["root"] / "out", [str(world["ref"])])
    assert found(world, matches) == world["expected"]
    by_name = {r.ref_path: r for r in matches.itertuples()}
    excerpt = by_name["long.mid"]
    assert excerpt.rule in ("containment", "excerpt")
    assert excerpt.part_of == excerpt.ref_sha256  # the held-out piece lies inside the long one
    assert 195.0 <= excerpt.part_start < excerpt.part_end <= 400.0
    assert by_name["edited.mid"].rule in ("jaccard", "alignment")
    assert summary["test_in_reference"] == 4 and summary["val_in_reference"] == 1
    assert summary["by_split"]["test"]["by_tier"] == {"note": 1, "transposed": 1, "melody": 0,
                                                      "near": 2}
    ref = summary["references"][0]
    assert ref["files"] == 15 and ref["by_status"]["quarantined"] == 3
    assert ref["by_reason"] == {"corrupt": 1, "empty_file": 1, "not_midi": 1}
    bad = artifacts.read_parquet(world["root"] / "out" / "quarantined.parquet")
    assert bad["path"].tolist() == ["broken.mid", "empty.mid", "notes.mid"]


def test_train_pieces_are_checked_when_asked(world):
    data, out = world["data"], world["root"] / "with_train"
    run(ContaminationConfig(against=[str(world["ref"])], splits=["train", "test"]),
        DedupeConfig(), ingestion.IngestConfig(), RuntimeConfig(workers=1, progress=False),
        manifest=data / "manifest.parquet", notes=data / "notes.parquet",
        splits=data / "splits.parquet", out_dir=out, report=out / "summary.json",
        cache_dir=world["root"] / "cache")
    got = found(world, artifacts.read_parquet(out / "matches.parquet"))
    assert ("p08", "train_copy.mid", "note") in got
    assert not any(name == "p04" for name, _, _ in got)  # val is not asked for


def test_cached_rerun_and_workers_give_identical_bytes(world):
    first = world["root"] / "a"
    check(world, first, [str(world["ref"])], cache=world["root"] / "fresh_cache")
    env = artifacts.read_json(first / "summary.env.json")
    assert env["references_from_cache"] == [False]
    second = world["root"] / "b"
    check(world, second, [str(world["ref"])], workers=2, cache=world["root"] / "fresh_cache")
    assert artifacts.read_json(second / "summary.env.json")["references_from_cache"] == [True]
    for name in ("matches.parquet", "quarantined.parquet", "summary.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_changed_reference_is_not_read_from_the_cache(world, tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(world["ref"], ref)
    cache = tmp_path / "cache"
    matches, _ = check(world, tmp_path / "a", [str(ref)], cache=cache)
    (ref / "resaved.mid").unlink()
    matches, summary = check(world, tmp_path / "b", [str(ref)], cache=cache)
    assert ("p00", "resaved.mid", "note") not in found(world, matches)
    assert summary["references"][0]["files"] == 14
    assert len(list(cache.iterdir())) == 2  # one entry per content


def test_file_list_and_manifest_references_agree_with_the_folder(world, tmp_path):
    ref = world["ref"]
    names = sorted(p.relative_to(ref).as_posix() for p in ref.rglob("*.mid"))
    listing = world["root"] / "lists" / "files.txt"  # its paths are relative to its folder
    listing.parent.mkdir(exist_ok=True)
    rel = Path("..") / "reference"
    listing.write_text("# reference files\n" + "\n".join((rel / n).as_posix() for n in names))
    matches, summary = check(world, tmp_path / "list_out", [str(listing)])
    assert found(world, matches) == {(q, f"../reference/{r}", t) for q, r, t in world["expected"]}
    assert summary["references"][0]["kind"] == "list"

    ingested = tmp_path / "other_project"
    ingestion.run(ingestion.IngestConfig(), RuntimeConfig(workers=1, progress=False),
                  raw_dir=ref, metadata=None, manifest=ingested / "manifest.parquet",
                  notes=ingested / "notes.parquet", report=ingested / "ingest.json")
    matches, summary = check(world, tmp_path / "manifest_out",
                             [str(ingested / "manifest.parquet")])
    assert found(world, matches) == world["expected"]
    assert summary["references"][0]["by_status"]["quarantined"] == 3


def test_no_reference_means_no_verdict(world, tmp_path):
    matches, summary = check(world, tmp_path, [])
    assert matches.empty and summary["references"] == []
    assert summary["test_in_reference"] is None
    rule = Criterion(name="no_test_in_reference", metric="contamination.test_in_reference",
                     op="==", threshold=0, rationale="why")
    assert evaluate(rule, build_metrics({"contamination": summary})).value is None


def test_the_optional_criterion_fails_on_planted_overlap_and_passes_without(world, tmp_path):
    rule = Criterion(name="no_test_in_reference", metric="contamination.test_in_reference",
                     op="==", threshold=0, rationale="why")
    _, summary = check(world, tmp_path / "planted", [str(world["ref"])])
    assert evaluate(rule, build_metrics({"contamination": summary})).status == "FAIL"
    clean = tmp_path / "clean"
    clean.mkdir()
    for k in range(6):
        shutil.copy(world["ref"] / f"other{k}.mid", clean / f"other{k}.mid")
    _, summary = check(world, tmp_path / "clean_out", [str(clean)])
    assert summary["test_in_reference"] == 0
    assert evaluate(rule, build_metrics({"contamination": summary})).status == "PASS"


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "does not exist"),
    (lambda d: (d / "x.json").write_text("{}") and d / "x.json", "neither a folder"),
    (lambda d: (d / "l.txt").write_text("nowhere.mid\n") and d / "l.txt", "do not exist"),
    (lambda d: (d / "m.parquet").write_bytes(b"") or d / "m.parquet", "no notes.parquet"),
])
def test_a_bad_reference_fails_fast_naming_the_key(world, tmp_path, make, message):
    bad = make(tmp_path)
    with pytest.raises(ParamsError, match=message) as e:
        check(world, tmp_path / "out", [str(bad)])
    assert "contamination.against" in str(e.value) and str(bad) in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_config_refuses_repeats():
    with pytest.raises(ValueError, match="twice"):
        ContaminationConfig(against=["a", "a"])
    assert json.loads(json.dumps(ContaminationConfig().model_dump())) == {
        "against": [], "splits": ["val", "test"]}


def test_cli_check_goes_beside_the_pipeline_outputs(world, tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    data = world["data"]
    params = Path(__file__).resolve().parents[2] / "params.yaml"
    rc = main(["contamination", "--params", str(params), "--against", str(world["ref"]),
               "--manifest", str(data / "manifest.parquet"), "--notes",
               str(data / "notes.parquet"), "--split-table", str(data / "splits.parquet"),
               "--workers", "1"])
    assert rc == 0
    assert "test 4 of 4" in capsys.readouterr().out
    check_dir = tmp_path / "reports" / "contamination-check"
    assert found(world, artifacts.read_parquet(check_dir / "matches.parquet")) == \
        world["expected"]
    assert (check_dir / "summary.json").is_file()
    assert not (tmp_path / "reports" / "contamination.json").exists()  # the stage's outputs
    assert main(["contamination", "--params", str(params), "--against",
                 str(tmp_path / "nowhere")]) == 2
    assert "--against: " in capsys.readouterr().err


def test_decontamination_keeps_planted_copies_out_of_source_train(world, tmp_path):
    """The adaptation experiment's decontaminate -> split: the reference is a pretraining corpus;
    its pieces that copy a project val/test piece (``matches.parquet``'s ``ref_sha256``) never
    reach its train split (``split.exclude_train``), though a plain split puts them there; the
    copy of a project *train* piece is no leak of held-out music and splits as before."""
    from pipeline.core.config import parse_section
    from pipeline.stages.split import SplitConfig, read_exclude_train, split_table

    source = tmp_path / "source"
    ingestion.run(ingestion.IngestConfig(), RuntimeConfig(workers=1, progress=False),
                  raw_dir=world["ref"], metadata=None, manifest=source / "manifest.parquet",
                  notes=source / "notes.parquet", report=source / "ingest.json")
    check(world, tmp_path / "decontamination", [str(source / "manifest.parquet")])
    man = artifacts.read_parquet(source / "manifest.parquet")
    man = man[man["status"] == "ok"]
    sha_of = dict(zip(man["path"], man["sha256"], strict=True))
    copies = read_exclude_train(tmp_path / "decontamination" / "matches.parquet")
    assert sorted(copies) == sorted(sha_of[r] for _, r, _ in world["expected"])
    shas = sorted(man["sha256"])
    files = pd.DataFrame({"sha256": shas, "group": [""] * len(shas)})
    clusters = pd.DataFrame({"sha256": shas, "cluster_id": shas, "keep": [True] * len(shas)})
    cfg = parse_section("split", {"exclude_test": None, "train": 0.98, "val": 0.01,
                                  "test": 0.01}, SplitConfig)
    plain = split_table(files, clusters, cfg).set_index("sha256")["split"]
    clean = split_table(files, clusters, cfg, exclude_train=copies).set_index("sha256")["split"]
    assert (plain[copies] == "train").sum() >= 3  # a plain split would pretrain on them
    assert not (clean[copies] == "train").any()
    others = [s for s in shas if s not in copies]
    assert (clean[others] == plain[others]).all()
    assert clean[sha_of["train_copy.mid"]] == plain[sha_of["train_copy.mid"]]

"""Leakage audit: crossing counts that can see a leak, the grouped split against the per-piece
contrast, the independent near-copy measure in the split stage (an edited copy dedupe does not
link is found; dedupe's alignment threshold honoured), and real Bach chorales whose soprano tunes
agree ending in one split whatever their titles. The search itself is tested in
``tests/similarity/test_neighbours.py``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig, parse_section
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.leakage import audit, crossing_counts
from pipeline.similarity.neighbours import Melodies, ShingleMatrix, TokenStrings
from pipeline.stages.dedupe import DedupeConfig
from pipeline.stages.dedupe import run as run_dedupe
from pipeline.stages.split import SplitConfig, splitter
from pipeline.stages.split import run as run_split
from tests.similarity.test_neighbours import _chorale_corpus, edited, tune
from tests.stages.test_dedupe import planted_corpus, write_corpus

RULE = DedupeConfig().rule

PLAIN = SplitConfig(exclude_test=None)  # nothing excluded from test
PLAIN_NO_MINIMUM = SplitConfig(exclude_test=None, min_groups=0)


def test_crossing_counts_see_a_leak():
    pieces = pd.DataFrame({"sha256": list("abcd"), "split": ["train", "test", "test", "val"],
                           "group_id": ["g1", "g1", "g2", "g3"], "group": ["x", "x", "", "y"]})
    pairs = pd.DataFrame({"a": ["a", "c", "d"], "b": ["b", "d", "z"]})
    got = crossing_counts(pieces, pairs)
    assert got == {"crossing_groups": 1, "crossing_metadata_groups": 1, "crossing_pairs": 2,
                   "pairs_with_a_dropped_piece": 1}


def test_audit_contrasts_grouped_and_random_split(tmp_path):
    pieces, _ = planted_corpus(seed=5, families=30, singles=60)
    manifest, notes, _ = write_corpus(tmp_path, pieces)
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(DedupeConfig(), runtime, manifest=manifest, notes=notes,
               out_dir=tmp_path / "dedupe", report=tmp_path / "dedupe.json")
    paths = dict(splits=tmp_path / "splits.parquet", report=tmp_path / "split.json",
                 leakage_report=tmp_path / "leakage.json", figure=tmp_path / "leakage.png")
    run_split(PLAIN, runtime, manifest=manifest, notes=notes,
              dedupe_dir=tmp_path / "dedupe", **paths)
    leak = artifacts.read_json(paths["leakage_report"])
    assert leak["grouped_test_audited"] > 0 and leak["random_test_audited"] > 0
    for key in ("crossing_groups", "crossing_pairs", "crossing_metadata_groups",
                "test_with_pair_in_train", "test_with_cluster_mate_in_train"):
        assert leak[f"grouped_{key}"] == 0, key
    # the same pieces split at random leak planted copies into test
    assert leak["random_crossing_pairs"] > 0
    assert leak["random_test_with_cluster_mate_in_train"] > 0
    assert leak["random_nearest_train_jaccard_max"] > leak["grouped_nearest_train_jaccard_max"]
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the audit alone is deterministic, figure included
    table = artifacts.read_parquet(paths["splits"])
    clusters = artifacts.read_parquet(tmp_path / "dedupe" / "clusters.parquet")
    kept = table.assign(group="", cluster_id=clusters.set_index("sha256")["cluster_id"]
                        .reindex(table["sha256"]).to_numpy())
    all_notes = fp.read_notes(notes)
    rows = np.flatnonzero(np.isin(all_notes.sha256, kept["sha256"]))
    sm = ShingleMatrix.build(all_notes, 4, 4)
    sm = ShingleMatrix(sm.sha256[rows], sm.matrix[rows], sm.sizes[rows])
    mel = Melodies.build(all_notes).select(rows)
    tok = TokenStrings.build(all_notes, 4).select(rows)
    pairs = artifacts.read_parquet(tmp_path / "dedupe" / "pairs.parquet")
    kw = dict(seed=1, ratios=(0.8, 0.1, 0.1), max_test=5, rule=RULE)
    r1, curves1 = audit(kept, pairs, sm, mel, tok, **kw)
    r2, curves2 = audit(kept, pairs, sm, mel, tok, **kw, workers=2)
    assert r1 == r2 and r1["grouped_test_audited"] <= 5
    assert curves1.keys() == curves2.keys() and all(
        np.array_equal(curves1[k], curves2[k]) for k in curves1)
    assert len(curves1["grouped: test → nearest train"]) == r1["grouped_test_audited"]
    ind = r1["independent"]
    assert ind["test_measured"] == min(5, ind["test_pieces"]) and ind["val_measured"] <= 5
    # the independent measure, with the random-split contrast beside it in the report
    ind = leak["independent"]
    assert ind["test_measured"] == ind["test_pieces"] == leak["grouped_test_audited"]
    assert ind["test_near_train"] == 0  # dedupe bound every planted variant into one group
    assert ind["random_split"]["test_near_train"] > 0
    assert ind["random_split"]["test_near_train_share"] > ind["test_near_train_share"]


def _labels_in(split: str, n: int, prefix: str) -> list[str]:
    """``n`` metadata labels whose (single-label) group the default split puts in ``split``."""
    labels = np.array([f"{prefix}{i}" for i in range(400)], dtype=object)
    splits, _ = splitter(PLAIN).assign(np.char.add("group:", labels.astype(str)).astype(object))
    return list(labels[splits == split][:n])


def test_edited_copy_that_dedupe_does_not_link_is_found(tmp_path):
    """An edited copy (5% of notes changed or dropped) of a train tune placed in test, with
    dedupe's near and melody tiers off: the crossing counts stay 0, the independent measure
    names the pair; 40 unrelated tunes of the same style (one interval distribution, one
    cadence) are never near copies of each other."""
    rng = np.random.default_rng(7)
    pieces = {f"u{i:02d}": tune(rng, int(rng.integers(40, 151))) for i in range(40)}
    pieces["original"] = tune(rng, 100)
    pieces["copy"] = edited(rng, pieces["original"], k=5)
    groups = {"original": _labels_in("train", 1, "o")[0], "copy": _labels_in("test", 1, "c")[0]}
    manifest, notes, shas = write_corpus(tmp_path, pieces, groups=groups)
    cfg = parse_section("dedupe", {"policy": {"near": "off", "melody": "off"}}, DedupeConfig)
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(cfg, runtime, manifest=manifest, notes=notes, out_dir=tmp_path / "dedupe",
               report=tmp_path / "dedupe.json")
    paths = dict(splits=tmp_path / "splits.parquet", report=tmp_path / "split.json",
                 leakage_report=tmp_path / "leakage.json", figure=tmp_path / "leakage.png")
    run_split(PLAIN, runtime, manifest=manifest, notes=notes,
              dedupe_dir=tmp_path / "dedupe", **paths)
    split_of = artifacts.read_parquet(paths["splits"]).set_index("sha256")["split"]
    assert split_of[shas["original"]] == "train" and split_of[shas["copy"]] == "test"
    assert len(artifacts.read_parquet(tmp_path / "dedupe" / "pairs.parquet")) == 0
    leak = artifacts.read_json(paths["leakage_report"])
    assert leak["grouped_crossing_pairs"] == leak["grouped_crossing_groups"] == 0
    ind = leak["independent"]
    assert ind["test_measured"] == ind["test_pieces"] == int((split_of == "test").sum())
    assert ind["test_near_train"] == 1  # the copy, and none of the unrelated tunes
    assert ind["test_near_train_share"] == pytest.approx(1 / ind["test_pieces"], abs=1e-6)
    [example] = ind["examples"]
    assert (example["test_sha256"], example["train_sha256"]) == (shas["copy"], shas["original"])
    assert example["fired"] and example["melody_similarity"] >= ind["alignment_threshold"]
    assert ind["val_near_train"] == 0 and ind["within_train"]["near_other_group"] == 0
    assert ind["within_train"]["melody_max"] < ind["alignment_threshold"]
    assert ind["within_train"]["alignment_max"] < ind["alignment_threshold"]


def test_dedupes_near_alignment_is_the_audits_threshold(tmp_path):
    """The audit reads ``near_alignment`` from dedupe's fingerprint.json: with the default the
    edited chorale dedupe does not link (near tier off) is a near copy by alignment alone; with
    dedupe's ``near_alignment`` raised to 0.95 it is not. ``workers`` changes nothing."""
    pieces = _chorale_corpus()
    groups = {"original": _labels_in("train", 1, "o")[0], "copy": _labels_in("test", 1, "c")[0]}
    manifest, notes, shas = write_corpus(tmp_path, pieces, groups=groups)

    def audit_with(dedupe: dict, workers: int = 1) -> tuple[dict, bytes]:
        cfg = parse_section("dedupe", {"policy": {"near": "off", "melody": "off"}, **dedupe},
                            DedupeConfig)
        runtime = RuntimeConfig(workers=workers, progress=False)
        run_dedupe(cfg, runtime, manifest=manifest, notes=notes, out_dir=tmp_path / "dedupe",
                   report=tmp_path / "dedupe.json")
        paths = dict(splits=tmp_path / "splits.parquet", report=tmp_path / "split.json",
                     leakage_report=tmp_path / "leakage.json", figure=tmp_path / "leakage.png")
        run_split(PLAIN_NO_MINIMUM, runtime, manifest=manifest, notes=notes,
                  dedupe_dir=tmp_path / "dedupe", **paths)
        split_of = artifacts.read_parquet(paths["splits"]).set_index("sha256")["split"]
        assert split_of[shas["original"]] == "train" and split_of[shas["copy"]] == "test"
        return (artifacts.read_json(paths["leakage_report"])["independent"],
                paths["leakage_report"].read_bytes())

    ind, raw = audit_with({})
    assert ind["alignment_threshold"] == pytest.approx(13 / 15, abs=1e-6)
    assert ind["test_near_train"] == ind["test_near_train_by_alignment"] == 1
    assert ind["test_near_train_by_shingles"] == ind["test_near_train_by_melody"] == 0
    [example] = ind["examples"]
    assert (example["test_sha256"], example["train_sha256"]) == (shas["copy"], shas["original"])
    assert example["fired"] == ["alignment"]
    assert ind["alignment_threshold"] <= example["alignment_similarity"] < 0.95
    assert audit_with({}, workers=2)[1] == raw
    ind, _ = audit_with({"near_alignment": 0.95})
    assert ind["alignment_threshold"] == 0.95
    assert ind["test_near_train"] == ind["test_near_train_by_alignment"] == 0


# ------------------------------------------------------------------------------ real chorales
# Pairs whose soprano tune agrees up to transposition: under different titles (BWV 258 / 114.7),
# with the alto crossing above the soprano (47.5 / 421), under one title (9.7 / 155.5); plus two
# unrelated chorales.
BACH_BWV = ("258", "114.7", "47.5", "421", "9.7", "155.5", "269", "347")


@pytest.fixture(scope="module")
def bach_tables(tmp_path_factory):
    from pipeline.music.parsing import note_hash, parse_midi
    from pipeline.stages.corpus import chorale_list, chorale_midi

    entries = [e for e in chorale_list() if e["bwv"] in BACH_BWV]
    entries = list({e["bwv"]: e for e in entries}.values())
    pieces, groups = {}, {}
    for e in entries:
        data, err = chorale_midi(e)
        if data is None:
            pytest.skip(f"music21 cannot build BWV {e['bwv']}: {err}")
        name = f"bwv{e['bwv']}"
        pieces[name] = parse_midi(data).notes
        groups[name] = e["title"]
    root = tmp_path_factory.mktemp("bach")
    manifest, notes, shas = write_corpus(root, pieces, groups=groups)
    assert all(note_hash(p) for p in pieces.values())
    return root, manifest, notes, shas, pieces, groups


def _soprano_key(notes: dict) -> tuple:
    top = notes["track"] == notes["track"].min()
    p = notes["pitch"][top].astype(int)
    p = p[np.r_[True, p[1:] != p[:-1]]]
    return tuple(np.diff(p))


def test_bach_same_soprano_same_split_whatever_the_title(bach_tables):
    root, manifest, notes, shas, pieces, groups = bach_tables
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(DedupeConfig(), runtime, manifest=manifest, notes=notes, out_dir=root / "dedupe",
               report=root / "dedupe.json")
    paths = dict(splits=root / "splits.parquet", report=root / "split.json",
                 leakage_report=root / "leakage.json", figure=root / "leakage.png")
    # five groups leave val empty: this test checks grouping only, so the minimum is off
    run_split(PLAIN_NO_MINIMUM, runtime, manifest=manifest, notes=notes,
              dedupe_dir=root / "dedupe", **paths)
    table = artifacts.read_parquet(paths["splits"]).set_index("sha256")
    by_tune: dict[tuple, list[str]] = {}
    for name, n in pieces.items():
        by_tune.setdefault(_soprano_key(n), []).append(name)
    shared = [names for names in by_tune.values() if len(names) > 1]
    assert len(shared) == 3  # the three planted tune pairs, found from the notes themselves
    assert any(len({groups[n] for n in names}) > 1 for names in shared)  # titles differ
    for names in shared:
        assert table.loc[[shas[n] for n in names], "group_id"].nunique() == 1, names
        assert table.loc[[shas[n] for n in names], "split"].nunique() == 1, names
    assert table.loc[[shas["bwv269"], shas["bwv347"]], "group_id"].nunique() == 2
    leak = artifacts.read_json(paths["leakage_report"])
    assert leak["grouped_crossing_groups"] == leak["grouped_crossing_pairs"] == 0
    # chorales on different tunes (sharing cadences) are not near copies of each other
    within = leak["independent"]["within_train"]
    assert within["measured"] >= 3 and within["near_other_group"] == 0
    assert within["melody_max"] < leak["independent"]["alignment_threshold"]
    assert within["alignment_max"] < leak["independent"]["alignment_threshold"]

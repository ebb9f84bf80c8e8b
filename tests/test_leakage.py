"""Leakage audit: exact nearest neighbours, crossing counts that can see a leak, and real Bach
chorales whose soprano tunes agree ending in one split whatever their titles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.core import artifacts
from pipeline.core.config import RuntimeConfig
from pipeline.music import fingerprints as fp
from pipeline.music.leakage import ShingleMatrix, audit, crossing_counts, nearest, random_split
from pipeline.stages.dedupe import DedupeConfig
from pipeline.stages.dedupe import run as run_dedupe
from pipeline.stages.ingest import NOTES_SCHEMA
from pipeline.stages.split import SplitConfig
from pipeline.stages.split import run as run_split
from tests.test_dedupe import planted_corpus, write_corpus


def _matrix(pieces: dict) -> ShingleMatrix:
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **v} for k, v in pieces.items()]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    return ShingleMatrix.build(fp.notes_from_table(table), 4, 4)


def test_nearest_equals_brute_force():
    pieces, _ = planted_corpus(seed=1, families=3, singles=6)
    sm = _matrix(pieces)
    off, vals = sm.matrix.indptr, sm.matrix.indices
    sets = [np.sort(vals[off[i] : off[i + 1]]) for i in range(len(sm.sha256))]
    query, pool = np.arange(0, len(sets), 2), np.arange(1, len(sets), 2)
    for exclude_self, pool_ in ((False, pool), (True, np.arange(len(sets)))):
        j, c = nearest(sm, query, pool_, exclude_self=exclude_self)
        for n, q in enumerate(query):
            sims = [fp.jaccard_containment(sets[q], sets[p]) for p in pool_ if p != q]
            assert j[n] == pytest.approx(max(s[0] for s in sims))
            assert c[n] == pytest.approx(max(s[1] for s in sims))
    assert j.max() > 0.5  # the planted variants are found


def test_crossing_counts_see_a_leak():
    pieces = pd.DataFrame({"sha256": list("abcd"), "split": ["train", "test", "test", "val"],
                           "group_id": ["g1", "g1", "g2", "g3"], "group": ["x", "x", "", "y"]})
    pairs = pd.DataFrame({"a": ["a", "c", "d"], "b": ["b", "d", "z"]})
    got = crossing_counts(pieces, pairs)
    assert got == {"crossing_groups": 1, "crossing_metadata_groups": 1, "crossing_pairs": 2,
                   "pairs_with_a_dropped_piece": 1}


def test_random_split_is_seeded_and_proportional():
    a = random_split(20000, (0.8, 0.1, 0.1), seed=3)
    assert (a == random_split(20000, (0.8, 0.1, 0.1), seed=3)).all()
    assert abs((a == "test").mean() - 0.1) < 0.01 and abs((a == "train").mean() - 0.8) < 0.01


def test_audit_contrasts_grouped_and_random_split(tmp_path):
    pieces, _ = planted_corpus(seed=5, families=30, singles=60)
    manifest, notes, _ = write_corpus(tmp_path, pieces)
    runtime = RuntimeConfig(workers=1, progress=False)
    run_dedupe(DedupeConfig(), runtime, manifest=manifest, notes=notes,
               out_dir=tmp_path / "dedupe", report=tmp_path / "dedupe.json")
    paths = dict(splits=tmp_path / "splits.parquet", report=tmp_path / "split.json",
                 leakage_report=tmp_path / "leakage.json", figure=tmp_path / "leakage.png")
    run_split(SplitConfig(), runtime, manifest=manifest, notes=notes,
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
    sm = ShingleMatrix.build(fp.read_notes(notes), 4, 4)
    sm = ShingleMatrix(sm.sha256[np.isin(sm.sha256, kept["sha256"])],
                       sm.matrix[np.flatnonzero(np.isin(sm.sha256, kept["sha256"]))],
                       sm.sizes[np.isin(sm.sha256, kept["sha256"])])
    pairs = artifacts.read_parquet(tmp_path / "dedupe" / "pairs.parquet")
    kw = dict(seed=1, ratios=(0.8, 0.1, 0.1), max_test=5, near_jaccard=0.5, near_containment=0.8)
    r1, png1 = audit(kept, pairs, sm, **kw)
    r2, png2 = audit(kept, pairs, sm, **kw)
    assert r1 == r2 and png1 == png2 and r1["grouped_test_audited"] <= 5


# ------------------------------------------------------------------------------ real chorales
# Pairs whose soprano tune agrees up to transposition: under different titles (BWV 258 / 114.7),
# with the alto crossing above the soprano (47.5 / 421), under one title (9.7 / 155.5); plus two
# unrelated chorales.
BACH_BWV = ("258", "114.7", "47.5", "421", "9.7", "155.5", "269", "347")


@pytest.fixture(scope="module")
def bach_tables(tmp_path_factory):
    from pipeline.music.midi import note_hash, parse_midi
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
    run_split(SplitConfig(), runtime, manifest=manifest, notes=notes, dedupe_dir=root / "dedupe",
              **paths)
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

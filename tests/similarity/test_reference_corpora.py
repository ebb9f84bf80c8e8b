"""Reference corpora (:mod:`pipeline.similarity.reference_corpora`): how a reference is named and
checked, its fingerprints cached by content, and held-out pieces matched with it tier by tier.
The stage that runs them end to end, on real MIDI files, is tested in
``tests/stages/test_contamination.py``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core import artifacts
from pipeline.core.config import ParamsError, RuntimeConfig
from pipeline.core.splits import SPLITS_SCHEMA
from pipeline.music.manifest import IngestConfig
from pipeline.similarity.duplicates import DedupeConfig
from pipeline.similarity.reference_corpora import (
    ReferenceSource,
    content_hash,
    equal_keys,
    fingerprint_key,
    held_out,
    load_reference,
    match,
    resolve,
)
from tests.stages.test_dedupe import base_piece, variant, write_corpus

RUNTIME = RuntimeConfig(workers=1, progress=False)


def test_a_folder_a_list_and_a_table_name_their_files(tmp_path):
    (tmp_path / "ref" / "sub").mkdir(parents=True)
    for name in ("b.mid", "sub/a.midi", "notes.txt"):
        (tmp_path / "ref" / name).write_bytes(b"x")
    folder = resolve(str(tmp_path / "ref"))
    assert (folder.kind, folder.files) == ("folder", ("b.mid", "sub/a.midi"))
    listing = tmp_path / "list.txt"
    listing.write_text("# two files, one twice\nref/sub/a.midi\n\nref/b.mid\nref/b.mid\n")
    assert resolve(str(listing)) == ReferenceSource(str(listing), "list", tmp_path,
                                                    ("ref/b.mid", "ref/sub/a.midi"))
    table = tmp_path / "list.csv"
    table.write_text("path,license\nref/b.mid,cc0\n")
    assert resolve(str(table)).files == ("ref/b.mid",)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "does not exist"),
    (lambda d: (d / "x.json").write_text("{}") and d / "x.json", "neither a folder"),
    (lambda d: (d / "l.txt").write_text("nowhere.mid\n") and d / "l.txt", "do not exist"),
    (lambda d: (d / "l.csv").write_text("file\na.mid\n") and d / "l.csv", "no 'path' column"),
    (lambda d: (d / "m.parquet").write_bytes(b"") or d / "m.parquet", "no notes.parquet"),
])
def test_a_bad_reference_names_the_key_and_the_value(tmp_path, make, message):
    bad = make(tmp_path)
    with pytest.raises(ParamsError, match=message) as e:
        resolve(str(bad), key="--against")
    assert "--against" in str(e.value) and str(bad) in str(e.value)


def test_the_cache_keys_follow_the_content_and_the_settings(tmp_path):
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "a.mid").write_bytes(b"one")
    src = resolve(str(tmp_path / "ref"))
    before = content_hash(src, IngestConfig())
    assert content_hash(src, IngestConfig()) == before
    assert content_hash(src, IngestConfig(min_notes=2)) != before
    (tmp_path / "ref" / "a.mid").write_bytes(b"two")
    assert content_hash(src, IngestConfig()) != before
    assert fingerprint_key(DedupeConfig()) != fingerprint_key(DedupeConfig(num_perm=64))
    # thresholds that only judge pairs do not touch the fingerprints
    assert fingerprint_key(DedupeConfig()) == fingerprint_key(DedupeConfig(near_jaccard=0.6))


def test_equal_keys_pairs_equal_non_empty_keys():
    qi, ri = equal_keys(np.array(["a", "", "b", "a"], dtype=object),
                        np.array(["", "a", "c", "b"], dtype=object))
    assert sorted(zip(qi.tolist(), ri.tolist(), strict=True)) == [(0, 1), (2, 3), (3, 1)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A project of 10 pieces (4 held out) and a reference holding a resaved, a transposed and
    an edited copy of three held-out pieces, a copy of a train piece and unrelated pieces; both
    written as manifest and notes tables."""
    root = tmp_path_factory.mktemp("corpora")
    rng = np.random.default_rng(3)
    project = {f"p{i}": base_piece(rng, n_events=int(rng.integers(50, 80))) for i in range(10)}
    manifest, notes, shas = write_corpus(root / "project", project)
    split = {"p0": "test", "p1": "test", "p2": "val", "p3": "val"}
    artifacts.write_parquet(root / "project" / "splits.parquet", pa.table({
        "sha256": [shas[k] for k in project], "group_id": [f"g{k}" for k in project],
        "split": [split.get(k, "train") for k in project], "fold": [-1] * len(project)},
        schema=SPLITS_SCHEMA))
    reference = {"resaved": variant(rng, project["p0"], "resaved"),
                 "up": variant(rng, project["p1"], "transposed"),
                 "edited": variant(rng, project["p2"], "edited"),
                 "train_copy": project["p7"]}
    reference |= {f"other{i}": base_piece(rng, n_events=60) for i in range(5)}
    ref_manifest, _, ref_shas = write_corpus(root / "reference", reference)
    return {"root": root, "manifest": manifest, "notes": notes, "shas": shas,
            "ref_manifest": ref_manifest, "ref_shas": ref_shas}


def test_held_out_pieces_are_matched_tier_by_tier(corpora):
    cfg = DedupeConfig()
    project = corpora["root"] / "project"
    q = held_out(corpora["manifest"], corpora["notes"], project / "splits.parquet",
                 ["val", "test"], cfg, RUNTIME)
    assert q.n == 4 and sorted(q.split.tolist()) == ["test", "test", "val", "val"]
    ref = load_reference(resolve(str(corpora["ref_manifest"])), IngestConfig(), cfg, RUNTIME,
                         corpora["root"] / "cache")
    assert not ref.cached and ref.side.n == 9
    m = match(q, ref.side, ref.views, cfg)
    name = {v: k for k, v in corpora["shas"].items()}
    ref_name = {v: k for k, v in corpora["ref_shas"].items()}
    got = {(name[q.sha256[i]], ref_name[ref.side.sha256[j]], t)
           for i, j, t in zip(m["qi"], m["ri"], m["tier"], strict=True)}
    assert got == {("p0", "resaved", "note"), ("p1", "up", "transposed"),
                   ("p2", "edited", "near")}
    near = m[m["tier"] == "near"].iloc[0]
    assert near["rule"] in ("jaccard", "containment", "alignment", "melody", "excerpt")
    # read back from the cache: the same fingerprints, runs and matches
    again = load_reference(resolve(str(corpora["ref_manifest"])), IngestConfig(), cfg,
                           RUNTIME, corpora["root"] / "cache")
    assert again.cached
    assert np.array_equal(again.side.fps.signatures, ref.side.fps.signatures)
    assert all(np.array_equal(a, b) for a, b in zip(again.views, ref.views, strict=True))
    assert match(q, again.side, again.views, cfg).equals(m)

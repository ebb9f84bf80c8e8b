"""Duplicate detection shared by dedupe and contamination (:mod:`pipeline.similarity.duplicates`):
settings, star edges of equal keys, LSH candidates, verification and the verdict store."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.duplicates import (
    DedupeConfig,
    VerdictStore,
    fingerprint,
    star_edges,
    verdict_key,
    verify,
)
from tests.stages.test_dedupe import base_piece, variant, write_corpus


def test_star_edges_join_each_group_to_its_smallest_index():
    keys = np.array(["x", "", "y", "x", "", "x", "y", "z"], dtype=object)
    a, b = star_edges(keys)
    assert sorted(zip(a.tolist(), b.tolist(), strict=True)) == [(0, 3), (0, 5), (2, 6)]
    none = star_edges(np.array(["", ""], dtype=object))
    assert none[0].size == none[1].size == 0


@pytest.mark.parametrize("raw, message", [
    ({"lsh_threshold": 0.6, "near_jaccard": 0.5}, "lsh_threshold"),
    ({"short_melody_notes": 5, "min_melody_notes": 12}, "min_melody_notes"),
])
def test_inconsistent_settings_are_rejected(raw, message):
    with pytest.raises(ValidationError, match=message):
        DedupeConfig(**raw)


def test_verdict_key_ignores_thresholds_that_only_decide():
    base = verdict_key(DedupeConfig())
    assert verdict_key(DedupeConfig(near_containment=0.9, lsh_threshold=0.3, max_df=10)) == base
    assert verdict_key(DedupeConfig(shingle_k=5)) != base


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A piece, an edited copy of it and an unrelated piece: fingerprints and sequences."""
    rng = np.random.default_rng(11)
    base = base_piece(rng, n_events=60)
    pieces = {"a": base, "b": variant(rng, base, "edited"), "c": base_piece(rng, n_events=60)}
    _, notes_path, shas = write_corpus(tmp_path_factory.mktemp("three"), pieces)
    notes = fp.read_notes(notes_path)
    name_of = {sha: name for name, sha in shas.items()}
    names = [name_of[s] for s in notes.sha256]
    cfg = DedupeConfig()
    return names, notes, cfg, fingerprint(notes, cfg), similarity.Sequences.build(
        notes, cfg.ioi_resolution)


def test_verify_confirms_an_edited_copy_and_not_an_unrelated_piece(three):
    names, _, cfg, fps, seqs = three
    at = {n: i for i, n in enumerate(names)}
    a = np.array([min(at["a"], at["b"]), min(at["a"], at["c"])])
    b = np.array([max(at["a"], at["b"]), max(at["a"], at["c"])])
    v = verify(fps, seqs, a, b, cfg)
    assert v.ok.tolist() == [True, False]
    assert v.rule[0] != "" and v.rule[1] == ""
    assert v.jaccard[0] > v.jaccard[1]


def test_verdict_store_returns_what_was_stored_and_nothing_for_an_unknown_pair(three, tmp_path):
    _, _, cfg, fps, seqs = three
    digests = ["d0", "d1", "d2"]
    store = VerdictStore(tmp_path, cfg, digests)
    al = similarity.Alignment(0.9, 0.8, 0.95, 1, 2.0, 10.0)
    store.put(0, 1, 0.5, 0.75, al)
    store.put(0, 2, 0.1, 0.2, None)
    assert store.save() == 2
    again = VerdictStore(tmp_path, cfg, digests)
    a, b = np.array([0, 0, 1]), np.array([1, 2, 2])
    again.load(a, b)
    assert again.get(0, 1) == (0.5, 0.75, al)
    assert again.get(0, 2) == (0.1, 0.2, None)
    assert again.get(1, 2) is None and again.hits == 2
    assert again.unmeasured(a, b).tolist() == [1, 2]
    measures = verify(fps, seqs, np.array([0]), np.array([1]), cfg, verdicts=again)
    assert measures.jaccard[0] == 0.5 and not math.isnan(measures.containment[0])


def test_lsh_candidates_equal_datasketch_minhashlsh():
    from datasketch import LeanMinHash, MinHashLSH

    from pipeline.similarity.duplicates import LSH_WEIGHTS, lsh_candidates

    rng = np.random.default_rng(0)
    sets = []
    for _ in range(40):
        s = np.unique(rng.integers(0, 5000, 200))
        m = s.copy()
        hit = rng.random(m.size) < rng.uniform(0.1, 0.6)
        m[hit] = rng.integers(5000, 9999, hit.sum())
        sets += [s, np.unique(m)]
    offsets = np.concatenate([[0], np.cumsum([s.size for s in sets])])
    cfg = DedupeConfig()
    sig = fp.minhash_signatures(offsets, np.concatenate(sets).astype(np.uint64),
                                fp.minhash_permutations(cfg.num_perm, cfg.seed))
    a, b = lsh_candidates(sig, np.arange(len(sets)), cfg)
    lsh = MinHashLSH(threshold=cfg.lsh_threshold, num_perm=cfg.num_perm, weights=LSH_WEIGHTS)
    sketches = [LeanMinHash(seed=cfg.seed, hashvalues=s, scheme="affine32") for s in sig]
    for i, m in enumerate(sketches):
        lsh.insert(i, m)
    ref = sorted({(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m)
                  if i != j})
    assert len(ref) > 20
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == ref

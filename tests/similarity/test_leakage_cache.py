"""The leakage audit's cache (``.cache/split``): a run that starts from an earlier run's results
reports exactly what a run without them reports, through added pieces, pieces that moved split,
groups that merged or split, a piece whose notes changed under the same sha256, and a tie that a
new piece wins; and it reuses most queries while doing so. A damaged cache is ignored. Also the
merge property the cache rests on: results over a pool are the merge of results over its parts.
The per-piece inputs (shingles, tokens, melodies) kept by note digest equal a fresh build."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.music.manifest import NOTES_SCHEMA
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.digests import note_digests, take_pieces
from pipeline.similarity.duplicates import DedupeConfig
from pipeline.similarity.leakage import audit
from pipeline.similarity.leakage_cache import AuditCache, audit_inputs
from pipeline.similarity.neighbours import (
    MEASURES,
    Melodies,
    Neighbours,
    ShingleMatrix,
    TokenStrings,
    neighbours,
)
from tests.similarity.test_neighbours import edited, tune
from tests.stages.test_dedupe import base_piece, variant

RULE = DedupeConfig().rule
SPLITS = np.array(["train", "train", "train", "val", "test"], dtype=object)


def corpus() -> dict[str, dict]:
    """Tunes of one style with edited copies, chordal pieces with variants, and ``s06``: the
    same notes as ``t06`` under a name that sorts first (a tie for every query near ``t06``)."""
    rng = np.random.default_rng(21)
    pieces = {f"t{i:02d}": tune(rng, int(rng.integers(14, 160))) for i in range(36)}
    for i in range(0, 36, 3):
        pieces[f"t{i:02d}_copy"] = edited(rng, pieces[f"t{i:02d}"],
                                          k=max(1, pieces[f"t{i:02d}"]["pitch"].size // 25))
    for i in range(4):
        base = base_piece(rng, n_events=int(rng.integers(30, 70)))
        pieces[f"c{i}"] = base
        pieces[f"c{i}_edit"] = variant(rng, base, "edited")
    pieces["s06"] = {k: v.copy() for k, v in pieces["t06"].items()}
    return pieces


def arrays(pieces: dict[str, dict]):
    names = sorted(pieces)  # the sha256 column is the name here: rows stay in name order
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **pieces[k]} for k in names]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    notes = fp.notes_from_table(table)
    return (ShingleMatrix.build(notes, 4, 4), Melodies.build(notes), TokenStrings.build(notes, 4),
            note_digests(notes))


def table(names: list[str], split: dict[str, str], group: dict[str, str]) -> pd.DataFrame:
    names = sorted(names)
    return pd.DataFrame({"sha256": names, "split": [split[n] for n in names],
                         "group_id": [group[n] for n in names], "group": "",
                         "cluster_id": names})


def run(pieces, names, split, group, cache=None, max_test=10):
    sm, mel, tok, digests = arrays({n: pieces[n] for n in names})
    store = AuditCache(cache, "k", digests) if cache is not None else None
    report, curves = audit(table(names, split, group), pd.DataFrame({"a": [], "b": []}), sm, mel,
                          tok, seed=3, ratios=(0.6, 0.2, 0.2), max_test=max_test, rule=RULE,
                          cache=store)
    return report, curves, store


@pytest.mark.parametrize("max_test", [10, 100], ids=["sampled", "every-piece"])
def test_a_run_from_the_cache_equals_a_fresh_run(tmp_path, max_test):
    pieces = corpus()
    rng = np.random.default_rng(4)
    every = sorted(pieces)
    split = {n: str(rng.choice(SPLITS)) for n in every}
    split |= {"t06": "train", "s06": "train", "t06_copy": "test", "t09": "train",
              "t09_copy": "test", "t12": "train", "t12_copy": "train", "t15": "train",
              "t15_copy": "train"}
    first = [n for n in every if n not in {"s06", "t07", "t08_copy", "c3_edit"}
             and (n[:3] in ("t09", "t12", "t15") or rng.random() > 0.1)]
    group = {n: f"g-{n}" for n in every}
    group["t12"] = group["t12_copy"] = "g-t12"  # one group in the first run only
    _, _, s1 = run(pieces, first, split, group, tmp_path, max_test)
    assert sum(v["queries_measured"] for v in s1.stats.values()) > 0

    # the next run: pieces added (s06 ties t06), t09 (t09_copy's near copy) and others moved,
    # t12's group split (its copy is no longer excluded), t15 and its copy now one group (it is
    # excluded), and t10's notes changed under the same name
    split2 = dict(split)
    for n in ["t09", *[n for n in first if n.startswith("t1") and n[:3] not in ("t12", "t15")]
              ][:4]:
        split2[n] = {"train": "val", "val": "train", "test": "train"}[split[n]]
    group2 = {n: f"g-{n}" for n in every}
    group2["t15"] = group2["t15_copy"] = "g-t15"
    pieces2 = dict(pieces)
    pieces2["t10"] = edited(np.random.default_rng(9), pieces["t10"], k=2)
    r2, curves2, s2 = run(pieces2, every, split2, group2, tmp_path, max_test)
    fresh, curves_fresh, _ = run(pieces2, every, split2, group2, max_test=max_test)
    assert r2 == fresh and curves2.keys() == curves_fresh.keys()
    assert all(np.array_equal(curves2[k], curves_fresh[k]) for k in curves2)
    assert all(v["queries_reused"] > 0 for v in s2.stats.values()), s2.stats
    # adding s06 alone to a run that had t06_copy's partner t06: the stored best is merged with
    # s06 and the tie goes to it (every test piece measured here); only queries s06 enters as
    # are measured in full
    run(pieces2, [n for n in every if n != "s06"], split2, group2, tmp_path, max_test=100)
    r4, _, s4 = run(pieces2, every, split2, group2, tmp_path, max_test=100)
    assert r4 == run(pieces2, every, split2, group2, max_test=100)[0]
    examples = {e["test_sha256"]: e["train_sha256"] for e in r4["independent"]["examples"]}
    assert examples["t06_copy"] == "s06"
    assert sum(v["queries_measured"] for v in s4.stats.values()) <= 3, s4.stats
    assert all(v["pairs_measured_for_reused"] <= v["queries_reused"] for v in s4.stats.values())
    # a third run with nothing changed reuses every query and measures nothing
    r3, _, s3 = run(pieces2, every, split2, group2, tmp_path, max_test)
    assert r3 == fresh
    assert all(v["queries_measured"] == v["pairs_measured_for_reused"] == 0
               for v in s3.stats.values()), s3.stats


def test_a_damaged_or_mismatched_cache_is_ignored(tmp_path):
    pieces = corpus()
    names = sorted(pieces)
    split = dict(zip(names, np.resize(SPLITS, len(names)), strict=True))
    group = {n: n for n in names}
    fresh, _, _ = run(pieces, names, split, group)
    run(pieces, names, split, group, tmp_path)
    (tmp_path / "k" / "pieces.parquet").write_bytes(b"not parquet")
    again, _, store = run(pieces, names, split, group, tmp_path)
    assert again == fresh
    assert all(v["queries_reused"] == 0 for v in store.stats.values())
    # a pieces file from another run: the results name the one they go with
    run(pieces, names[:-3], split, group, tmp_path / "other")
    (tmp_path / "k" / "pieces.parquet").write_bytes(
        (tmp_path / "other" / "k" / "pieces.parquet").read_bytes())
    again, _, store = run(pieces, names, split, group, tmp_path)
    assert again == fresh and all(v["queries_reused"] == 0 for v in store.stats.values())


@pytest.mark.parametrize("exclude", [None, "group"])
def test_results_over_a_pool_are_the_merge_of_results_over_its_parts(exclude):
    pieces = corpus()
    sm, mel, tok, _ = arrays(pieces)
    n = sm.sha256.size
    groups = np.arange(n) // 3 if exclude else None
    row = {name: i for i, name in enumerate(sm.sha256)}
    rng = np.random.default_rng(8)
    others = np.setdiff1d(np.arange(n), [row["t06_copy"], row["t06"], row["s06"]])
    query = np.sort(np.r_[rng.choice(others, size=19, replace=False), row["t06_copy"]])
    pool = np.setdiff1d(np.arange(n), query)
    whole = neighbours(sm, mel, tok, query, pool, RULE, groups=groups)
    assert (whole.values[:, MEASURES.index("alignment")] > 0).any()
    parts = np.array_split(rng.permutation(pool), 3)
    merged = Neighbours.zeros(query.size)
    for part in parts[::-1]:
        merged.merge(neighbours(sm, mel, tok, query, np.sort(part), RULE, groups=groups),
                     np.arange(query.size))
    for field in ("values", "rows", "partner", "partner_sims"):
        assert np.array_equal(getattr(whole, field), getattr(merged, field)), field
    # ties go to the lowest row: s06 (the same notes as t06, a smaller sha256)
    assert whole.partner[np.flatnonzero(query == row["t06_copy"])[0]] == row["s06"]


def _same_inputs(a, b) -> None:
    sm_a, mel_a, tok_a = a
    sm_b, mel_b, tok_b = b
    assert list(sm_a.sha256) == list(sm_b.sha256)
    assert (sm_a.matrix != sm_b.matrix).nnz == 0 and np.array_equal(sm_a.sizes, sm_b.sizes)
    assert mel_a.views == mel_b.views
    assert np.array_equal(mel_a.lengths, mel_b.lengths) and np.array_equal(mel_a.same, mel_b.same)
    assert tok_a.exact == tok_b.exact and tok_a.coarse == tok_b.coarse
    assert np.array_equal(tok_a.lengths, tok_b.lengths)
    assert np.array_equal(tok_a.onsets, tok_b.onsets)


def test_per_piece_inputs_from_the_cache_equal_a_fresh_build(tmp_path):
    """Cold, warm and partly warm (pieces added; two pieces with the same notes share one
    entry) builds of the shingle matrix, melodies and token strings equal the plain build; a
    damaged segment only costs time."""
    pieces = corpus()
    names = sorted(pieces)
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **pieces[k]} for k in names]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    notes = fp.notes_from_table(table)
    digests = note_digests(notes)
    plain = (ShingleMatrix.build(notes, 4, 4), Melodies.build(notes),
             TokenStrings.build(notes, 4))
    some = np.flatnonzero(~np.isin(notes.sha256, ["c1", "t07", "t09_copy"]))
    stats: dict = {}
    part = audit_inputs(take_pieces(notes, some), 4, 4, [digests[i] for i in some], tmp_path, stats)
    assert stats == {"features_reused": 0, "features_measured": some.size - 1}  # t06 = s06
    _same_inputs(part, (ShingleMatrix.build(take_pieces(notes, some), 4, 4),
                        Melodies.build(take_pieces(notes, some)),
                        TokenStrings.build(take_pieces(notes, some), 4)))
    _same_inputs(audit_inputs(notes, 4, 4, digests, tmp_path, stats), plain)
    assert stats == {"features_reused": some.size, "features_measured": 3}
    _same_inputs(audit_inputs(notes, 4, 4, digests, tmp_path, stats), plain)
    assert stats["features_measured"] == 0
    for seg in (tmp_path).rglob("seg-*.parquet"):
        seg.write_bytes(b"damaged")
    _same_inputs(audit_inputs(notes, 4, 4, digests, tmp_path, stats), plain)
    _same_inputs(audit_inputs(notes, 4, 4, digests, None, stats), plain)


def test_one_block_and_many_blocks_give_the_same_neighbours(monkeypatch):
    """A query set of one block is measured as pool × queries' transpose, a larger one as query
    blocks × the pool's transpose: the same intersection counts, so the same results."""
    from pipeline.similarity import neighbours as search

    pieces = corpus()
    sm, mel, tok, _ = arrays(pieces)
    query = np.arange(0, sm.sha256.size, 2)
    pool = np.arange(1, sm.sha256.size, 2)
    groups = np.arange(sm.sha256.size) // 3
    one = neighbours(sm, mel, tok, query, pool, RULE, groups=groups, align=False)
    monkeypatch.setattr(search, "BLOCK_ROWS", 4)  # now several blocks of 4
    many = neighbours(sm, mel, tok, query, pool, RULE, groups=groups, align=False)
    assert (one.values[:, :4] > 0).any()
    for field in ("values", "rows", "partner", "partner_sims"):
        assert np.array_equal(getattr(one, field), getattr(many, field)), field


def test_features_measured_a_few_notes_at_a_time_are_those_measured_at_once(tmp_path,
                                                                            monkeypatch):
    """Pieces measured in chunks of a few notes (every chunk's rows under their own digests)
    give the plain build's inputs, without the store, into it and from it."""
    from pipeline.similarity import leakage_cache

    pieces = corpus()
    table = pa.Table.from_pandas(pd.DataFrame([{"sha256": k, **pieces[k]} for k in sorted(pieces)]),
                                 schema=NOTES_SCHEMA, preserve_index=False)
    notes = fp.notes_from_table(table)
    digests = note_digests(notes)
    plain = (ShingleMatrix.build(notes, 4, 4), Melodies.build(notes),
             TokenStrings.build(notes, 4))
    monkeypatch.setattr(leakage_cache, "FEATURES_CHUNK_NOTES", 60)
    assert len(notes.chunks(max_notes=60)) > 5
    stats: dict = {}
    _same_inputs(audit_inputs(notes, 4, 4, digests, None, stats), plain)
    _same_inputs(audit_inputs(notes, 4, 4, digests, tmp_path, stats), plain)
    assert stats["features_measured"] > 0
    _same_inputs(audit_inputs(notes, 4, 4, digests, tmp_path, stats), plain)
    assert stats["features_measured"] == 0

"""Per-sequence overlap with the training set (longest shared span, novelty, nearest training
piece by shingles) and music statistics, on a REMI world of random melodies."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from pipeline.audit.overlap import (
    Shingling,
    bar_tokens_per_id,
    build_training_index,
    decode_all,
    measure,
    measure_all,
    shingle_sets,
)
from pipeline.core import artifacts
from pipeline.music.descriptors import STATS
from pipeline.similarity.rule import NearCopyRule, NearCopySettings
from pipeline.tokens.tokenizer import load_tokenizer
from tests.stages.test_generate import make_world


@dataclass(frozen=True)
class Plan:
    ngram_sizes: tuple[int, ...] = (4, 8)
    interval_ngram_sizes: tuple[int, ...] = (2, 4)
    beats_per_bar: int = 4
    groove_resolution: int = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(tokenizer, training rows, held-out rows, training index) of a small REMI world."""
    paths = make_world(tmp_path_factory.mktemp("world"), n_train=8, n_val=2, n_test=2)
    tok = load_tokenizer(paths["tokenizer"])
    table = artifacts.read_parquet(paths["tokens"]).sort_values("sha256")
    train = table[table["split"] == "train"].reset_index(drop=True)
    held = table[table["split"] != "train"].reset_index(drop=True)
    return tok, train, held, build_training_index(tok, train, Shingling())


def test_bar_tokens_are_counted_per_id(world):
    tok = world[0]
    counts = bar_tokens_per_id(tok)
    expected = np.zeros(len(tok), dtype=np.int64)
    for token, i in tok.vocab.items():
        expected[i] = int(token.startswith("Bar"))
    assert counts is not None and counts.tolist() == expected.tolist() and counts.sum() >= 1


def test_shingling_is_the_dedupe_rules(tmp_path):
    rule = NearCopyRule.of(NearCopySettings(shingle_k=6, ioi_resolution=2))
    artifacts.write_json(tmp_path / "fingerprint.json", rule.to_json())
    assert Shingling.read(tmp_path / "fingerprint.json") == Shingling(k=6, ioi_resolution=2)
    assert Shingling.of(rule) == Shingling(k=6, ioi_resolution=2)
    default = NearCopySettings()
    assert Shingling() == Shingling(k=default.shingle_k, ioi_resolution=default.ioi_resolution)


def test_a_replayed_training_piece_overlaps_it_entirely(world):
    tok, train, _, index = world
    ids = np.asarray(train["ids"][3], dtype=np.int64)
    inner = ids[10:70]
    [whole, part] = measure_all([ids, inner], index, tok, Plan(), bar_tokens_per_id(tok))
    assert whole["lcs_tokens"] == len(ids) and whole["lcs_start"] == 0
    assert whole["lcs_train_sha256"] == train["sha256"][3] and whole["lcs_train_start"] == 0
    assert whole["novelty_tok_4"] == whole["novelty_tok_8"] == 0.0
    assert whole["novelty_int_2"] == 0.0
    assert whole["nn_sha256"] == train["sha256"][3] and whole["nn_jaccard"] == 1.0
    assert whole["decode_ok"] and whole["n_tokens"] == len(ids)
    assert set(STATS) <= set(whole) and whole["n_notes"] > 0
    assert part["lcs_tokens"] == 60 and part["lcs_train_start"] == 10
    assert part["nn_sha256"] == train["sha256"][3] and part["nn_containment"] > 0.5
    assert whole["lcs_bars"] >= 1  # the span crosses bar lines


def test_held_out_music_overlaps_less(world):
    tok, _, held, index = world
    rows = measure_all([np.asarray(x, dtype=np.int64) for x in held["ids"]], index, tok, Plan(),
                       None)
    for r, ids in zip(rows, held["ids"], strict=True):
        assert r["lcs_tokens"] < len(ids) / 2
        assert r["novelty_tok_8"] > 0.5 and r["nn_jaccard"] < 1.0
        assert np.isnan(r["lcs_bars"])  # no Bar counts given


def test_an_undecodable_sequence_keeps_its_token_measures_only(world):
    _, train, _, index = world
    ids = np.asarray(train["ids"][0][:20], dtype=np.int64)
    row = measure(ids, None, np.zeros(0, dtype=np.uint64), index, Plan(), None)
    assert not row["decode_ok"] and row["lcs_tokens"] == 20
    assert np.isnan(row["novelty_int_2"]) and np.isnan(row["nn_jaccard"])
    assert row["nn_sha256"] is None
    assert all(np.isnan(row[s]) for s in [*STATS, "n_notes"])
    nothing = measure(np.zeros(0, dtype=np.int64), None, np.zeros(0, dtype=np.uint64), index,
                      Plan(), None)
    assert (nothing["lcs_tokens"], nothing["lcs_start"], nothing["lcs_train_sha256"]) == (
        0.0, -1, None)
    assert np.isnan(nothing["novelty_tok_4"])  # shorter than n: nothing to judge


def test_shingle_sets_are_per_notes_table(world):
    tok, train, _, _ = world
    notes = decode_all(tok, [np.asarray(train["ids"][0]), np.asarray(train["ids"][0]),
                             np.asarray(train["ids"][1])])
    assert all(n is not None for n in notes)
    a, b, c = shingle_sets([*notes], 4, 4)
    assert np.array_equal(a, b) and not np.array_equal(a, c) and a.size > 0
    empty, full = shingle_sets([None, notes[0]], 4, 4)
    assert empty.size == 0 and np.array_equal(full, a)
    assert shingle_sets([], 4, 4) == []

"""Each piece's condition ids (pipeline.conditions.assign): labels learned from train only, a
model's vocabulary applied to any table, and keys moved by transposition."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.conditions.assign import (
    model_vocab,
    piece_conditions,
    transpose_label,
    transposed_ids,
    with_vocab,
)
from pipeline.conditions.extract import MODES, PITCH_NAMES
from pipeline.conditions.vocab import ConditionVocab


def test_piece_conditions_learn_labels_from_train_only():
    table = pd.DataFrame({"sha256": ["c", "a", "b"], "split": ["test", "train", "val"],
                          "key": ["E minor", "D major", "A minor"]})
    pc = piece_conditions(table, ["key"])
    assert pc.vocab.labels == (("D major",),)  # val's and test's labels are not learned
    assert pc.of("a").tolist() == [1]
    assert pc.of("b").tolist() == [0] and pc.of("c").tolist() == [0]
    assert pc.of("not-listed").tolist() == [0]
    assert pc.many(["a", "b"]).shape == (2, 1)
    with pytest.raises(ValueError, match="no column 'tempo'"):
        piece_conditions(table, ["tempo"])


def test_transposition_moves_the_key_only():
    assert transpose_label("key", "G major", 2) == "A major"
    assert transpose_label("key", "B minor", 1) == "C minor"
    assert transpose_label("key", "C major", -1) == "B major"
    assert transpose_label("density", "low", 5) == "low"
    table = pd.DataFrame({"sha256": ["a", "b"], "split": ["train", "train"],
                          "key": ["C major", "D major"], "density": ["low", "low"]})
    pc = piece_conditions(table, ["key", "density"])
    assert pc.vocab.decode(transposed_ids(pc, "a", 2)) == {"key": "D major", "density": "low"}
    # a transposed key that train never had is "none", not another key
    assert pc.vocab.decode(transposed_ids(pc, "a", 1)) == {"key": None, "density": "low"}


def test_a_models_vocabulary_applies_to_any_table():
    """A trained model's labels, applied to pieces of any split: labels it never learned and
    pieces the table lacks are "none"; a table without one of its conditions is refused."""
    vocab = ConditionVocab(names=("key",), labels=(("C major", "D major"),))
    assert model_vocab(None) is None
    assert model_vocab({"vocab": vocab.to_dict(), "dropout": 0.1}) == vocab
    table = pd.DataFrame({"sha256": ["b", "a"], "split": ["test", "val"],
                          "key": ["D major", "F minor"]})
    pc = with_vocab(table, vocab)
    assert pc.vocab is vocab
    assert pc.many(["a", "b", "c"]).tolist() == [[0], [2], [0]]
    with pytest.raises(ValueError, match="conditioned on \\['key'\\], but the condition table has "
                                         "no column 'key'"):
        with_vocab(table.drop(columns=["key"]), vocab)


def test_the_digest_follows_the_ids_not_the_row_order():
    table = pd.DataFrame({"sha256": ["a", "b", "c"], "split": ["train"] * 3,
                          "mode": ["major", "minor", "major"]})
    digest = piece_conditions(table, ["mode"]).digest()
    assert piece_conditions(table.iloc[::-1], ["mode"]).digest() == digest
    assert len(digest) == 64 and int(digest, 16) >= 0
    changed = table.assign(mode=["major", "minor", "minor"])
    assert piece_conditions(changed, ["mode"]).digest() != digest


KEYS = [f"{t} {m}" for t in PITCH_NAMES for m in MODES]


@given(st.sampled_from(KEYS), st.integers(-30, 30), st.integers(-30, 30))
def test_transpositions_add_up_and_twelve_semitones_change_nothing(key, a, b):
    moved = transpose_label("key", key, a)
    assert moved in KEYS and moved.split(" ")[1] == key.split(" ")[1]  # the mode stays
    assert transpose_label("key", moved, b) == transpose_label("key", key, a + b)
    assert transpose_label("key", key, 12 * a) == key


def test_what_transposition_leaves_alone_and_refuses():
    assert transpose_label("key", None, 3) is None
    nan = transpose_label("key", float("nan"), 3)
    assert isinstance(nan, float) and np.isnan(nan)
    with pytest.raises(ValueError, match="key label 'H major' is not '<tonic> <mode>'"):
        transpose_label("key", "H major", 1)
    with pytest.raises(ValueError, match="key label 'C dorian'"):
        transpose_label("key", "C dorian", 1)
    table = pd.DataFrame({"sha256": ["a", "b"], "split": ["train", "train"],
                          "key": ["C major", None], "density": ["low", "high"]})
    pc = piece_conditions(table, ["density", "key"])
    assert transposed_ids(pc, "a", 12).tolist() == pc.of("a").tolist()  # an octave: the same
    own = pc.of("a").tolist()
    assert pc.vocab.decode(transposed_ids(pc, "a", 2))["key"] is None  # D major: never learned
    assert pc.of("a").tolist() == own  # the piece's own ids are left as they were
    assert pc.vocab.decode(transposed_ids(pc, "b", 2)) == {"density": "high", "key": None}
    plain = piece_conditions(table, ["density"])
    assert transposed_ids(plain, "a", 5).tolist() == plain.of("a").tolist()  # no key slot

"""Synthetic token tables: seeded Markov pieces, and the three token artifacts written as the
tokenize stage writes them."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict

import numpy as np

from pipeline.core.artifacts import read_parquet
from pipeline.tokens.contract import TokenInfo
from pipeline.training.synthetic import BOS, EOS, N_SPECIAL, PAD, synthetic_pieces, write_token_data


def test_pieces_are_seeded_ids_outside_the_specials():
    a = synthetic_pieces(12, vocab_size=40, mean_len=30, seed=4)
    assert len(a) == 12
    assert all(p.dtype == np.int32 and len(p) >= 4 for p in a)
    assert all(p.min() >= N_SPECIAL and p.max() < 40 for p in a)
    assert {PAD, BOS, EOS} == set(range(N_SPECIAL))
    same = synthetic_pieces(12, vocab_size=40, mean_len=30, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, same, strict=True))
    other = synthetic_pieces(12, vocab_size=40, mean_len=30, seed=5)
    assert not all(np.array_equal(x, y) for x, y in zip(a, other, strict=True))


def test_pieces_have_structure_to_learn():
    """Each id has 4 likely successors (5% noise): their 4 most common successors cover nearly
    every transition, where a uniform draw over 37 ids would cover about 11%."""
    pieces = synthetic_pieces(60, vocab_size=40, mean_len=60, seed=0)
    succ: dict[int, Counter] = defaultdict(Counter)
    for p in pieces:
        for a, b in zip(p[:-1].tolist(), p[1:].tolist(), strict=True):
            succ[a][b] += 1
    top4 = sum(sum(n for _, n in c.most_common(4)) for c in succ.values())
    total = sum(sum(c.values()) for c in succ.values())
    assert top4 / total > 0.9


def test_write_token_data_writes_the_tokenize_stages_artifacts(tmp_path):
    paths = write_token_data(tmp_path, n_pieces=30, vocab_size=50, mean_len=20, seed=2,
                             n_augmented=4, info_extra={"split_hash": "mine"}, name="x")
    assert paths == {"tokens": tmp_path / "tokens.parquet", "info": tmp_path / "info.json",
                     "augmented": tmp_path / "augmented.parquet"}
    info = TokenInfo.read(paths["info"])
    assert (info.vocab_size, info.pad_id, info.bos_id, info.eos_id) == (50, PAD, BOS, EOS)
    assert (info.tokenizer_hash, info.split_hash) == ("tok-hash", "mine")
    table = read_parquet(paths["tokens"], columns=["sha256", "split", "track", "ids", "n_tokens"])
    assert list(table["sha256"]) == sorted(table["sha256"])
    assert set(table["sha256"]) == {hashlib.sha256(f"x{i}".encode()).hexdigest()
                                    for i in range(30)}
    assert table["split"].value_counts().to_dict() == {"train": 24, "val": 3, "test": 3}
    assert (table["n_tokens"] == table["ids"].map(len)).all()
    pieces = synthetic_pieces(30, 50, 20, 2)
    first = table[table["sha256"] == hashlib.sha256(b"x0").hexdigest()].iloc[0]
    assert first["split"] == "val" and list(first["ids"]) == pieces[0].tolist()
    aug = read_parquet(paths["augmented"])
    train = set(table.loc[table["split"] == "train", "sha256"])
    assert len(aug) == 8 and set(aug["sha256"]) <= train and aug["sha256"].nunique() == 4
    assert sorted(aug["transpose"].unique()) == [-1, 1]
    none = write_token_data(tmp_path / "plain", n_pieces=10)
    assert len(read_parquet(none["augmented"])) == 0


def test_corpora_written_under_other_names_share_no_piece(tmp_path):
    a = write_token_data(tmp_path / "a", n_pieces=10, name="src")
    b = write_token_data(tmp_path / "b", n_pieces=10, name="tgt")
    shas = [set(read_parquet(p["tokens"])["sha256"]) for p in (a, b)]
    assert not shas[0] & shas[1]

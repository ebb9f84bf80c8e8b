"""The tokenize stage's tables (pipeline.tokens.tables): the vocabulary trained on train pieces
as miditok trains it on their files, the rows, flags and counts of a block, and tables that do
not depend on the batch they are assembled in."""

from __future__ import annotations

import miditok
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from symusic import Score

from pipeline.core.artifacts import sha256_file
from pipeline.tokens import tables
from pipeline.tokens.contract import TOKENS_SCHEMA
from pipeline.tokens.entries import pack
from pipeline.tokens.store import Entries
from pipeline.tokens.tokenizer import make_tokenizer, tokenizer_hash

CONFIG = {"use_programs": True}


def held(encodings: dict) -> Entries:
    """Base encodings held in memory, as a run without a store holds them."""
    entries = Entries()
    entries.packed = {(sha, 0): pack(enc) for sha, enc in encodings.items()}
    return entries


def pieces_of(shas: list[str]) -> pd.DataFrame:
    """Every third piece val, the others train."""
    return pd.DataFrame({"sha256": shas,
                         "split": ["val" if i % 3 == 0 else "train" for i in range(len(shas))]})


def test_no_model_trains_nothing(base_encodings):
    tok = make_tokenizer("REMI", CONFIG)
    out, trained_on = tables.train_model("none", 600, tok, pieces_of(sorted(base_encodings)),
                                         held(base_encodings))
    assert out is tok and trained_on == [] and not tok.is_trained


def test_the_vocabulary_is_miditoks_own_on_the_train_files(base_encodings, kept_fixtures):
    """Trained from stored base encodings, the vocabulary is the one miditok trains on the train
    pieces' files, byte for byte; val pieces, pieces without an entry and ``also`` pieces
    without one are not read, ``also`` pieces with one are."""
    path_of = {sha256_file(p): p for p in kept_fixtures}
    shas = sorted(base_encodings)
    other, mine = shas[-1], shas[:-1]  # ``other``: another corpus's train piece
    pieces = pieces_of([*mine, "f" * 64])  # "f" * 64: in the splits, never encoded
    train = [s for s, split in zip(pieces["sha256"], pieces["split"], strict=True)
             if split == "train" and s in base_encodings]
    size = len(make_tokenizer("REMI", CONFIG).vocab) + 60
    ours, trained_on = tables.train_model("BPE", size, make_tokenizer("REMI", CONFIG), pieces,
                                          held(base_encodings), also=[other, "e" * 64])
    assert trained_on == sorted([*train, other]) and ours.is_trained
    theirs = make_tokenizer("REMI", CONFIG)
    theirs.train(vocab_size=size, model="BPE",
                 files_paths=[path_of[s] for s in sorted([*train, other])])
    assert tokenizer_hash(ours) == tokenizer_hash(theirs)
    alone, _ = tables.train_model("BPE", size, make_tokenizer("REMI", CONFIG), pieces,
                                  held(base_encodings))
    assert tokenizer_hash(alone) != tokenizer_hash(ours)


def test_tables_hold_encodes_ids_whatever_the_batch(base_encodings, kept_fixtures, tmp_path,
                                                    monkeypatch):
    """With a trained vocabulary, each kept fixture's row holds the ids of miditok's ``encode``,
    a lossless round trip and no flag; a piece that could not be encoded keeps one row with its
    flag. Assembled two pieces at a time, the files and statistics are the same."""
    path_of = {sha256_file(p): p for p in kept_fixtures}
    shas = sorted([*base_encodings, "0" * 64])  # "0" * 64: its file could not be read
    pieces = pieces_of(shas)
    tok = make_tokenizer("REMI", CONFIG)
    tok, _ = tables.train_model("BPE", len(tok.vocab) + 60, tok, pieces, held(base_encodings))
    failures = {"0" * 64: ("read_error", "not MIDI")}

    def write(folder):
        stats = tables.write_tables(tok, pieces, dict.fromkeys(base_encodings, (0,)),
                                    held(base_encodings), failures, folder / "tokens.parquet",
                                    folder / "augmented.parquet")
        return stats, {n: (folder / f"{n}.parquet").read_bytes() for n in ("tokens", "augmented")}

    stats, files = write(tmp_path / "whole")
    monkeypatch.setattr(tables, "BATCH", 2)
    assert write(tmp_path / "by-two") == (stats, files)
    table = pq.read_table(tmp_path / "whole" / "tokens.parquet")
    assert table.schema == TOKENS_SCHEMA
    rows = table.to_pylist()
    assert [r["sha256"] for r in rows] == shas
    for r in rows:
        if r["sha256"] == "0" * 64:
            assert (r["track"], r["ids"], r["flags"]) == (-1, [], ["read_error"])
            continue
        want = tok.encode(Score.from_midi(path_of[r["sha256"]].read_bytes())).ids
        assert r["ids"] == want and r["n_tokens"] == len(want)
        assert r["flags"] == [] and r["roundtrip_f1"] == 1.0
    assert stats["pieces"] == len(shas) and stats["flagged_pieces"] == 1
    assert stats["flags"] == {"read_error": 1} and stats["compression"] > 1.0
    assert stats["base_tokens"] == sum(len(s.ids) for e in base_encodings.values()
                                       for s in e.seqs)
    assert pq.read_table(tmp_path / "whole" / "augmented.parquet").num_rows == 0


def test_rows_flags_and_counts_from_a_block():
    """Each piece's rows, flags and round-trip F1 as the table contract states them, built from
    a block of packed entries: notes dropped, a lossy round trip, an unchecked one, an entry
    without sequences, a piece that could not be encoded, and augmented copies (one refused)."""
    from collections import Counter

    from pipeline.tokens.entries import Encoding, SeqEncoding, pack, parse_block
    from pipeline.tokens.tables import batch_tables

    def seq(n_ids: int, n_notes: int, matched: int, decoded: int) -> SeqEncoding:
        return SeqEncoding(track=-1, program=-1, is_drum=False, n_notes=n_notes,
                           ids=np.arange(n_ids, dtype=np.int32), bar_starts=np.zeros(1, np.int32),
                           beat_starts=np.zeros(1, np.int32), rt_matched=matched,
                           rt_decoded=decoded)

    a, b, c, d, e = (ch * 64 for ch in "abcde")
    entries = {(a, 0): Encoding(5, (seq(6, 4, 4, 4),)), (a, 2): Encoding(5, (seq(7, 4, -1, -1),)),
               (b, 0): Encoding(3, (seq(4, 3, 2, 3),)), (c, -1): Encoding(2, (), True),
               (c, 0): Encoding(2, ()), (e, 0): Encoding(1, (seq(3, 1, -1, -1),))}
    keys = sorted(entries)
    block = parse_block(keys, [pack(entries[k]) for k in keys])
    examples, counts = [], Counter()
    tokens, augmented = batch_tables(
        miditok.REMI(miditok.TokenizerConfig(use_programs=True)), None, [a, b, c, d, e],
        ["train", "val", "train", "test", "val"], block, None,
        {d: ("read_error", "not MIDI")}, examples, counts)
    rows = tokens.to_pylist()
    assert [(r["sha256"][0], r["track"], r["n_tokens"], r["n_notes"], r["n_notes_input"],
             r["flags"]) for r in rows] == [
        ("a", -1, 6, 4, 5, ["notes_dropped"]), ("b", -1, 4, 3, 3, ["roundtrip_lossy"]),
        ("c", -1, 0, 0, 2, ["no_notes", "notes_dropped"]), ("d", -1, 0, 0, 0, ["read_error"]),
        ("e", -1, 3, 1, 1, [])]
    f1 = [r["roundtrip_f1"] for r in rows]
    assert f1[0] == 1.0 and f1[1] == 2 * 2 / 6 and f1[2] is None and f1[3] is None
    assert np.isnan(f1[4])
    assert rows[0]["ids"] == list(range(6)) and rows[2]["ids"] == [] == rows[3]["ids"]
    assert examples == [{"sha256": d, "flags": ["read_error"], "detail": "not MIDI"}]
    assert augmented.to_pylist() == [{"sha256": a, "transpose": 2, "track": -1,
                                      "ids": list(range(7)), "n_tokens": 7}]
    assert counts == Counter(base_tokens=13, augmented_sequences=1, augment_out_of_range=1)

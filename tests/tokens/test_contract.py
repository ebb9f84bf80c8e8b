"""The token contract (pipeline.tokens.contract): ``info.json`` written and read back, its
missing keys named with the stage that makes it, the special ids, the defaults of a token table
and its reader's order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.core.artifacts import ArtifactError, write_json, write_parquet
from pipeline.tokens.contract import (
    TOKENS_SCHEMA,
    TokenInfo,
    never_sampled,
    read_tokens,
    tokens_table,
)

REQUIRED = ("vocab_size", "pad_id", "bos_id", "eos_id", "tokenizer_hash", "split_hash")


def test_info_round_trips_and_leaves_unset_keys_out(tmp_path):
    full = TokenInfo(vocab_size=600, pad_id=0, bos_id=1, eos_id=2, tokenizer_hash="t" * 64,
                     split_hash="s" * 64, tokenizer="REMI", model="BPE", base_vocab_size=486,
                     one_token_stream=True)
    full.write(tmp_path / "info.json")
    assert TokenInfo.read(tmp_path / "info.json") == full
    bare = TokenInfo(600, 0, 1, 2, "t", "s")
    assert tuple(bare.to_dict()) == REQUIRED
    bare.write(tmp_path / "bare.json")
    assert TokenInfo.read(tmp_path / "bare.json") == bare


def test_an_incomplete_info_file_names_what_it_lacks_and_its_stage(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages:\n  tokenize:\n    outs:\n    - data/tokens\n")
    path = tmp_path / "data" / "tokens" / "info.json"
    path.parent.mkdir(parents=True)
    write_json(path, {"vocab_size": 600, "pad_id": 0, "unknown": 1})
    with pytest.raises(ArtifactError, match=r"info\.json lacks bos_id, eos_id, tokenizer_hash, "
                                            r"split_hash: re-run `dvc repro tokenize`"):
        TokenInfo.read(path)
    write_json(path, [600, 0, 1, 2])  # not an object
    with pytest.raises(ArtifactError, match="lacks " + ", ".join(REQUIRED)):
        TokenInfo.read(path)
    path.unlink()
    with pytest.raises(ArtifactError, match="does not exist"):
        TokenInfo.read(path)


def test_special_ids_and_the_ids_never_sampled():
    info = TokenInfo(vocab_size=10, pad_id=4, bos_id=1, eos_id=2, tokenizer_hash="",
                     split_hash="")
    assert info.special_ids() == (1, 2, 4)
    assert TokenInfo(10, 0, 0, 2, "", "").special_ids() == (0, 2)  # distinct
    assert never_sampled(info) == [1, 4]  # PAD and BOS, never EOS: it ends a sample
    tokenizer = SimpleNamespace(special_tokens_ids=[4, 1, 2, 3])
    assert never_sampled(info, tokenizer) == [1, 3, 4]


def test_a_token_table_takes_the_defaults_it_lacks():
    table = tokens_table([
        {"sha256": "b", "split": "val", "track": 0, "ids": [5, 6, 7], "n_notes": 2},
        {"sha256": "a", "split": "train", "track": -1, "ids": [], "flags": ["read_error"],
         "n_notes_input": 9},
    ])
    assert table.schema == TOKENS_SCHEMA
    b, a = table.to_pylist()
    assert (b["n_tokens"], b["n_notes"], b["n_notes_input"]) == (3, 2, 2)  # from ids and n_notes
    assert (b["program"], b["is_drum"], b["roundtrip_f1"], b["flags"]) == (0, False, 1.0, [])
    assert (a["n_tokens"], a["n_notes"], a["n_notes_input"], a["flags"]) == (
        0, 0, 9, ["read_error"])


def test_read_tokens_sorts_by_piece_and_track_and_picks_splits(tmp_path):
    rows = [{"sha256": s, "split": p, "track": t, "ids": [t]}
            for s, p, t in [("c", "test", 0), ("a", "train", 1), ("b", "val", 0),
                            ("a", "train", 0)]]
    write_parquet(tmp_path / "tokens.parquet", tokens_table(rows))
    df = read_tokens(tmp_path / "tokens.parquet")  # train and val: test rows are a look
    assert list(zip(df["sha256"], df["track"], strict=True)) == [("a", 0), ("a", 1), ("b", 0)]
    assert list(df.index) == [0, 1, 2]
    some = read_tokens(tmp_path / "tokens.parquet", ["sha256", "ids"], ["val"])
    assert list(some.columns) == ["sha256", "ids"]
    assert some["sha256"].tolist() == ["b"]
    with pytest.raises(ValueError, match=r"pipeline\.decision\.looks"):
        read_tokens(tmp_path / "tokens.parquet", ["sha256", "split"], ["val", "test"])
    with pytest.raises(ArtifactError, match="has no column 'notes'"):
        read_tokens(tmp_path / "tokens.parquet", ["notes"])


# ------------------------------------------------------------------------------ compound tokens
def test_compound_info_round_trips_and_lists_its_codebooks(compound_tokens):
    info = TokenInfo.read(compound_tokens["info"])
    assert info.compound is True
    assert [(c["name"], c["size"]) for c in info.codebooks] == [("Pitch", 10), ("Duration", 8)]
    single = TokenInfo(600, 0, 1, 2, "t", "s", tokenizer="REMI")
    assert "compound" not in single.to_dict() and "codebooks" not in single.to_dict()


@pytest.mark.parametrize("raw", [{"compound": True}, {"codebooks": [{"name": "Pitch"}]},
                                 {"compound": True, "codebooks": [{"name": "Pitch", "size": 4}]}],
                         ids=["no-codebooks", "not-compound", "codebook-lacks-ids"])
def test_compound_info_without_consistent_codebooks_is_refused(tmp_path, raw):
    write_json(tmp_path / "info.json", {**dict.fromkeys(REQUIRED, 0), **raw})
    with pytest.raises(ArtifactError, match="compound and codebooks"):
        TokenInfo.read(tmp_path / "info.json")


def test_refuse_compound_names_the_key_and_its_value(compound_tokens):
    from pipeline.core.config import ParamsError
    from pipeline.tokens.contract import refuse_compound

    with pytest.raises(ParamsError, match=r"tokenize\.tokenizer: CPWord — symkit x reads one id "
                                          r"stream.*but not yet modelled here"):
        refuse_compound(TokenInfo.read(compound_tokens["info"]), "symkit x")
    refuse_compound(TokenInfo(600, 0, 1, 2, "t", "s", tokenizer="REMI"), "symkit x")


def test_compound_tables_refuse_to_be_read_for_their_ids(compound_tokens, tmp_path):
    """A compound table is never read as empty ids; its codes are read as written, and a
    single-stream table read for codes gives none."""
    from pipeline.core.config import ParamsError

    with pytest.raises(ParamsError, match=r"compound tokens.*not yet modelled"):
        read_tokens(compound_tokens["tokens"], ["sha256", "ids"])
    rows = read_tokens(compound_tokens["tokens"], ["sha256", "codes", "n_tokens"])
    assert [[list(c) for c in codes] for codes in rows["codes"]] == [[[4, 5, 6], [4, 4, 5]]] * 3
    assert list(rows["n_tokens"]) == [3, 3, 3]
    write_parquet(tmp_path / "single.parquet",
                  tokens_table([{"sha256": "a", "split": "train", "track": 0, "ids": [5]}]))
    single = read_tokens(tmp_path / "single.parquet", ["sha256", "ids", "codes"])
    assert single["codes"].isna().all() and list(single["ids"][0]) == [5]


def test_compound_schemas_add_codes_after_ids_and_leave_single_stream_ones_alone():
    from pipeline.tokens.contract import (
        AUGMENTED_SCHEMA,
        augmented_schema,
        tokens_schema,
    )

    assert tokens_schema(False) is TOKENS_SCHEMA and augmented_schema(False) is AUGMENTED_SCHEMA
    names = tokens_schema(True).names
    assert names[names.index("ids") + 1] == "codes"
    assert augmented_schema(True).names[:5] == ["sha256", "transpose", "track", "ids", "codes"]

"""A trained vocabulary applied to stored base ids (pipeline.tokens.vocabulary): the words
miditok's model is fed, the final ids of miditok's ``encode`` for each ``encode_ids_split``, and
final ids expanded back to base ids as miditok decodes them."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import miditok
import numpy as np
import pytest
from symusic import Score

from pipeline.core.artifacts import sha256_file
from pipeline.tokens.entries import SeqEncoding, pack, parse_block
from pipeline.tokens.tokenizer import make_tokenizer
from pipeline.tokens.vocabulary import apply_model, expand, expansion_table, words


def trained(kept_fixtures, **config):
    """The project's tokenizer with a BPE vocabulary miditok learns from the kept fixtures."""
    tok = make_tokenizer("REMI", {"use_programs": True, **config})
    tok.train(vocab_size=len(tok.vocab) + 100, model="BPE", files_paths=kept_fixtures)
    return tok


def test_words_split_the_ids_at_bars_or_beats():
    """One character per base id, cut where each bar (or beat) starts, or not at all."""
    seq = SeqEncoding(track=-1, program=-1, is_drum=False, n_notes=0,
                      ids=np.array([3, 1, 4, 1, 5, 2], np.int32),
                      bar_starts=np.array([0, 3], np.int32),
                      beat_starts=np.array([0, 2, 3, 5], np.int32), rt_matched=-1, rt_decoded=-1)
    table = list("abcdef")

    def split(how: str) -> SimpleNamespace:
        return SimpleNamespace(config=SimpleNamespace(encode_ids_split=how))

    assert words(split("bar"), table, seq) == ["dbe", "bfc"]
    assert words(split("beat"), table, seq) == ["db", "e", "bf", "c"]
    assert words(split("no"), table, seq) == ["dbebfc"]
    assert words(split("bar"), table, replace(seq, bar_starts=np.zeros(0, np.int32))) == [
        "dbebfc"]


def block_of(base_encodings):
    shas = sorted(base_encodings)
    return shas, parse_block([(s, 0) for s in shas], [pack(base_encodings[s]) for s in shas])


def test_an_untrained_tokenizer_keeps_the_base_ids(base_encodings):
    _, block = block_of(base_encodings)
    assert apply_model(make_tokenizer("REMI", {"use_programs": True}), block) is None


@pytest.mark.parametrize("split", ["bar", "beat", "no"])
def test_final_ids_are_those_of_encode(split, base_encodings, kept_fixtures):
    """The trained model applied to stored base ids (three sequences a batch) gives each kept
    fixture the ids of miditok's ``encode`` of its file, learned ids included."""
    tok = trained(kept_fixtures, encode_ids_split=split)
    path_of = {sha256_file(p): p for p in kept_fixtures}
    shas, block = block_of(base_encodings)
    final = apply_model(tok, block, batch=3)
    assert [f.tolist() for f in final] == [
        tok.encode(Score.from_midi(path_of[s].read_bytes())).ids for s in shas]
    assert all(f.dtype == np.int32 for f in final)
    assert max(int(f.max()) for f in final) >= len(tok.vocab)


def test_expand_matches_miditok_decode_token_ids(kept_fixtures):
    """The vectorised lossless check equals miditok's own per-id decoding."""
    tok = trained(kept_fixtures)
    table = expansion_table(tok)
    rows = [tok.encode(Score.from_midi(p.read_bytes())).ids for p in kept_fixtures]
    assert max(int(np.max(r)) for r in rows) >= len(tok.vocab)  # learned ids are present
    for ids in rows:
        seq = miditok.TokSequence(ids=[int(i) for i in ids], are_ids_encoded=True)
        tok.decode_token_ids(seq)
        assert expand(np.asarray(ids, np.int64), table).tolist() == seq.ids
    assert expand(np.zeros(0, np.int64), table).tolist() == []

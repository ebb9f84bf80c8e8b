"""Which notes a range of ids stands for (:mod:`pipeline.tokens.spans`): a span's marked notes
are the whole notes inside it, the same (pitch, duration) multiset as its ids decoded alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipeline.music.midi import score_notes
from pipeline.tokens.spans import open_pitch, prefix_mask, span_mask
from pipeline.tokens.tokenizer import decode_ids, load_tokenizer
from tests.stages.test_generate import make_world, random_score


@pytest.fixture(scope="module")
def piece(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("spans"), seed=0)
    tok = load_tokenizer(world["tokenizer"])
    ids = np.asarray(tok.encode(random_score(np.random.default_rng(5)))[0].ids)
    return tok, ids, score_notes(decode_ids(tok, ids)[0])


def _pitch_durations(notes, mask=None) -> Counter:
    m = np.ones(len(notes["pitch"]), dtype=bool) if mask is None else mask
    return Counter(zip(notes["pitch"][m].tolist(), notes["duration"][m].tolist(), strict=True))


def test_a_span_marks_the_notes_its_ids_hold_whole(piece):
    tok, ids, notes = piece
    width, opened = 12, 0
    for start in range(len(ids) - width):
        mask = span_mask(tok, ids, start, start + width, notes)
        alone = score_notes(decode_ids(tok, ids[start: start + width])[0])
        assert _pitch_durations(notes, mask) == _pitch_durations(alone), start
        opened += open_pitch(tok, ids, start) is not None
    assert opened > 10  # spans that start inside a note were checked


def test_prefix_and_whole_sequence(piece):
    tok, ids, notes = piece
    assert prefix_mask(tok, ids, len(ids), notes).all()
    assert not prefix_mask(tok, ids, 0, notes).any()
    assert span_mask(tok, ids, 0, len(ids), notes).all()

"""Note digests and piece selection (:mod:`pipeline.similarity.digests`): a digest follows
exactly the note columns the tiers read, and a selection keeps the pieces asked for, in order."""

from __future__ import annotations

import numpy as np

from pipeline.similarity import fingerprints as fp
from pipeline.similarity.digests import note_digests, take_pieces
from tests.stages.test_dedupe import _notes


def _arrays(pieces: list[dict]) -> fp.NoteArrays:
    cat = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    offsets = np.concatenate([[0], np.cumsum([p["pitch"].size for p in pieces])]).astype(np.int64)
    shas = np.array([f"{i:04d}" for i in range(len(pieces))], dtype=object)
    return fp.NoteArrays(shas, offsets, cat["onset"], cat["duration"], cat["pitch"],
                         cat["is_drum"], cat["track"])


def test_digests_change_when_a_note_changes():
    base = _notes([0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [60, 62, 64])
    moved = dict(base, pitch=np.array([60, 62, 65], np.int16))
    later = dict(base, onset=np.array([0.0, 1.0, 2.5]))
    shorter = {k: v[:2] for k, v in base.items()}
    d = note_digests(_arrays([base, moved, later, shorter]))
    assert len(set(d)) == 4


def test_digests_ignore_what_the_tiers_do_not_read():
    base = _notes([0.0, 1.0], [1.0, 1.0], [60, 62])
    other = dict(base, velocity=np.array([10, 120], np.int16), program=np.ones(2, np.int16))
    arrays = _arrays([base, other])
    d = note_digests(arrays)
    assert d[0] == d[1]  # velocity and program are not in the digest, nor the piece's sha256


def test_an_empty_piece_has_a_digest_of_its_own():
    empty = _notes([], [], [])
    d = note_digests(_arrays([empty, _notes([0.0], [1.0], [60]), empty]))
    assert d[0] == d[2] != d[1]


def test_take_pieces_keeps_the_pieces_asked_for_in_that_order():
    pieces = [_notes(np.arange(n, dtype=float), np.ones(n), 60 + np.arange(n))
              for n in (3, 0, 5, 2)]
    notes = _arrays(pieces)
    idx = np.array([2, 0, 1])
    taken = take_pieces(notes, idx)
    assert taken.sha256.tolist() == notes.sha256[idx].tolist()
    assert taken.lengths.tolist() == [5, 3, 0]
    assert note_digests(taken) == [note_digests(notes)[i] for i in idx]
    assert take_pieces(notes, np.arange(4)) is notes  # all pieces, in order: no copy


def test_note_digests_follow_every_column_the_tiers_read():
    base = _notes([0.0, 1.0, 2.0], [1.0, 1.0, 2.0], [60, 62, 64])
    pieces = [base, base, dict(base, track=np.array([0, 1, 0], np.int16)),
              dict(base, duration=base["duration"] * 2), dict(base, is_drum=np.ones(3, bool))]
    cat = {k: np.concatenate([p[k] for p in pieces]) for k in base}
    arrays = fp.NoteArrays(np.array(list("abcde"), object), np.arange(0, 16, 3, dtype=np.int64),
                           cat["onset"], cat["duration"], cat["pitch"], cat["is_drum"],
                           cat["track"])
    d = note_digests(arrays)
    assert d[0] == d[1] and len(set(d[1:])) == 4 and all(len(x) == 32 for x in d)

"""Dedupe's per-piece store (:mod:`pipeline.similarity.dedupe_cache`): what it returns equals
measuring every piece; a known digest is read back, an unknown one is measured."""

from __future__ import annotations

import numpy as np

from pipeline.similarity import fingerprints as fp
from pipeline.similarity.dedupe_cache import features_key, piece_work, sequences_for
from pipeline.similarity.digests import note_digests, take_pieces
from pipeline.stages.dedupe import DedupeConfig
from tests.stages.test_dedupe import base_piece, planted_corpus, write_corpus


def test_features_key_follows_the_settings_features_depend_on():
    base = features_key(DedupeConfig())
    assert base.startswith("features-") and base == features_key(DedupeConfig())
    assert features_key(DedupeConfig(lsh_threshold=0.3)) == base  # candidates only
    assert features_key(DedupeConfig(num_perm=64)) != base
    assert features_key(DedupeConfig(shingle_k=5)) != base


def test_a_stored_piece_is_read_back_and_an_unknown_one_measured(tmp_path):
    rng = np.random.default_rng(4)
    pieces = {f"p{i}": base_piece(rng, n_events=30) for i in range(3)}
    _, notes_path, _ = write_corpus(tmp_path, pieces)
    notes = fp.read_notes(notes_path)
    digests = note_digests(notes)
    cfg = DedupeConfig()
    stats: dict = {}
    first = piece_work(take_pieces(notes, np.array([0, 1])), cfg, digests[:2], tmp_path / "c",
                       stats=stats)
    assert stats == {"features_reused": 0, "features_measured": 2}
    assert (tmp_path / "c" / features_key(cfg)).is_dir()
    work = piece_work(notes, cfg, digests, tmp_path / "c", stats=stats)
    assert stats == {"features_reused": 2, "features_measured": 1}
    assert np.array_equal(work.fps.signatures[:2], first.fps.signatures)
    assert work.fps.transposed[:2].tolist() == first.fps.transposed.tolist()


def test_sequences_for_no_piece_are_all_empty():
    notes = fp.NoteArrays(np.array(["a", "b"], object), np.array([0, 2, 3], np.int64),
                          np.array([0.0, 1.0, 0.0]), np.ones(3), np.array([60, 62, 64], np.int16),
                          np.zeros(3, bool), np.zeros(3, np.int16))
    seqs = sequences_for(notes, np.zeros(0, np.int64), 4, np.array([2, 1]))
    assert seqs.tokens == ("", "") and seqs.melodies == (("", ""), ("", ""))
    assert seqs.distinct_onsets.tolist() == [2, 1]


def test_per_piece_work_from_the_cache_equals_measuring_every_piece(tmp_path):
    """Fingerprints, distinct onsets and winnowed runs read from the features store (cold,
    partly warm, warm) equal those measured over all pieces; sequences built for some pieces
    only hold exactly those pieces' full-build entries."""
    from pipeline.similarity.alignment import Sequences
    from pipeline.similarity.dedupe_cache import piece_work, sequences_for
    from pipeline.similarity.duplicates import fingerprint, winnow_views

    pieces, _ = planted_corpus(seed=6, families=4, singles=10)
    _, notes_path, _ = write_corpus(tmp_path, pieces)
    notes = fp.read_notes(notes_path)
    digests = note_digests(notes)
    cfg = DedupeConfig()
    fps, seqs = fingerprint(notes, cfg), Sequences.build(notes, cfg.ioi_resolution)
    views = winnow_views(seqs, cfg)
    half = np.arange(0, notes.n_pieces, 2)
    piece_work(take_pieces(notes, half), cfg, [digests[i] for i in half], tmp_path / "c")
    for _ in range(2):  # partly warm, then warm
        stats: dict = {}
        work = piece_work(notes, cfg, digests, tmp_path / "c", stats=stats)
        for field in ("transposed", "melody", "shingle_offsets", "shingles", "signatures",
                      "short_melody", "short_signatures"):
            got, want = getattr(work.fps, field), getattr(fps, field)
            assert got.dtype == want.dtype and np.array_equal(got, want), field
        assert np.array_equal(work.distinct_onsets, seqs.distinct_onsets)
        assert all(np.array_equal(a, b) for a, b in zip(work.views, views, strict=True))
        assert any(v.size for v in views)
        assert (work.fps.short_melody != "").any()
    assert stats == {"features_reused": notes.n_pieces, "features_measured": 0}
    some = np.array([1, 4, 5])
    lazy = sequences_for(notes, some, cfg.ioi_resolution, seqs.distinct_onsets)
    for i in range(notes.n_pieces):
        if i in some:
            assert lazy.tokens[i] == seqs.tokens[i] and np.array_equal(lazy.onsets[i],
                                                                         seqs.onsets[i])
            assert (lazy.melodies[0][i], lazy.melodies[1][i]) == (seqs.melodies[0][i],
                                                                  seqs.melodies[1][i])
        else:
            assert lazy.tokens[i] == "" and lazy.melodies[0][i] == ""

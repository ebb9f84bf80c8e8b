"""The round-trip check (pipeline.tokens.roundtrip): multiset matches against Counter
intersections, note keys across time divisions, and the batched check against miditok's decode."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokens.roundtrip import match_counts, multiset_matches, same_per_owner
from tests.tokens._encodings import score_with

rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows, rows)
def test_multiset_matches_equals_counter_intersection(a, b):
    arr = lambda x: np.array(x, np.int64).reshape(-1, 2)  # noqa: E731
    expected = sum((Counter(a) & Counter(b)).values())
    assert multiset_matches(arr(a), arr(b)) == expected


def same_multisets(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """:func:`same_per_owner` of pairs of row arrays (pair ``k``: ``a[k]`` and ``b[k]``)."""
    def columns(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        owner = np.repeat(np.arange(len(rows)), [len(x) for x in rows])
        if not len(owner):
            return owner, np.zeros((0, 0), np.int64)
        return owner, np.concatenate(rows).astype(np.int64).T.copy()

    return same_per_owner(len(a), *columns(a), *columns(b))


small_rows = st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 3), st.integers(0, 2),
                                st.integers(0, 2)), max_size=12)


@settings(max_examples=80, deadline=None)
@given(small_rows, small_rows, st.randoms())
def test_same_multiset_is_equality_of_counters(a, b, rnd):
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    assert same_multisets([arr(a)], [arr(b)]).tolist() == [Counter(a) == Counter(b)]
    shuffled = list(a)
    rnd.shuffle(shuffled)
    assert same_multisets([arr(a)], [arr(shuffled)]).tolist() == [True]


wide = st.lists(st.tuples(st.sampled_from([-1, 0, 2**40, -(2**40)]), st.integers(0, 2),
                          st.integers(-3, 3), st.sampled_from([0, 7, 2**35])), max_size=20)


@settings(max_examples=60, deadline=None)
@given(wide, wide)
def test_multiset_matches_wide_rows(a, b):
    """Rows too wide for one 62-bit code take the exact fallback; same answer either way."""
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    assert multiset_matches(arr(a), arr(b)) == sum((Counter(a) & Counter(b)).values())


def test_match_counts_compares_across_time_divisions():
    a = score_with(8, [(0, 4, 60), (4, 4, 62), (8, 2, 64)])
    b = score_with(480, [(0, 240, 60), (240, 240, 62), (480, 60, 64)])  # last duration differs
    assert match_counts(a, b) == (2, 3)
    assert match_counts(a, score_with(16, [(0, 8, 60), (8, 8, 62), (16, 4, 64)])) == (3, 3)
    assert match_counts(a, score_with(8, [(0, 4, 60)], program=5)) == (0, 1)  # program counts


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(small_rows, small_rows), max_size=5), st.randoms())
def test_same_multisets_is_same_multiset_per_pair(pairs, rnd):
    """Pairs settled together give what each gives alone (no row of one pair meets another)."""
    arr = lambda x: np.array(x, np.int64).reshape(-1, 4)  # noqa: E731
    a = [arr(x) for x, _ in pairs]
    b = [arr(y) if rnd.random() < 0.5 else arr(rnd.sample(x, len(x))) for x, y in pairs]
    together = same_multisets(a, b).tolist()
    assert together == [same_multisets([x], [y]).tolist()[0] for x, y in zip(a, b, strict=True)]
    assert together == [Counter(map(tuple, x.tolist())) == Counter(map(tuple, y.tolist()))
                        for x, y in zip(a, b, strict=True)]


def test_roundtrip_batch_equals_miditok_decode_per_check(remi):
    """The batched check gives miditok's decode counts, whether the fast reader agrees with the
    reference (most checks) or not (a reference that is not the encoded score, so the batch
    falls back to decoding those): a mismatch in one check never leaks into another."""
    from pipeline.tokens.roundtrip import RoundTrip, roundtrip_batch, roundtrip_counts

    scores = [score_with(480, [(0, 480, 60 + k), (480, 240, 64), (960, 480, 67 - k)])
              for k in range(4)]
    pre = [remi.preprocess_score(s) for s in scores]
    checks = []
    for k, p in enumerate(pre):
        ts = remi.encode(p, encode_ids=False, no_preprocess_score=True)
        reference = pre[(k + 1) % len(pre)] if k % 2 else p  # odd checks: the wrong score
        checks.append(RoundTrip(k, 0, np.asarray(ts.ids, np.int32), reference, True,
                                (-1, False)))
    got = roundtrip_batch(remi, checks)
    want = [roundtrip_counts(remi, c.ids, c.reference, c.index, c.one_stream, c.program)
            for c in checks]
    assert got == want
    assert [g[0] == 3 for g in got] == [True, False, True, False]


def test_note_keys_put_times_on_the_grid_and_drums_at_program_minus_one():
    from symusic import Note, Track

    from pipeline.tokens.roundtrip import note_keys

    s = score_with(8, [(0, 4, 60), (4, 2, 62)], program=40)
    drums = Track(name="d", program=0, is_drum=True)
    drums.notes.append(Note(2, 1, 36, 90))
    s.tracks.append(drums)
    keys = lambda *a, **k: sorted(map(tuple, note_keys(*a, **k).tolist()))  # noqa: E731
    assert keys(s, 24) == [(-1, 6, 36, 3), (40, 0, 60, 12), (40, 12, 62, 6)]
    assert keys(s, 8, program=0) == [(0, 0, 60, 4), (0, 2, 36, 1), (0, 4, 62, 2)]


def test_keys_of_many_scores_are_each_scores_keys():
    from symusic import Score

    from pipeline.tokens.roundtrip import note_keys, notes_keys_batch

    scores = [score_with(8, [(0, 4, 60)]), Score(8),
              score_with(16, [(0, 8, 62), (8, 8, 64)], program=3)]
    got = notes_keys_batch(scores, 16)
    assert [g.shape for g in got] == [(1, 4), (0, 4), (2, 4)]
    for g, s in zip(got, scores, strict=True):
        np.testing.assert_array_equal(g, note_keys(s, 16))
    assert notes_keys_batch([], 16) == []


def test_a_per_track_check_compares_a_sequence_with_its_own_track():
    import miditok

    from pipeline.tokens.roundtrip import roundtrip_counts

    tok = miditok.REMI(miditok.TokenizerConfig(use_programs=False))
    score = score_with(480, [(0, 480, 60), (480, 480, 62)])
    score.tracks.append(score_with(480, [(0, 240, 70), (240, 240, 71), (480, 240, 72)],
                                   program=33).tracks[0])
    pre = tok.preprocess_score(score)
    ids = [np.asarray(ts.ids) for ts in tok.encode(pre, encode_ids=False,
                                                   no_preprocess_score=True)]
    assert roundtrip_counts(tok, ids[0], pre, 0, False, (0, False)) == (2, 2)
    assert roundtrip_counts(tok, ids[1], pre, 1, False, (33, False)) == (3, 3)
    assert roundtrip_counts(tok, ids[0], pre, 1, False, (33, False)) == (0, 2)  # another track

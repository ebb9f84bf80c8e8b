"""Edit-tolerant near duplicates (:mod:`pipeline.similarity.alignment` and the dedupe near tier):
short pieces with a few edited notes and short excerpts are linked, the excerpt with where it lies
in the longer piece; unrelated pieces that share only stock figures are not."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.similarity import alignment as similarity
from pipeline.similarity import fingerprints as fp
from pipeline.similarity.rule import alignment_threshold
from pipeline.stages.dedupe import DedupeConfig
from tests.stages.test_dedupe import _sorted, run_dedupe


def melody_piece(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A monophonic tune: scale steps, rhythm on an eighth-note grid."""
    steps = rng.choice([-2, -1, -1, 1, 1, 2, 3, -3, 0], size=n)
    pitch = np.clip(67 + np.cumsum(steps), 55, 84)
    ioi = rng.choice([0.5, 0.5, 1.0, 1.0, 1.5, 2.0], size=n)
    onset = np.concatenate([[0.0], np.cumsum(ioi)[:-1]])
    return _sorted({"onset": onset, "duration": ioi.astype(float),
                    "pitch": pitch.astype(np.int16), "velocity": np.full(n, 80, np.int16),
                    "track": np.zeros(n, np.int16), "program": np.zeros(n, np.int16),
                    "is_drum": np.zeros(n, bool)})


def take(n: dict, keep: np.ndarray) -> dict:
    return {k: v[keep] for k, v in n.items()}


def edited(rng: np.random.Generator, n: dict, count: int) -> dict:
    """``count`` notes moved by a step (never the first, so the opening stays)."""
    n = {k: v.copy() for k, v in n.items()}
    at = rng.choice(np.arange(1, n["pitch"].size), size=count, replace=False)
    n["pitch"][at] = (n["pitch"][at] + rng.choice([-2, 2], size=count)).astype(np.int16)
    return n


def excerpt(n: dict, start: int, length: int) -> dict:
    """Notes ``start .. start + length - 1`` shifted to begin at beat 0."""
    keep = np.zeros(n["pitch"].size, dtype=bool)
    keep[start: start + length] = True
    out = take(n, keep)
    out["onset"] = out["onset"] - out["onset"][0]
    return out


def test_alignment_threshold_is_the_jaccard_definition_measured_by_alignment():
    assert alignment_threshold(0.5, 4) == pytest.approx(1 - 2 / 15)
    assert DedupeConfig().rule.alignment == pytest.approx(alignment_threshold(0.5, 4))
    assert DedupeConfig(near_alignment=0.9).rule.alignment == 0.9


def test_locate_finds_an_edited_excerpt_and_where_it_lies():
    rng = np.random.default_rng(0)
    long_ = "".join(chr(300 + v) for v in rng.integers(0, 12, 400))
    part = list(long_[150:230])
    part[40] = "A"  # one substitution
    score, start, end = similarity.locate("".join(part), long_)
    assert (start, end) == (150, 230)
    assert score == pytest.approx(1 - 2 / 160)
    assert similarity.locate("xyz" * 10, long_)[0] < 0.5  # nothing shared: a poor score
    assert similarity.locate(long_[7:10], long_) == (1.0, 7, 10)  # shorter than a gram
    assert similarity.locate("", "ab")[0] == 0.0


def test_winnowing_proposes_every_pair_sharing_a_long_run_and_no_other():
    rng = np.random.default_rng(1)
    texts = ["".join(chr(300 + v) for v in rng.integers(0, 40, 60)) for _ in range(6)]
    texts[5] = texts[5][:20] + texts[0][10:24] + texts[5][34:]  # a 14-token run of piece 0
    a, b = similarity.winnow_candidates(texts, np.ones(6, bool), min_run=14, k=7, max_df=50,
                                        min_share=0.0)
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == [(0, 5)]
    a, b = similarity.winnow_candidates(texts, np.ones(6, bool), min_run=14, k=7, max_df=1,
                                        min_share=0.0)
    assert a.size == 0  # a run more pieces hold than max_df proposes nothing


def test_onsets_count_chords_once():
    n = _sorted({"onset": np.array([0.0, 0.0, 1.0, 1.0, 2.0]),
                 "duration": np.ones(5), "pitch": np.array([60, 64, 62, 65, 67], np.int16),
                 "velocity": np.full(5, 80, np.int16), "track": np.zeros(5, np.int16),
                 "program": np.zeros(5, np.int16), "is_drum": np.zeros(5, bool)})
    arrays = fp.notes_from_table(pa.Table.from_pylist(
        [{"sha256": "x", **{k: v.tolist() for k, v in n.items()}}]))
    seqs = similarity.Sequences.build(arrays, 4)
    assert seqs.distinct_onsets.tolist() == [3]
    assert seqs.onsets[0].tolist() == [0.0, 1.0, 1.0, 2.0]  # one per token (notes after the first)


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    rng = np.random.default_rng(7)
    tune = melody_piece(rng, 48)  # short: one edited note breaks 5 of its ~44 shingles
    long_tune = melody_piece(rng, 240)
    pieces = {
        "tune": tune, "tune_edited": edited(rng, tune, 3),  # 6% of its notes changed
        "long": long_tune, "long_excerpt": excerpt(long_tune, 90, 30),  # 12.5% of it
        "long_excerpt_short": excerpt(long_tune, 10, 8),  # fewer onsets than min_align_onsets
    }
    # unrelated tunes of one style that share an 8-note opening figure
    figure = melody_piece(rng, 8)
    for s in range(6):
        other = melody_piece(rng, int(rng.integers(30, 80)))
        head = {k: v[:8] for k, v in figure.items()}
        tail = {k: v[8:] for k, v in other.items()}
        tail["onset"] = tail["onset"] - tail["onset"][0] + head["onset"][-1] + 1.0
        pieces[f"stock{s}"] = _sorted({k: np.concatenate([head[k], tail[k]]) for k in head})
    root = tmp_path_factory.mktemp("similar")
    return pieces, *run_dedupe(root, pieces)


def test_edited_short_tune_is_linked_by_alignment(linked):
    _, shas, clusters, pairs, _ = linked
    assert clusters.loc[shas["tune"], "cluster_id"] == clusters.loc[shas["tune_edited"],
                                                                    "cluster_id"]
    a, b = sorted([shas["tune"], shas["tune_edited"]])
    row = pairs[(pairs["a"] == a) & (pairs["b"] == b)].iloc[0]
    assert row["similarity"] < DedupeConfig().near_jaccard  # shingles alone would miss it
    assert row["rule"] in ("alignment", "melody")
    assert row["alignment"] >= DedupeConfig().rule.alignment


def test_an_excerpt_is_linked_with_where_it_lies(linked):
    pieces, shas, clusters, pairs, _ = linked
    a, b = sorted([shas["long"], shas["long_excerpt"]])
    row = pairs[(pairs["a"] == a) & (pairs["b"] == b)].iloc[0]
    assert row["rule"] in ("containment", "excerpt")
    assert row["part_of"] == shas["long"]
    onset = pieces["long"]["onset"]
    assert row["part_start"] == pytest.approx(onset[91])  # its first token is its second note
    assert row["part_end"] == pytest.approx(onset[119])
    assert clusters.loc[shas["long_excerpt_short"], "cluster_id"] != \
        clusters.loc[shas["long"], "cluster_id"]  # 8 onsets: below min_align_onsets


def test_tunes_sharing_only_a_stock_figure_stay_apart(linked):
    _, shas, clusters, _, report = linked
    ids = {clusters.loc[shas[f"stock{s}"], "cluster_id"] for s in range(6)}
    assert len(ids) == 6
    assert report["near_candidates"] > 0  # they were proposed (a shared run) and rejected


def test_locate_is_the_same_from_its_gram_cache():
    """locate keeps each string's anchor grams (similarity._grams and _sorted_grams); a warm
    cache must give what a cold one gives, and the kept arrays cannot be written to."""
    rng = np.random.default_rng(8)
    texts = ["".join(chr(0x100 + int(c)) for c in rng.integers(0, 12, n)) for n in (5, 40, 90)]
    pairs = [(a, b) for a in texts for b in texts if len(a) <= len(b)]
    similarity._grams.cache_clear()
    similarity._sorted_grams.cache_clear()
    cold = [similarity.locate(a, b) for a, b in pairs]
    assert [similarity.locate(a, b) for a, b in pairs] == cold
    assert similarity._grams.cache_info().hits > 0
    with pytest.raises(ValueError):
        similarity._grams(texts[1], 6)[0] = 0


def pairs_by_sets(packed: np.ndarray, max_df: int, min_share: float) -> list[tuple[int, int]]:
    """pairs_sharing's rule, written out with sets."""
    holders: dict[int, set[int]] = {}
    for v in packed.tolist():
        holders.setdefault(v & ((1 << similarity.KEY_BITS) - 1), set()).add(
            v >> similarity.KEY_BITS)
    size: dict[int, int] = {}
    shared: dict[tuple[int, int], int] = {}
    for pieces in holders.values():
        if len(pieces) > max_df:
            continue
        for p in pieces:
            size[p] = size.get(p, 0) + 1
        for a in pieces:
            for b in pieces:
                if a < b:
                    shared[(a, b)] = shared.get((a, b), 0) + 1
    return sorted(pair for pair, n in shared.items()
                  if n >= min_share * min(size[pair[0]], size[pair[1]]))


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 25)), max_size=150),
       st.integers(1, 6), st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]))
@settings(max_examples=200, deadline=None)
def test_pairs_sharing_equals_the_rule_by_sets(held, max_df, min_share):
    from pipeline.core.arrays import unique

    packed = unique(np.array([(p << similarity.KEY_BITS) | k for p, k in held], np.uint64))
    a, b = similarity.pairs_sharing(packed, max_df, min_share)
    assert a.dtype == b.dtype == np.int64
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == pairs_by_sets(packed, max_df,
                                                                            min_share)


def test_pairs_sharing_judges_in_blocks(monkeypatch):
    rng = np.random.default_rng(3)
    held = {(int(p) << similarity.KEY_BITS) | int(k)
            for p, k in zip(rng.integers(0, 40, 900), rng.integers(0, 120, 900), strict=True)}
    packed = np.array(sorted(held), np.uint64)
    whole = similarity.pairs_sharing(packed, 8, 0.2)
    monkeypatch.setattr(similarity, "PAIR_BLOCK", 7)
    blocks = similarity.pairs_sharing(packed, 8, 0.2)
    assert whole[0].size > 7 and all(np.array_equal(x, y) for x, y in zip(whole, blocks,
                                                                           strict=True))
    assert list(zip(*(x.tolist() for x in whole), strict=True)) == pairs_by_sets(packed, 8, 0.2)

"""Training data: token rows -> examples (bad rows counted), the seeded window stream, shards,
padded and packed batches, validation windows and condition dropout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.artifacts import read_parquet, write_parquet
from pipeline.tokens.contract import TokenInfo, tokens_table
from pipeline.training.data import (
    PackedRows,
    Shard,
    WindowStream,
    drop_conditions,
    load_corpus,
    make_batch,
    val_window_plan,
    val_windows,
)
from tests._transformer_data import BOS, EOS, PAD, write_token_data


# ------------------------------------------------------------------------------------- corpus
def test_examples_are_wrapped_rows_whatever_the_files_row_order(tmp_path):
    paths = write_token_data(tmp_path / "a", n_pieces=20, mean_len=12, seed=3)
    info = TokenInfo.read(paths["info"])
    corpus = load_corpus(paths["tokens"], info)
    table = read_parquet(paths["tokens"]).sort_values("sha256")
    for split, examples in (("train", corpus.train), ("val", corpus.val)):
        rows = table[table["split"] == split]
        assert [e.tolist() for e in examples] == [[BOS, *ids, EOS] for ids in rows["ids"]]
        assert all(e.dtype == np.int64 for e in examples)
    assert len(corpus.train) + len(corpus.val) < len(table)  # test rows are never read
    assert corpus.skipped == {} and corpus.n_augmented == 0 and corpus.conditions is None
    reversed_rows = table.iloc[::-1].to_dict("records")
    write_parquet(tmp_path / "reversed.parquet", tokens_table(reversed_rows))
    again = load_corpus(tmp_path / "reversed.parquet", info)
    assert [e.tolist() for e in again.train] == [e.tolist() for e in corpus.train]
    assert [e.tolist() for e in again.val] == [e.tolist() for e in corpus.val]


def test_augmented_rows_join_train_when_the_file_exists(tmp_path):
    paths = write_token_data(tmp_path, n_pieces=20, mean_len=12, n_augmented=3)
    info = TokenInfo.read(paths["info"])
    plain = load_corpus(paths["tokens"], info)
    both = load_corpus(paths["tokens"], info, paths["augmented"])
    assert both.n_augmented == 6  # two transpositions of each of 3 pieces
    assert len(both.train) == len(plain.train) + 6 and len(both.val) == len(plain.val)
    aug = read_parquet(paths["augmented"]).sort_values(["sha256", "transpose"])
    assert [e.tolist() for e in both.train[-6:]] == [[BOS, *ids, EOS] for ids in aug["ids"]]
    missing = load_corpus(paths["tokens"], info, tmp_path / "absent.parquet")
    assert missing.n_augmented == 0 and len(missing.train) == len(plain.train)


def test_bad_rows_are_counted_not_dropped_silently(tmp_path):
    import pyarrow.parquet as pq

    from pipeline.core.artifacts import write_parquet

    paths = write_token_data(tmp_path, n_pieces=30, mean_len=40)
    table = pq.read_table(paths["tokens"]).to_pandas()
    train_rows = np.flatnonzero(table["split"] == "train")
    table.at[train_rows[0], "ids"] = np.array([5, 999, 6], dtype=np.int32)
    table.at[train_rows[1], "ids"] = np.array([5, EOS, 6], dtype=np.int32)
    write_parquet(paths["tokens"], pq.read_table(paths["tokens"]).from_pandas(
        table, schema=pq.read_schema(paths["tokens"]), preserve_index=False))
    corpus = load_corpus(paths["tokens"], TokenInfo.read(paths["info"]))
    assert corpus.skipped == {"train:id_out_of_range": 1, "train:special_id_inside_piece": 1}


# -------------------------------------------------------------------------- windows and batches
def _examples(n: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.concatenate([[BOS], rng.integers(3, 50, rng.integers(3, 60)), [EOS]])
            for _ in range(n)]


def test_windows_keep_token_order_and_epochs_are_permutations():
    ex = _examples()
    s = WindowStream(ex, 16, seed=3)
    for epoch in range(3):
        assert sorted(s.position(epoch * 7 + j)[0] for j in range(7)) == list(range(7))
    for k in range(40):
        i, off = s.position(k)
        w = s.window(k)
        assert np.array_equal(w, ex[i][off : off + len(w)]) and len(w) <= 17
    again = WindowStream(ex, 16, seed=3)
    assert [again.position(k) for k in range(40)] == [s.position(k) for k in range(40)]
    assert [WindowStream(ex, 16, 4).position(k) for k in range(40)] != [s.position(k)
                                                                       for k in range(40)]


def test_shards_tile_each_step():
    one = Shard(0, 1, micro_batch=2, grad_accum=4)
    two = [Shard(r, 2, micro_batch=2, grad_accum=2) for r in range(2)]
    for step in range(3):
        a = sorted(k for m in range(4) for k in one.micro_positions(step, m))
        b = sorted(k for s in two for m in range(2) for k in s.micro_positions(step, m))
        assert a == b == list(one.step_positions(step))


def test_batches_pad_and_mask():
    b = make_batch([np.array([1, 5, 6, 2]), np.array([1, 7])], 5, PAD)
    assert b.x.tolist() == [[1, 5, 6, PAD, PAD], [1, PAD, PAD, PAD, PAD]]
    assert b.y.tolist() == [[5, 6, 2, -100, -100], [7, -100, -100, -100, -100]]
    assert b.n_valid == 4


def test_val_windows_cover_every_target_once():
    ex = _examples()
    wins = val_windows(ex, 8)
    assert sum(len(w) - 1 for w in wins) == sum(len(e) - 1 for e in ex)
    assert len(val_windows(ex, 8, max_windows=5)) == 5


def test_stream_batches_equal_window_by_window_batches():
    ex = _examples(9)
    s = WindowStream(ex, 16, seed=5)
    for ks in (range(0, 4), range(7, 12), range(16, 20), range(40, 41)):  # across epochs too
        a, b = s.batch(ks, PAD), make_batch([s.window(k) for k in ks], 16, PAD)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.mask, b.mask)
        assert a.x.dtype == b.x.dtype == torch.long
        assert s.n_targets(ks) == b.n_valid == sum(s.n_valid(k) for k in ks)


def test_packed_rows_hold_consecutive_windows_each_as_itself():
    from pipeline.training.data import PackedRows

    rng = np.random.default_rng(1)
    ex = [np.concatenate([[BOS], rng.integers(3, 50, n), [EOS]]) for n in rng.integers(1, 25, 9)]
    s = WindowStream(ex, 16, seed=5)
    p = PackedRows(s)
    b = p.batch(range(0, 6), PAD)
    k = 0
    for r in range(6):
        assert p.start(r) == k
        segs = b.segments[r]
        for seg in range(int(segs.max()) + 1):
            w = s.window(k)
            cols = (segs == seg).nonzero()[:, 0]
            assert cols.tolist() == list(range(int(cols[0]), int(cols[0]) + len(w) - 1))
            assert b.x[r, cols].tolist() == w[:-1].tolist()
            assert b.y[r, cols].tolist() == w[1:].tolist()
            k += 1
        pad = segs == -1
        assert (b.x[r, pad] == PAD).all() and not b.mask[r, pad].any()
        assert int(b.mask[r].sum()) == p.n_targets(range(r, r + 1)) <= 16
    assert p.start(6) == k and k > 6  # several short pieces share a row
    # pieces longer than the row: one window a row, the same batch as unpacked
    long = [np.arange(3, 3 + 40) for _ in range(5)]
    s2 = WindowStream(long, 16, seed=5)
    a, u = PackedRows(s2).batch(range(3, 8), PAD), s2.batch(range(3, 8), PAD)
    assert torch.equal(a.x, u.x) and torch.equal(a.y, u.y) and (a.segments == 0).all()


def test_invalid_inputs_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"window 1 has 7 tokens; need 2\.\.6"):
        make_batch([np.array([1, 5]), np.arange(7)], 5, PAD)
    with pytest.raises(ValueError, match="need 2"):
        make_batch([np.array([1])], 5, PAD)
    with pytest.raises(ValueError, match="is the train split empty"):
        WindowStream([], 8, seed=0)
    ex = [np.array([BOS, 3, 4, EOS]), np.array([BOS, 5, EOS])]
    with pytest.raises(ValueError, match="1 condition rows for 2 examples"):
        WindowStream(ex, 8, seed=0, cond=[np.array([1])])
    conditioned = WindowStream(ex, 8, seed=0, cond=[np.array([1]), np.array([2])])
    with pytest.raises(ValueError, match="pack: false"):
        PackedRows(conditioned)


def test_val_window_plan_keeps_evenly_spaced_windows_in_order():
    ex = [np.arange(20), np.arange(9), np.arange(33)]  # 19, 8 and 32 targets
    full = val_window_plan(ex, 8)
    assert full == [(0, 0), (0, 8), (0, 16), (1, 0), (2, 0), (2, 8), (2, 16), (2, 24)]
    kept = val_window_plan(ex, 8, max_windows=3)
    assert kept == [full[0], full[4], full[-1]]  # the first, the middle and the last
    assert val_window_plan(ex, 8, max_windows=50) == full
    assert [w.tolist() for w in val_windows(ex, 8, 3)] == [
        ex[e][s : s + 9].tolist() for e, s in kept]


# --------------------------------------------------------------------------------- conditions
def test_condition_dropout_is_seeded_by_position():
    cond = torch.tensor([[2, 5]] * 400)
    none = np.array([0, 3])
    a = drop_conditions(cond, none, 0.25, seed=7, position=40)
    assert torch.equal(a, drop_conditions(cond, none, 0.25, seed=7, position=40))
    assert not torch.equal(a, drop_conditions(cond, none, 0.25, seed=7, position=41))
    dropped = (a == torch.tensor([0, 3])).all(dim=1)
    assert ((a == torch.tensor([2, 5])).all(dim=1) | dropped).all()  # whole rows, never halves
    assert 0.18 < dropped.float().mean() < 0.32
    assert torch.equal(drop_conditions(cond, none, 0.0, seed=7, position=40), cond)


def test_windows_carry_their_pieces_conditions():
    examples = [np.array([BOS, 3, 4, 5, EOS]), np.array([BOS, 6, 7, EOS])]
    stream = WindowStream(examples, 8, seed=1, cond=[np.array([1]), np.array([2])])
    b = stream.batch(range(0, 6), PAD)
    first = {3: 1, 6: 2}
    assert [first[int(x)] for x in b.x[:, 1]] == b.cond[:, 0].tolist()



def test_compound_examples_are_framed_per_codebook_and_batched_alike(compound_tokens):
    """Compound rows become (steps, K) examples framed by each codebook's BOS and EOS; the
    stream's gathered batch equals make_batch over the same windows, padded per codebook."""
    from models.base import IGNORE_INDEX
    from pipeline.training.data import codebook_counts, load_corpus

    info = TokenInfo.read(compound_tokens["info"])
    corpus = load_corpus(compound_tokens["tokens"], info, compound_tokens["augmented"])
    assert corpus.n_augmented == 1 and len(corpus.train) == 3 and len(corpus.val) == 1
    np.testing.assert_array_equal(corpus.val[0], [[1, 1], [4, 4], [5, 4], [6, 5], [2, 2]])
    pad = np.asarray(info.codebook_ids("pad_id"))
    stream = WindowStream(corpus.train, seq_len=6, seed=3)
    b = stream.batch(range(0, 5), pad)
    ref = make_batch([stream.window(k) for k in range(5)], 6, pad)
    for got, want in ((b.x, ref.x), (b.y, ref.y), (b.mask, ref.mask)):
        assert torch.equal(got, want)
    assert b.x.shape == (5, 6, 2) and b.mask.shape == (5, 6)
    assert (b.y[:, 4:] == IGNORE_INDEX).all() and (b.x[:, 4:] == torch.as_tensor(pad)).all()
    # codebook 1's id 4 (CPWord's Ignore_None there) is not scored; codebook 0 scores all
    counts = codebook_counts(b.y, ((), (4,)))
    assert counts.tolist() == [20, 20 - int((b.y[..., 1] == 4).sum())]

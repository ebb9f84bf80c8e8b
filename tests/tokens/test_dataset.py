"""pipeline.tokens.dataset: experiment loading, windowing, padding and collation."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.base import IGNORE_INDEX
from pipeline.core.artifacts import ArtifactError, write_json, write_parquet
from pipeline.tokens.dataset import load_experiment, window_starts

PAD, BOS, EOS = 0, 1, 2


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(1, 12), st.integers(1, 12), st.booleans())
def test_windows_cover_every_target(length, seq_len, stride, pad):
    """With stride <= seq_len (and padding), every target position is inside some window."""
    starts = window_starts(length, seq_len, stride, pad)
    covered = set()
    for s in starts:
        assert 0 <= s < max(1, length - 1)
        covered |= set(range(s + 1, min(length, s + seq_len + 1)))
    if pad and stride <= seq_len:
        assert covered == set(range(1, length))
    if not pad:
        assert all(s + seq_len + 1 <= length for s in starts)
    if stride == seq_len and pad:  # disjoint targets: each scored exactly once
        assert sum(min(length, s + seq_len + 1) - s - 1 for s in starts) == max(0, length - 1)


@pytest.fixture
def experiment(tmp_path):
    tokens = pa.table({
        "sha256": ["a", "b", "c", "d"], "split": ["train", "train", "val", "train"],
        "track": pa.array([-1, -1, -1, -1], pa.int16()),
        "ids": pa.array([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], []], pa.list_(pa.int32())),
    })
    write_parquet(tmp_path / "data/tokens/tokens.parquet", tokens)
    write_parquet(tmp_path / "data/tokens/augmented.parquet", pa.table({
        "sha256": ["a"], "transpose": pa.array([2], pa.int8()), "track": pa.array([-1], pa.int16()),
        "ids": pa.array([[7, 8]], pa.list_(pa.int32())), "n_tokens": pa.array([2], pa.int32())}))
    write_json(tmp_path / "data/tokens/info.json", {"vocab_size": 20, "pad_id": PAD,
                                                   "bos_id": BOS, "eos_id": EOS,
                                                   "tokenizer": "REMI", "tokenizer_hash": "t",
                                                   "split_hash": "s"})
    return load_experiment(tmp_path)


def test_dataset_frames_pads_and_masks(experiment):
    ds = experiment.dataset("train", seq_len=4)
    # a: BOS 5 6 7 8 9 EOS (7 tokens) -> windows at 0 and 4; b: BOS 10 11 EOS -> one window
    assert len(ds) == 3
    x, y, m = ds[0]
    assert x.tolist() == [BOS, 5, 6, 7] and y.tolist() == [5, 6, 7, 8] and m.tolist() == [1] * 4
    x, y, m = ds[1]
    assert x.tolist() == [8, 9, PAD, PAD] and y.tolist() == [9, EOS, IGNORE_INDEX, IGNORE_INDEX]
    assert m.tolist() == [1, 1, 0, 0]
    targets = np.concatenate([ds[i][1].numpy() for i in range(len(ds))])
    assert BOS not in targets and PAD not in targets  # never targets
    assert sorted(t for t in targets if t != IGNORE_INDEX) == sorted([5, 6, 7, 8, 9, EOS,
                                                                      10, 11, EOS])


def test_unpadded_dataset_keeps_full_windows_only(experiment):
    ds = experiment.dataset("train", seq_len=4, pad=False)
    assert len(ds) == 1 and ds[0][2].tolist() == [1, 1, 1, 1]


def test_collate_and_dataloader(experiment):
    import torch

    loader = torch.utils.data.DataLoader(experiment.dataset("train", seq_len=3, stride=2),
                                         batch_size=2, collate_fn=experiment.collate)
    x, y, m = next(iter(loader))
    assert x.shape == y.shape == m.shape == (2, 3) and x.dtype == torch.int64


def test_augmented_only_for_train(experiment):
    assert len(experiment.sequences("train", augmented=True)) == 3
    with pytest.raises(ValueError, match="train split only"):
        experiment.sequences("val", augmented=True)
    with pytest.raises(ValueError, match="split = 'dev'"):
        experiment.tokens("dev")


def test_missing_experiment_is_explained(tmp_path):
    """The error names the file and the dvc.yaml stage that makes it."""
    shutil.copy(Path(__file__).parents[2] / "dvc.yaml", tmp_path / "dvc.yaml")
    with pytest.raises(ArtifactError, match=r"data/tokens/info.json does not exist: re-run "
                                            r"`dvc repro tokenize`"):
        load_experiment(tmp_path)
    (tmp_path / "data/tokens").mkdir(parents=True)
    (tmp_path / "data/tokens/info.json").write_text('{"vocab_size": 3')
    with pytest.raises(ArtifactError, match="is not a readable JSON file: re-run `dvc repro "
                                            "tokenize`"):
        load_experiment(tmp_path)


def test_end_to_end_with_stage_output(tmp_path):
    """The stage's own outputs load: tokenizer decodes a window's ids."""
    from symusic import Note, Score, Track

    from pipeline.core.artifacts import sha256_bytes
    from pipeline.core.config import RuntimeConfig
    from pipeline.stages.tokenize import TokenizeConfig, run

    raw = tmp_path / "data/raw"
    raw.mkdir(parents=True)
    rows = []
    for i in range(3):
        s = Score(480)
        t = Track(name="p", program=0, is_drum=False)
        for k in range(20):
            t.notes.append(Note(k * 240, 240, 60 + (k * (i + 1)) % 12, 80))
        s.tracks.append(t)
        data = s.dumps_midi()
        (raw / f"{i}.mid").write_bytes(data)
        rows.append({"path": f"{i}.mid", "sha256": sha256_bytes(data), "status": "ok"})
    import pandas as pd

    write_parquet(tmp_path / "data/manifest.parquet", pd.DataFrame(rows))
    write_parquet(tmp_path / "data/splits.parquet", pd.DataFrame({
        "sha256": [r["sha256"] for r in rows], "group_id": ["a", "b", "c"],
        "split": ["train", "train", "val"], "fold": 0}))
    run(TokenizeConfig(model="none"), RuntimeConfig(workers=1, progress=False),
        raw_dir=raw, manifest=tmp_path / "data/manifest.parquet",
        splits=tmp_path / "data/splits.parquet", split_report=None,
        tokenizer_out=tmp_path / "data/tokenizer.json", tokens_dir=tmp_path / "data/tokens",
        cache_dir=None, report=tmp_path / "reports/tokenize.json")
    exp = load_experiment(tmp_path)
    assert len(exp.splits) == 3 and len(exp.tokens("val")) == 1
    x, _, m = exp.dataset("val", seq_len=4096)[0]
    ids = x[m.bool()].tolist()[1:]  # drop BOS
    assert sum(len(t.notes) for t in exp.tokenizer.decode(ids).tracks) == 20


def test_compound_tokens_are_refused_not_read_as_empty_sequences(compound_tokens, tmp_path):
    from pipeline.core.config import ParamsError

    shutil.copytree(compound_tokens["info"].parent, tmp_path / "exp" / "data" / "tokens")
    exp = load_experiment(tmp_path / "exp")
    with pytest.raises(ParamsError, match=r"tokenize\.tokenizer: CPWord — the token dataset"):
        exp.sequences("train")
